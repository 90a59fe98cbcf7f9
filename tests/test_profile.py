"""Kernel profile loader: real available_filter_functions, and one-line errors for non-profiles."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from discover.errors import UserError
from discover.profile import (KernelProfile, clone_base, dump_profile, empty_profile,
                              load_profile, parse_filter_functions)

FIXTURES = Path(__file__).resolve().parent.parent.parent / "shared" / "fixtures" / "debian-6.1.0-57-amd64"
AFF = FIXTURES / "tracefs" / "available_filter_functions.nfs.txt"


def _profile_from_fixture() -> KernelProfile:
    data = empty_profile()
    data.update(uname={"release": "6.1.0-57-amd64"}, modules={}, events={},
                filter_functions=parse_filter_functions(AFF.read_text().splitlines()))
    return KernelProfile(data)


def test_filter_functions_keep_module_and_clone_suffixes() -> None:
    lines = AFF.read_text().splitlines()
    rows = parse_filter_functions(lines)
    assert len(rows) == len([l for l in lines if l.strip()])
    by_name = {name: mod for name, mod in rows}
    assert by_name["nfs_file_read"] == "nfs"
    assert by_name["kernfs_put.part.0"] is None
    prof = _profile_from_fixture()
    assert prof.traceable("nfs_getattr")
    assert not prof.traceable("nfs_no_such_function")
    assert "nfs_request_mount.constprop.0.isra.0" in prof.clones("nfs_request_mount")
    assert prof.function_modules("nfs_file_read") == {"nfs"}


def test_clone_base_strips_every_gcc_suffix() -> None:
    assert clone_base("nfs_request_mount.constprop.0.isra.0") == "nfs_request_mount"
    assert clone_base("_fh_update.part.0.isra.0") == "_fh_update"
    assert clone_base("nfs_file_read") == "nfs_file_read"


def test_roundtrip(tmp_path: Path) -> None:
    prof = _profile_from_fixture()
    out = tmp_path / "p.json"
    dump_profile(prof.data, out)
    again = load_profile(out)
    assert again.traceable("nfs_file_write")
    assert again.release == "6.1.0-57-amd64"


@pytest.mark.parametrize("content, needle", [
    ("not json at all", "not a kernel profile (not JSON)"),
    (json.dumps({"nodes": [], "links": []}), "not a kernel profile"),
    (json.dumps({"schema": "probekit-kernel-profile", "version": 99, "uname": {}}), "newer"),
    (json.dumps({"schema": "probekit-kernel-profile", "version": 1}), "lacks"),
])
def test_not_a_profile_is_one_line(tmp_path: Path, content: str, needle: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    with pytest.raises(UserError) as err:
        load_profile(bad)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_trace_file_is_not_a_profile() -> None:
    with pytest.raises(UserError, match="not a kernel profile"):
        load_profile(FIXTURES / "function_graph" / "nfs42.nfs4_file_open.trace")

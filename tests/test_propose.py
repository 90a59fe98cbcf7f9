"""`discover propose nfs` on a profile built from the real Debian 6.1 tracefs capture."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import pytest

from discover.errors import UserError
from discover.profile import KernelProfile, dump_profile
from discover.propose import Proposer, build_spec
from discover.snapshot import build_profile
from discover.spec import dumps_spec, load_spec, parse_ops

from test_snapshot import fixture_tracefs

REPO = Path(__file__).resolve().parent.parent
ALL_OPS = ["read", "write", "open", "getattr", "fsync", "commit"]


@pytest.fixture(scope="module")
def profile_data(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    tmp = tmp_path_factory.mktemp("prof")
    empty = tmp / "empty"
    empty.mkdir()
    return build_profile(fixture_tracefs(tmp), proc=empty, sysfs=empty, boot=empty)


def _first(spec: Dict[str, Any], op: str) -> Dict[str, Any]:
    return spec["ops"][op]["candidates"][0]


def test_six_operations_ranked(profile_data: Dict[str, Any], tmp_path: Path) -> None:
    proposer = Proposer(KernelProfile(profile_data), "nfs")
    spec, _ = build_spec(proposer, proposer.propose(ALL_OPS))
    out = tmp_path / "nfs.toml"
    out.write_text(dumps_spec(spec))
    spec = load_spec(out)
    assert list(spec["ops"]) == ALL_OPS
    assert [spec["ops"][op]["letter"] for op in ALL_OPS] == list("RWOGFC")
    # read/write: no file-level tracepoint on 6.1 -> the kprobes bcc nfsslower uses
    for op, fn in (("read", "nfs_file_read"), ("write", "nfs_file_write")):
        first = _first(spec, op)
        assert first["kind"] == "kprobe" and [a["entry"] for a in first["attach"]] == [fn]
        assert any("bcc" in r for r in first["reasons"])
    # open: both ->open variants and the atomic-open path, but not the nested v4 callback
    opens = {a["entry"] for a in _first(spec, "open")["attach"]}
    assert opens == {"nfs_file_open", "nfs4_file_open", "nfs_atomic_open"}
    assert all(a["optional"] for a in _first(spec, "open")["attach"])
    assert any("nfs_atomic_open added" in r for r in _first(spec, "open")["reasons"])
    # getattr, fsync: a same-task tracepoint pair at the filesystem layer comes first
    for op in ("getattr", "fsync"):
        first = _first(spec, op)
        assert first["kind"] == "tracepoint" and first["match"] == "task"
        assert first["attach"][0]["entry"] == f"nfs:nfs_{op}_enter"
        assert first["attach"][0]["exit"] == f"nfs:nfs_{op}_exit"
    # commit: async pair, matched on shared fields, then the kprobe fallback
    commit = _first(spec, "commit")
    assert commit["attach"][0]["entry"] == "nfs:nfs_initiate_commit"
    assert commit["attach"][0]["exit"] == "nfs:nfs_commit_done"
    assert commit["match"] == "keys" and "fileid" in commit["keys"]
    assert any(c["kind"] == "kprobe" for c in spec["ops"]["commit"]["candidates"][1:])
    # every candidate written is attachable on this kernel
    traceable = {name for name, _ in profile_data["filter_functions"]}
    for op in ALL_OPS:
        for cand in spec["ops"][op]["candidates"]:
            for point in cand["attach"]:
                if cand["kind"] != "tracepoint":
                    assert point["entry"] in traceable


def test_no_btf_means_no_fentry(profile_data: Dict[str, Any]) -> None:
    proposer = Proposer(KernelProfile(profile_data), "nfs")
    fentry = [c for c in proposer.candidates("read") if c.kind == "fentry"]
    assert fentry and not any(c.usable for c in fentry)
    assert any("no BTF" in r for c in fentry for r in c.reasons)


def test_errors_are_user_errors(profile_data: Dict[str, Any]) -> None:
    with pytest.raises(UserError, match="unknown operation 'readdirs'"):
        parse_ops("read,readdirs")
    assert parse_ops("R,W") == ["read", "write"]  # the letters nfsslower takes
    with pytest.raises(UserError, match="unknown filesystem 'nosuchfs'"):
        Proposer(KernelProfile(profile_data), "nosuchfs")
    with pytest.raises(UserError, match="filesystem module xfs is not loaded"):
        Proposer(KernelProfile(profile_data), "xfs")
    unloaded = dict(profile_data, modules={"sunrpc": {"size": 1, "refcount": 1, "used_by": [], "state": "Live"}},
                    unavailable={})
    with pytest.raises(UserError, match="filesystem module nfs is not loaded"):
        Proposer(KernelProfile(unloaded), "nfs")


def _propose(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="300")  # wide table: one candidate line per cell line
    return subprocess.run([sys.executable, "-m", "discover", "propose", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_cli_profile_drives_same_spec_twice(profile_data: Dict[str, Any], tmp_path: Path) -> None:
    prof = tmp_path / "p.json"
    dump_profile(profile_data, prof)
    outs = []
    for i in range(2):
        out = tmp_path / f"nfs{i}.toml"
        res = _propose("nfs", "--kernel-profile", str(prof), "-o", str(out))
        assert res.returncode == 0, res.stderr
        assert "nfs_file_read [nfs]: in available_filter_functions" in res.stdout
        outs.append(out.read_text())
    assert outs[0] == outs[1]


def test_cli_bad_inputs_one_line(tmp_path: Path) -> None:
    not_profile = tmp_path / "graph.json"
    not_profile.write_text(json.dumps({"nodes": [], "links": []}))
    for args in (["nfs", "--kernel-profile", str(not_profile)], ["nfs", "--ops", "read,bogus"]):
        res = _propose(*args)
        assert res.returncode != 0
        assert res.stderr.count("\n") == 1 and res.stderr.startswith("discover: error:"), res.stderr

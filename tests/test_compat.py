"""Compatibility reports on real kernels: 6.1.0-50 as a package and as the live lab profile, and 6.12."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import pytest

from debian_kernels import ABI_61, ABI_612, LAB_61, kernel_dir
from discover.errors import UserError
from discover.profile import KernelProfile
from probes.compat import (ABSENT, CHANGED, INLINED, OK, Kernel, build_report, disagreements,
                           load_kernel, render, spec_attach_points, spec_events, spec_functions,
                           spec_modules)
from probes.fetch import fetch_kernel
from discover.spec import load_spec, validate_spec

REPO = Path(__file__).resolve().parents[1]
NFS_SPEC = REPO / "probes" / "specs" / "nfs.toml"


def _point(entry: str, exit: str, kind: str, module: str = "nfs", optional: bool = False,
           args: Dict[str, str] = None) -> Dict[str, Any]:
    kinds = {"tracepoint": ("tracepoint", "tracepoint"), "kprobe": ("kprobe", "kretprobe"),
             "fentry": ("fentry", "fexit")}[kind]
    point = {"entry": entry, "exit": exit, "entry_kind": kinds[0], "exit_kind": kinds[1],
             "module": module, "optional": optional}
    if args:
        point["args"] = args
    return point


def _cand(kind: str, *points: Dict[str, Any]) -> Dict[str, Any]:
    return {"kind": kind, "match": "task", "module": "nfs", "attach": list(points)}


#: a spec written for 5.10 (nfs_readpage) with later fallbacks, to see renames and signature changes
SPEC: Dict[str, Any] = {
    "schema": "probekit-probe-spec", "version": 1, "filesystem": "nfs", "kernel": "6.1.0-50-amd64",
    "ops": {
        "read": {"letter": "R", "candidates": [
            _cand("kprobe", _point("nfs_readpage", "nfs_readpage", "kprobe")),
            _cand("fentry", _point("nfs_read_folio", "nfs_read_folio", "fentry", args={"file": "file"})),
            _cand("tracepoint", _point("nfs:nfs_aop_readpage", "nfs:nfs_aop_readpage_done", "tracepoint",
                                       args={"fileid": "fileid", "offset": "offset"})),
        ]},
        "getattr": {"letter": "G", "candidates": [
            _cand("tracepoint", _point("nfs:nfs_getattr_enter", "nfs:nfs_getattr_exit", "tracepoint",
                                       args={"fileid": "fileid", "error": "exit.error"})),
            _cand("kprobe", _point("nfs_getattr", "nfs_getattr", "kprobe", args={"dentry": "path->dentry"})),
        ]},
        "write": {"letter": "W", "candidates": [
            _cand("kprobe", _point("nfs_updatepage", "nfs_updatepage", "kprobe")),
            _cand("kprobe", _point("nfs_file_write", "nfs_file_write", "kprobe")),
        ]},
        "open": {"letter": "O", "candidates": [
            _cand("kprobe", _point("nfs_file_open", "nfs_file_open", "kprobe"),
                  _point("nfs4_file_open", "nfs4_file_open", "kprobe", module="nfsv4", optional=True)),
        ]},
    },
}


@pytest.fixture(scope="module")
def kernels() -> Dict[str, Kernel]:
    validate_spec(SPEC, "test spec")
    functions = spec_functions(SPEC)
    return {"pkg61": load_kernel(str(kernel_dir(ABI_61)), functions, ["nfs"]),
            "live61": load_kernel(str(LAB_61 / "profile.json.gz"), functions, ["nfs"]),
            "pkg612": load_kernel(str(kernel_dir(ABI_612)), functions, ["nfs"])}


def _cells(report: Dict[str, Any], label: str) -> Dict[str, Dict[str, Any]]:
    return {p["name"]: p["cells"][label] for p in report["attach_points"]}


def test_package_and_live_profile_agree(kernels: Dict[str, Kernel]) -> None:
    """The package of 6.1.0-50 must give the verdicts the booted 6.1.0-50 gives."""
    pkg, live = kernels["pkg61"], kernels["live61"]
    assert pkg.label == kernel_dir(ABI_61).name and live.label == "6.1.0-50-amd64"
    report = build_report(SPEC, [pkg, live], pkg, "test spec")
    pkg_cells, live_cells = _cells(report, pkg.label), _cells(report, live.label)
    assert {n: c["status"] for n, c in pkg_cells.items()} == {n: c["status"] for n, c in live_cells.items()}
    for op in report["ops"].values():
        assert op["kernels"][pkg.label]["candidate"] == op["kernels"][live.label]["candidate"]
    # nfs_readpage became nfs_read_folio in 5.19: absent on 6.1, read falls back to candidate #2
    assert pkg_cells["nfs_readpage"]["status"] == ABSENT
    assert report["ops"]["read"]["kernels"][pkg.label]["candidate"] == 1
    assert pkg_cells["nfs_read_folio"]["status"] == OK and "lives in module nfs" in pkg_cells["nfs_read_folio"]["notes"][0]
    assert pkg_cells["nfs:nfs_getattr_enter"]["status"] == OK


def test_changes_against_612(kernels: Dict[str, Kernel]) -> None:
    pkg61, pkg612 = kernels["pkg61"], kernels["pkg612"]
    report = build_report(SPEC, [pkg61, pkg612], pkg61, "test spec")
    cells = _cells(report, pkg612.label)
    getattr_cell = cells["nfs_getattr"]
    assert getattr_cell["status"] == CHANGED
    assert any("param 1 struct user_namespace * -> struct mnt_idmap * idmap" in n for n in getattr_cell["notes"])
    assert getattr_cell["prototype"].startswith("int nfs_getattr(struct mnt_idmap *idmap, const struct path *path")
    assert cells["nfs:nfs_getattr_enter"]["status"] == OK
    # nfs_aop_readpage went from a page to (offset, count) with the folio conversion
    readpage = cells["nfs:nfs_aop_readpage"]
    assert readpage["status"] == CHANGED
    assert any(n.startswith(f"fields changed vs {pkg61.label}: +count") for n in readpage["notes"])
    assert any("TP_PROTO changed" in n and "loff_t, size_t" in n and "struct page *" in n for n in readpage["notes"])
    assert not any("args." in n for n in readpage["notes"])  # fileid and offset are still there
    assert report["ops"]["getattr"]["kernels"][pkg612.label]["candidate"] == 0
    assert cells["nfs_readpage"]["status"] == ABSENT  # absent everywhere in this report: not "inlined?"
    # nfs_updatepage became nfs_update_folio: gone on 6.12, the report says so and hints the new name
    update = cells["nfs_updatepage"]
    assert update["status"] == INLINED
    assert any(n.startswith(f"renamed? names here and not on {pkg61.label}:") and "nfs_update_folio" in n
               for n in update["notes"])
    assert report["ops"]["write"]["kernels"][pkg612.label]["candidate"] == 1
    assert report["ops"]["write"]["kernels"][pkg61.label]["candidate"] == 0


def test_renderers(kernels: Dict[str, Kernel]) -> None:
    report = build_report(SPEC, [kernels["pkg61"], kernels["pkg612"]], kernels["pkg61"], "test spec")
    table = render(report, "table")
    assert "nfs_getattr" in table and "CHANGED [nfs]" in table and "absent" in table
    md = render(report, "md")
    assert md.startswith("# Compatibility") and "| attach point | ops |" in md
    page = render(report, "html")
    assert page.startswith("<!DOCTYPE html>") and "<style>" in page
    assert not re.search(r"(src|href)\s*=", page), "HTML must be self-contained"
    assert json.loads(render(report, "json"))["reference"] == kernels["pkg61"].label


def test_lab_hook_marks_and_disagrees(kernels: Dict[str, Kernel]) -> None:
    pkg = kernels["pkg61"]
    agree = {pkg.label: {"read": {"candidate": 1, "ok": True}}}
    report = build_report(SPEC, [pkg], pkg, "t", agree)
    assert report["lab"] == {pkg.label: {"read": "verified"}} and disagreements(report) == []
    assert "lab-verified" in render(report, "table")
    clash = {pkg.label: {"read": {"candidate": 0, "ok": True}}}
    assert disagreements(build_report(SPEC, [pkg], pkg, "t", clash))
    # a lab names the kernel by uname -r: it lands on the package's column
    by_uname = {pkg.profile.release: {"read": {"candidate": 1, "ok": True}}}
    assert pkg.profile.release == f"{pkg.label}-amd64"
    assert build_report(SPEC, [pkg], pkg, "t", by_uname)["lab"] == {pkg.label: {"read": "verified"}}


def test_committed_nfs_spec_on_61(kernels: Dict[str, Kernel]) -> None:
    """The spec proposed on the 6.1.0-50 lab guest: every operation covered by the package of that kernel."""
    spec = load_spec(NFS_SPEC)
    pkg = load_kernel(str(kernel_dir(ABI_61)), spec_functions(spec), spec_modules(spec), events=spec_events(spec))
    report = build_report(spec, [pkg], pkg, str(NFS_SPEC))
    for op, info in report["ops"].items():
        assert info["kernels"][pkg.label]["covered"], op
    assert len(report["attach_points"]) == len(spec_attach_points(spec))


def _probes(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "probes", *args], cwd=REPO, capture_output=True, text=True)


def test_unknown_version_is_one_line() -> None:
    with pytest.raises(UserError, match="no Debian amd64 kernel 9.99"):
        fetch_kernel("9.99")
    res = _probes("compat", str(NFS_SPEC), "--kernel", "9.99")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith("probes: error: no Debian amd64 kernel 9.99")
    res = _probes("compat", str(NFS_SPEC), "--kernel", "not-a-kernel")
    assert res.returncode == 1 and res.stderr.strip().splitlines()[-1].startswith("probes: error: --kernel not-a-kernel")


def test_cli_writes_html(tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    res = _probes("compat", str(NFS_SPEC), "--kernel", kernel_dir(ABI_61).name, "--kernel", str(LAB_61 / "profile.json.gz"),
                  "--format", "html", "-o", str(out))
    assert res.returncode == 0, res.stderr
    assert out.read_text().count("<tr>") > 10


def test_lookup_profiles_give_the_full_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading only the modules that define the spec's names changes no cell, pick or warning.

    The same two real packages analysed twice: every module read (a complete profile) and
    through the compat path (kernelpkg.Lookup: the spec's functions, events and modules).
    """
    from probes.compat import spec_events, spec_modules
    from probes.kernelpkg import Lookup, profile_from_package
    monkeypatch.setenv("PROBEKIT_PROFILE_CACHE", str(tmp_path))
    spec = load_spec(NFS_SPEC)
    functions, events, modules = spec_functions(spec), spec_events(spec), spec_modules(spec)
    full, fast = [], []
    for abi in (ABI_61, ABI_612):
        data = profile_from_package([kernel_dir(abi)], sorted(functions), workers=1)
        assert data["package"]["lookup"] is None
        full.append(Kernel(abi, KernelProfile(data)))
        kernel = load_kernel(str(kernel_dir(abi)), functions, modules, events=events)
        lookup = kernel.profile.data["package"]["lookup"]
        assert lookup == Lookup.of(functions, events, modules).as_dict()
        read = [m for m, info in kernel.profile.data["package"]["modules"].items() if info["read"]]
        assert set(modules) <= set(read) and len(read) < 20
        fast.append(kernel)
    for spec_used in (spec, SPEC):
        a = build_report(spec_used, full, full[0], "spec")
        b = build_report(spec_used, fast, fast[0], "spec")
        assert a["attach_points"] == b["attach_points"]
        assert a["ops"] == b["ops"]


def test_fentry_pick_attaches_as_kprobe_without_module_btf(kernels: Dict[str, Kernel]) -> None:
    """A 6.1 package whose nfs module has no BTF: the fentry candidate is still picked (the generator
    attaches it as a kprobe pair) and the report says what is lost, not that it fails."""
    import copy
    data = copy.deepcopy(kernels["pkg61"].profile.data)
    data["package"]["modules"]["nfs"]["btf"] = False
    data["btf"]["functions"] = {n: f for n, f in data["btf"]["functions"].items() if f["module"] != "nfs"}
    no_btf = Kernel("nobtf", KernelProfile(data))
    pick = build_report(SPEC, [no_btf], no_btf, "t")["ops"]["read"]["kernels"]["nobtf"]
    assert pick["candidate"] == 1 and pick["label"] == "fentry nfs_read_folio"
    assert pick["attached_as"] == ["kprobe"] and pick["warnings"] == []
    assert pick["degraded"] == ["nfs_read_folio: module nfs has no BTF here, so file not read "
                                "(no file name/offset in its events)"]
    with_btf = build_report(SPEC, [kernels["pkg61"]], kernels["pkg61"], "t")["ops"]["read"]["kernels"]
    assert with_btf[kernels["pkg61"].label]["degraded"] == [] and with_btf[kernels["pkg61"].label]["warnings"] == []


def test_a_series_means_the_labs_kernel_of_that_series() -> None:
    """`--kernel 6.12 --lab-results lab.json` reports on the 6.12 the lab booted (uname -r
    labels of a real five-kernel lab run), whatever other 6.12 build the cache holds."""
    from probes.cli import lab_kernel_for
    lab = {"5.10.0-32-amd64": {}, "6.1.0-50-amd64": {}, "6.12.117+deb13-amd64": {}, "7.2.13+deb14-amd64": {},
           "7.3.4+deb13-amd64": {}}
    assert [lab_kernel_for(v, lab) for v in ("5.10", "6.1", "6.12", "7.2", "7.3")] == \
        ["5.10.0-32", "6.1.0-50", "6.12.117+deb13", "7.2.13+deb14", "7.3.4+deb13"]
    # exact versions, other series, paths and live are left alone; two of a series stay ambiguous
    assert [lab_kernel_for(v, lab) for v in ("6.1.0-47", "6.16", "live", "/tmp/k.json")] == \
        ["6.1.0-47", "6.16", "live", "/tmp/k.json"]
    assert lab_kernel_for("6.1", dict(lab, **{"6.1.0-47-amd64": {}})) == "6.1"

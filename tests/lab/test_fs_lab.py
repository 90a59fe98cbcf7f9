"""Lab tests of fsslower, fsdist and fstop -t FS on ext4, XFS, btrfs and SMB/CIFS (issue 13),
on 5.10 (kprobes, no module BTF) and 6.12 (fentry) in CI.

In the shared per-kernel guest (tests/lab/conftest.py; on a pair, its client), one guest run
(labs/checks/fs/guest.py) makes each local filesystem on a loop file under a device-mapper
`delay` device and mounts the image's Samba share twice (cache=strict, cache=loose), starts
`fsslower -t xfs 0`, `fsdist -t ext4` (the worker's pid only: the root is ext4 too),
`fstop -t btrfs` and `fsslower -t cifs 0` once, and runs a known workload on each mount
twice, without and with 600 ms added to every I/O by dm-delay (every SMB round trip by
netem on lo); the tools end by SIGTERM, SIGINT and SIGHUP. labs/checks/fs/verdicts.py judges it:
counts and bytes exact per phase, the delay shown when injected and not without, nothing
left attached, mounted or mapped. The tools' picks and counts are each spec's
--lab-results for this kernel, and `probes compat` of the kernel's Debian package must
agree with them, every operation lab-verified.

On 6.12 the same run also starts `nfs-exporter -t xfs,ext4,btrfs,cifs` before anything is
mounted, so that each filesystem whose module its first mount loads is attached then, and
scrapes it right before and right after every phase: its per-mount counts and bytes grow
by what the workload issued and the tool counted, its histograms show the delay as the
tools do, no probe attached at the start restarts when the others arrive, and SIGTERM
leaves nothing behind.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict

import pytest
from conftest import KERNELS, guest_run, guest_script, matrix, on_kernels, once_run

from labs.checks.fs import verdicts as fc
from labs.checks.shared import GUEST_SCRIPTS

pytestmark = pytest.mark.lab

FILESYSTEMS = ["xfs", "ext4", "btrfs", "cifs"]
fs_kernels = on_kernels("fs")
#: where the run checks nfs-exporter over the same filesystems (fentry and core on trixie)
EXPORTER_KERNELS = ("6.12",)
fs_exporter_kernels = pytest.mark.parametrize(
    "kernel_lab", [k for k in KERNELS if k in matrix().get("fs", ()) and k in EXPORTER_KERNELS], indirect=True,
    ids=lambda k: f"k{k}")


@guest_run("fs", fixture="fs_data")
def run_fs_checks(kernel_lab: Any) -> Dict[str, Any]:
    script = GUEST_SCRIPTS["fs"] + (" --exporter" if kernel_lab.kernel in EXPORTER_KERNELS else "")
    return guest_script(kernel_lab, "fs", script, timeout=1800)


@pytest.fixture
def fs_data(kernel_lab: Any) -> Dict[str, Any]:
    out = once_run(kernel_lab, "fs")
    assert out["ok"], out.get("error")
    return out["data"]


@fs_kernels
@pytest.mark.parametrize("fs", FILESYSTEMS)
@pytest.mark.parametrize("verify", fc.RUN_CHECKS, ids=lambda f: f.__name__[len("verify_"):])
def test_fs_tool(fs_data: Dict[str, Any], fs: str, verify: Any) -> None:
    verify(fs_data["runs"][fs], fs)


@fs_kernels
@pytest.mark.parametrize("fs", FILESYSTEMS)
def test_mount_point_finds_the_superblock(fs_data: Dict[str, Any], fs: str) -> None:
    fc.verify_mount_point_finds_the_superblock(fs_data, fs)


@fs_kernels
def test_fs_tools_leave_nothing_behind(fs_data: Dict[str, Any]) -> None:
    fc.verify_nothing_left(fs_data, ",".join(FILESYSTEMS))


@fs_exporter_kernels
@pytest.mark.parametrize("fs", FILESYSTEMS)
@pytest.mark.parametrize("verify", fc.EXPORTER_CHECKS, ids=lambda f: f.__name__[len("verify_"):])
def test_fs_exporter(fs_data: Dict[str, Any], fs: str, verify: Any) -> None:
    verify(fs_data, fs)


@fs_exporter_kernels
def test_fs_exporter_stops_clean(fs_data: Dict[str, Any]) -> None:
    fc.verify_exporter_stopped(fs_data)


@guest_run("fs static", fixture="fs_static")
def run_fs_static(kernel_lab: Any) -> Dict[str, Any]:
    """probes compat SPEC for this kernel's Debian package, with this run's lab results, per
    filesystem: computed while the guest is up, which static_kernel falls back to."""
    from probes.compat import build_report, render, spec_attach_points, spec_functions
    from probes.runtime import SPECS_DIR
    from discover.spec import load_spec
    from test_probes_lab import static_kernel
    out = once_run(kernel_lab, "fs")
    assert out["ok"], out.get("error")
    reports: Dict[str, Any] = {}
    for fs in FILESYSTEMS:
        lab_results = fc.lab_results(out["data"], fs)
        release = out["data"]["release"]
        if not all(run["ok"] for run in lab_results[release].values()):  # that filesystem's test says so
            reports[fs] = {"lab_results": lab_results}
            continue
        spec_path = SPECS_DIR / f"{fs}.toml"
        spec = load_spec(spec_path)
        modules = sorted({p.module for p in spec_attach_points(spec) if p.module and p.module != "vmlinux"})
        kernel = static_kernel(kernel_lab.lab, release, spec_functions(spec), modules)
        report = build_report(spec, [kernel], kernel, str(spec_path), lab_results)
        (Path(kernel_lab.artifacts) / f"compat-{fs}-{kernel.label}.txt").write_text(render(report, "table"))
        (Path(kernel_lab.artifacts) / f"lab-results-{fs}.json").write_text(json.dumps(lab_results, indent=1))
        reports[fs] = {"spec": spec, "label": kernel.label, "report": report}
    return reports


@pytest.fixture
def fs_static(kernel_lab: Any) -> Dict[str, Any]:
    return once_run(kernel_lab, "fs static")


@fs_kernels
@pytest.mark.parametrize("fs", FILESYSTEMS)
def test_fs_static_report_agrees_with_the_lab(fs_static: Dict[str, Any], fs: str) -> None:
    from probes.compat import disagreements
    found = fs_static[fs]
    assert "report" in found, f"not every operation recorded in the lab: {found['lab_results']}"
    assert disagreements(found["report"]) == []
    assert found["report"]["lab"] == {found["label"]: {op: "verified" for op in found["spec"]["ops"]}}

"""Lab tests of nfsslower / nfsdist / nfstop on real NFS traffic, on the matrix's `probes` kernels.

In the shared per-kernel guest (tests/lab/conftest.py; on a pair, its client, with netem on
the link to the server instead of lo), booted once for all its checks (each tool starts on
the loader --backend auto picks: core, 10-50 s under TCG, where the kernel allows, else bcc,
which compiles at start, 20-80 s): the guest side (labs/checks/probes/guest.py, also used by
`labs test --lab-results`) runs the tools around a workload with known counts and reports
both as JSON; labs/checks/probes/verdicts.py compares them (the same verdicts `labs test --topology
pair --lab-results` gives). Two guest runs per kernel keep tool starts to five (six with the bcc reference): `main`
(nfsslower + nfsdist with --ops all once, around the workload on NFSv3, on NFSv4.2, a
metadata phase per mount, and NFSv3 with netem delay; where they run on core, one nfsdist on
bcc beside them over the same phases, whose counts and bytes must be theirs) and `v3only` (all three tools with
nfsv4 unloaded, nfstop watching the workload's process; then nfsv4 loaded under them: on core they
trace it beside their running programs and count a workload on NFSv4.2, on bcc they say to restart). v3only runs on the kernels of
the matrix's `v3only` (a pair's fault run starts all three tools on a v3-only client and checks
the same there). A third run, `identity` (its kernels: docs/ci.md), checks the mount and cgroup of each
operation (two systemd scope units on two mounts: nfsslower --cgroup -M, nfstop --by cgroup,
nfsdist --per-mount).

The guest also reports, per operation, the spec candidate the tools picked and whether it
recorded the operation: that is the kernel's --lab-results (docs/compat.md), written to the
artefact directory, and the static compat report of the same kernel's Debian package must
agree with it (probes.compat.disagreements == []) with every operation lab-verified.

Debian 11's Python 3.9 has no TOML module, so the guest is given the spec as JSON (same keys).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import pytest
from conftest import KERNELS, guest_run, guest_script, matrix, on_kernels, once_run, say

from discover.errors import UserError
from labs.checks.probes import verdicts as pc
from labs.checks.probes.verdicts import Results, data
from labs.checks.shared import GUEST_SCRIPTS
from labs.vm.base import Lab

pytestmark = pytest.mark.lab


@guest_run("probes", fixture="results")
def run_guest_checks(kernel_lab: Any) -> Dict[str, Dict[str, Any]]:
    """Run every guest check of this topology once."""
    lab: Lab = kernel_lab.lab
    share = getattr(lab, "guest_project_dir", "/opt/probekit")
    out: Dict[str, Dict[str, Any]] = {}
    # main only where the v3-only start is proven elsewhere, as on the pair (its fault run)
    for check in pc.guest_runs(with_faults=kernel_lab.kernel not in matrix()["v3only"]):
        with kernel_lab.timed(f"probes {check}"):
            res = lab.run(f"cd {share} && python3 {GUEST_SCRIPTS['probes']} {check}", timeout=1200)
        assert res.exit_code == 0, f"{check}: exit {res.exit_code}: {res.stderr[-2000:]}"
        out[check] = json.loads(res.stdout.strip().splitlines()[-1])
        say(f"[probes lab] {kernel_lab.kernel} {check}: {kernel_lab.times[f'probes {check}']:.0f} s")
    main = data(out, "main")
    release = main["kernel"]["release"]
    kernel_lab.artifacts.mkdir(parents=True, exist_ok=True)
    (kernel_lab.artifacts / f"guest-{release}.json").write_text(json.dumps(out, indent=1) + "\n")
    write_lab_results(kernel_lab.root, main["lab_results"])
    return out


@pytest.fixture
def results(kernel_lab: Any) -> Dict[str, Dict[str, Any]]:
    return once_run(kernel_lab, "probes")


def write_lab_results(artifacts: Path, per_kernel: Dict[str, Any]) -> None:
    """lab-results-<uname -r>.json per kernel, and lab-results.json merging every kernel so far."""
    for release, ops in per_kernel.items():
        (artifacts / f"lab-results-{release}.json").write_text(json.dumps({release: ops}, indent=1) + "\n")
    merged: Dict[str, Any] = {}
    for path in sorted(artifacts.glob("lab-results-*.json")):
        merged.update(json.loads(path.read_text()))
    (artifacts / "lab-results.json").write_text(json.dumps(merged, indent=1) + "\n")


def test_tools_stopped_by_sigterm_or_ctrl_c_leave_nothing_attached(results: Results) -> None:
    pc.verify_tools_stopped_by_sigterm_or_ctrl_c_leave_nothing_attached(results)


@pytest.mark.parametrize("mount", ["nfs3", "nfs42"])
def test_nfsdist_counts_match_the_workload(results: Results, mount: str) -> None:
    pc.verify_nfsdist_counts_match_the_workload(results, mount)


@pytest.mark.parametrize("mount", ["nfs3", "nfs42"])
def test_metadata_operations_are_counted(results: Results, mount: str) -> None:
    pc.verify_metadata_operations_are_counted(results, mount)


def test_nfsslower_reports_injected_latency(results: Results) -> None:
    pc.verify_nfsslower_reports_injected_latency(results)


def test_nfsdist_histogram_moves_with_delay(results: Results) -> None:
    pc.verify_nfsdist_histogram_moves_with_delay(results)


@on_kernels("v3only")  # a pair's fault run checks its v3-only client
def test_nfstop_shows_the_workload_process(results: Results) -> None:
    pc.verify_nfstop_shows_the_workload_process(results)


@on_kernels("v3only")  # a pair's fault run checks its v3-only client
def test_every_command_runs_without_nfsv4(results: Results) -> None:
    pc.verify_every_command_runs_without_nfsv4(results)


@on_kernels("v3only")  # a pair's fault run checks its v3-only client
def test_late_nfsv4_is_traced_by_the_running_tools(results: Results) -> None:
    pc.verify_late_nfsv4_is_traced_by_the_running_tools(results)


@guest_run("probes identity", fixture="identity")
def run_identity(kernel_lab: Any) -> Results:
    share = getattr(kernel_lab.lab, "guest_project_dir", "/opt/probekit")
    res = kernel_lab.lab.run(f"cd {share} && python3 {GUEST_SCRIPTS['probes']} identity", timeout=1200)
    assert res.exit_code == 0, f"identity: exit {res.exit_code}: {res.stderr[-2000:]}"
    out = {"identity": json.loads(res.stdout.strip().splitlines()[-1])}
    kernel_lab.artifacts.mkdir(parents=True, exist_ok=True)
    (kernel_lab.artifacts / "guest-identity.json").write_text(json.dumps(out, indent=1) + "\n")
    return out


@pytest.fixture
def identity(kernel_lab: Any) -> Results:
    return once_run(kernel_lab, "probes identity")


@on_kernels("identity")  # module BTF (5.10 has none: kprobe-timed operations there cannot tell their mount)
@pytest.mark.parametrize("verify", pc.IDENTITY_CHECKS, ids=lambda f: f.__name__[len("verify_"):])
def test_identity_of_each_operation(identity: Results, verify: Any) -> None:
    verify(identity)


#: where nfsdist's two loaders are run into kretprobe misses (issue 34): trixie's bcc makes
#: its kretprobes in tracefs and its libbpf through BPF links, whose missed counts 6.12 gives
FORCED_MISS_KERNELS = ("6.12",)
forced_miss_kernels = pytest.mark.parametrize(
    "kernel_lab", [k for k in KERNELS if k in matrix().get("probes", ()) and k in FORCED_MISS_KERNELS],
    indirect=True, ids=lambda k: f"k{k}")


@guest_run("probes kmiss", fixture="forced_miss")
def run_forced_miss(kernel_lab: Any) -> Results:
    return {"kmiss": guest_script(kernel_lab, "probes kmiss", f"{GUEST_SCRIPTS['probes']} kmiss", timeout=900)}


@pytest.fixture
def forced_miss(kernel_lab: Any) -> Results:
    return once_run(kernel_lab, "probes kmiss")


@forced_miss_kernels
def test_a_forced_kretprobe_miss_is_reported(forced_miss: Results) -> None:
    pc.verify_a_forced_kretprobe_miss_is_reported(forced_miss)


def test_both_tools_pick_the_same_candidates(results: Results) -> None:
    pc.verify_both_tools_pick_the_same_candidates(results)


def test_fentry_where_the_loader_and_btf_allow(results: Results) -> None:
    pc.verify_fentry_where_the_loader_and_btf_allow(results)


def test_auto_picks_the_loader_and_bcc_counts_the_same(results: Results) -> None:
    pc.verify_auto_picks_the_loader_and_bcc_counts_the_same(results)


def static_kernel(lab: Lab, release: str, functions: Any, modules: List[str]) -> Any:
    """The booted kernel's Debian package (exact ABI, cached under ~/.cache/probekit), else a
    `discover snapshot` profile taken in the guest, said as such (the package could not be had)."""
    from probes.compat import load_kernel, short_label
    from probes.fetch import fetch_kernel
    try:
        return load_kernel(str(fetch_kernel(short_label(release))), functions, modules)
    except UserError as exc:
        say(f"[probes lab] no Debian package for {release} ({exc}): using a discover snapshot of the guest")
    guest = f"/tmp/profile-{release}.json"
    res = lab.run(f"cd /opt/probekit && python3 -m discover snapshot -o {guest} "
                  + " ".join(f"--btf-module {m}" for m in modules), timeout=900)
    assert res.exit_code == 0, res.stderr[-1000:]
    local = Path(f"/tmp/probes-lab-profile-{release}.json")
    lab.get(guest, local)
    return load_kernel(str(local), functions, modules)


@guest_run("static nfs", fixture="static_report")
def run_static_report(kernel_lab: Any) -> Dict[str, Any]:
    """probes compat (the same code as the command) for this kernel, with this run's lab results:
    computed while the guest is up, which static_kernel falls back to."""
    from probes.compat import build_report, render, spec_attach_points, spec_functions
    from probes.runtime import DEFAULT_SPEC
    from discover.spec import load_spec
    main = data(once_run(kernel_lab, "probes"), "main")
    lab_results = main["lab_results"]
    release = main["kernel"]["release"]
    assert list(lab_results) == [release]
    assert all(run["ok"] for run in lab_results[release].values()), lab_results
    spec = load_spec(DEFAULT_SPEC)
    modules = sorted({p.module for p in spec_attach_points(spec) if p.module and p.module != "vmlinux"})
    kernel = static_kernel(kernel_lab.lab, release, spec_functions(spec), modules)
    report = build_report(spec, [kernel], kernel, str(DEFAULT_SPEC), lab_results)
    (kernel_lab.artifacts / f"compat-{kernel.label}.txt").write_text(render(report, "table"))
    return {"spec": spec, "label": kernel.label, "report": report, "table": render(report, "table")}


@pytest.fixture
def static_report(kernel_lab: Any) -> Dict[str, Any]:
    return once_run(kernel_lab, "static nfs")


def test_static_report_agrees_with_the_lab(static_report: Dict[str, Any]) -> None:
    from probes.compat import disagreements
    report, spec = static_report["report"], static_report["spec"]
    assert disagreements(report) == []
    assert report["lab"] == {static_report["label"]: {op: "verified" for op in spec["ops"]}}
    assert static_report["table"].count("lab-verified") == len(spec["ops"])

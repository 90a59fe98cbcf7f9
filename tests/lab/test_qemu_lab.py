"""Lab tests: `labs test`'s integration checks on Debian's 6.1 kernel, checked end to end.

Runs the integration checks once in the shared 6.1 guest (tests/lab/conftest.py, booted
once for every lab test of that kernel) and asserts on what really came back from the
guest: the report, the call graphs, the tracefs metadata and the interrupt checks. Needs
root (image build, QEMU); runs in CI.
"""
from __future__ import annotations

import json

import pytest
from conftest import guest_run, on_kernels, once_run, say

from labs.integration import CALLGRAPH_TARGETS, Report, run_integration

#: discovery is kernel-neutral code: one kernel proves the checks (the probe checks run on all)
pytestmark = [pytest.mark.lab, on_kernels("integration")]


@guest_run("integration", fixture="report")
def _integration(kernel_lab) -> Report:  # type: ignore[no-untyped-def]
    return run_integration(kernel_lab.lab, kernel_lab.artifacts, progress=say,
                           already_up=True)


@pytest.fixture
def report(kernel_lab) -> Report:  # type: ignore[no-untyped-def]
    return once_run(kernel_lab, "integration")


def check(report: Report, name: str) -> str:
    found = [c for c in report.checks if c.name == name]
    assert found, f"check {name!r} did not run; ran: {[c.name for c in report.checks]}"
    assert found[0].passed, f"{name}: {found[0].detail}"
    return found[0].detail


def test_lab_boots_a_debian_6_1_kernel(report: Report) -> None:
    check(report, "lab up (boot, NFS export and mounts)")
    assert report.kernel_release.startswith("6.1.") and report.kernel_release.endswith("-amd64")


def test_nfs_v3_and_v42_are_mounted(report: Report) -> None:
    assert check(report, "NFSv3 and NFSv4.2 mounted") == "nfs3 vers=3, nfs42 vers=4.2"
    mounts = (report.run_dir / "tracefs" / "proc-mounts-nfs.txt").read_text()
    assert "/mnt/nfs3 nfs " in mounts and "vers=3" in mounts
    assert "/mnt/nfs42 nfs4 " in mounts and "vers=4.2" in mounts


def test_workload_runs_on_both_mounts(report: Report) -> None:
    check(report, "known workload on both mounts")


def test_tracefs_metadata_is_copied_out(report: Report) -> None:
    check(report, "tracefs metadata")
    tracefs = report.run_dir / "tracefs"
    functions = (tracefs / "available_filter_functions.nfs.txt").read_text().split("\n")
    names = {line.split()[0] for line in functions if line}
    assert {"nfs_file_read", "nfs_file_write", "nfs_getattr"} <= names
    assert "function_graph" in (tracefs / "available_tracers.txt").read_text().split()
    assert (tracefs / "uname-r.txt").read_text().strip() == report.kernel_release
    assert "nfsv4" in (tracefs / "lsmod.txt").read_text()
    fmt = (tracefs / "events" / "nfs" / "nfs_getattr_enter" / "format").read_text()
    assert fmt.startswith("name: nfs_getattr_enter")


@pytest.mark.parametrize("function", [target[0] for target in CALLGRAPH_TARGETS])
def test_discover_callgraph_in_the_guest(report: Report, function: str) -> None:
    check(report, f"discover callgraph {function}")
    graphs = {path.stem: path for path in (report.run_dir / "callgraph").glob("*.json")}
    name = function if function in graphs else "nfs_file_open"
    graph = json.loads(graphs[name].read_text())
    # the traced function is the only real root; anything else at the top is interrupt work or a
    # call cut at the trace's start or end (both happen in real captures, both are marked)
    nodes = {node["id"]: node for node in graph["nodes"]}
    assert name in graph["graph"]["roots"]
    assert all(nodes[root]["irq"] or nodes[root]["cut_start"] or nodes[root]["cut_end"]
               for root in graph["graph"]["roots"] if root != name)
    links = [link for link in graph["links"] if link["source"] == name]
    calls = [link for link in links if link["kind"] == "call"]
    assert calls and all(link["calls"] >= 1 for link in calls)
    # interrupt work that landed inside is kept apart, counted as irq calls
    assert all(link["irq_calls"] >= 1 for link in links if link["kind"] == "interrupt")


@pytest.mark.parametrize("sig", ["INT", "TERM"])
def test_killing_discover_mid_capture_restores_tracefs(report: Report, sig: str) -> None:
    check(report, f"SIG{sig} mid-capture restores tracefs")
    result = json.loads((report.run_dir / "interrupt" / f"{sig}.json").read_text())
    assert result["was_capturing"] and result["during"]["current_tracer"].strip() == "function_graph"
    assert result["before"] == result["after"]
    assert result["before"]["current_tracer"].strip() == "nop"


def test_report_is_written(report: Report) -> None:
    data = json.loads((report.run_dir / "report.json").read_text())
    assert data["kernel_release"] == report.kernel_release
    assert data["passed"] == report.passed
    assert "boot" in data["timings"] and "total" in data["timings"]
    assert (report.run_dir / "report.txt").read_text().startswith("labs test: qemu")

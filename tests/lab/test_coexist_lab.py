"""Lab test: `discover callgraph nfs_file_read` while `trace-cmd record -p function` runs.

labs/checks/coexist/guest.py in the guest (see its docstring) prints one JSON document.
On 6.11 and later (function_graph runs in instances there) discover captures in its
private instance beside trace-cmd: both see the workload's calls, nothing of trace-cmd's
settings changes, the instance and a stale one a killed run left are gone, and a second
discover is refused in one line (the graph filters are global). Before 6.11 the old path:
discover refuses the busy tracer in one line, then captures on the global tracer alone
(trace-cmd then saw no call: the workload runs inside discover).
Measured by hand (labs run, TCG, 1 vCPU): 7.3 120 s, 6.12 99 s, 6.1 149 s.
Uses the shared per-kernel guest of tests/lab/conftest.py (one boot per kernel); CI runs it on
6.1 and 6.12, one kernel of each path.
"""
from __future__ import annotations

import json
from typing import Any, Dict

import pytest
from conftest import guest_run, on_kernels, once_run

from labs.checks.shared import GUEST_SCRIPTS

pytestmark = [pytest.mark.lab, on_kernels("coexist")]


def instances_for_function_graph(release: str) -> bool:
    """function_graph in a private instance: Linux 6.11 and later (discover's own test)."""
    major, minor = (int(part) for part in release.split(".")[:2])
    return (major, minor) >= (6, 11)


@guest_run("coexist", fixture="coexist")
def _run(kernel_lab: Any) -> Dict[str, Any]:
    share = getattr(kernel_lab.lab, "guest_project_dir", "/opt/probekit")
    result = kernel_lab.lab.run(f"cd {share} && python3 {GUEST_SCRIPTS['coexist']} nfs_file_read /mnt/nfs3",
                                timeout=900)
    assert result.exit_code == 0, result.stderr[-600:]
    kernel_lab.artifacts.mkdir(parents=True, exist_ok=True)
    (kernel_lab.artifacts / "coexist.json").write_text(result.stdout)
    return json.loads(result.stdout)


@pytest.fixture
def coexist(kernel_lab: Any) -> Dict[str, Any]:
    return once_run(kernel_lab, "coexist")


def test_trace_cmd_recorded_and_settings_left_as_found(kernel_lab: Any, coexist: Dict[str, Any]) -> None:
    tracecmd = coexist["tracecmd"]
    assert tracecmd["recording"] and tracecmd["exit_code"] == 0, tracecmd["tail"]
    assert coexist["untouched"], f"discover changed {coexist['changed_by_discover']}"
    assert coexist["stale_removed"]
    assert coexist["instances_after"] == []


def test_discover_beside_trace_cmd(kernel_lab: Any, coexist: Dict[str, Any]) -> None:
    first = coexist["discover"]
    if instances_for_function_graph(kernel_lab.release):
        assert first["exit_code"] == 0, first["stderr"]
        assert first["calls"] > 0
        # trace-cmd's function tracer saw every call discover's graph counted
        assert coexist["tracecmd"]["calls"] >= first["calls"]
        assert first["samples"] and all(s["global_tracer"] == "function" and
                                        any(i.startswith("probekit-") for i in s["instances"])
                                        for s in first["samples"])
        second = first["second"]
        assert second["exit_code"] == 1
        assert second["stderr"].startswith("discover: error: function_graph is already running in instance "
                                           "probekit-") and second["stderr"].count("\n") == 1
    else:
        assert first["exit_code"] == 1
        assert first["stderr"] == ("discover: error: ftrace is in use (current_tracer is function): stop the "
                                   "other tracer, or use --force to take over and restore it after\n")
        alone = coexist["alone"]
        assert alone["exit_code"] == 0 and alone["calls"] > 0, alone["stderr"]
        assert alone["samples"] and all(s["global_tracer"] == "function_graph" for s in alone["samples"])

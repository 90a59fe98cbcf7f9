"""Guest side of the coexistence check: `discover callgraph` while trace-cmd records.

Runs inside a lab guest as root from /opt/probekit (Python 3.9+, stdlib only; the
discover it runs is the share's). Prints one JSON object. Steps:

1. `trace-cmd record -p function -l 'nfs_*'` starts on the global buffer (the filter
   keeps the function tracer affordable under TCG); snapshot A of tracefs once it runs.
2. A stale instance is made as a killed run would leave it (instances/probekit-<a PID
   that is not running>).
3. `discover callgraph FUNCTION --workload 'workload.sh read MOUNT'` runs; while it
   captures, the global tracer and the instance list are sampled, and a second
   discover (another function) is started to see what it does.
4. Snapshot B once discover ended, trace-cmd still recording: B must equal A (nothing
   of trace-cmd's changed, the stale and our own instance gone).
5. trace-cmd is stopped and its report counted; when discover refused to share (the
   global path, before 6.11) discover runs once more alone to show that path works.

Usage: coexist_check.py FUNCTION MOUNT
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List

from kill_check import TRACEFS, graph_tracer_on, tracefs_state

SHARE = "/opt/probekit"
WORKLOAD = f"{SHARE}/labs/guest/workload.sh"


def read(name: str) -> str:
    try:
        with open(os.path.join(TRACEFS, name)) as handle:
            return handle.read().strip()
    except OSError:
        return ""


def instances() -> List[str]:
    return sorted(os.listdir(os.path.join(TRACEFS, "instances")))


def dead_pid() -> int:
    pid = 4194303
    while os.path.exists(f"/proc/{pid}"):
        pid -= 1
    return pid


def discover(args: List[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "discover", "callgraph", *args], cwd=SHARE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def calls_of(path: str, function: str) -> int:
    try:
        with open(path) as handle:
            graph = json.load(handle)
    except (OSError, ValueError):
        return 0
    return sum(node["calls"] for node in graph["nodes"] if node["id"] == function)


def wait_for(test: Any, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if test():
            return True
        time.sleep(0.2)
    return False


def run_discover(function: str, mount: str, output: str, second: str) -> Dict[str, Any]:
    """discover with the workload; samples taken while it captures; the second discover's outcome."""
    # the sleep keeps the capture open while the second discover starts (seconds under TCG)
    proc = discover([function, "--workload", f"sh {WORKLOAD} read {mount}; sleep 20", "--format", "json",
                     "-o", output])
    samples: List[Dict[str, Any]] = []
    second_result: Dict[str, Any] = {}
    while proc.poll() is None:
        if graph_tracer_on():
            samples.append({"global_tracer": read("current_tracer"), "instances": instances()})
            if not second_result:
                other = discover([second, "--duration", "2", "--format", "json", "-o", "/tmp/coexist2.json"])
                out, err = other.communicate(timeout=300)
                second_result = {"exit_code": other.returncode, "stderr": err[-600:]}
        time.sleep(0.3)
    out, err = proc.communicate()
    return {"exit_code": proc.returncode, "stderr": err[-1500:], "calls": calls_of(output, function),
            "samples": samples[:20], "second": second_result}


def main(function: str, mount: str) -> None:
    started = time.monotonic()
    subprocess.run(["sh", WORKLOAD, "prepare", mount], check=True)
    initial = tracefs_state()
    tracecmd = subprocess.Popen(["trace-cmd", "record", "-p", "function", "-l", "nfs_*", "-o", "/tmp/coexist.dat"],
                                cwd="/tmp", stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    recording = wait_for(lambda: read("current_tracer") == "function" and read("tracing_on") == "1", 180)
    time.sleep(1.0)
    with_tracecmd = tracefs_state()
    stale = os.path.join(TRACEFS, "instances", f"probekit-{dead_pid()}")
    os.mkdir(stale)
    first = run_discover(function, mount, "/tmp/coexist.json", "nfs_getattr")
    after_discover = tracefs_state()
    tracecmd.send_signal(signal.SIGINT)
    try:
        tc_out, _ = tracecmd.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        tracecmd.kill()
        tc_out, _ = tracecmd.communicate()
    report = subprocess.run(["trace-cmd", "report", "-i", "/tmp/coexist.dat"], capture_output=True, text=True)
    tc_calls = sum(1 for line in report.stdout.splitlines()
                   if "function:" in line and line.split("function:", 1)[1].split()[:1] == [function])
    alone: Dict[str, Any] = {}
    if first["exit_code"] != 0:
        alone = run_discover(function, mount, "/tmp/coexist-alone.json", "nfs_getattr")
    final = tracefs_state()
    print(json.dumps({
        "kernel": os.uname().release, "function": function,
        "tracecmd": {"recording": recording, "exit_code": tracecmd.returncode, "calls": tc_calls,
                     "tail": tc_out[-600:]},
        "discover": first, "alone": alone,
        "stale_removed": not os.path.exists(stale),
        "untouched": with_tracecmd == after_discover,
        "changed_by_discover": sorted(k for k in set(with_tracecmd) | set(after_discover)
                                      if with_tracecmd.get(k) != after_discover.get(k)),
        "restored": initial == final,
        "changed_overall": sorted(k for k in set(initial) | set(final) if initial.get(k) != final.get(k)),
        "instances_after": instances(),
        "seconds": round(time.monotonic() - started, 1),
    }, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:3])

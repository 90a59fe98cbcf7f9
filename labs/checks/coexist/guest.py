"""Guest side of the coexistence check: `discover callgraph` while trace-cmd records.

Runs inside a lab guest as root from /opt/probekit (Python 3.9+, stdlib only; the
discover it runs is the share's). Prints one JSON object. Steps:

1. `trace-cmd record -p function -l 'nfs_*'` starts on the global buffer (the filter
   keeps the function tracer affordable under TCG); snapshot A of tracefs once trace-cmd
   says it records ("Hit Ctrl^C to stop recording", printed after it turned tracing on).
2. A stale instance is made as a killed run would leave it (instances/probekit-<a PID
   that is not running>).
3. `discover callgraph FUNCTION --workload 'workload.sh read MOUNT; <wait>'` runs; while it
   captures, the global tracer and the instance list are sampled, and a second
   discover (another function) is started to see what it does. The workload then waits
   for a marker file written once the second discover has ended (not for a fixed time: on
   a loaded host a 20 s window closed before the second discover ran), up to
   SECOND_WAIT_S, after which the JSON says the second discover never ended.
4. Snapshot B once discover ended, trace-cmd still recording: B must equal A (nothing
   of trace-cmd's changed, the stale and our own instance gone).
5. trace-cmd is stopped and its report counted; when discover refused to share (the
   global path, before 6.11) discover runs once more alone to show that path works.

Usage: python3 labs/checks/coexist/guest.py FUNCTION MOUNT
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List

# run as a script (python3 PATH in the guest): its project tree is not on sys.path by itself
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
from labs.checks.interrupt.guest import TRACEFS, capturing_place, tracefs_state  # noqa: E402
from labs.checks.shared import PROJECT, guest_path  # noqa: E402

WORKLOAD = guest_path("workload")
#: written once the second discover has ended; the first one's workload waits for it
SECOND_DONE = "/tmp/coexist-second.done"
#: upper bound of that wait (and of every wait here): its expiry is reported, never judged
SECOND_WAIT_S = 600
TRACECMD_LOG = "/tmp/coexist-trace-cmd.log"
#: what trace-cmd record prints once tracing is on and its recorders run
TRACECMD_RECORDING = "Hit Ctrl^C to stop recording"


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
    return subprocess.Popen([sys.executable, "-m", "discover", "callgraph", *args], cwd=PROJECT,
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


def until_second_done(bound_s: int) -> str:
    """sh that waits for SECOND_DONE, polling 5 times a second, at most bound_s."""
    return (f"i=0; while [ ! -e {SECOND_DONE} ] && [ $i -lt {bound_s * 5} ]; do sleep 0.2; i=$((i + 1)); done; "
            f"[ -e {SECOND_DONE} ] || echo 'coexist: the second discover never ended' >&2")


def run_discover(function: str, mount: str, output: str, second: str) -> Dict[str, Any]:
    """discover with the workload; samples taken while it captures; the second discover's outcome.

    The workload keeps the capture open until the second discover has ended (SECOND_DONE),
    so the second one provably starts while the first captures."""
    if os.path.exists(SECOND_DONE):
        os.unlink(SECOND_DONE)
    proc = discover([function, "--workload", f"sh {WORKLOAD} read {mount}; {until_second_done(SECOND_WAIT_S)}",
                     "--format", "json", "-o", output])
    samples: List[Dict[str, Any]] = []
    second_result: Dict[str, Any] = {"exit_code": None,
                                     "stderr": "the second discover never started: function_graph was not seen "
                                               "on while the first discover ran"}
    started_second = False
    try:
        while proc.poll() is None:
            if capturing_place():
                samples.append({"global_tracer": read("current_tracer"), "instances": instances()})
                if not started_second:
                    started_second = True
                    other = discover([second, "--duration", "2", "--format", "json", "-o", "/tmp/coexist2.json"])
                    try:
                        _, err = other.communicate(timeout=SECOND_WAIT_S)
                        second_result = {"exit_code": other.returncode, "stderr": err[-600:]}
                    except subprocess.TimeoutExpired:
                        other.kill()
                        other.communicate()
                        second_result = {"exit_code": None,
                                         "stderr": f"the second discover never ended (killed after {SECOND_WAIT_S} s)"}
                    with open(SECOND_DONE, "w"):
                        pass
            time.sleep(0.3)
    finally:
        with open(SECOND_DONE, "w"):
            pass  # whatever happened, the first discover's workload may end
    out, err = proc.communicate()
    return {"exit_code": proc.returncode, "stderr": err[-1500:], "calls": calls_of(output, function),
            "samples": samples[:20], "second": second_result}


def tracecmd_says_recording() -> bool:
    try:
        with open(TRACECMD_LOG) as handle:
            return TRACECMD_RECORDING in handle.read()
    except OSError:
        return False


def main(function: str, mount: str) -> None:
    started = time.monotonic()
    subprocess.run(["sh", WORKLOAD, "prepare", mount], check=True)
    initial = tracefs_state()
    # stdbuf: trace-cmd's stdout is a file here, line-buffered so that its "recording" line shows at once
    tracecmd = subprocess.Popen(["stdbuf", "-oL", "trace-cmd", "record", "-p", "function", "-l", "nfs_*",
                                 "-o", "/tmp/coexist.dat"],
                                cwd="/tmp", stdout=open(TRACECMD_LOG, "w"), stderr=subprocess.STDOUT, text=True)
    recording = wait_for(lambda: tracecmd_says_recording() or tracecmd.poll() is not None, SECOND_WAIT_S) and \
        tracecmd_says_recording() and read("current_tracer") == "function" and read("tracing_on") == "1"
    with_tracecmd = tracefs_state()
    stale = os.path.join(TRACEFS, "instances", f"probekit-{dead_pid()}")
    os.mkdir(stale)
    first = run_discover(function, mount, "/tmp/coexist.json", "nfs_getattr")
    after_discover = tracefs_state()
    tracecmd.send_signal(signal.SIGINT)
    try:
        tracecmd.wait(timeout=SECOND_WAIT_S)
    except subprocess.TimeoutExpired:
        tracecmd.kill()
        tracecmd.wait()
    with open(TRACECMD_LOG) as handle:
        tc_out = handle.read()
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

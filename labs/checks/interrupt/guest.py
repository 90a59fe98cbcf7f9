"""Guest side of the interrupt check: kill `discover` mid-capture, prove tracefs is restored.

Runs inside a lab guest as root (Python 3.9+, stdlib only). Prints one JSON object:
the tracefs state before, during (function_graph on) and after, the signal sent and
discover's exit code. The signal is delivered to discover itself with default
dispositions, as a terminal's Ctrl-C or a service manager's stop would deliver it.
Usage: python3 labs/checks/interrupt/guest.py SIGNAL FUNCTION WORKLOAD  (SIGNAL: INT, TERM or HUP)
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Dict

TRACEFS = "/sys/kernel/tracing"
#: every tracefs file a capture may change
STATE_FILES = [
    "current_tracer", "tracing_on", "trace_options", "set_graph_function", "set_graph_notrace",
    "set_ftrace_filter", "set_ftrace_notrace", "set_ftrace_pid", "set_event", "set_event_pid",
    "buffer_size_kb", "max_graph_depth", "tracing_thresh", "tracing_cpumask", "trace_clock",
    "kprobe_events", "uprobe_events",
]


def tracefs_state() -> Dict[str, str]:
    """The content of every state file (absent ones left out), plus the instance names."""
    state: Dict[str, str] = {}
    for name in STATE_FILES:
        try:
            with open(os.path.join(TRACEFS, name)) as handle:
                state[name] = handle.read()
        except OSError:
            pass
    state["instances/"] = " ".join(sorted(os.listdir(os.path.join(TRACEFS, "instances"))))
    return state


def capturing_place() -> str:
    """Where function_graph runs with tracing on: globally (before 6.11) or in discover's own
    instance (instances/probekit-PID, 6.11 and later); '' while nowhere."""
    places = [TRACEFS] + [os.path.join(TRACEFS, "instances", name)
                          for name in os.listdir(os.path.join(TRACEFS, "instances")) if name.startswith("probekit-")]
    for place in places:
        try:
            with open(os.path.join(place, "current_tracer")) as t, open(os.path.join(place, "tracing_on")) as o:
                if t.read().strip() == "function_graph" and o.read().strip() == "1":
                    return place
        except OSError:
            continue
    return ""


def traced_entries(place: str) -> int:
    """Events in the place's ring buffer, every CPU: above 0 once the workload reached the function."""
    total = 0
    for cpu in os.listdir(os.path.join(place, "per_cpu")):
        try:
            with open(os.path.join(place, "per_cpu", cpu, "stats")) as stats:
                total += sum(int(line.split()[1]) for line in stats if line.startswith("entries:"))
        except (OSError, ValueError, IndexError):
            continue
    return total


def main(sig_name: str, function: str, workload: str) -> None:
    sig = getattr(signal, "SIG" + sig_name)
    before = tracefs_state()
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "discover", "callgraph", function, "--workload", workload,
         "--format", "json", "-o", "/tmp/kill_check.json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL) for s in (signal.SIGINT, signal.SIGTERM)])
    during: Dict[str, str] = {}
    entries = 0
    # the signal goes once the capture has recorded calls of the function: mid-capture by evidence
    # (the workload runs for minutes), however slow the guest; 300 s is only a hang bound
    while time.monotonic() - started < 300 and proc.poll() is None:
        place = capturing_place()
        if place and not during:
            during = tracefs_state()
        if place:
            entries = traced_entries(place)
            if entries:
                break
        time.sleep(0.3)
    proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    after = tracefs_state()
    print(json.dumps({
        "signal": sig_name, "function": function, "exit_code": proc.returncode,
        "was_capturing": bool(during), "entries_at_signal": entries, "restored": before == after,
        "changed": sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k)),
        "before": before, "during": during, "after": after,
        "seconds": round(time.monotonic() - started, 1),
        "stdout_tail": out[-1500:], "stderr_tail": err[-1500:],
    }, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:4])

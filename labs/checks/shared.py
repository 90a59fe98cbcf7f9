"""What both sides of a lab check need: the host, which runs the guest scripts and judges the JSON
they print, and the guest scripts themselves, which a guest's python3 runs from the project share.

Why one module: a host verdict that imported a guest script would import all of it (its tools,
its workloads, its sys.path set-up) for one constant; here are only the names both sides read,
the path of every guest script, and the formats of what the tools print that both parse.
Stdlib only, Python 3.9 (Debian 11's guest). tests/test_layering.py holds labs to it.
"""
from __future__ import annotations

import os
import re
import time
from typing import Any, Dict

#: the project tree this module is in: the source share in a guest, the checkout on the host
PROJECT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: every script the host runs in a guest, and what the guest scripts run of each other's,
#: by name: its path in the project tree (the guest's share, /opt/probekit)
GUEST_SCRIPTS = {
    "probes": "labs/checks/probes/guest.py",
    "faults": "labs/checks/faults/guest.py",
    "fs": "labs/checks/fs/guest.py",
    "exporter": "labs/checks/exporter/guest.py",
    "nfsdtop": "labs/checks/nfsdtop/guest.py",
    "nollvm": "labs/checks/nollvm/guest.py",
    "fleet": "labs/checks/fleet/guest.py",
    "coexist": "labs/checks/coexist/guest.py",
    "interrupt": "labs/checks/interrupt/guest.py",
    "smoke": "labs/checks/smoke/guest.py",
    "workload": "labs/checks/workload.sh",
    "smb_share": "labs/checks/fs/smb_share.sh",
}


def guest_path(name: str) -> str:
    """A guest script's absolute path where this module runs (for a guest script that runs another)."""
    return os.path.join(PROJECT, GUEST_SCRIPTS[name])


#: metadata ops the probes guest's metadata() issues an exact number of times, whatever the
#: dentry cache holds; lookup, access and readdir (cache-dependent) happen at least once
META_EXACT = ("mkdir", "rmdir", "unlink", "rename", "link", "symlink", "setattr")
META_SOME = ("lookup", "access", "readdir")

#: runs recorded before phases kept their "flushed" evidence: how late after a phase's end a
#: tool printed the interval that held its last operations (1.7 s and 1.8 s seen on a loaded
#: 7.3 pair client); new runs wait for the evidence instead (the probes guest's wait_flushed)
INTERVAL_LATE_S = 3.0


def wall(ts: str) -> float:
    """A tool's interval stamp (local wall second) as epoch seconds."""
    return time.mktime(time.strptime(ts, "%Y-%m-%d %H:%M:%S"))


def interval_in(ts: str, phase: Dict[str, Any]) -> bool:
    """Did a tool's interval stamped `ts` fall inside the phase? An interval is stamped when it is
    printed, after its counts were read, so one stamped before start - 1 holds none of the phase;
    every interval holding the phase's operations was printed by phase["flushed"] (wait_flushed),
    or, in runs recorded before that evidence was kept, by end + INTERVAL_LATE_S."""
    last = phase["flushed"] if "flushed" in phase else phase["end"] + INTERVAL_LATE_S
    return phase["start"] - 1 <= wall(ts) <= last


def attach_kinds(stderr: str) -> Dict[str, Any]:
    """How a tool attached, from its --verbose lines: the loader (`backend: core (why)`), the
    `attach:` verdict, per operation each fentry candidate's function with `fentry/fexit`
    or `kprobes (why)`, and on core how the fentry targets were given (`fentry targets:`)."""
    found: Dict[str, Any] = {"backend": None, "backend_why": None, "attach": None, "functions": {}, "targets": []}
    for line in stderr.splitlines():
        match = re.match(r"^\S+: backend: (\w+) \((.*)\)$", line)
        if match:
            found["backend"], found["backend_why"] = match.group(1), match.group(2)
        match = re.match(r"^\S+: attach: (.*)$", line)
        if match:
            found["attach"] = match.group(1)
        match = re.match(r"^\S+: fentry targets: (.*)$", line)
        if match:
            found["targets"].append(match.group(1))
        match = re.match(r"^\S+: (\w+): (\w+): (fentry/fexit|kprobes \(.*\))$", line)
        if match:
            found["functions"].setdefault(match.group(1), {})[match.group(2)] = match.group(3)
    return found

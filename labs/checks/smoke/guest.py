"""Guest side of the Vagrant smoke: one nfsdist around the known workload on the NFSv3 mount.

The Vagrant path's one exact probe count (tests/lab/test_vagrant_pair.py): the probe checks
themselves run on the QEMU kernels. nfsdist (bcc's default operations) ends by SIGINT and
prints its totals then, so every operation the workload finished is in them, whatever the
guest's speed. Prints one JSON document: what was issued, what nfsdist counted and reported
missed, and the tracing programs before and after.

  python3 labs/checks/smoke/guest.py
"""
from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any, Dict

# run as a script (python3 PATH in the guest): its project tree is not on sys.path by itself
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
from labs.checks.probes.guest import (MOUNTS, json_lines, kernel_attachments, prepare, stop, tool,  # noqa: E402
                                      wait_ready, workload)


def smoke() -> Dict[str, Any]:
    log = "/tmp/nfsdist-smoke.out"
    prepare(MOUNTS["nfs3"], "smoke")
    before = kernel_attachments()
    proc = tool(["nfsdist", "--json"], log)
    wait_ready(proc, log)
    during = kernel_attachments()
    issued = workload(MOUNTS["nfs3"], "smoke")
    res = stop(proc, log, signal.SIGINT)
    totals = json_lines(res["lines"], "ops")
    return {"rc": res["rc"], "stderr": res["stderr"][-1500:], "issued": issued,
            "ops": totals[-1]["ops"] if totals else {}, "missed": totals[-1].get("missed", {}) if totals else {},
            "attached": {"before": before, "during": during, "after": kernel_attachments()}}


if __name__ == "__main__":
    try:
        print(json.dumps({"ok": True, "data": smoke()}))
    except Exception as exc:  # reported as data: the host test shows it
        print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}))
    sys.exit(0)

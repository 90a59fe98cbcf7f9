"""The fault run on a QEMU pair: the client runs labs/checks/faults/guest.py (one nfsslower,
nfsdist and nfstop each around five phases of a mixed workload); the host plays the faults the
guest cannot play itself: it stops the server's QEMU with SIGSTOP for PAUSE_S seconds and
resumes it with SIGCONT, and restarts nfs-server in the server guest. They talk through the
results share, which is the same directory in the guests and on the host.
"""
from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict

from labs.checks.shared import GUEST_SCRIPTS
from labs.vm.base import SERVER, CommandResult
from labs.vm.console import GuestFailure

#: the guest side: the workload under the tools, through the phases
SCRIPT = GUEST_SCRIPTS["faults"]
PAUSE_S = 30.0
Progress = Callable[[str], None]


def pause_server(lab: Any, seconds: float = PAUSE_S) -> Dict[str, Any]:
    """SIGSTOP the server guest's QEMU, wait, SIGCONT it (the guest's clock jumps, nothing else).

    Meanwhile a command is sent to the stopped guest: how long the lab takes to say that it
    does not answer, and what it says, is the "guest stops answering" check."""
    pid = lab.signal_node(SERVER, signal.SIGSTOP)
    started = time.monotonic()
    silent: Dict[str, Any] = {}
    try:
        try:
            lab.run("true", node=SERVER, timeout=seconds * 4)
            silent["message"] = None
        except GuestFailure as exc:
            silent["message"] = str(exc)
        silent["seconds"] = round(time.monotonic() - started, 1)
        time.sleep(max(0.0, seconds - (time.monotonic() - started)))
    finally:
        lab.signal_node(SERVER, signal.SIGCONT)
    return {"action": "SIGSTOP/SIGCONT", "qemu_pid": pid, "paused_s": round(time.monotonic() - started, 1),
            "silent": silent, "console_log": str(lab.console_log(lab.node_name(SERVER))),
            "kernel_release": lab.image.kernel_release}


def restart_server(lab: Any) -> Dict[str, Any]:
    started = time.monotonic()
    res: CommandResult = lab.run("systemctl restart nfs-server", node=SERVER, timeout=300)
    if res.exit_code != 0:
        raise AssertionError(f"systemctl restart nfs-server exited {res.exit_code}: {res.stderr.strip()[-200:]}")
    return {"action": "systemctl restart nfs-server", "seconds": round(time.monotonic() - started, 1)}


def run_faults(lab: Any, progress: Progress = print, timeout: float = 2400.0) -> Dict[str, Any]:
    """Run the fault phases: the guest script in the client, the host's actions when it asks.

    Returns the guest's JSON document ({"ok": ..., "data"/"error": ...}) with the host's
    notes per action under data["host"]."""
    if getattr(lab, "topology", "single") == "single":
        raise AssertionError("the fault checks need a server guest of its own (--topology pair or fleet)")
    signals = Path(lab.results_dir) / "faults"
    signals.mkdir(parents=True, exist_ok=True)
    for stale in signals.iterdir():
        stale.unlink()
    actions: Dict[str, Callable[[], Dict[str, Any]]] = {"pause": lambda: pause_server(lab),
                                                         "restart": lambda: restart_server(lab)}
    share = getattr(lab, "guest_project_dir", "/opt/probekit")
    box: Dict[str, Any] = {}

    def guest() -> None:
        try:
            box["result"] = lab.run(f"cd {share} && python3 {SCRIPT} run", timeout=timeout)
        except Exception as exc:  # handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=guest, daemon=True)
    thread.start()
    notes: Dict[str, Any] = {}
    while thread.is_alive():
        for name, act in actions.items():
            if name not in notes and (signals / f"{name}.request").exists():
                progress(f"[faults] {name}: {act.__doc__ or name} ...")
                try:
                    notes[name] = act()
                except AssertionError as exc:
                    notes[name] = {"error": str(exc)}
                progress(f"[faults] {name}: {notes[name]}")
                tmp = signals / f"{name}.done.tmp"
                tmp.write_text(json.dumps(notes[name]) + "\n")
                tmp.rename(signals / f"{name}.done")
        thread.join(0.2)
    if "error" in box:
        raise box["error"]
    res: CommandResult = box["result"]
    if res.exit_code != 0:
        raise AssertionError(f"{SCRIPT} exited {res.exit_code}: {res.stderr.strip()[-500:]}")
    found = json.loads(res.stdout.strip().splitlines()[-1])
    if found.get("ok"):
        found["data"]["host"] = notes
    return found

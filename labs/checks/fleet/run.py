"""The fleet run: the host drives labs/checks/fleet/guest.py in the three guests at once.

nfsdtop by client and nfs-exporter --nfsd on the server throughout; client-b reads lightly and
steadily, timing each read, under nfsdist and nfs-exporter, beside a Prometheus scraping the
three exporters with the shipped rules; client-a, under nfs-exporter and nfstop by cgroup, runs
parallel writers and readers in a scope unit in the `heavy` phase only, between `before` and
`after` (a `drain` phase, excluded, waits for its workers to stop), and reads as client-b does
in the `pause`, while the host keeps the server's QEMU stopped. The host paces the phases
through a file in the results share; labs.checks.fleet.verdicts judges what the guests bring back.
"""
from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Dict, List

from labs.checks.shared import GUEST_SCRIPTS
from labs.install import install_tools
from labs.vm.base import SERVER

#: the guest side, run in the three guests at once
SCRIPT = GUEST_SCRIPTS["fleet"]
#: seconds of the compared phases: each holds over ten nfsdtop intervals and a few hundred reads
#: (`heavy` lasts until Prometheus fires NFSNoisyClient for client-a, NOISY_WAIT_S at most)
PHASE_S = {"before": 30.0, "heavy": 45.0, "after": 30.0}
#: bound of every wait on a guest's marker (a tool's bcc compile on a loaded TCG host included)
MARKER_WAIT_S = 900.0
#: how long `heavy` may go on past PHASE_S for NFSNoisyClient to fire (its expression's rates
#: are over 5 minutes: the server's request rate over that window must pass the rule's floor)
NOISY_WAIT_S = 240.0
#: the longest the server stays stopped waiting for NFSOperationsStuck (past 20 s in flight):
#: under the clients' RPC timeout over TCP (60 s), so that no request is sent twice
PAUSE_MAX_S = 55.0
Progress = Callable[[str], None]


def _guest(lab: Any, node: str, args: str) -> Dict[str, Any]:
    """One role of the fleet guest script in a guest: the JSON document it printed last."""
    share = getattr(lab, "guest_project_dir", "/opt/probekit")
    res = lab.run(f"cd {share} && python3 {SCRIPT} {args}", node=node, timeout=2400)
    if res.exit_code != 0:
        raise AssertionError(f"{node}: {SCRIPT} {args}: exit {res.exit_code}: {res.stderr[-2000:]}")
    out: Dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def _detached(lab: Any, node: str, role: str, share: Path) -> Dict[str, Any]:
    """A role started in the background of its guest, its document then awaited in the results
    share: no command of the guest's agent is outstanding while the host stops its QEMU."""
    project = getattr(lab, "guest_project_dir", "/opt/probekit")
    log = f"/tmp/fleet-{role}.log"
    res = lab.run(f"cd {project} && (setsid python3 {SCRIPT} {role} --to /results/fleet/{role}.json "
                  f"</dev/null >{log} 2>&1 &)", node=node, timeout=120)
    if res.exit_code != 0:
        raise AssertionError(f"{node}: {SCRIPT} {role} did not start: {res.stderr[-2000:]}")
    done = share / f"{role}.json"
    deadline = time.monotonic() + 2400
    while not done.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{node}: no {done.name} from {SCRIPT} {role} after 2400 s")
        time.sleep(1)
    out: Dict[str, Any] = json.loads(done.read_text())
    return out


def _wait_marker(path: Path, runs: Dict[str, "Future[Dict[str, Any]]"], bound: float = MARKER_WAIT_S,
                 needed: bool = True) -> bool:
    """Until a guest leaves `path` in the results share; a guest role that ended first is why not.
    Past `bound`: an error if the marker is `needed`, else False (the verdicts say what is missing)."""
    deadline = time.monotonic() + bound
    while not path.exists():
        for name, run in runs.items():
            if run.done() and not path.exists():  # a role leaves its marker before it ends
                raise AssertionError(f"{name} ended before {path.name}: {run.result()}")
        if time.monotonic() > deadline:
            if needed:
                raise AssertionError(f"no {path.name} after {bound:.0f} s")
            return False
        time.sleep(0.5)
    return True


def _pause_server(lab: Any, share: Path, runs: Dict[str, "Future[Dict[str, Any]]"]) -> Dict[str, Any]:
    """The server's QEMU stopped (SIGSTOP) until Prometheus fires NFSOperationsStuck for both
    clients' mounts, PAUSE_MAX_S at most, then continued."""
    pid = lab.signal_node(SERVER, signal.SIGSTOP)
    stopped, mono = time.time(), time.monotonic()
    try:
        fired = _wait_marker(share / "stuck.fired", runs, PAUSE_MAX_S, needed=False)
    finally:
        lab.signal_node(SERVER, signal.SIGCONT)
    return {"qemu_pid": pid, "stopped": round(stopped, 3), "paused_s": round(time.monotonic() - mono, 1),
            "stuck_fired": fired}


def run_fleet(lab: Any, local_dir: Path, progress: Progress = print) -> Dict[str, Any]:
    """The fleet run: tools installed in the three guests, the files made, then the roles at once
    through the phases; the guests' documents, the host's phase times and the pause."""
    share = Path(lab.results_dir) / "fleet"
    share.mkdir(parents=True, exist_ok=True)
    for stale in share.iterdir():
        stale.unlink()
    phases: List[List[Any]] = []
    waits: Dict[str, Any] = {}

    def enter(name: str) -> None:
        (share / "phase.tmp").write_text(name + "\n")
        os.replace(share / "phase.tmp", share / "phase")
        phases.append([name, round(time.time(), 3)])
        progress(f"[fleet] phase {name}")

    enter("setup")
    server, (heavy_node, light_node) = lab.node_name(SERVER), lab.client_names()
    for node in (server, heavy_node, light_node):
        install_tools(lab, local_dir, node=node)
    prepared = {name: _guest(lab, node, f"prepare {name}") for node, name in ((light_node, "light"),
                                                                             (heavy_node, "heavy"))}
    error = ""
    with ThreadPoolExecutor(3) as pool:
        # the clients' tools first, nfsdtop on the server once they run: a tool's start is no request of the workload's
        runs = {"light": pool.submit(_guest, lab, light_node, "light"),
                "heavy": pool.submit(_guest, lab, heavy_node, "heavy")}
        try:
            _wait_marker(share / "light.tool", runs)
            _wait_marker(share / "heavy.tool", runs)
            runs["server"] = pool.submit(_detached, lab, server, "server", share)
            for marker in ("server.ready", "light.ready", "heavy.ready", "prom.ready"):
                _wait_marker(share / marker, runs)
            enter("before")
            time.sleep(PHASE_S["before"])
            enter("heavy")
            time.sleep(PHASE_S["heavy"])
            waits["noisy_fired"] = _wait_marker(share / "noisy.fired", runs, NOISY_WAIT_S, needed=False)
            enter("drain")
            _wait_marker(share / "heavy.done", runs)
            enter("after")
            time.sleep(PHASE_S["after"])
            enter("pause")
            _wait_marker(share / "heavy.reading", runs)  # client-b reads all along
            waits["pause"] = _pause_server(lab, share, runs)
            enter("resumed")
            _wait_marker(share / "light.resumed", runs)
            _wait_marker(share / "heavy.resumed", runs)
            enter("stop")
            for name in ("light", "heavy"):
                runs[name].result(timeout=MARKER_WAIT_S)
        except AssertionError as exc:  # a role failed: what the others brought back is kept all the same
            error = str(exc)
        finally:
            enter("end")
        found: Dict[str, Dict[str, Any]] = {}
        for name, run in runs.items():
            try:
                found[name] = run.result(timeout=MARKER_WAIT_S)
            except AssertionError as exc:  # its script exited non-zero: said as its document
                found[name] = {"check": f"fleet-{name}", "ok": False, "error": str(exc)}
    out = {"check": "fleet", "ok": not error and all(doc["ok"] for doc in list(found.values()) + list(prepared.values())),
           "data": dict(found, prepare=prepared, phases=phases, waits=waits,
                        nodes={"server": server, "heavy": heavy_node, "light": light_node})}
    return dict(out, error=error) if error else out

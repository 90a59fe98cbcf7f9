"""The fleet check: on a QEMU fleet (one server, client-a, client-b), client-a's load slows client-b.

The host drives labs/guest/fleet_guest.py in the three guests at once (run_fleet): nfsdtop by
client on the server throughout; client-b reads lightly and steadily, timing each read, under
nfsdist; client-a runs parallel writers and readers in the `heavy` phase only, between `before`
and `after` (a `drain` phase, excluded, waits for its workers to stop). The verdicts compare the
phases with each other, never with a fixed latency: client-b's high-quantile read latency is
higher in `heavy` than in `before` and in `after`, by its own timings and by nfsdist; nfsdtop
ranks client-a first while it runs and shows it nowhere else; and each client's NFSv3 requests
per procedure in nfsdtop are what its workload issued (its /proc/net/rpc/nfs differences), short
by no more than the requests nfsdtop reported it missed.
"""
from __future__ import annotations

import calendar
import json
import math
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Dict, List, Sequence, Tuple

from labs.base import SERVER
from labs.integration import install_tools
from probes.commands import proc_label

GUEST_SCRIPT = "labs/guest/fleet_guest.py"
#: seconds of the compared phases: each holds about 20 nfsdtop intervals and a few hundred reads
PHASE_S = {"before": 40.0, "heavy": 45.0, "after": 40.0}
#: the compared quantile of client-b's read latency
QUANTILE = 0.9
#: bound of every wait on a guest's marker (a tool's bcc compile on a loaded TCG host included)
MARKER_WAIT_S = 900.0
Progress = Callable[[str], None]


def _guest(lab: Any, node: str, args: str) -> Dict[str, Any]:
    """One fleet_guest.py role in a guest: the JSON document it printed last."""
    share = getattr(lab, "guest_project_dir", "/opt/probekit")
    res = lab.run(f"cd {share} && python3 {GUEST_SCRIPT} {args}", node=node, timeout=2400)
    if res.exit_code != 0:
        raise AssertionError(f"{node}: {GUEST_SCRIPT} {args}: exit {res.exit_code}: {res.stderr[-2000:]}")
    out: Dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def _wait_marker(path: Path, runs: Dict[str, "Future[Dict[str, Any]]"]) -> None:
    """Until a guest leaves `path` in the results share; a guest role that ended first is why not."""
    deadline = time.monotonic() + MARKER_WAIT_S
    while not path.exists():
        for name, run in runs.items():
            if run.done() and not path.exists():  # a role leaves its marker before it ends
                raise AssertionError(f"{name} ended before {path.name}: {run.result()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {path.name} after {MARKER_WAIT_S:.0f} s")
        time.sleep(0.5)


def run_fleet(lab: Any, local_dir: Path, progress: Progress = print) -> Dict[str, Any]:
    """The fleet run: tools installed on the server and client-b, the files made, then the three
    roles at once through the phases; the guests' documents and the host's phase times."""
    share = Path(lab.results_dir) / "fleet"
    share.mkdir(parents=True, exist_ok=True)
    for stale in share.iterdir():
        stale.unlink()
    phases: List[List[Any]] = []

    def enter(name: str) -> None:
        (share / "phase.tmp").write_text(name + "\n")
        os.replace(share / "phase.tmp", share / "phase")
        phases.append([name, round(time.time(), 3)])
        progress(f"[fleet] phase {name}")

    enter("setup")
    server, (heavy_node, light_node) = lab.node_name(SERVER), lab.client_names()
    for node in (server, light_node):
        install_tools(lab, local_dir, node=node)
    prepared = {name: _guest(lab, node, f"prepare {name}") for node, name in ((light_node, "light"),
                                                                             (heavy_node, "heavy"))}
    error = ""
    with ThreadPoolExecutor(3) as pool:
        # nfsdist on client-b first, nfsdtop on the server once it runs: a tool's start is no request of the workload's
        runs = {"light": pool.submit(_guest, lab, light_node, "light")}
        try:
            _wait_marker(share / "light.tool", runs)
            runs["server"] = pool.submit(_guest, lab, server, "server")
            _wait_marker(share / "server.ready", runs)
            runs["heavy"] = pool.submit(_guest, lab, heavy_node, "heavy")
            _wait_marker(share / "light.ready", runs)
            _wait_marker(share / "heavy.ready", runs)
            for name in ("before", "heavy"):
                enter(name)
                time.sleep(PHASE_S[name])
            enter("drain")
            _wait_marker(share / "heavy.done", runs)
            enter("after")
            time.sleep(PHASE_S["after"])
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
           "data": dict(found, prepare=prepared, phases=phases, nodes={"server": server, "heavy": heavy_node,
                                                                      "light": light_node})}
    return dict(out, error=error) if error else out


# -- what the verdicts read -------------------------------------------------------------------

def role(data: Dict[str, Any], name: str) -> Dict[str, Any]:
    doc = data[name]
    assert doc["ok"], f"{name}: {doc.get('error')}"
    return dict(doc["data"])


def span_of(seen: Sequence[Sequence[Any]], name: str) -> Tuple[float, float]:
    """When a guest saw a phase start and the next one start (its own clock)."""
    starts = [float(t) for phase, t in seen]
    index = [phase for phase, _ in seen].index(name)
    return starts[index], starts[index + 1] if index + 1 < len(starts) else math.inf


def wall(ts: str, gmtoff: int) -> float:
    """A tool's interval stamp (the guest's local time, to the second) as epoch seconds."""
    return calendar.timegm(time.strptime(ts, "%Y-%m-%d %H:%M:%S")) - gmtoff


def in_phase(record: Dict[str, Any], span: Tuple[float, float], length: float, gmtoff: int) -> bool:
    """Whether a tool's interval (stamped `ts` to the second when printed, `length` s long) lies
    wholly inside a phase's span."""
    end = wall(record["ts"], gmtoff)
    return span[0] <= end - length and end + 1 <= span[1]


def nfsdtop_intervals(server: Dict[str, Any]) -> List[Dict[str, Any]]:
    records = [json.loads(line) for line in server["nfsdtop"]["lines"] if line.startswith("{")]
    assert records and records[0] == {"tracing": ["rpc", "read", "write"], "by": "client"}, records[:1]
    return records[1:]


def nfsdist_intervals(light: Dict[str, Any]) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in light["nfsdist"]["lines"] if line.startswith("{") and '"ts"' in line]


def quantile(values: Sequence[float], q: float = QUANTILE) -> float:
    """The smallest value with at least q of them at or below it."""
    ordered = sorted(values)
    assert ordered, "no values"
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def bucket_quantile(buckets: Dict[int, int], q: float = QUANTILE) -> int:
    """The log2 bucket (its upper end, µs) that holds quantile q of a histogram's counts."""
    total = sum(buckets.values())
    assert total, "an empty histogram"
    seen = 0
    for end in sorted(buckets):
        seen += buckets[end]
        if seen >= q * total:
            return end
    raise AssertionError("unreachable")


def read_hist(light: Dict[str, Any], name: str) -> Dict[int, int]:
    """nfsdist's read histogram summed over the intervals wholly inside a phase (bucket end -> count)."""
    span = span_of(light["seen"], name)
    out: Dict[int, int] = {}
    for record in nfsdist_intervals(light):
        if in_phase(record, span, 1.0, light["gmtoff"]) and "read" in record["ops"]:
            for slot in record["ops"]["read"]["hist"]:
                out[slot["interval-end"]] = out.get(slot["interval-end"], 0) + slot["count"]
    return out


def per_client(server: Dict[str, Any]) -> Dict[str, Dict[str, int]]:
    """nfsdtop's NFSv3 requests per client address and procedure, summed over the whole run."""
    out: Dict[str, Dict[str, int]] = {}
    for record in nfsdtop_intervals(server):
        for pair in record["requests"]:
            label = proc_label(pair["program"], pair["version"], pair["proc"])
            if label.startswith("NFSv3 "):
                found = out.setdefault(pair["client"], {})
                found[label] = found.get(label, 0) + pair["count"]
    return out


# -- verdicts ---------------------------------------------------------------------------------

def verify_ran_and_detached(data: Dict[str, Any]) -> None:
    """Every role ended well; nfsdtop and nfsdist exited 0 after SIGTERM, nfsdtop leaving the
    server with the tracing programs it had before; every heavy worker made requests."""
    server, light, heavy = role(data, "server"), role(data, "light"), role(data, "heavy")
    assert server["nfsdtop"]["rc"] == 0, server["nfsdtop"]["stderr"][-2000:]
    assert light["nfsdist"]["rc"] == 0, light["nfsdist"]["stderr"][-2000:]
    attach = server["attachments"]
    assert attach["after"]["bpf_progs"] == attach["before"]["bpf_progs"], attach
    assert heavy["workers"] and all(w["requests"] > 0 for w in heavy["workers"]), heavy["workers"]


def verify_both_clients_served(data: Dict[str, Any]) -> None:
    """Two clients on two addresses of the lab link, both connected to the server's NFS port and
    both in nfsdtop's rows."""
    server, light, heavy = role(data, "server"), role(data, "light"), role(data, "heavy")
    addresses = {light["address"], heavy["address"]}
    assert len(addresses) == 2 and light["server"] == heavy["server"], (light["address"], heavy["address"])
    assert addresses <= set(server["clients"]), (addresses, server["clients"])
    rows = {row["client"] for record in nfsdtop_intervals(server) for row in record["rows"]}
    assert addresses <= rows, (addresses, rows)


def missed(server: Dict[str, Any]) -> int:
    """The requests nfsdtop said it did not count, over the run (its intervals' "missed")."""
    return sum(sum(record["missed"].values()) for record in nfsdtop_intervals(server))


def verify_counts_per_client(data: Dict[str, Any]) -> None:
    """Each client's NFSv3 requests per procedure in nfsdtop are what it issued (its own RPC
    counters' differences), the light client's reads and the heavy one's writes included, but for
    the requests nfsdtop itself reported as not counted: no procedure counted more than its
    client issued, and all that is short is at most what nfsdtop said it missed (exact when it
    missed none). A missed request has no address, so which client's it was is unknown."""
    server = role(data, "server")
    counted = per_client(server)
    short = 0
    for name in ("light", "heavy"):
        client = role(data, name)
        issued = {label: n for label, n in client["issued"].items() if n}
        assert issued.get("NFSv3 READ"), f"{name}: no READ issued: {issued}"
        seen = counted.get(client["address"], {})
        over = {label: (n, issued.get(label, 0)) for label, n in seen.items() if n > issued.get(label, 0)}
        assert not over, f"{name} ({client['address']}): nfsdtop counted more than issued: {over}"
        short += sum(n - seen.get(label, 0) for label, n in issued.items())
    assert role(data, "heavy")["issued"].get("NFSv3 WRITE"), role(data, "heavy")["issued"]
    assert short <= missed(server), f"{short} NFSv3 requests not counted, nfsdtop reported {missed(server)} missed"


def verify_heavy_client_ranked_first(data: Dict[str, Any]) -> None:
    """Every nfsdtop interval wholly inside `heavy` ranks client-a first; none inside `before` or
    `after` shows an NFSv3 request of client-a (its load is the heavy phase's; both clients' NFSv4
    mounts renew their leases throughout)."""
    server = role(data, "server")
    heavy_address, light_address = role(data, "heavy")["address"], role(data, "light")["address"]
    intervals = nfsdtop_intervals(server)
    for name in ("before", "heavy", "after"):
        span = span_of(server["seen"], name)
        inside = [r for r in intervals if in_phase(r, span, r["seconds"], server["gmtoff"])]
        assert inside, f"{name}: no nfsdtop interval wholly inside it"
        firsts = [r["rows"][0]["client"] if r["rows"] else None for r in inside]
        if name == "heavy":
            assert set(firsts) == {heavy_address}, f"heavy: first rows {firsts} (client-a {heavy_address})"
        else:
            shown = {row["client"] for r in inside for row in r["rows"] if any(p.startswith("NFSv3 ") for p in row["procs"])}
            assert shown == {light_address}, f"{name}: NFSv3 requests of {shown} (client-b {light_address} only)"


def reads_by_phase(light: Dict[str, Any]) -> Dict[str, List[float]]:
    """client-b's read latencies (µs) per phase; reads that straddle a phase change are "edge"."""
    by_phase: Dict[str, List[float]] = {}
    for _start, micros, name in light["reads"]:
        by_phase.setdefault(name, []).append(micros)
    return by_phase


def verify_light_reads_slower_under_load(data: Dict[str, Any]) -> None:
    """client-b's own timings: the QUANTILE of its read latency in `heavy` is above that of `before`
    and of `after` (reads that straddle a phase change are left out)."""
    by_phase = reads_by_phase(role(data, "light"))
    q = {name: quantile(by_phase.get(name, [])) for name in ("before", "heavy", "after")}
    assert q["heavy"] > max(q["before"], q["after"]), f"p{QUANTILE * 100:.0f} read µs per phase: {q}"


def verify_nfsdist_sees_the_slowdown(data: Dict[str, Any]) -> None:
    """nfsdist on client-b counts each of its reads, and the log2 bucket of its QUANTILE read
    latency in `heavy` is above those of `before` and `after`."""
    light = role(data, "light")
    total = sum(r["ops"]["read"]["count"] for r in nfsdist_intervals(light) if "read" in r["ops"])
    assert total == len(light["reads"]), f"nfsdist counted {total} reads, the workload made {len(light['reads'])}"
    q = {name: bucket_quantile(read_hist(light, name)) for name in ("before", "heavy", "after")}
    assert q["heavy"] > max(q["before"], q["after"]), f"p{QUANTILE * 100:.0f} read bucket (µs) per phase: {q}"


def summary(data: Dict[str, Any]) -> str:
    """One line for the run's report: the phases' read quantiles."""
    by_phase = reads_by_phase(role(data, "light"))
    return ", ".join(f"{name} p{QUANTILE * 100:.0f} {quantile(by_phase[name]) / 1000:.1f} ms"
                     for name in ("before", "heavy", "after") if by_phase.get(name))


FLEET_CHECKS = (verify_ran_and_detached, verify_both_clients_served, verify_counts_per_client,
                verify_heavy_client_ranked_first, verify_light_reads_slower_under_load,
                verify_nfsdist_sees_the_slowdown)

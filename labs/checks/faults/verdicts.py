"""Fault checks on a QEMU pair: the tools on the client while the server stops, restarts or loses packets.

The verify_* functions turn the JSON of the fault run (labs.checks.faults.run: the guest's
document, with the host's notes of each fault it played) into a verdict (AssertionError with
what was wrong) and a detail line for reports; `labs test --topology pair` and
tests/lab/test_faults_lab.py both use them.
"""
from __future__ import annotations

import json
import os
import signal
from typing import Any, Dict, List, Optional

from discover.spec import DEFAULT_OPS
from labs.checks.faults.run import PAUSE_S
from labs.checks.probes.verdicts import counted_once, mean_bucket, phase_hist
from labs.checks.shared import interval_in

#: NFSv3 procedures an operation of the mixed workload may wait in
NFS3_PROCEDURES = {"NULL", "GETATTR", "SETATTR", "LOOKUP", "ACCESS", "READ", "WRITE", "CREATE", "COMMIT",
                   "FSSTAT", "FSINFO", "PATHCONF", "READDIRPLUS", "READDIR", "REMOVE", "RENAME", "LINK",
                   "MKDIR", "RMDIR", "SYMLINK", "READLINK", "MKNOD"}
#: the commands the guest runs through every phase, all started with nfsv4 unloaded
TOOLS = ("nfsslower", "nfsdist", "nfstop")


def _data(result: Dict[str, Any]) -> Dict[str, Any]:
    assert result.get("ok"), f"the guest's fault run failed: {result.get('error')}"
    return result["data"]


def traced_ops(data: Dict[str, Any]) -> List[str]:
    """The operations the tools recorded (nfsdist's JSON carries every op it traces)."""
    intervals = data["nfsdist"]["intervals"]
    return sorted(intervals[0]["ops"]) if intervals else []


def exact_counts(data: Dict[str, Any], phase: str, skip: tuple = ()) -> str:
    """nfsdist's per-op counts of a phase equal what its workload issued, but for operations it
    reported missed: nothing lost silently, nothing counted twice. Only ops the tools trace; a
    lookup happens at least once per round."""
    issued = data["phases"][phase]["issued"]
    seen = data["seen"].get(phase, {}).get("ops", {})
    missed = data["seen"].get(phase, {}).get("missed", {})
    checked = []
    for op in traced_ops(data):
        if op in skip:
            continue
        if op in issued:
            counted = counted_once(f"{phase} {op} (nfsdist)", seen.get(op, {}).get("count", 0), issued[op],
                                   missed.get(op, 0))
            checked.append(f"{op} {counted}")
        elif op == "lookup":
            assert seen[op]["count"] >= issued["lookup_min"], f"{phase} lookup: {seen[op]['count']} < {issued['lookup_min']}"
            checked.append(f"lookup {seen[op]['count']}>={issued['lookup_min']}")
    assert checked, f"{phase}: no operation of the workload was traced"
    assert data["seen"][phase]["anomalies"] == 0, f"{phase}: {data['seen'][phase]['anomalies']} anomalies"
    return ", ".join(checked)


def stall_records(data: Dict[str, Any], phase: str, lines: str = "slower_lines") -> List[Dict[str, Any]]:
    """nfsslower's in-flight records that appeared while a phase ran, with when (guest monotonic);
    `lines`: default_slower_lines for the nfsslower run with its default operations."""
    p = data["phases"][phase]
    return [dict(line["record"], seen_mono=line["mono"]) for line in data[lines]
            if line["record"].get("in_flight") is True and p["mono_start"] <= line["mono"] <= p["mono_end"] + 5]


def _stall_timing(data: Dict[str, Any], stalls: List[Dict[str, Any]]) -> Dict[Any, List[Dict[str, Any]]]:
    """The pause's stall lines, grouped per stuck operation, came in time: none older than the
    pause, the first within threshold + one stall interval (plus how late this run's ticks were,
    read from its own re-prints), each re-printed no faster than every interval."""
    phase = data["phases"]["pause"]
    threshold_s, interval_s = data["threshold_ms"] / 1000, data["stall_interval_s"]
    requested = phase["mono_start"]
    first = min(s["seen_mono"] for s in stalls)
    pause_at = first - min(s["in_flight_ms"] for s in stalls) / 1000  # when the first stuck op began
    assert pause_at >= requested - 1, "an in-flight line older than the pause"
    # how late the tool's interval ticks ran on this host, from its own re-prints of one stuck
    # operation: the first line may come that much after threshold + one interval, no later
    by_op: Dict[Any, List[Dict[str, Any]]] = {}
    for s in stalls:
        by_op.setdefault((s["pid"], s["op"], s["start_us"]), []).append(s)
    ages_by_op = {key: sorted(s["in_flight_ms"] for s in lines) for key, lines in by_op.items()}
    gaps_by_op = {key: [b - a for a, b in zip(ages, ages[1:])] for key, ages in ages_by_op.items()}
    gaps = [gap for op_gaps in gaps_by_op.values() for gap in op_gaps]
    assert gaps, "no operation was re-printed during the pause: the tool's interval cannot be measured"
    late_ms = max(0.0, max(gaps) - interval_s * 1000)
    first_ms = min(s["in_flight_ms"] for s in stalls)
    assert first_ms <= (threshold_s + interval_s) * 1000 + late_ms, \
        f"first in-flight line only after {first_ms:.0f} ms (threshold {threshold_s:.0f} s + interval " \
        f"{interval_s} s, ticks at most {late_ms:.0f} ms late)"
    assert all(s["in_flight_ms"] >= data["threshold_ms"] for s in stalls), "an in-flight line below the threshold"
    for key, op_gaps in gaps_by_op.items():
        assert all(gap >= interval_s * 1000 - 500 for gap in op_gaps), \
            f"{key} re-printed faster than every {interval_s} s: {ages_by_op[key]}"
    return by_op


def _stall_detail(stalls: List[Dict[str, Any]]) -> str:
    return "\n".join(f"      stall: pid {s['pid']} {s['comm']} op {s['op']} ({s['type']}) rpc {s['rpc']} "
                     f"file {s['file']} in flight {s['in_flight_ms']:.0f} ms server {s['server']}"
                     for s in sorted(stalls, key=lambda s: s["seen_mono"]))


def _naming_other_files(data: Dict[str, Any], stalls: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The stall lines that name a file the pause phase's workload never touched."""
    phase = data["phases"]["pause"]
    files = set(phase["files"]) | {"read.bin"} | {f"missing-{i}" for i in range(phase["rounds"] + 1)}
    return [s for s in stalls if os.path.basename(s["file"]) not in files]


def verify_pause_stalls(result: Dict[str, Any]) -> str:
    """Stall lines while the server is stopped: within threshold + one stall interval, naming the
    workload's op, pid and file (or the RPC a kworker waits in), repeated at most every interval,
    and each stuck operation later completes with at least the time it was seen in flight."""
    data = _data(result)
    stalls = stall_records(data, "pause")
    assert stalls, "no in-flight line while the server was stopped"
    by_op = _stall_timing(data, stalls)
    pid = data["workload_pid"]
    mine = [s for s in stalls if s["pid"] == pid and s["op"] != "rpc"]
    assert mine, f"no in-flight line for the workload's pid {pid}: {stalls[:3]}"
    if data["kernel"]["module_btf"]:
        other = _naming_other_files(data, mine)
        assert not other, f"in-flight lines naming other files: {other[:3]}"
    for s in stalls:
        if s.get("rpc") is not None:
            assert s["rpc"] in NFS3_PROCEDURES, f"unknown RPC procedure {s['rpc']!r}"
    completed = [line["record"] for line in data["slower_lines"] if line["record"].get("in_flight") is False]
    for (spid, op, start_us), lines in by_op.items():
        if op == "rpc":
            continue
        longest = max(s["in_flight_ms"] for s in lines)
        done = [c for c in completed if c["pid"] == spid and c["op"] == op and c["lat_us"] >= longest * 1000
                and abs(c["end_us"] - c["lat_us"] - start_us) < 50_000]
        assert done, f"the stuck {op} of pid {spid} (start {start_us} us) never completed"
    return _stall_detail(stalls)


def verify_default_pause_stalls(result: Dict[str, Any]) -> str:
    """nfsslower as a new user runs it (bcc's default operations, no --ops) sees the pause too:
    in time, a line for the workload's process naming the operation it is stuck in, the one
    the --ops all run shows (as the RPC beneath it, with its file, where that operation is
    outside the default set); and no completed line of an operation it was not asked for."""
    data = _data(result)
    lines = data["default_slower_lines"]
    tracing = next(line["record"]["tracing"] for line in lines if "tracing" in line["record"])
    assert set(tracing) <= set(DEFAULT_OPS), f"the default nfsslower traced {tracing}"
    completed = {line["record"]["op"] for line in lines if line["record"].get("in_flight") is False}
    assert completed <= set(tracing), f"completed lines of operations not asked for: {completed - set(tracing)}"
    stalls = stall_records(data, "pause", "default_slower_lines")
    assert stalls, "no in-flight line from nfsslower with its default operations while the server was stopped"
    _stall_timing(data, stalls)
    pid = data["workload_pid"]
    mine = [s for s in stalls if s["pid"] == pid]
    assert mine, f"no in-flight line for the workload's pid {pid} with the default operations: {stalls[:3]}"
    stuck = {(s["op"], s["rpc"]) for s in stall_records(data, "pause") if s["pid"] == pid and s["op"] != "rpc"}
    shown = {(s["op"], s["rpc"]) for s in mine}
    named = [(op, rpc) for op, rpc in stuck if (op, rpc) in shown or ("rpc", rpc) in shown]
    assert named, f"the default run shows {sorted(shown, key=str)}, not the stuck {sorted(stuck, key=str)}"
    assert all(op in tracing for op, rpc in shown if op != "rpc"), shown
    for s in mine:
        if s["op"] == "rpc":
            assert s["rpc"] in NFS3_PROCEDURES and s["server"] == data["server"], s
    if data["kernel"]["module_btf"]:
        other = _naming_other_files(data, mine)
        assert not other, f"lines naming other files: {other[:3]}"
    return f"tracing {','.join(tracing)}; stuck (--ops all) {sorted(stuck, key=str)}\n" + _stall_detail(stalls)


def _mount_series(scrape: Dict[str, Any], mountpoint: str) -> Optional[Dict[str, Any]]:
    return next((s for s in scrape["series"] if s["mountpoint"] == mountpoint), None)


def verify_exporter_names_the_stuck_server(result: Dict[str, Any]) -> str:
    """While the server is stopped, nfs-exporter's per-mount series of the paused mount, labelled
    with the server and export, show operations in flight for seconds (the bar nfstop's check
    sets), older than anything in flight in the plain phase; once the server answers, the
    mount's series is back to nothing in flight before the next phase; it ran to the end."""
    data = _data(result)
    exporter = data["nfs_exporter"]
    # 143: SIGTERM detached it; killed by the signal: it was compiling again for nfsv4 (nothing attached)
    assert exporter["rc"] in (143, -signal.SIGTERM), f"nfs-exporter exited {exporter['rc']}: {exporter['stderr'][-300:]}"
    scrapes = exporter["scrapes"]
    pause, plain, restart = (data["phases"][name] for name in ("pause", "plain", "restart"))
    mount = pause["mount"]

    def window(start: float, end: float) -> List[Dict[str, Any]]:
        return [s for sc in scrapes if start <= sc["mono"] <= end for s in [_mount_series(sc, mount)] if s]

    during = window(pause["mono_start"], pause["mono_end"])
    assert during, f"no scrape of {mount}'s series while the server was stopped ({len(scrapes)} scrapes)"
    stuck = [s for s in during if s.get("in_flight", 0) >= 1]
    assert stuck, f"{mount}: nothing in flight in {len(during)} scrapes while the server was stopped"
    assert all(s["server"] == data["server"] and s["export"].startswith(data["server"] + ":") for s in stuck), stuck[0]
    oldest = max(s["oldest_s"] for s in stuck)
    before = max((s.get("oldest_s", 0.0) for s in window(plain["mono_start"], plain["mono_end"])), default=0.0)
    assert oldest >= PAUSE_S / 3 and oldest > before, \
        f"{mount}: oldest in flight {oldest} s while stopped, {before} s in the plain phase"
    after = window(pause["mono_end"], restart["mono_start"])
    assert any(s.get("in_flight") == 0 for s in after), \
        f"{mount}: still in flight in every scrape after the pause ({[s.get('in_flight') for s in after]})"
    return (f"server {stuck[0]['server']} export {stuck[0]['export']} mountpoint {mount}: in flight in "
            f"{len(stuck)} of {len(during)} scrapes while stopped, oldest {oldest:.1f} s (plain phase: {before:.1f} s); "
            f"{len(after)} scrapes after, back to 0")


def verify_pause_completes(result: Dict[str, Any]) -> str:
    """After SIGCONT every operation of the pause phase completed, counted exactly once."""
    data = _data(result)
    note = data["host"].get("pause", {})
    assert "error" not in note and note.get("paused_s", 0) >= PAUSE_S - 1, f"the server was not paused: {note}"
    phase = data["phases"]["pause"]
    assert phase["mono_end"] - phase["mono_start"] >= note["paused_s"] - 1, "the workload did not wait for the server"
    return f"paused {note['paused_s']} s; {phase['rounds']} rounds; exact: " + exact_counts(data, "pause")


def verify_loss(result: Dict[str, Any]) -> str:
    """With netem loss on the link, counts stay exact and the latencies move up."""
    data = _data(result)
    detail = exact_counts(data, "loss")
    moved = []
    for op in ("write", "fsync", "read"):
        if op in traced_ops(data):
            intervals = data["nfsdist"]["intervals"]
            plain, lossy = (mean_bucket(phase_hist(intervals, "plain", op)),
                            mean_bucket(phase_hist(intervals, "loss", op)))
            moved.append((op, plain, lossy))
    assert any(lossy > plain for _, plain, lossy in moved), f"no latency moved with {data['loss_percent']}% loss: {moved}"
    return (f"{data['loss_percent']}% loss on {data['device']}: exact: {detail}; mean bucket "
            + ", ".join(f"{op} {plain:.0f}->{lossy:.0f} us" for op, plain, lossy in moved))


def verify_restart(result: Dict[str, Any]) -> str:
    data = _data(result)
    note = data["host"].get("restart", {})
    assert "error" not in note and "seconds" in note, f"nfs-server was not restarted: {note}"
    return f"restart took {note['seconds']} s; {data['phases']['restart']['rounds']} rounds; exact: " \
        + exact_counts(data, "restart")


def v4_late_verdict(stderr: str) -> Optional[str]:
    """How a tool said it handled nfsv4 appearing later: "attached" (on core: traced beside its
    running programs), "restart" (on bcc) or None."""
    text = stderr.lower()
    if "module nfsv4 loaded after the start: now traced: " in text:
        return "attached"
    if "restart" in text:
        return "restart"
    return None


def verify_v4late(result: Dict[str, Any]) -> str:
    """Started without nfsv4: the tools said at start what they do not cover and why; once nfsv4
    is loaded and NFSv4.2 mounted they either attach (NFSv4 opens counted) or say to restart."""
    data = _data(result)
    assert not data["nfsv4_loaded_at_start"], f"nfsv4 could not be unloaded: {data['unload']}"
    verdicts = {}
    for name in TOOLS:
        stderr = data[name]["stderr"]
        assert data[name]["rc"] == 0, f"{name} exited {data[name]['rc']}: {stderr[-300:]}"
        assert "nfs4_file_open" in stderr and "not loaded" in stderr, f"{name} did not say nfs4_file_open is missing"
        verdicts[name] = v4_late_verdict(stderr)
    counted = data["seen"].get("v4late", {}).get("ops", {}).get("open", {}).get("count", 0)
    issued = data["phases"]["v4late"]["issued"]["open"]
    if verdicts["nfsdist"] == "attached":
        detail = exact_counts(data, "v4late")
    else:
        assert verdicts["nfsdist"] == "restart", \
            f"nfsdist neither attached to nfsv4 nor said to restart (NFSv4 opens counted {counted} of {issued})"
        detail = exact_counts(data, "v4late", skip=data["v4_module_ops"])
    return ", ".join(f"{name}: {verdicts[name]}" for name in TOOLS) + f"; exact: {detail}"


def verify_nfstop_process(result: Dict[str, Any]) -> str:
    """nfstop with its default operations names the workload's process with every read and write
    it issued over all five phases, counts no other operation, and while the server is stopped
    shows it with an operation in flight for seconds (an RPC beneath, where the stuck operation
    is outside the default set)."""
    data = _data(result)
    rows = [json.loads(line) for line in data["nfstop"]["lines"] if line.startswith("{")]
    mine = [(row["ts"], p) for row in rows for p in row["processes"] if p["pid"] == data["workload_pid"]]
    assert mine, f"pid {data['workload_pid']} never appeared in nfstop"
    assert {p["comm"] for _, p in mine} == {"python3"}, {p["comm"] for _, p in mine}
    counted = []
    for op in ("read", "write"):
        issued = sum(phase["issued"].get(op, 0) for phase in data["phases"].values())
        seen = sum(p["ops"].get(op, {}).get("count", 0) for _, p in mine)
        missed = sum(row.get("missed", {}).get(op, 0) for row in rows)
        counted.append(f"{op} " + counted_once(f"nfstop, pid {data['workload_pid']}, {op}", seen, issued, missed))
    outside = {op for row in rows for p in row["processes"] for op in p["ops"]} - set(DEFAULT_OPS)
    assert not outside, f"nfstop with its default operations counted {outside}"
    stuck = [p for ts, p in mine if interval_in(ts, data["phases"]["pause"]) and p["in_flight"]]
    oldest = max((p["oldest_ms"] for p in stuck), default=0.0)
    assert oldest >= PAUSE_S * 1000 / 3, \
        f"while the server was stopped nfstop showed pid {data['workload_pid']} in flight for at most {oldest} ms"
    return f"{', '.join(counted)} over {len(mine)} intervals; in flight during the pause: oldest {oldest / 1000:.1f} s"


def verify_silent_guest(result: Dict[str, Any]) -> str:
    """A command sent to the stopped server fails as soon as the lab sees its QEMU stopped, in one
    line that names the kernel and the console log."""
    note = _data(result)["host"].get("pause", {})
    silent = note.get("silent", {})
    message = silent.get("message")
    assert message, f"a command in the stopped guest did not fail: {silent}"
    # found stopped (its QEMU's state), not presumed dead after the agent's patience ran out
    assert "is stopped (SIGSTOP" in message, f"the stopped guest was not seen as stopped: {message}"
    assert "\n" not in message and note["kernel_release"] in message and note["console_log"] in message, message
    return f"after {silent['seconds']} s: {message}"


#: the fault checks of `labs test --topology pair`, in the order they ran
FAULT_CHECKS = [
    ("fault: server paused, stall lines", verify_pause_stalls),
    ("fault: server paused, default nfsslower", verify_default_pause_stalls),
    ("fault: server paused, exporter per mount", verify_exporter_names_the_stuck_server),
    ("fault: server paused, all complete", verify_pause_completes),
    ("fault: stopped guest reported", verify_silent_guest),
    ("fault: netem loss on the link", verify_loss),
    ("fault: nfs-server restarted", verify_restart),
    ("fault: nfsv4 loaded after start", verify_v4late),
    ("fault: nfstop shows the process", verify_nfstop_process),
]

"""Verdicts on a local-filesystem lab run (labs/checks/fs/guest.py's JSON): fsslower, fsdist and
fstop -t FS against a known workload, without and with dm-delay under the filesystem.

Each check takes the run's `data` and one filesystem, and fails with a message that names the
filesystem, the phase and the numbers. Phases: `plain` (no delay) and `delay` (DELAY_MS on
every I/O of the device, or every SMB round trip), per cache mode on SMB (`strict plain`). Whichever tool watched a filesystem, the same three questions are
asked of it: did it count the workload's operations and bytes exactly, did the delay show
(operations at or above it with the delay, none without), and did it leave nothing behind.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Tuple

from labs.checks.shared import interval_in

#: what the workload issues per phase and which operations must show the delay
BYTES_OPS = ("read", "write")
#: the operations that wait for the device in every delayed phase: each fsync writes, and
#: the first read of a file whose pages were dropped reads
DELAYED_OPS = ("fsync", "read")

Seen = Dict[str, Dict[str, Dict[str, float]]]


def _ops_of(run: Dict[str, Any]) -> List[str]:
    return [op for op in next(iter(run["phases"].values()))["issued"] if not op.endswith("_bytes")]


def _phase_of_interval(ts: str, phases: Dict[str, Any]) -> str:
    """The phase an interval printed at wall second `ts` belongs to ("" if none), by the NFS
    checks' own window (shared.interval_in)."""
    return next((name for name, phase in phases.items() if interval_in(ts, phase)), "")


def seen_by_phase(run: Dict[str, Any]) -> Seen:
    """phase -> op -> {count, bytes, slow, lat_ms}: what the tool reported for each phase's
    operations. `slow`: operations the tool shows at or above the delay (fsslower: latency;
    fsdist: in a log2 bucket reaching the delay; fstop: count when the average is at or above
    it); lat_ms: the phase's total latency of the op where the tool gives one."""
    delay_us = run["delay_ms"] * 1000
    out: Seen = {name: {} for name in run["phases"]}

    def add(phase: str, op: str, count: float, nbytes: float, slow: float, lat_ms: float) -> None:
        entry = out[phase].setdefault(op, {"count": 0, "bytes": 0, "slow": 0, "lat_ms": 0.0})
        for key, value in (("count", count), ("bytes", nbytes), ("slow", slow), ("lat_ms", lat_ms)):
            entry[key] += value

    worker = {phase["pid"] for phase in run["phases"].values()}
    for record in run["records"]:
        if run["tool"] == "fsslower":  # end_us: the kernel's monotonic clock
            moment = record["end_us"] / 1e6
            phase = next((name for name, p in run["phases"].items() if p["mono_start"] <= moment <= p["mono_end"]), "")
            if phase and record["pid"] in worker:
                add(phase, record["op"], 1, record["bytes"], record["lat_us"] >= delay_us, record["lat_us"] / 1000.0)
            continue
        phase = _phase_of_interval(record["ts"], run["phases"])
        if not phase:
            continue
        if run["tool"] == "fsdist":
            for op, entry in record["ops"].items():
                slow = sum(b["count"] for b in entry["hist"] if b["interval-end"] >= delay_us)
                add(phase, op, entry["count"], entry["bytes"], slow, 0.0)
        else:  # fstop: the worker's row
            for row in record.get("processes", []):
                for op, entry in row["ops"].items() if row["pid"] in worker else ():
                    add(phase, op, entry["count"], entry["bytes"],
                        entry["count"] if entry["avg_ms"] >= run["delay_ms"] else 0, entry["avg_ms"] * entry["count"])
    return out


def verify_tool_ran(run: Dict[str, Any], fs: str) -> None:
    """The tool ran to its stop signal, and the delay was in place in the delayed phases (the
    dm table said `delay`, or lo had its netem qdisc)."""
    assert run.get("phases"), f"{fs}: the run did not get to its phases: {run.get('stderr', '')[-1500:]}"
    assert run["rc"] == 0, f"{fs}: {run['tool']} exited {run['rc']}: {run['stderr'][-1500:]}"
    assert "Traceback" not in run["stderr"], f"{fs}: {run['stderr'][-1500:]}"
    how = run["injected"].split()
    assert how[2:3] == ["delay"] or how[:2] == ["qdisc", "netem"], f"{fs}: the delay in place: {run['injected']}"


def verify_counts_exact(run: Dict[str, Any], fs: str) -> None:
    """Per phase and operation, the tool's count (and bytes of reads and writes) is what the
    workload issued, no more and no less."""
    seen = seen_by_phase(run)
    for name, phase in run["phases"].items():
        issued = phase["issued"]
        for op in _ops_of(run):
            got = seen[name].get(op, {"count": 0, "bytes": 0})
            assert got["count"] == issued[op], f"{fs} {name}: {op} counted {got['count']}, issued {issued[op]}"
            if op in BYTES_OPS:
                assert got["bytes"] == issued[f"{op}_bytes"], \
                    f"{fs} {name}: {op} bytes {got['bytes']}, issued {issued[f'{op}_bytes']}"


#: the workload's operations that wait on the device, and so on dm-delay: the others (buffered
#: writes, opens and stats of cached inodes) wait only on the CPU, which a loaded host stalls
#: past any mark (CI, 6.12, one vCPU: 4 of 8 undelayed xfs writes at 570-961 ms, one after
#: the other, where the delayed phase's writes took under 18 ms)
DEVICE_OPS = ("read", "fsync")


def _plain_faster(slow: Dict[str, float], delayed: Dict[str, float], issued: Dict[str, int], where: str) -> None:
    """Without the delay, by comparison with the phase that has it: fewer of the operations that
    wait on the device at or above it, and not every fsync (the delay is what makes them all
    slow)."""
    assert sum(slow.get(op, 0) for op in DEVICE_OPS) < sum(delayed.get(op, 0) for op in DEVICE_OPS) \
        and slow.get("fsync", 0) < issued["fsync"], \
        f"{where}: at or above the delay without it {slow}, with it {delayed} (fsyncs issued {issued['fsync']})"


def verify_delay_visible(run: Dict[str, Any], fs: str) -> None:
    """With dm-delay, every fsync and at least one read (of dropped pages) is shown at or above
    the delay; without it, fewer of the operations that wait on the device are, and not every
    fsync."""
    seen = seen_by_phase(run)
    for name in run["phases"]:
        if name.endswith("plain"):
            delayed = name[:-len("plain")] + "delay"
            _plain_faster({op: e["slow"] for op, e in seen[name].items()},
                          {op: e["slow"] for op, e in seen[delayed].items()}, run["phases"][name]["issued"],
                          f"{fs} {name}: {run['tool']} at {run['delay_ms']} ms")
            continue
        delay, issued = seen[name], run["phases"][name]["issued"]
        assert delay["fsync"]["slow"] == issued["fsync"], \
            f"{fs} {name}: {delay['fsync']['slow']} of {issued['fsync']} fsyncs at or above {run['delay_ms']} ms"
        if run["tool"] == "fstop":  # averages: the reads' summed latency holds the delayed one
            assert delay["read"]["lat_ms"] >= run["delay_ms"], f"{fs} {name}: reads took {delay['read']['lat_ms']} ms"
        else:
            assert delay["read"]["slow"] >= 1, f"{fs} {name}: no read at or above {run['delay_ms']} ms: {delay['read']}"


def verify_nothing_left(data: Dict[str, Any], fs: str) -> None:
    """While attached the kernel holds more tracing programs; after every tool was stopped by
    its signal, the same programs and kprobe_events as before, and no mount or dm device."""
    before, during, after = data["attached_before"], data["attached_during"], data["attached_after"]
    assert len(during["bpf_progs"]) > len(before["bpf_progs"]), f"{fs}: nothing attached while running: {during}"
    assert after["bpf_progs"] == before["bpf_progs"], f"{fs}: programs left: {after} (before {before})"
    assert after["kprobe_events"] == before["kprobe_events"], f"{fs}: kprobe_events left: {after['kprobe_events']}"
    assert data["mounts_after"] == "0" and data["dm_after"] == "0", \
        f"{fs}: lab mounts {data['mounts_after']}, dm devices {data['dm_after']} left"


def verify_mount_point_finds_the_superblock(data: Dict[str, Any], fs: str) -> None:
    """--mount-point resolves each lab mount to its superblock's dev (what the probe reads),
    also where stat(2) reports another dev (btrfs: the subvolume's)."""
    for devs in data["devs"][fs]:
        assert devs["mount_point"] == devs["mountinfo"], f"{fs}: --mount-point gave {devs}"


def lab_results(data: Dict[str, Any], fs: str) -> Dict[str, Any]:
    """`probes compat --lab-results` for this kernel and filesystem: per operation the
    candidate the tool picked and whether it recorded the operation."""
    run = data["runs"][fs]
    seen = seen_by_phase(run)
    plain = [name for name in seen if name.endswith("plain")]
    return {data["release"]: {op: {"candidate": run["picks"].get(op),
                                   "ok": op in run["picks"] and all(seen[p].get(op, {}).get("count", 0) > 0
                                                                    for p in plain)}
                              for op in _ops_of(run)}}


RUN_CHECKS: Tuple[Callable[[Dict[str, Any], str], None], ...] = (
    verify_tool_ran, verify_counts_exact, verify_delay_visible)


def _exporter_delta(phase: Dict[str, Any], fs: str, field: str, key: str) -> float:
    scraped = phase["exporter"]
    return scraped["after"][fs][field].get(key, 0) - scraped["before"][fs][field].get(key, 0)


def verify_exporter_counts_exact(data: Dict[str, Any], fs: str) -> None:
    """nfs-exporter -t, scraped right before and right after each phase's workload: the phase
    mount's probekit_FS_ops_total, its histogram's count and (reads, writes) bytes_total grew by
    what the workload issued and by what the terminal tool counted in the same phase; the
    filesystem's other lab mounts (SMB: the other cache mode's) did not move."""
    run = data["runs"][fs]
    seen = seen_by_phase(run)
    for name, phase in run["phases"].items():
        issued = phase["issued"]
        for op in _ops_of(run):
            key = f"{op} {phase['mount']}"
            ops, count = _exporter_delta(phase, fs, "ops", key), _exporter_delta(phase, fs, "count", key)
            tool = seen[name].get(op, {"count": 0, "bytes": 0})
            assert ops == issued[op] == tool["count"], \
                f"{fs} {name}: {op} exporter {ops}, issued {issued[op]}, {run['tool']} {tool['count']}"
            assert count == ops, f"{fs} {name}: {op} histogram count {count}, ops_total {ops}"
            if op in BYTES_OPS:
                nbytes = _exporter_delta(phase, fs, "bytes", key)
                assert nbytes == issued[f"{op}_bytes"] == tool["bytes"], \
                    f"{fs} {name}: {op} exporter bytes {nbytes}, issued {issued[f'{op}_bytes']}, tool {tool['bytes']}"
        others = {key for key in phase["exporter"]["after"][fs]["ops"] if not key.endswith(" " + phase["mount"])}
        moved = {key: _exporter_delta(phase, fs, "ops", key) for key in others if _exporter_delta(phase, fs, "ops", key)}
        assert moved == {}, f"{fs} {name}: other mounts' series moved during the phase: {moved}"


def verify_exporter_delay_visible(data: Dict[str, Any], fs: str) -> None:
    """The exporter's histogram shows the delay as the tools do: with it, every fsync and at
    least one read above the last bucket below DELAY_MS; without it, fewer of the operations
    that wait on the device and not every fsync."""
    run = data["runs"][fs]

    def slow_of(phase: Dict[str, Any]) -> Dict[str, float]:
        return {op: _exporter_delta(phase, fs, "slow", f"{op} {phase['mount']}") for op in _ops_of(run)}

    for name, phase in run["phases"].items():
        slow = slow_of(phase)
        if name.endswith("plain"):
            _plain_faster(slow, slow_of(run["phases"][name[:-len("plain")] + "delay"]), phase["issued"],
                          f"{fs} {name}: the exporter")
            continue
        assert slow["fsync"] == phase["issued"]["fsync"], f"{fs} {name}: {slow} of {phase['issued']}"
        assert slow["read"] >= 1, f"{fs} {name}: no read above the delay's bucket: {slow}"


def exporter_scrapes(data: Dict[str, Any]) -> List[Tuple[str, Dict[str, Any]]]:
    """Every scrape of the run in the order taken: at the start, once every probe was attached,
    then before and after each phase."""
    out = [("start", data["exporter"]["start"]), ("attached", data["exporter"]["attached"])]
    for fs, run in data["runs"].items():
        for name, phase in run["phases"].items():
            out += [(f"{fs} {name} before", phase["exporter"]["before"]), (f"{fs} {name} after", phase["exporter"]["after"])]
    return out


def verify_exporter_probes_independent(data: Dict[str, Any], fs: str) -> None:
    """A filesystem the exporter waited for at the start (its module not loaded before its
    first mount) was attached once the mount loaded it; a probe attached at the start kept its
    attach time through every later scrape (the others' arrival restarted nothing); nothing was
    attached again, and no lab series ever went down."""
    said = data["exporter"]["start_said"].splitlines()
    waited = any(line.startswith(f"nfs-exporter: {fs}: ") and "waiting for" in line for line in said)
    scrapes = exporter_scrapes(data)
    start = scrapes[0][1][fs]
    assert start["attached"] == (0 if waited else 1), f"{fs}: at the start {start}, waited {waited}"
    times = {label: s[fs]["attach_time"] for label, s in scrapes[1:]}
    assert all(s[fs]["attached"] == 1 for _, s in scrapes[1:]), f"{fs}: detached in a scrape: {scrapes}"
    assert len(set(times.values())) == 1, f"{fs}: attached again: {times}"
    if not waited:
        assert start["attach_time"] == scrapes[1][1][fs]["attach_time"], f"{fs}: restarted: {start} {times}"
    assert not any("attaching again" in line for line in data["exporter"]["stderr"].splitlines()), \
        data["exporter"]["stderr"][-1500:]
    for (label_a, a), (label_b, b) in zip(scrapes, scrapes[1:]):
        for field in ("ops", "bytes", "count"):
            down = {key: (a[fs][field][key], b[fs][field].get(key)) for key in a[fs][field]
                    if b[fs][field].get(key, -1) < a[fs][field][key]}
            assert down == {}, f"{fs}: {field} went down from {label_a} to {label_b}: {down}"


def verify_exporter_stopped(data: Dict[str, Any]) -> None:
    """SIGTERM: exit 143 through the error boundary, its last line saying so, no traceback
    (verify_nothing_left: no program or kprobe left, the exporter's included)."""
    exporter = data["exporter"]
    lines = exporter["stderr"].splitlines()
    assert exporter["rc"] == 143 and lines[-1] == "nfs-exporter: terminated by SIGTERM; stopped and cleaned up", \
        exporter["stderr"][-1500:]
    assert "Traceback" not in exporter["stderr"], exporter["stderr"][-1500:]


EXPORTER_CHECKS: Tuple[Callable[[Dict[str, Any], str], None], ...] = (
    verify_exporter_counts_exact, verify_exporter_delay_visible, verify_exporter_probes_independent)

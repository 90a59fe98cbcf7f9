"""nfstop's per-interval rows: p99 only from a histogram difference that holds the interval's
operations (the issue's measured defect: `W avg/p99 ms 1.68/0.00` for a process in the
interval in which it exited)."""
from __future__ import annotations

from probes.commands import _top_rows


def entry(count: int, lat_ms: float, slots: dict, comm: str = "dd", cgroup: int = 0) -> dict:
    return {"count": count, "lat_ns": int(lat_ms * 1e6 * count), "bytes": 0, "comm": comm, "cgroup": cgroup,
            "slots": slots}


def test_p99_is_the_bucket_bound_when_the_difference_holds_every_operation() -> None:
    # two writes of about 1.7 ms: log2 usec slot 11 holds 1024..2047 us
    rows = _top_rows({(4242, 0): {"write": entry(2, 1.68, {11: 2})}}, 1.0, [])
    assert rows[0]["ops"]["write"]["p99_ms"] == 2.047
    assert rows[0]["ops"]["write"]["p99_ms"] >= rows[0]["ops"]["write"]["avg_ms"]


def test_no_p99_when_the_histogram_difference_misses_operations() -> None:
    """The count saw one write, the histogram read none: no p99 (was 0.00), not a made-up one."""
    rows = _top_rows({(4242, 0): {"write": entry(1, 1.68, {}), "open": entry(3, 13.89, {14: 2})}}, 1.0, [])
    assert rows[0]["ops"]["write"]["p99_ms"] is None
    assert rows[0]["ops"]["open"]["p99_ms"] is None
    assert rows[0]["ops"]["write"]["avg_ms"] == 1.68


def test_by_cgroup_sums_processes_and_their_histograms() -> None:
    """A build's short processes in one unit: one row, counts and slots summed, PIDS counted;
    a process stuck right now joins its cgroup's row as in flight."""
    from probes.inflight import Stall

    names = {11: "/system.slice/build.scope", 12: "/system.slice/backup.service"}
    data = {(100, 0): {"write": entry(2, 1.5, {11: 2}, "cc1", 11)},
            (101, 0): {"write": entry(1, 3.0, {12: 1}, "cc1", 11), "read": entry(1, 0.5, {9: 1}, "cc1", 11)},
            (200, 0): {"read": entry(4, 0.2, {8: 4}, "tar", 12)}}
    stuck = [Stall(300, 300, "ld", "open", 0, 2_500_000_000, "?", None, None)]
    rows = _top_rows(data, 2.0, stuck, "cgroup", names.__getitem__, str,
                     lambda pid: "/system.slice/build.scope")
    build = next(r for r in rows if r["cgroup"] == "/system.slice/build.scope")
    assert build["pids"] == 3 and build["ops"]["write"]["count"] == 3 and build["ops"]["read"]["count"] == 1
    assert build["ops"]["write"]["p99_ms"] == 4.095  # slot 12 (2048..4095 us) from process 101
    assert build["in_flight"] == 1 and build["oldest_ms"] == 2500.0
    backup = next(r for r in rows if r["cgroup"] == "/system.slice/backup.service")
    assert backup["pids"] == 1 and backup["ops_per_s"] == 2.0 and "pid" not in backup
    by_pid = _top_rows(data, 2.0, [], "pid", names.__getitem__)
    assert {r["pid"]: r["cgroup"] for r in by_pid} == {100: names[11], 101: names[11], 200: names[12]}


def test_by_mount_keys_on_the_superblock() -> None:
    mounts = {57: "/mnt/nfs3", 58: "/mnt/nfs42"}
    data = {(100, 57): {"read": entry(2, 1.0, {10: 2})}, (100, 58): {"read": entry(3, 1.0, {10: 3})}}
    rows = _top_rows(data, 1.0, [], "mount", str, mounts.__getitem__)
    assert {r["mount"]: r["ops"]["read"]["count"] for r in rows} == {"/mnt/nfs3": 2, "/mnt/nfs42": 3}

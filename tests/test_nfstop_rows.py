"""nfstop's per-interval rows: p99 only from a histogram difference that holds the interval's
operations (the issue's measured defect: `W avg/p99 ms 1.68/0.00` for a process in the
interval in which it exited)."""
from __future__ import annotations

from probes.commands import _top_rows


def entry(count: int, lat_ms: float, slots: dict) -> dict:
    return {"count": count, "lat_ns": int(lat_ms * 1e6 * count), "bytes": 0, "comm": "dd", "slots": slots}


def test_p99_is_the_bucket_bound_when_the_difference_holds_every_operation() -> None:
    # two writes of about 1.7 ms: log2 usec slot 11 holds 1024..2047 us
    rows = _top_rows({4242: {"write": entry(2, 1.68, {11: 2})}}, 1.0, {})
    assert rows[0]["ops"]["write"]["p99_ms"] == 2.047
    assert rows[0]["ops"]["write"]["p99_ms"] >= rows[0]["ops"]["write"]["avg_ms"]


def test_no_p99_when_the_histogram_difference_misses_operations() -> None:
    """The count saw one write, the histogram read none: no p99 (was 0.00), not a made-up one."""
    rows = _top_rows({4242: {"write": entry(1, 1.68, {}), "open": entry(3, 13.89, {14: 2})}}, 1.0, {})
    assert rows[0]["ops"]["write"]["p99_ms"] is None
    assert rows[0]["ops"]["open"]["p99_ms"] is None
    assert rows[0]["ops"]["write"]["avg_ms"] == 1.68

"""Map reads at real-time priority (probes.runtime.RealtimeReads): on, nested, put back, and refused.

Why it matters: a reader preempted inside a BPF map access holds its CPU's BPF guard, and the
kernel skips every probe that fires there meanwhile (seen on a Debian 7.3 guest, PREEMPT_LAZY).
"""
from __future__ import annotations

import os
from types import SimpleNamespace
from typing import List, Tuple

import pytest

from as_nobody import View
from probes.runtime import RealtimeReads, Session


@pytest.mark.skipif(os.geteuid() != 0, reason="SCHED_FIFO needs root (CAP_SYS_NICE); the refused case runs anywhere")
def test_reads_run_real_time_nested_and_the_policy_comes_back() -> None:
    reads = RealtimeReads()
    before = os.sched_getscheduler(0)
    with reads():
        assert os.sched_getscheduler(0) == os.SCHED_FIFO and os.sched_getparam(0).sched_priority == 1
        with reads():
            assert os.sched_getscheduler(0) == os.SCHED_FIFO
        assert os.sched_getscheduler(0) == os.SCHED_FIFO  # the inner read does not end the outer one
    assert os.sched_getscheduler(0) == before and reads.allowed is True
    assert "real-time priority" in reads.describe()


@pytest.mark.skipif(os.geteuid() != 0, reason="SCHED_FIFO needs root (CAP_SYS_NICE)")
def test_the_slower_tools_read_and_show_their_events_at_real_time_priority() -> None:
    """A reader with its fair share of one CPU fell behind the writers it traced and the ring
    buffer dropped their events (bench/README.md, "bench_load.py"): the poll and the lines it
    brings run real-time, and the policy comes back between polls."""
    seen: List[Tuple[str, int]] = []
    before = os.sched_getscheduler(0)

    def poll_events(_ringbuf: bool) -> None:
        seen.append(("poll", os.sched_getscheduler(0)))

    def show(_batch: List[object]) -> None:
        seen.append(("show", os.sched_getscheduler(0)))

    session = SimpleNamespace(stopped=False, _tick=lambda: None, backend=SimpleNamespace(poll_events=poll_events),
                              probe=SimpleNamespace(ringbuf=False), reading=RealtimeReads(), _batch=[{"op": 0}],
                              _on_batch=show)
    Session.poll_until_stopped(session, 0.05)  # type: ignore[arg-type]
    assert ("show", os.SCHED_FIFO) in seen and ("poll", os.SCHED_FIFO) in seen
    assert {policy for _what, policy in seen} == {os.SCHED_FIFO}
    assert os.sched_getscheduler(0) == before


def test_refused_reads_go_on_at_normal_priority_and_say_so(unprivileged: View) -> None:
    """As a user without CAP_SYS_NICE: the read still runs, once refused it is not asked again."""
    code = ("import os; from probes.runtime import RealtimeReads\n"
            "r = RealtimeReads()\n"
            "with r(): inside = os.sched_getscheduler(0)\n"
            "with r(): pass\n"
            "print(inside == os.SCHED_OTHER, r.allowed, r.describe())")
    res = unprivileged.run([str(unprivileged.python), "-c", code], unprivileged.repo, {})
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(
        "True False map reads: normal priority (SCHED_FIFO refused: no CAP_SYS_NICE)"), res.stdout

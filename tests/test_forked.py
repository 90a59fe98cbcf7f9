"""probes.forked: a child's answer arrives whole or is said missing, never waited for for ever.

What multiprocessing's pools got wrong, here on purpose: a child killed half-way through
sending its answer (the pool's reader thread then waited for the rest for ever), children
ending out of order, and a command leaving while children still work.
"""
from __future__ import annotations

import os
import signal
import time
from multiprocessing.context import ForkProcess
from typing import List

import pytest

from discover.errors import UserError
from probes.forked import Forked

#: an answer far larger than a pipe's buffer: its child blocks half-way through sending it
BIG = 16 << 20


def _blocked_in_write(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/wchan") as fh:
            return "pipe" in fh.read()
    except OSError:
        return False


def test_a_child_killed_half_way_through_its_answer_is_said(forked_children: List[ForkProcess]) -> None:
    with Forked(lambda size: b"x" * size, 1, lambda size: f"the answer of {size} bytes") as children:
        children.submit(BIG)
        deadline = time.monotonic() + 30
        while not _blocked_in_write(forked_children[0].pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _blocked_in_write(forked_children[0].pid), "the child never got to send its answer"
        os.kill(forked_children[0].pid, signal.SIGKILL)
        with pytest.raises(UserError, match=r"^the answer of 16777216 bytes ended without an answer "
                                            r"\(killed by SIGKILL\)$"):
            list(children.answers())


def test_answers_come_in_the_order_submitted(forked_children: List[ForkProcess]) -> None:
    """The first task ends last; two children at a time; a third waits for a free one."""
    with Forked(lambda pause: (time.sleep(pause), pause)[1], 2, str) as children:
        for pause in (0.6, 0.0, 0.1):
            children.submit(pause)
        assert list(children.answers()) == [0.6, 0.0, 0.1]
    assert [p.exitcode for p in forked_children] == [0, 0, 0]


def test_leaving_ends_the_children_still_working(forked_children: List[ForkProcess]) -> None:
    """An error (here a KeyboardInterrupt) while children work: they are stopped, not waited for."""
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with Forked(time.sleep, 2, str) as children:
            children.submit(60.0)
            children.submit(60.0)
            raise KeyboardInterrupt
    assert time.monotonic() - began < 30
    assert [p.exitcode for p in forked_children] == [128 + signal.SIGTERM] * 2

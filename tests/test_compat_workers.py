"""probes compat's package workers (probes.compat.analyse_packages) end, whatever stops them.

The moments a stop signal was lost with multiprocessing's Pool are here made to happen on
purpose, in this process: a signal while a worker is being forked, an error from one worker
while another analyses a real package. The command itself, signalled at the moments its
workers start and with a worker killed alone, is in tests/test_bad_inputs.py
(signal/compat-worker*).
"""
from __future__ import annotations

import os
import signal
import sys
import time
from multiprocessing.context import ForkProcess
from pathlib import Path
from typing import Any, Iterator, List

import pytest

from debian_kernels import ABI_61, ABI_612, kernel_dir
from discover.errors import Terminated, UserError
from probes.compat import analyse_packages
from probes.forked import drop_lost_stop
from probes.kernelpkg import Lookup

LOOKUP = Lookup.of({"nfs_file_read", "nfs_getattr"}, (), ["nfs"])
#: what "promptly" means here: a worker stopped ends its xz and exits in well under a second
PROMPT = 10.0


def _raise_terminated(signum: int, _frame: Any) -> None:
    raise Terminated(signum)


@pytest.fixture
def started(forked_children: List[ForkProcess], monkeypatch: pytest.MonkeyPatch,
            tmp_path: Path) -> Iterator[List[ForkProcess]]:
    """The workers analyse_packages forks, as they start; profiles cached in tmp_path (none is
    there: each package is analysed), SIGTERM raising Terminated as under the boundary."""
    monkeypatch.setenv("PROBEKIT_PROFILE_CACHE", str(tmp_path))
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield forked_children
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_signal_as_a_worker_is_forked_stops_it(started: List[ForkProcess], monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM as the first worker is forked (the parent had not yet recorded it, the worker
    had not yet set its signals up: with the Pool, a worker left running or a traceback):
    no second worker is started, the first is told to stop and ends on its own (143: it
    ended its xz), and the signal reaches the caller's handler."""
    start = ForkProcess.start

    def signalled(process: ForkProcess) -> None:
        start(process)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(ForkProcess, "start", signalled)
    began = time.monotonic()
    with pytest.raises(Terminated, match="SIGTERM"):
        analyse_packages([kernel_dir(ABI_612), kernel_dir(ABI_61)], LOOKUP, 2)
    assert time.monotonic() - began < PROMPT
    assert [p.exitcode for p in started] == [128 + signal.SIGTERM]


def test_a_workers_error_stops_the_others(started: List[ForkProcess], tmp_path: Path) -> None:
    """A package that is not one fails at once; the worker on a real package is stopped then,
    not waited for, and the error is the caller's, with the worker's traceback as its cause."""
    empty = tmp_path / "empty"
    empty.mkdir()
    began = time.monotonic()
    with pytest.raises(UserError, match="empty: no kernel image and no modules: not a Debian kernel package") as err:
        analyse_packages([empty, kernel_dir(ABI_612)], LOOKUP, 2)
    assert time.monotonic() - began < PROMPT
    assert "Traceback" in str(err.value.__cause__)
    assert [p.exitcode for p in started] == [0, 128 + signal.SIGTERM]


class _RaisesWhenGone:
    """An object whose __del__ raises, as a signal handler's exception does when it runs there."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __del__(self) -> None:
        raise self.exc


def test_a_stop_lost_in_a_finalizer_is_not_said(capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's Terminated raised inside a __del__ ends there: printed, it would be a second
    stderr line; the parent's SIGTERM stops the worker then. Anything else is printed as ever."""
    monkeypatch.setattr(sys, "unraisablehook", drop_lost_stop)
    _RaisesWhenGone(Terminated(signal.SIGTERM))
    _RaisesWhenGone(ValueError("a bug in a __del__"))
    err = capsys.readouterr().err
    assert "a bug in a __del__" in err and "Terminated" not in err

"""Work shared out to forked children that end, whatever stops them or the command.

Why not multiprocessing's Pool or concurrent.futures' ProcessPoolExecutor: both share one
result pipe between their workers and read it from a thread. A worker killed while it sends
(a SIGTERM to the command's process group, the OOM killer) leaves half a message there, and
that thread, and then the command's exit, waits for the rest for ever; a worker killed while
it waits for work holds the task queue's lock; their threads take signals the main thread
then never sees. Here each task is one child forked with the stop signals blocked, with its
own answer pipe and nothing else shared: a child that ends without a whole answer is an
EOF on its pipe, said as one line, and the parent's stop signals are its ordinary handlers (a
Terminated, a KeyboardInterrupt) with every child ended on the way out; inside this module's
own steps they are only noted, and raised at the step's end (raised from the handler, one is
lost when it runs inside a finalizer, such as the one that closes a reaped child's pipes).
A task's input is the parent's memory at the fork: nothing is sent to a child, only its
answer back.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Generic, Iterator, List, Optional, Tuple, TypeVar

from discover.errors import STOP_SIGNALS, Terminated, UserError, run_cleanups, stop_signals_blocked

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess

Task = TypeVar("Task")
#: how long a child told to stop has to end its own children (an xz) before it is killed
STOP_GRACE = 5.0
#: the parent's longest wait for its children before it looks at the stop signals it noted
WAIT_STEP = 0.2


def _stop_child(signum: int, _frame: Any) -> None:
    """A child's SIGTERM and SIGHUP: unwind it, as the command's own handler does."""
    raise Terminated(signum)


def drop_lost_stop(unraisable: Any) -> None:
    """A child's sys.unraisablehook. A Terminated its handler raised inside a __del__ or a
    generator's finalization ends there, printed as "Exception ignored" (a stray stderr line);
    it is dropped unsaid: the parent, which the group's signal reached too, sends its own
    SIGTERM next (and SIGKILL if that one is lost as well)."""
    if not isinstance(unraisable.exc_value, Terminated):
        sys.__unraisablehook__(unraisable)


def _child(work: Callable[[Any], Any], task: Any, answer: "Connection") -> None:
    """In a child forked with the stop signals blocked: run `work(task)`, send back
    (True, result) or (False, the exception with its traceback), then exit. A SIGTERM (the
    group's, or the parent's ending it) unwinds it as it does the command, running its undo
    steps (its xz), and it exits without a word: the parent says what happened. Ctrl-C is the
    parent's, which ends it then: a terminal sends SIGINT to the whole group."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _stop_child)
    sys.unraisablehook = drop_lost_stop
    reply: Optional[Tuple[bool, Any]] = None
    code = 128 + signal.SIGTERM  # stopped, unless it gets to an answer
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # one sent since the fork is raised here
        try:
            reply = (True, work(task))
        except Exception as exc:
            from multiprocessing.pool import ExceptionWithTraceback
            reply = (False, ExceptionWithTraceback(exc, exc.__traceback__))
        code = 0
    except Terminated as exc:
        # the parent's SIGTERM follows the group's: it waits, and what the unwinding left (a
        # generator reading a package, its xz) is finalized when `exc` goes, below, unhurried
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        code = 128 + exc.signum
    finally:
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # its cleanup and answer are not cut short
            problems = run_cleanups()
            if reply is not None:
                answer.send((False, UserError("; ".join(problems))) if problems and reply[0] else reply)
        finally:
            os._exit(code)  # never back into the parent's code it was forked from, nor a traceback


@contextlib.contextmanager
def stops_noted() -> Iterator[List[int]]:
    """The stop signals that come meanwhile noted in the list yielded, then raised through the
    handlers they had (ignored ones stay ignored). Only the main thread has handlers to swap."""
    came: List[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield came
        return
    handlers = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    for signum, handler in handlers.items():
        if handler is not signal.SIG_IGN:
            signal.signal(signum, lambda number, _frame: came.append(number))
    try:
        yield came
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        if came:
            signal.raise_signal(came[0])


def ended(process: "BaseProcess") -> str:
    """How a child that sent no answer ended, for the message."""
    code = process.exitcode
    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}"
    if code is not None and code > 128 and code - 128 in STOP_SIGNALS:
        return f"stopped by {signal.Signals(code - 128).name}"
    return f"exit status {code}"


class Forked(Generic[Task]):
    """`work(task)` for each task submitted, in at most `limit` children at a time, one per
    task; answers in the order submitted. A child's exception is raised here (its traceback
    as the cause), as is a UserError naming `what(task)` for a child that ended without an
    answer; leaving the `with` block ends every child still running."""

    def __init__(self, work: Callable[[Task], Any], limit: int, what: Callable[[Task], str]) -> None:
        import multiprocessing
        self._fork = multiprocessing.get_context("fork")
        self._work, self._limit, self._what = work, max(1, limit), what
        self._waiting: List[Tuple[int, Task]] = []
        self._running: Dict["Connection", Tuple["BaseProcess", int, Task]] = {}
        self._answers: Dict[int, Any] = {}
        self._submitted = 0

    def __enter__(self) -> "Forked[Task]":
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.close()

    def submit(self, task: Task) -> None:
        """Queue `task`; a child starts at once if one may, and children done are collected."""
        self._waiting.append((self._submitted, task))
        self._submitted += 1
        self._step(0.0)

    def answers(self) -> Iterator[Any]:
        """Every task's answer, in the order submitted, waiting for each."""
        for index in range(self._submitted):
            while index not in self._answers:
                self._step(None)
            yield self._answers.pop(index)

    def _step(self, timeout: Optional[float]) -> None:
        """Start children while there is room, then collect the answers ready within `timeout`
        (None: at least one)."""
        from multiprocessing.connection import wait
        with stops_noted() as came:
            while self._waiting and len(self._running) < self._limit and not came:
                index, task = self._waiting.pop(0)
                reader, writer = self._fork.Pipe(duplex=False)
                with stop_signals_blocked():  # the child sets its handlers before it takes one
                    process = self._fork.Process(target=_child, args=(self._work, task, writer))
                    process.start()
                    self._running[reader] = (process, index, task)
                writer.close()  # the child's end: its exit is then the pipe's end here
            deadline = None if timeout is None else time.monotonic() + timeout
            while self._running and not came:
                left = WAIT_STEP if deadline is None else min(WAIT_STEP, max(0.0, deadline - time.monotonic()))
                ready = wait(list(self._running), timeout=left)
                for reader in ready:
                    self._collect(reader)
                if ready or (deadline is not None and time.monotonic() >= deadline):
                    return

    def _collect(self, reader: "Connection") -> None:
        """A child's answer, read whole; the child reaped."""
        process, index, task = self._running[reader]
        try:
            ok, value = reader.recv()
        except (EOFError, OSError):  # no answer, or half of one ("got end of file during message")
            ok, value = False, None
        process.join()
        del self._running[reader]
        reader.close()
        if not ok:
            raise value or UserError(f"{self._what(task)} ended without an answer ({ended(process)})")
        self._answers[index] = value

    def close(self) -> None:
        """End the children still running (SIGTERM, then SIGKILL after STOP_GRACE), signals
        held meanwhile: a second Ctrl-C cannot leave one behind."""
        with stop_signals_blocked():
            running = [process for process, _index, _task in self._running.values()]
            for process in running:
                if process.exitcode is None:
                    process.terminate()  # it ends its own children on the way out
            deadline = time.monotonic() + STOP_GRACE
            for process in running:
                process.join(max(0.0, deadline - time.monotonic()))
                if process.exitcode is None:
                    process.kill()
                    process.join()
            for reader in self._running:
                reader.close()
            self._running.clear()
            self._waiting.clear()

"""Stall reports from operations in flight: the file a stuck thread's system call names,
RPCs folded into the operation that waits for them, and when a stall line is due.

The /proc reading is checked on real blocked processes of this host (a FIFO open with no
writer blocks in openat, a read of an empty FIFO in read), the same way a thread stuck
on an NFS server is blocked in its system call.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from probes.inflight import (InFlight, Stall, StallReporter, file_of, stalls, still_in_flight, thread_comm,
                             thread_tgid)

pytestmark = pytest.mark.skipif(os.uname().machine != "x86_64", reason="system call numbers are x86_64's")


def _blocked(code: str, fifo: Path, *more: Path) -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen([sys.executable, "-c", code, str(fifo), *map(str, more)])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # until it sleeps in the system call
            syscall = Path(f"/proc/{proc.pid}/syscall").read_text()
            if not syscall.startswith("running") and syscall.split()[0] in ("0", "257"):
                break
            time.sleep(0.05)
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "stuck-file.fifo"
    os.mkfifo(path)
    return path


def test_file_of_a_thread_blocked_opening_a_path(fifo: Path) -> None:
    for proc in _blocked("import sys; open(sys.argv[1])", fifo):
        assert file_of(proc.pid, proc.pid) == "stuck-file.fifo"
        assert thread_comm(proc.pid, proc.pid).startswith("python")


def test_file_of_a_thread_blocked_reading_a_descriptor(fifo: Path) -> None:
    code = "import os, sys; fd = os.open(sys.argv[1], os.O_RDWR); os.read(fd, 1)"
    for proc in _blocked(code, fifo):
        assert file_of(proc.pid, proc.pid) == "stuck-file.fifo"


def test_thread_tgid() -> None:
    """The probe keeps thread ids only: a worker thread maps back to its process."""
    import threading
    seen: list = []
    done = threading.Event()
    worker = threading.Thread(target=lambda: (seen.append(threading.get_native_id()), done.wait(10)))
    worker.start()
    while not seen:
        time.sleep(0.01)
    try:
        assert seen[0] != os.getpid() and thread_tgid(seen[0]) == os.getpid()
    finally:
        done.set()
        worker.join()
    proc = subprocess.Popen(["sleep", "5"])
    try:
        assert thread_tgid(proc.pid) == proc.pid
    finally:
        proc.kill()
        proc.wait()
    assert thread_tgid(proc.pid) == 0


def test_file_of_a_running_or_gone_thread_is_unknown() -> None:
    assert file_of(os.getpid(), os.getpid()) == "?"  # this thread is running, not in a call
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert file_of(proc.pid, proc.pid) == "?"
    assert file_of(os.getpid(), os.getpid(), machine="aarch64") == "?"


def test_a_threads_rpc_is_folded_into_its_operation_and_kworker_rpcs_stand_alone(fifo: Path) -> None:
    for proc in _blocked("import sys; open(sys.argv[1])", fifo):
        now = time.monotonic_ns()
        entries = [
            InFlight(proc.pid, proc.pid, "create", now - 31 * 10**9, "", ""),
            InFlight(proc.pid, proc.pid, "rpc", now - 30 * 10**9, "python3", "CREATE", None),
            InFlight(os.getpid(), os.getpid(), "rpc", now - 29 * 10**9, "kworker/u2:1", "WRITE", None),
            InFlight(os.getpid(), os.getpid(), "rpc", now - 10**8, "kworker/u2:1", "GETATTR", None),
        ]
        found = stalls(entries, now, 10**9)
        assert [(s.op, s.rpc, s.file) for s in found] == [("create", "CREATE", "stuck-file.fifo"),
                                                          ("rpc", "WRITE", "WRITE")]
        assert found[0].pid == proc.pid and found[0].comm.startswith("python") and found[0].age_ns == 31 * 10**9
        # a thread slot carries no process: it is read from /proc for the old entries only
        slot = [InFlight(proc.pid, 0, "create", now - 31 * 10**9, "", "")]
        assert [(s.pid, s.file) for s in stalls(slot, now, 10**9)] == [(proc.pid, "stuck-file.fifo")]
        assert [(s.pid, s.file) for s in stalls(slot, now, 10**9, describe=False)] == [(proc.pid, "?")]
    # a slot whose thread has exited is stale (a missed return), not a stall
    assert stalls([InFlight(proc.pid, proc.pid, "read", now - 60 * 10**9, "", "")], now, 0) == []


def test_a_threads_rpc_outside_the_traced_ops_names_its_file(fifo: Path) -> None:
    """With the default ops a create is not traced, only the RPC it waits in: that RPC's line
    names the file the stuck thread's system call names, and keeps the sunrpc client id for
    the exporter's per-mount series (describe=False reads no /proc file)."""
    for proc in _blocked("import sys; open(sys.argv[1])", fifo):
        now = time.monotonic_ns()
        entries = [InFlight(proc.pid, proc.pid, "rpc", now - 30 * 10**9, "python3", "CREATE", 7)]
        found = stalls(entries, now, 10**9)
        assert [(s.op, s.pid, s.rpc, s.file, s.client_id) for s in found] == \
            [("rpc", proc.pid, "CREATE", "stuck-file.fifo", 7)]
        assert [(s.file, s.client_id) for s in stalls(entries, now, 0, describe=False)] == [("CREATE", 7)]


def test_an_operation_that_ends_while_its_file_is_read_is_not_a_stall(fifo: Path) -> None:
    """/proc is read after the map: an RPC that completes in between leaves its thread in its
    next system call, whose file the line would name; the map read again drops it."""
    second = fifo.with_name("next-file.fifo")
    os.mkfifo(second)
    for proc in _blocked("import sys; open(sys.argv[1]); open(sys.argv[2])", fifo, second):
        now = time.monotonic_ns()
        entries = [InFlight(proc.pid, proc.pid, "rpc", now - 30 * 10**9, "python3", "CREATE", 7)]
        assert [s.file for s in stalls(entries, now, 10**9)] == ["stuck-file.fifo"]
        os.close(os.open(fifo, os.O_WRONLY))  # the first open returns: the thread moves on
        deadline = time.monotonic() + 10
        while file_of(proc.pid, proc.pid) != "next-file.fifo" and time.monotonic() < deadline:
            time.sleep(0.05)
        found = stalls(entries, now, 10**9)
        assert [s.file for s in found] == ["next-file.fifo"]  # what a late /proc read names
        assert still_in_flight(found, []) == []
        assert still_in_flight(found, entries) == found


def test_stall_lines_when_crossing_then_every_interval() -> None:
    reporter = StallReporter(min_age_ns=10**9, interval_s=10)
    stall = Stall(7, 7, "dd", "write", 5, 2 * 10**9, "f", None, None)
    t = 100 * 10**9
    assert reporter.due([stall], t) == [stall]
    assert reporter.due([stall], t + 9 * 10**9) == []
    assert reporter.due([stall], t + 10 * 10**9) == [stall]
    other = stall._replace(start_ns=6)  # the same thread's next operation is a new stall
    assert reporter.due([other], t + 11 * 10**9) == [other]
    assert reporter.due([stall], t + 12 * 10**9) == [stall]  # forgotten once it was gone

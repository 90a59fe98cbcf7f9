"""The lab's agent client waits out a guest that stops answering for a while, and a forked
child does not hold its connection.

A real qemu-guest-agent (Debian's, the one in every lab image) listens on a unix socket
on the host; SIGSTOP holds it as a host under load held a CI guest's vCPUs for 30 s. Like
QEMU's chardev in the lab, it serves one client at a time.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterator, List

import pytest

from labs.vm.agent import AgentUnreachable, GuestAgent, connect, run_command


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[subprocess.Popen]:
    sock = tmp_path / "qga.sock"
    proc = subprocess.Popen(["qemu-ga", "-m", "unix-listen", "-p", str(sock), "-f", str(tmp_path / "qga.pid"),
                             "-t", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not sock.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "qemu-ga did not start"
            time.sleep(0.05)
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_a_command_waits_for_an_agent_held_up_for_a_while(agent: subprocess.Popen, tmp_path: Path) -> None:
    polls: List[float] = []
    os.kill(agent.pid, signal.SIGSTOP)
    threading.Timer(3.0, os.kill, (agent.pid, signal.SIGCONT)).start()
    started = time.monotonic()
    result = run_command(tmp_path / "qga.sock", ["/bin/echo", "answered"], timeout=30,
                         on_poll=lambda: polls.append(time.monotonic()), reply_timeout=1.0, patience=20.0)
    assert result.exit_code == 0 and result.stdout == "answered\n"
    assert time.monotonic() - started >= 3.0
    assert polls and polls[0] - started < 3.0, "the guest's health was not checked while it was silent"


def test_an_agent_silent_past_the_patience_is_an_error(agent: subprocess.Popen, tmp_path: Path) -> None:
    os.kill(agent.pid, signal.SIGSTOP)
    started = time.monotonic()
    with pytest.raises(AgentUnreachable, match="timed out"):
        run_command(tmp_path / "qga.sock", ["/bin/true"], timeout=30, reply_timeout=0.5, patience=2.0)
    assert 2.0 <= time.monotonic() - started < 10.0


def test_a_dead_guest_ends_the_wait_at_once(agent: subprocess.Popen, tmp_path: Path) -> None:
    """on_poll is where the lab raises for a panicked kernel or an exited QEMU."""
    def guest_died() -> None:
        raise RuntimeError("QEMU exited")

    os.kill(agent.pid, signal.SIGSTOP)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="QEMU exited"):
        run_command(tmp_path / "qga.sock", ["/bin/true"], timeout=30, on_poll=guest_died,
                    reply_timeout=0.5, patience=60.0)
    assert time.monotonic() - started < 5.0


def test_a_child_forked_while_a_connection_was_open_does_not_hold_the_agent(agent: subprocess.Popen,
                                                                           tmp_path: Path) -> None:
    """In CI a unit test forks beside the lab's threads: a child that kept a copy of an open
    connection kept the agent from taking the next one until it exited (seen: every connect of
    a 6.12 job failing with EAGAIN for the whole patience)."""
    first = GuestAgent(tmp_path / "qga.sock", timeout=2.0)
    child = os.fork()
    if child == 0:
        time.sleep(30)
        os._exit(0)
    try:
        first.close()
        with connect(tmp_path / "qga.sock", reply_timeout=1.0, patience=5.0) as second:
            assert second.call("guest-ping") == {}
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)

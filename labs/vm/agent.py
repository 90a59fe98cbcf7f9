"""A qemu-guest-agent client over the virtio-serial unix socket: commands without any network.

Each operation opens the socket, resynchronises with guest-sync-delimited (the agent may
hold a half-read request from an earlier client) and closes again, so several host
processes (`labs run` in two terminals) take turns instead of colliding.
"""
from __future__ import annotations

import base64
import json
import os
import random
import socket
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from labs.vm.base import CommandResult

#: a guest's command environment: the lab's tools, the project from the 9p share
GUEST_ENV = [
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME=/root",
    "LANG=C.UTF-8",
    "TERM=dumb",
    "COLUMNS=160",
    "PYTHONPATH=/opt/probekit",
    "PYTHONDONTWRITEBYTECODE=1",
]
CHUNK = 1 << 18
#: how long a guest that stopped answering is waited for while its QEMU lives and its console shows no panic
PATIENCE_S = 150.0


class AgentError(Exception):
    """The agent did not answer, or answered with an error."""


class AgentTimeout(AgentError):
    """A guest command outlived its timeout (it was sent SIGKILL)."""


class AgentUnreachable(AgentError):
    """Connecting or resynchronising failed: no request was sent, so trying again is safe."""


#: the connections open in this process. QEMU's chardev (and qemu-ga's unix-listen) serves one
#: client at a time and takes the next only once the last copy of a connection is closed: a
#: child forked while one was open (in CI a unit test forks beside the lab's threads) would keep
#: every later connect waiting in the listen queue (EAGAIN) for as long as it lives.
_OPEN: "weakref.WeakSet[GuestAgent]" = weakref.WeakSet()


def _close_in_child() -> None:
    """Drop a forked child's copies of the parent's connections (the parent's stay open)."""
    for agent in list(_OPEN):
        agent.sock.close()
    _OPEN.clear()


os.register_at_fork(after_in_child=_close_in_child)


class GuestAgent:
    """One connection to one guest's agent."""

    def __init__(self, path: Path, timeout: float = 10.0) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        _OPEN.add(self)
        self.sock.settimeout(timeout)
        self.buffer = b""
        try:
            self.sock.connect(str(path))
            self._sync()
        except OSError as exc:
            self.sock.close()
            raise AgentUnreachable(f"guest agent at {path}: {exc}") from exc

    def close(self) -> None:
        _OPEN.discard(self)
        self.sock.close()

    def __enter__(self) -> "GuestAgent":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _sync(self) -> None:
        token = random.randrange(1, 1 << 30)
        self.sock.sendall(b"\xff" + json.dumps({"execute": "guest-sync-delimited",
                                                 "arguments": {"id": token}}).encode() + b"\n")
        while True:
            data = self._recv()
            if b"\xff" in data:
                self.buffer = data.split(b"\xff")[-1]
                break
        while self._read_message().get("return") != token:
            pass

    def _recv(self) -> bytes:
        data = self.sock.recv(1 << 20)
        if not data:
            raise AgentError(f"guest agent at {self.path} closed the connection")
        return data

    def _read_message(self) -> Dict[str, Any]:
        decoder = json.JSONDecoder()
        while True:
            text = self.buffer.lstrip(b"\xff \r\n").decode("utf-8", "replace")
            if text:
                try:
                    message, end = decoder.raw_decode(text)
                    self.buffer = text[end:].encode()
                    return message
                except json.JSONDecodeError:
                    pass
            self.buffer += self._recv()

    def call(self, command: str, **arguments: Any) -> Any:
        """Execute one agent command and return its 'return' value."""
        request: Dict[str, Any] = {"execute": command}
        if arguments:
            request["arguments"] = arguments
        self.sock.sendall(json.dumps(request).encode() + b"\n")
        reply = self._read_message()
        if "error" in reply:
            raise AgentError(f"{command}: {reply['error'].get('desc', reply['error'])}")
        return reply.get("return")

    # -- commands ---------------------------------------------------------------------------

    def start(self, argv: List[str], stdin: Optional[bytes] = None) -> int:
        """Start argv as root in the guest (output captured); returns the guest pid."""
        args: Dict[str, Any] = {"path": argv[0], "arg": argv[1:], "env": GUEST_ENV, "capture-output": True}
        if stdin is not None:
            args["input-data"] = base64.b64encode(stdin).decode()
        return int(self.call("guest-exec", **args)["pid"])

    def status(self, pid: int) -> Optional[CommandResult]:
        """The result of a started command, or None while it runs."""
        status = self.call("guest-exec-status", pid=pid)
        if not status.get("exited"):
            return None
        code = status.get("exitcode")
        if code is None:  # killed by a signal
            code = 128 + int(status.get("signal", 0))
        return CommandResult(code, _decode(status.get("out-data")), _decode(status.get("err-data")))

    def kill(self, pid: int) -> None:
        self.call("guest-exec", path="/bin/kill", arg=["-KILL", str(pid)], env=GUEST_ENV)


    def write_file(self, remote: str, data: bytes) -> None:
        handle = self.call("guest-file-open", path=remote, mode="wb")
        try:
            for start in range(0, len(data), CHUNK):
                self.call("guest-file-write", handle=handle,
                          **{"buf-b64": base64.b64encode(data[start:start + CHUNK]).decode()})
        finally:
            self.call("guest-file-close", handle=handle)

    def read_file(self, remote: str) -> bytes:
        handle = self.call("guest-file-open", path=remote, mode="rb")
        parts: List[bytes] = []
        try:
            while True:
                chunk = self.call("guest-file-read", handle=handle, count=CHUNK)
                parts.append(base64.b64decode(chunk.get("buf-b64", "")))
                if chunk.get("eof") or not chunk.get("count"):
                    break
        finally:
            self.call("guest-file-close", handle=handle)
        return b"".join(parts)


def connect(socket_path: Path, on_poll: Optional[Callable[[], None]] = None,
            reply_timeout: float = 30.0, patience: float = PATIENCE_S) -> GuestAgent:
    """A connected agent, trying again while on_poll finds the guest alive.

    A guest whose vCPUs the host held up (seen in CI: the guest's clocksource watchdog
    reported a 30 s 'Long readout interval') answers late, not never; one missed sync
    must not fail every check of that boot.
    """
    deadline = time.monotonic() + patience
    while True:
        try:
            return GuestAgent(socket_path, timeout=reply_timeout)
        except AgentUnreachable:
            if time.monotonic() > deadline:
                raise
            if on_poll is not None:
                on_poll()
            time.sleep(1.0)


def run_command(socket_path: Path, argv: List[str], timeout: float,
                on_poll: Optional[Callable[[], None]] = None, stdin: Optional[bytes] = None,
                reply_timeout: float = 30.0, patience: float = PATIENCE_S) -> CommandResult:
    """Run argv in the guest and wait for it, holding the agent only briefly per poll.

    The agent serves one client at a time: a long command must not lock out a second
    `labs run` (or the console watcher's caller) for its whole duration.
    """
    with connect(socket_path, on_poll, reply_timeout, patience) as agent:
        pid = agent.start(argv, stdin)
    deadline = time.monotonic() + timeout
    pause = 0.05
    while True:
        with connect(socket_path, on_poll, reply_timeout, patience) as agent:
            result = agent.status(pid)
            if result is not None:
                return result
            if time.monotonic() > deadline:
                agent.kill(pid)
                raise AgentTimeout(f"command did not finish in {timeout:.0f} s: {' '.join(argv)[:120]}")
        if on_poll is not None:
            on_poll()
        time.sleep(pause)
        pause = min(pause * 2, 1.0)


def _decode(b64: Optional[str]) -> str:
    return base64.b64decode(b64).decode("utf-8", "replace") if b64 else ""

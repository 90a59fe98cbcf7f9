"""`down` also stops guests that an interrupted earlier process left running.

A killed test run leaves its QEMU up with no process that knows its pid; the next run's
`down` (before `up`) must find it by the `-name` in its argv, this lab's and no other's,
whatever state.json says (a crash can leave it unreadable). Real processes stand in for
QEMU here: what is checked is the pid bookkeeping, not QEMU.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from labs.vm.qemu import QemuLab

SLEEPER = "import time; time.sleep(120)"


@pytest.mark.parametrize("state", ["recorded", "not-json", "absent"])
def test_down_stops_a_guest_left_by_an_earlier_process(state: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROBEKIT_CACHE", str(tmp_path))
    left = subprocess.Popen([sys.executable, "-c", SLEEPER, "-name", "probekit-orphan-lab"])
    stranger = subprocess.Popen([sys.executable, "-c", SLEEPER, "-name", "probekit-other-lab"])
    mention = subprocess.Popen([sys.executable, "-c", SLEEPER, "probekit-orphan-lab"])  # e.g. a grep for it
    try:
        lab = QemuLab(kernel="6.1", topology="single", name="orphan", ssh=False)
        lab.state_dir.mkdir(parents=True)
        # an earlier process recorded both pids (the second as if reused by another program)
        text = {"recorded": json.dumps({"pids": {"lab": left.pid, "server": stranger.pid}}), "not-json": "{"}
        if state in text:
            (lab.state_dir / "state.json").write_text(text[state])
        lab.down()
        assert left.wait(timeout=10) is not None
        assert stranger.poll() is None, "a process without this lab's -name was killed"
        assert mention.poll() is None, "a process naming this lab's guest, not as its -name, was killed"
        assert not (lab.state_dir / "state.json").exists()
    finally:
        for proc in (left, stranger, mention):
            proc.kill()
            proc.wait()


def test_a_stopped_qemu_is_reported_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A guest whose QEMU is stopped (SIGSTOP) cannot answer: the lab says so at the next
    command instead of waiting out the agent's patience for a slow guest; continued, it is
    a guest like any other."""
    import signal
    import time

    from labs.vm.console import GuestFailure
    monkeypatch.setenv("PROBEKIT_CACHE", str(tmp_path))
    guest = subprocess.Popen([sys.executable, "-c", SLEEPER])
    try:
        lab = QemuLab(kernel="6.1", topology="single", name="stopped", ssh=False)
        lab.pids = {"lab": guest.pid}
        os.kill(guest.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while True:
            try:
                lab._check_node("lab")
            except GuestFailure as exc:
                assert "is stopped (SIGSTOP" in str(exc) and "\n" not in str(exc)
                break
            assert time.monotonic() < deadline, "a stopped QEMU was not noticed"
            time.sleep(0.05)
        os.kill(guest.pid, signal.SIGCONT)
        time.sleep(0.2)
        lab._check_node("lab")
    finally:
        guest.kill()
        guest.wait()


@pytest.mark.parametrize("prints_for, verdict", [(2.0, "console silent for 1 s"), (6.0, "still booting after 4 s")])
def test_a_slow_boot_waits_while_the_console_prints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    prints_for: float, verdict: str) -> None:
    """Readiness waits on evidence, not the host's speed: a guest that keeps printing is
    booting however long it takes; silence for the timeout is a stuck guest, and so is a boot
    that prints past BOOT_HANG_FACTOR timeouts (systemd's spinner of a hung job); one line each."""
    import threading
    import time

    import labs.vm.qemu
    from labs.vm.console import GuestFailure
    monkeypatch.setenv("PROBEKIT_CACHE", str(tmp_path))
    monkeypatch.setattr(labs.vm.qemu, "READY_POLL_S", 0.05)
    guest = subprocess.Popen([sys.executable, "-c", SLEEPER])
    lab = QemuLab(kernel="6.1", topology="single", name="slow", ssh=False)
    lab.nodes = lab.plan_nodes()
    lab.pids = {"lab": guest.pid}
    lab.state_dir.mkdir(parents=True)
    log = lab.console_log("lab")
    started = time.monotonic()

    def boot_messages() -> None:
        with open(log, "a") as console:
            while time.monotonic() < started + prints_for:
                console.write("[    1.0] still booting\n")
                console.flush()
                time.sleep(0.1)

    printer = threading.Thread(target=boot_messages)
    printer.start()
    try:
        with pytest.raises(GuestFailure) as failed:
            lab._wait_ready(1.0)
        assert time.monotonic() - started >= min(prints_for, 4.0), "failed while the console was still printing"
        assert f"not ready: {verdict}" in str(failed.value) and "\n" not in str(failed.value)
    finally:
        printer.join()
        guest.kill()
        guest.wait()


def test_a_listening_link_socket_is_seen_without_connecting_to_it() -> None:
    """The pair's client QEMU starts once the server's QEMU listens (its socket netdev takes one
    peer: a test connection would take the client's place), read from /proc/net/tcp."""
    import socket

    from labs.vm.qemu import tcp_listening
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        port = server.getsockname()[1]
        assert not tcp_listening(port)
        server.listen(1)
        assert tcp_listening(port)
    assert not tcp_listening(port)


def test_a_fleet_is_saved_reattached_and_taken_down_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A three-guest lab's state names every guest, with its address and link port; a later
    process (`labs down`) reattaches to all three and stops each."""
    from labs.vm.images import ImageInfo
    monkeypatch.setenv("PROBEKIT_CACHE", str(tmp_path))
    lab = QemuLab(kernel="7.3", topology="fleet", name="fleet", ssh=False)
    lab.image = ImageInfo(key="test", suite="trixie", kernel_release="7.3.0-test-amd64", directory=tmp_path,
                          rootfs=tmp_path / "rootfs.qcow2", vmlinuz=tmp_path / "vmlinuz", initrd=tmp_path / "initrd.img",
                          ssh_private_key=tmp_path / "key", ssh_public_key=tmp_path / "key.pub", packages=[])
    lab.nodes = lab.plan_nodes()
    lab.state_dir.mkdir(parents=True)
    guests = {node.name: subprocess.Popen([sys.executable, "-c", SLEEPER, "-name", lab.qemu_name(node.name)])
              for node in lab.nodes}
    try:
        lab.pids = {name: guest.pid for name, guest in guests.items()}
        lab._save()
        again = QemuLab.attach("fleet", progress=lambda _line: None)
        assert again.nodes == lab.nodes and [n.link_address for n in again.nodes] == ["10.77.0.1", "10.77.0.2",
                                                                                     "10.77.0.3"]
        assert again.status() == {"server": "running", "client-a": "running", "client-b": "running"}
        again.down()
        for guest in guests.values():
            guest.wait(timeout=10)
        assert not (lab.state_dir / "state.json").exists()
    finally:
        for guest in guests.values():
            if guest.poll() is None:
                guest.kill()
                guest.wait()

"""Start virtlogd and libvirtd when nothing else does (no systemd on lab hosts and CI).

Idempotent: a daemon whose control socket answers is left alone, so a host whose
init system already runs libvirt is not touched. Before starting libvirtd we make
sure no NAT/routed/bridged libvirt network is set to autostart, because libvirtd
would bring it up at once and that breaks the project's network rule.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import List, NamedTuple

from discover.errors import UserError

RUN_DIR = Path("/run")
NETWORKS_DIR = Path("/etc/libvirt/qemu/networks")
#: Written when probekit started the daemons itself, so `down` may stop them again.
MARKER = Path("/run/probekit/libvirt-started-by-probekit")
KVM_DEVICE = Path("/dev/kvm")
#: /dev/kvm's owner and mode before probekit gave it udev's (restored with the daemons)
KVM_MODE_MARKER = Path("/run/probekit/kvm-mode-before-probekit")


class Daemon(NamedTuple):
    name: str  # executable name, also the pid file stem
    sock: Path  # control socket that answers once the daemon is ready

    @property
    def pid_file(self) -> Path:
        return RUN_DIR / f"{self.name}.pid"


VIRTLOGD = Daemon("virtlogd", RUN_DIR / "libvirt" / "virtlogd-sock")
LIBVIRTD = Daemon("libvirtd", RUN_DIR / "libvirt" / "libvirt-sock")


def socket_answers(path: Path) -> bool:
    """True when a unix socket accepts a connection (a stale socket file does not)."""
    if not path.exists():
        return False
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(2.0)
    try:
        sock.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        sock.close()


def _pid_alive(pid_file: Path) -> int:
    """The pid recorded in a pid file when that process still lives, else 0."""
    try:
        pid = int(pid_file.read_text().split()[0])
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError, IndexError):
        return 0


def autostarted_forwarding_networks(networks_dir: Path = NETWORKS_DIR) -> List[Path]:
    """Autostart links of networks that would create a bridge or NAT on the host."""
    autostart = networks_dir / "autostart"
    if not autostart.is_dir():
        return []
    found = []
    for link in sorted(autostart.glob("*.xml")):
        try:
            root = ET.parse(link).getroot()
        except (OSError, ET.ParseError):
            found.append(link)  # unreadable: treat as unsafe rather than guess
            continue
        # An isolated network (no <forward>) still creates a host bridge: refuse it too.
        if root.find("bridge") is not None or root.find("forward") is not None:
            found.append(link)
    return found


def _start(daemon: Daemon, timeout: float = 30.0) -> None:
    exe = shutil.which(daemon.name) or f"/usr/sbin/{daemon.name}"
    if not os.path.exists(exe):
        raise UserError(f"{daemon.name} is not installed: run `bash scripts/setup` "
                        "(installs libvirt-daemon-system)")
    proc = subprocess.run([exe, "-d"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise UserError(f"{daemon.name} -d failed: {proc.stderr.strip() or proc.returncode}")
    deadline = time.monotonic() + timeout
    while not socket_answers(daemon.sock):
        if time.monotonic() > deadline:
            raise UserError(f"{daemon.name} started but {daemon.sock} does not answer "
                            f"after {timeout:.0f} s")
        time.sleep(0.2)


def kvm_device_as_udev_sets_it() -> None:
    """root:kvm 0660 on a /dev/kvm that no udev set up (root:root 0600 on this host).

    libvirt probes QEMU's capabilities as root, with KVM, then checks the cache against
    whether its QEMU user (libvirt-qemu, group kvm) may open /dev/kvm: on 0600 it may not,
    so every call found the cache outdated and probed again, and each `virsh define` took
    55 s (vagrant up defines a domain twice). Debian's udev rule gives kvm 0660; the
    guests stay TCG (the Vagrantfile asks for domain type qemu)."""
    try:
        import grp
        st, kvm_gid = KVM_DEVICE.stat(), grp.getgrnam("kvm").gr_gid
    except (OSError, KeyError):
        return
    if (st.st_uid, st.st_gid, st.st_mode & 0o777) != (0, 0, 0o600):
        return
    KVM_MODE_MARKER.parent.mkdir(parents=True, exist_ok=True)
    KVM_MODE_MARKER.write_text(f"{st.st_uid} {st.st_gid} {st.st_mode & 0o777:o}\n")
    os.chown(KVM_DEVICE, 0, kvm_gid)
    os.chmod(KVM_DEVICE, 0o660)


def restore_kvm_device() -> None:
    """Give /dev/kvm back the owner and mode kvm_device_as_udev_sets_it found."""
    try:
        uid, gid, mode = KVM_MODE_MARKER.read_text().split()
    except (OSError, ValueError):
        return
    try:
        os.chown(KVM_DEVICE, int(uid), int(gid))
        os.chmod(KVM_DEVICE, int(mode, 8))
    except OSError:
        pass
    KVM_MODE_MARKER.unlink(missing_ok=True)


def ensure_daemons() -> List[str]:
    """Make virtlogd and libvirtd answer; return the names of those started here."""
    if os.geteuid() != 0:
        raise UserError("the vagrant lab needs root (it uses the system libvirt daemon)")
    started = []
    for daemon in (VIRTLOGD, LIBVIRTD):
        if socket_answers(daemon.sock):
            continue
        if daemon is LIBVIRTD:
            for link in autostarted_forwarding_networks():
                # libvirtd would start this bridge/NAT network right away: never here.
                print(f"labs: disabling autostart of libvirt network {link.stem} "
                      "(bridge/NAT networks break the network rule)")
                link.unlink()
            kvm_device_as_udev_sets_it()
        _start(daemon)
        started.append(daemon.name)
    if started:
        MARKER.parent.mkdir(parents=True, exist_ok=True)
        previous = MARKER.read_text().split() if MARKER.exists() else []
        MARKER.write_text(" ".join(sorted(set(previous) | set(started))) + "\n")
    return started


def stop_daemons_started_by_us(timeout: float = 20.0) -> List[str]:
    """Stop the daemons that ensure_daemons started (recorded in MARKER); return them."""
    if not MARKER.exists():
        return []
    names = MARKER.read_text().split()
    stopped = []
    for daemon in (LIBVIRTD, VIRTLOGD):  # libvirtd first: it holds virtlogd's socket
        if daemon.name not in names:
            continue
        pid = _pid_alive(daemon.pid_file)
        if pid:
            os.kill(pid, 15)
            deadline = time.monotonic() + timeout
            while _pid_alive(daemon.pid_file) == pid and time.monotonic() < deadline:
                time.sleep(0.2)
            stopped.append(daemon.name)
    MARKER.unlink()
    restore_kvm_device()
    return stopped

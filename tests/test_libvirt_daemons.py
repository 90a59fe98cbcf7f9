"""What labs.vm.libvirt_daemons decides before it starts libvirtd: which networks it must not
let autostart, and whether a daemon's socket really answers."""
from __future__ import annotations

import os
import re
import socket
from pathlib import Path

import pytest

from labs.vm.libvirt_daemons import autostarted_forwarding_networks, socket_answers
from needs import missing

#: the NAT network Debian's libvirt-daemon-config-network package installs
PACKAGED_DEFAULT = Path("/etc/libvirt/qemu/networks/default.xml")


def packaged_default() -> str:
    """The packaged network's XML, or a skip naming what it needs (root: the file is 0600)."""
    if not PACKAGED_DEFAULT.exists():
        missing(f"needs {PACKAGED_DEFAULT} (libvirt-daemon-config-network; bash scripts/setup installs it)")
    if not os.access(PACKAGED_DEFAULT, os.R_OK):
        pytest.skip(f"needs root: {PACKAGED_DEFAULT} is readable by root only")
    return PACKAGED_DEFAULT.read_text()


def test_packaged_default_nat_network_is_refused_when_autostarted(tmp_path: Path) -> None:
    networks = tmp_path / "networks"
    (networks / "autostart").mkdir(parents=True)
    (networks / "default.xml").write_text(packaged_default())
    assert autostarted_forwarding_networks(networks) == []  # defined, not autostarted: fine
    (networks / "autostart" / "default.xml").symlink_to(networks / "default.xml")
    assert autostarted_forwarding_networks(networks) == [networks / "autostart" / "default.xml"]


def test_isolated_bridge_network_is_refused_too(tmp_path: Path) -> None:
    """No <forward> still means a host bridge with an address on it."""
    autostart = tmp_path / "autostart"
    autostart.mkdir()
    text = re.sub(r"<forward[^>]*/>|<forward.*?</forward>", "", packaged_default(), flags=re.S)
    assert "<forward" not in text
    (autostart / "isolated.xml").write_text(text.replace("<name>default</name>", "<name>isolated</name>"))
    assert autostarted_forwarding_networks(tmp_path) == [autostart / "isolated.xml"]


def test_socket_answers_only_when_something_listens(tmp_path: Path) -> None:
    path = tmp_path / "sock"
    assert not socket_answers(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    try:
        assert socket_answers(path)
    finally:
        server.close()
    assert path.exists() and not socket_answers(path)  # a stale socket file left by a dead daemon


def test_kvm_device_gets_udevs_mode_and_it_is_given_back(tmp_path: Path, monkeypatch) -> None:
    """root:root 0600, as this host's /dev/kvm is without udev: libvirt-qemu (group kvm) could
    not open it, libvirt found its capability cache outdated on every call, define took 55 s."""
    import grp
    from labs.vm import libvirt_daemons as ld
    if os.geteuid() != 0:
        pytest.skip("needs root: gives a file to root:root, as /dev/kvm is")
    device, marker = tmp_path / "kvm", tmp_path / "run" / "kvm-mode"
    device.write_text("")
    os.chown(device, 0, 0)
    os.chmod(device, 0o600)
    monkeypatch.setattr(ld, "KVM_DEVICE", device)
    monkeypatch.setattr(ld, "KVM_MODE_MARKER", marker)
    ld.kvm_device_as_udev_sets_it()
    st = device.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, grp.getgrnam("kvm").gr_gid, 0o660)
    ld.restore_kvm_device()
    st = device.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, 0, 0o600) and not marker.exists()


def test_a_kvm_device_someone_set_up_is_left_alone(tmp_path: Path, monkeypatch) -> None:
    from labs.vm import libvirt_daemons as ld
    device, marker = tmp_path / "kvm", tmp_path / "run" / "kvm-mode"
    device.write_text("")
    os.chmod(device, 0o666)
    monkeypatch.setattr(ld, "KVM_DEVICE", device)
    monkeypatch.setattr(ld, "KVM_MODE_MARKER", marker)
    ld.kvm_device_as_udev_sets_it()
    assert device.stat().st_mode & 0o777 == 0o666 and not marker.exists()

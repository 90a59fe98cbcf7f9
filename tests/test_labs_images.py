"""Image builder inputs: suite choice, package lists, and the cache key (no build, no root)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from discover.errors import UserError
from labs.vm import images


@pytest.mark.parametrize("kernel, suite", [
    ("5.10", "bullseye"), ("6.1", "bookworm"), ("6.12", "trixie"), ("7", "sid"), ("7.2", "sid"),
    ("7.3", "trixie-backports"), ("trixie", "trixie"), ("trixie-backports", "trixie-backports"),
])
def test_suite_for_kernel(kernel: str, suite: str) -> None:
    assert images.suite_for_kernel(kernel) == suite


def test_unknown_kernel_is_a_one_line_user_error() -> None:
    with pytest.raises(UserError, match="no Debian suite known for kernel '4.19'"):
        images.suite_for_kernel("4.19")


def test_package_list_has_the_kernel_headers_and_suite_names() -> None:
    packages = images.read_package_list("bookworm")
    assert {"linux-image-amd64", "linux-headers-amd64", "bpftool", "nfs-kernel-server",
            "qemu-guest-agent", "python3-bpfcc", "trace-cmd"} <= set(packages)
    assert packages == sorted(set(packages))


def test_a_backports_kernel_shares_its_base_suites_image(tmp_path: Path) -> None:
    """trixie's 6.12 and trixie-backports' 7.3 come from one image (one build, one key): the
    package list is the base suite's, and each request sees its own kernel's boot files."""
    assert images.image_suites("trixie-backports") == images.image_suites("trixie") == ["trixie", "trixie-backports"]
    assert images.image_suites("bookworm") == ["bookworm"] and images.image_suites("sid") == ["sid"]
    assert images.read_package_list("trixie-backports") == images.read_package_list("trixie")
    packages = images.read_package_list("trixie")
    assert images.image_key("trixie-backports", packages, b"k") == images.image_key("trixie", packages, b"k")
    assert images.base_suite("trixie-backports") == "trixie" and images.base_suite("sid") == "sid"
    boot = tmp_path / "root" / "boot"
    boot.mkdir(parents=True)
    for release in ("7.3.4+deb13-amd64", "6.12.117+deb13-amd64"):
        (boot / f"vmlinuz-{release}").touch()
    kernels = images._kernel_releases(tmp_path / "root", ["trixie", "trixie-backports"])
    assert kernels == {"trixie": "6.12.117+deb13-amd64", "trixie-backports": "7.3.4+deb13-amd64"}
    info = images.ImageInfo(key="k", suite="trixie", kernel_release=kernels["trixie"], directory=tmp_path,
                            rootfs=tmp_path / "r", vmlinuz=tmp_path / f"vmlinuz-{kernels['trixie']}",
                            initrd=tmp_path / f"initrd.img-{kernels['trixie']}", ssh_private_key=tmp_path / "k",
                            ssh_public_key=tmp_path / "k.pub", packages=[], kernels=kernels)
    seven = images._for_suite(info, "trixie-backports")
    assert (seven.kernel_release, seven.vmlinuz.name, seven.initrd.name) == \
        ("7.3.4+deb13-amd64", "vmlinuz-7.3.4+deb13-amd64", "initrd.img-7.3.4+deb13-amd64")
    assert images._for_suite(info, "trixie") == info
    images._check_series("7.3", seven)
    with pytest.raises(UserError, match="expected 1 kernel"):
        images._kernel_releases(tmp_path / "root", ["bookworm"])


def test_key_follows_every_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    provision = tmp_path / "provision"
    shutil.copytree(images.PROVISION_DIR, provision)
    monkeypatch.setattr(images, "PROVISION_DIR", provision)
    packages = images.read_package_list("bookworm")
    base = images.image_key("bookworm", packages, b"key")
    assert base.startswith("bookworm-")
    assert images.image_key("bookworm", packages, b"key") == base
    assert images.image_key("trixie", packages, b"key") != base
    assert images.image_key("bookworm", packages + ["strace"], b"key") != base
    assert images.image_key("bookworm", packages, b"other key") != base
    with (provision / "server.sh").open("a") as script:
        script.write("# changed\n")
    assert images.image_key("bookworm", packages, b"key") != base


def test_version_mismatch_is_reported(tmp_path: Path) -> None:
    info = images.ImageInfo(key="k", suite="trixie", kernel_release="6.12.117+deb13-amd64",
                            directory=tmp_path, rootfs=tmp_path / "r", vmlinuz=tmp_path / "v",
                            initrd=tmp_path / "i", ssh_private_key=tmp_path / "k",
                            ssh_public_key=tmp_path / "k.pub", packages=[])
    images._check_series("6.12", info)
    images._check_series("trixie", info)
    with pytest.raises(UserError, match="ships 6.12.117"):
        images._check_series("6.1", info)
    assert images.ImageInfo.from_json(info.to_json()) == info


def test_unmount_below_detaches_a_killed_builds_mounts_before_removal(tmp_path: Path) -> None:
    """What a stopped mmdebstrap leaves: its chroot's /proc and a /dev/shm bound from the
    host. They go first, deepest first, so that removing the tree cannot reach the host's."""
    import os
    import subprocess
    if os.geteuid() != 0:
        pytest.skip("mounting needs root (CI runs as root)")
    chroot = tmp_path / ".tmp-key-1" / "root"
    (chroot / "proc").mkdir(parents=True)
    (chroot / "dev" / "shm").mkdir(parents=True)
    subprocess.run(["mount", "-t", "proc", "proc", str(chroot / "proc")], check=True)
    subprocess.run(["mount", "--bind", "/dev/shm", str(chroot / "dev" / "shm")], check=True)
    mine = str(tmp_path.resolve()) + "/"
    try:
        images.unmount_below(tmp_path / ".tmp-key-1")
    finally:
        left = [line.split()[4] for line in open("/proc/self/mountinfo") if line.split()[4].startswith(mine)]
        for point in sorted(left, reverse=True):
            subprocess.run(["umount", "--lazy", point], check=False)
    assert left == []

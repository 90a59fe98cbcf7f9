"""Image builder inputs: suite choice, package lists, and the cache key (no build, no root)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, List

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


RELEASE = "6.1.0-99-amd64"


def fake_image(cache: Path, record: Callable[[images.ImageInfo, Path], None] = images.write_image_record) -> Path:
    """A bookworm image in `cache` as a build leaves it (files of a few bytes, the lab key
    pair), its image.json written by `record`; the image's directory."""
    (cache / "ssh").mkdir(parents=True)
    private = cache / "ssh" / "lab_ed25519"
    private.write_text("private\n")
    private.with_suffix(".pub").write_text("ssh-ed25519 AAAA probekit-lab\n")
    key = images.image_key("bookworm", images.read_package_list("bookworm"), private.with_suffix(".pub").read_bytes())
    directory = cache / "images" / key
    directory.mkdir(parents=True)
    for name in ("rootfs.qcow2", f"vmlinuz-{RELEASE}", f"initrd.img-{RELEASE}"):
        (directory / name).write_text(name)
    record(images.ImageInfo(key=key, suite="bookworm", kernel_release=RELEASE, directory=directory,
                            rootfs=directory / "rootfs.qcow2", vmlinuz=directory / f"vmlinuz-{RELEASE}",
                            initrd=directory / f"initrd.img-{RELEASE}", ssh_private_key=private,
                            ssh_public_key=private.with_suffix(".pub"), packages=["linux-image-amd64"],
                            kernels={"bookworm": RELEASE}), directory / "image.json")
    return directory


def absolute_record(info: images.ImageInfo, path: Path) -> None:
    """image.json as builders before write_image_record wrote it: every path absolute."""
    path.write_text(json.dumps(info.to_json(), indent=2) + "\n")


@pytest.mark.parametrize("record", [images.write_image_record, absolute_record], ids=["names", "absolute"])
def test_a_copied_cache_is_used_where_it_lies(record: Callable[[images.ImageInfo, Path], None], tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Copied elsewhere and named by PROBEKIT_CACHE, the cache's image is reused from there,
    not from where it was built (qemu-img's -b named the old place), nor built again; a
    record of an older builder, with absolute paths, is re-rooted the same way."""
    directory = fake_image(tmp_path / "old", record)
    assert (str(tmp_path) in (directory / "image.json").read_text()) == (record is absolute_record)
    shutil.copytree(tmp_path / "old", tmp_path / "new")
    shutil.rmtree(tmp_path / "old")
    monkeypatch.setenv("PROBEKIT_CACHE", str(tmp_path / "new"))
    new = tmp_path / "new" / "images" / directory.name
    said: List[str] = []
    info = images.build_image("6.1", progress=said.append)
    assert said == [f"[image] cached {directory.name} (kernel {RELEASE})"]
    assert info == images.cached_image("6.1")
    assert (info.directory, info.rootfs, info.vmlinuz, info.initrd) == (
        new, new / "rootfs.qcow2", new / f"vmlinuz-{RELEASE}", new / f"initrd.img-{RELEASE}")
    assert (info.ssh_private_key, info.ssh_public_key) == (
        tmp_path / "new" / "ssh" / "lab_ed25519", tmp_path / "new" / "ssh" / "lab_ed25519.pub")
    assert (info.key, info.suite, info.kernel_release, info.kernels) == (
        directory.name, "bookworm", RELEASE, {"bookworm": RELEASE})


def _drop_rootfs_field(record: Path) -> None:
    data = json.loads(record.read_text())
    del data["rootfs"]
    record.write_text(json.dumps(data))


#: a broken cache entry -> (how it is broken, what the line says after the record's path)
BROKEN = {
    "not-json": (lambda r: r.write_text('{"key": '), "image record is not JSON"),
    "not-utf8": (lambda r: r.write_bytes(b"\xff\xfe{}"), "image record is not JSON"),
    "directory": (lambda r: (r.unlink(), r.mkdir()), "Is a directory"),
    "a-list": (lambda r: r.write_text("[]"), "image record: (top level): expected an object, got []"),
    "field-missing": (_drop_rootfs_field, "image record: rootfs: missing (expected a non-empty string)"),
    "rootfs-gone": (lambda r: (r.parent / "rootfs.qcow2").unlink(), "the image's rootfs {dir}/rootfs.qcow2 is missing"),
    "initrd-gone": (lambda r: (r.parent / f"initrd.img-{RELEASE}").unlink(),
                    f"the image's initrd {{dir}}/initrd.img-{RELEASE} is missing"),
}


@pytest.mark.parametrize("broken", list(BROKEN))
def test_a_broken_cache_entry_is_one_line_naming_it(broken: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    directory = fake_image(tmp_path)
    monkeypatch.setenv("PROBEKIT_CACHE", str(tmp_path))
    damage, problem = BROKEN[broken]
    damage(directory / "image.json")
    for read in (lambda: images.build_image("6.1", progress=lambda _: None), lambda: images.cached_image("6.1")):
        with pytest.raises(UserError) as caught:
            read()
        assert str(caught.value) == (f"{directory}/image.json: {problem.format(dir=directory)}; "
                                     f"remove {directory} and `labs up` builds the image again")


def test_labs_up_on_a_broken_cache_entry_says_it_before_anything_starts(tmp_path: Path) -> None:
    """Not "internal error": one line, exit 1, and no lab state written (PATH empty: were the
    record not found, no real build could start)."""
    directory = fake_image(tmp_path / "cache")
    (directory / "image.json").write_text("{")
    res = subprocess.run([str(Path(sys.executable).parent / "labs"), "up", "--kernel", "6.1"], capture_output=True,
                         text=True, timeout=120, stdin=subprocess.DEVNULL,
                         env=dict(os.environ, PROBEKIT_CACHE=str(tmp_path / "cache"), HOME=str(tmp_path),
                                  PATH=str(tmp_path), PYTHONPATH=str(Path(__file__).resolve().parents[1])))
    assert (res.returncode, res.stderr) == (1, f"labs: error: {directory}/image.json: image record is not JSON; "
                                               f"remove {directory} and `labs up` builds the image again\n")
    assert not (tmp_path / "cache" / "labs").exists()

"""Kernel profiles from a real Debian package (6.1.0-50), checked against the live lab profile."""
from __future__ import annotations

import gc
import gzip
import hashlib
import multiprocessing
import signal
import struct
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from debian_kernels import ABI_61, ABI_612, LAB_61, kernel_dir, profile_61
from discover.profile import KernelProfile, load_profile
from probes import kernelpkg
from probes.kernelpkg import PackageError, decompress_vmlinuz, iter_package_files, profile_from_package

REPO = Path(__file__).resolve().parents[1]


def _deb() -> Path:
    return next(kernel_dir(ABI_61).glob("linux-image-*.deb"))


def test_identity_config_and_vmlinux_btf() -> None:
    data = profile_61()
    prof = KernelProfile(data)
    assert prof.release == f"{kernel_dir(ABI_61).name}-amd64"
    assert "Debian 6.1." in data["uname"]["version"]
    assert prof.config("CONFIG_NFS_FS") == "m" and prof.config("CONFIG_DEBUG_INFO_BTF") == "y"
    assert data["source"]["how"] == "package" and data["package"]["subset"] is True
    vfs_read = prof.btf_function("vfs_read")
    assert vfs_read["module"] is None
    assert vfs_read["prototype"] == "ssize_t vfs_read(struct file *file, char *buf, size_t count, loff_t *pos)"
    assert prof.function_modules("vfs_read") == {None}
    assert data["unavailable"]["kprobe_blacklist"]
    assert any("System.map" in note for note in data["package"]["notes"])


def test_module_functions_btf_and_tracepoints() -> None:
    prof = KernelProfile(profile_61())
    assert prof.function_modules("nfs_file_read") == {"nfs"}
    assert prof.btf_function("nfs_getattr")["params"][0] == ["mnt_userns", "struct user_namespace *"]
    assert prof.btf_function("nfs_read_folio")["prototype"] == "int nfs_read_folio(struct file *file, struct folio *folio)"
    # every nfs function's prototype, because --btf-module nfs was asked for
    assert len([f for f in prof.data["btf"]["functions"].values() if f["module"] == "nfs"]) > 400
    getattr_enter = prof.event("nfs", "nfs_getattr_enter")
    assert getattr_enter["module"] == "nfs" and getattr_enter["class"] == "nfs_inode_event"
    assert [f["name"] for f in getattr_enter["fields"]] == ["dev", "fhandle", "fileid", "version"]
    assert getattr_enter["proto"] == "void (*)(void *, const struct inode *)"
    assert "rpc_task_begin" in prof.events["sunrpc"]
    assert prof.data["package"]["modules"]["nfs"]["path"].endswith("kernel/fs/nfs/nfs.ko")


def test_package_reproduces_the_live_lab_profile() -> None:
    """Same kernel ABI booted in the lab: the package must predict its traceable functions and events."""
    live = load_profile(LAB_61 / "profile.json.gz")
    pkg = KernelProfile(profile_61())
    assert live.release == pkg.release
    for module in ("nfs", "nfsv3", "nfsv4", "sunrpc"):
        assert set(pkg.functions_in(module)) == set(live.functions_in(module)), module
    for system in ("nfs", "nfs4", "sunrpc"):
        assert set(pkg.events[system]) == set(live.events[system]), system
        for name, event in live.events[system].items():
            live_fields = [f["name"] for f in event["fields"] if not f["common"]]
            pkg_fields = [f["name"] for f in pkg.events[system][name]["fields"]]
            assert pkg_fields == live_fields, name
            live_offsets = [f["offset"] for f in event["fields"] if not f["common"]]
            assert [f["offset"] for f in pkg.events[system][name]["fields"]] == live_offsets, name


def test_truncated_package_is_one_error(tmp_path: Path) -> None:
    cut = tmp_path / "cut.deb"
    with open(_deb(), "rb") as src:
        cut.write_bytes(src.read(20 << 20))
    with pytest.raises(PackageError, match="truncated"):
        profile_from_package([cut])


@pytest.mark.parametrize("xz_tool", [True, False], ids=["xz-process", "python-lzma"])
def test_corrupt_package_is_one_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, xz_tool: bool) -> None:
    if not xz_tool:
        monkeypatch.setattr(kernelpkg, "_TAR_TOOLS", {})
    bad = tmp_path / "bad.deb"
    raw = bytearray(_deb().read_bytes()[: 30 << 20])
    raw[5 << 20:(5 << 20) + 4096] = bytes(4096)  # zero 4 KiB inside the xz stream
    bad.write_bytes(bytes(raw) + _deb().read_bytes()[30 << 20:])
    with pytest.raises(PackageError, match="corrupt"):
        profile_from_package([bad])


def test_xz_process_and_python_lzma_read_the_same_members(monkeypatch: pytest.MonkeyPatch) -> None:
    def members() -> List[Tuple[str, str]]:
        return [(rel, hashlib.sha256(data).hexdigest())
                for rel, data in iter_package_files(_deb(), lambda p: p.startswith("boot/") or "/fs/nfs/" in p)]
    with_tool = members()
    monkeypatch.setattr(kernelpkg, "_TAR_TOOLS", {})
    assert members() == with_tool and len(with_tool) >= 10


def test_not_a_package(tmp_path: Path) -> None:
    text = tmp_path / "notes.deb"
    text.write_text("not an archive\n")
    with pytest.raises(PackageError, match="not a Debian package"):
        profile_from_package([text])
    with pytest.raises(PackageError, match="bzImage"):
        decompress_vmlinuz(b"\0" * 4096, "x")


def test_modules_without_kernel_image_warns(tmp_path: Path) -> None:
    """Extracted packages lacking vmlinuz (so no base BTF): symbol tables only, said in the notes."""
    wanted = ("kernel/fs/nfs/nfs.ko", "boot/config-")
    for rel, data in iter_package_files(_deb(), lambda p: p.endswith(wanted[0]) or wanted[1] in p):
        target = tmp_path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    data = profile_from_package([tmp_path], ["nfs_file_read"])
    prof = KernelProfile(data)
    assert data["btf"] is None and "vmlinux" in data["unavailable"]
    assert any("no kernel image" in note for note in data["package"]["notes"])
    assert prof.function_modules("nfs_file_read") == {"nfs"}
    assert prof.event("nfs", "nfs_getattr_enter")["fields"] is None


def _probes(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "probes", *args], cwd=REPO, capture_output=True, text=True)


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    cut = tmp_path / "cut.deb"
    with open(_deb(), "rb") as src:
        cut.write_bytes(src.read(1 << 20))
    for args in (["kernel-profile", str(cut), "-o", str(tmp_path / "p.json")],
                 ["kernel-profile", str(tmp_path / "missing.deb"), "-o", str(tmp_path / "p.json")]):
        res = _probes(*args)
        assert res.returncode == 1
        assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr, res.stderr
        assert res.stderr.startswith("probes: error: ")


def _debs(abi: str) -> List[Path]:
    return sorted(kernel_dir(abi).glob("*.deb"))


def _extract(abi: str, target: Path, keep) -> None:
    """Members of a real package that `keep(path)` accepts, written under `target` (an extracted package)."""
    for deb in _debs(abi):
        for rel, data in iter_package_files(deb, keep):
            out = target / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data)


def _without_btf(vmlinuz: bytes) -> bytes:
    """The same bzImage with the vmlinux `.BTF` section renamed (`.BTX`), payload re-packed with gzip."""
    vmlinux = bytearray(decompress_vmlinuz(vmlinuz, "real"))
    shoff, = struct.unpack_from("<Q", vmlinux, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", vmlinux, 0x3A)
    names_at = struct.unpack_from("<Q", vmlinux, shoff + shstrndx * shentsize + 24)[0]
    for i in range(shnum):
        name_off = struct.unpack_from("<I", vmlinux, shoff + i * shentsize)[0]
        at = names_at + name_off
        if vmlinux[at:at + 5] == b".BTF\0":
            vmlinux[at:at + 5] = b".BTX\0"
            break
    else:
        raise AssertionError("no .BTF section in the real kernel image")
    payload = gzip.compress(bytes(vmlinux), compresslevel=1)
    setup_sects = vmlinuz[0x1F1] or 4
    payload_offset = struct.unpack_from("<I", vmlinuz, 0x248)[0]
    start = (setup_sects + 1) * 512 + payload_offset
    image = bytearray(vmlinuz[:start]) + payload
    struct.pack_into("<I", image, 0x24C, len(payload))
    return bytes(image)


def test_package_without_btf_is_a_note_not_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real 6.1 kernel image whose .BTF section is gone: functions from module symbol tables, said so."""
    monkeypatch.setenv("PROBEKIT_PROFILE_CACHE", str(tmp_path / "profiles"))
    tmp_path = tmp_path / "pkg"
    _extract(ABI_61, tmp_path, lambda p: p.startswith("boot/") or p.endswith(("/nfs.ko", "/sunrpc.ko")))
    vmlinuz = next(tmp_path.glob("boot/vmlinuz-*"))
    vmlinuz.write_bytes(_without_btf(vmlinuz.read_bytes()))
    data = profile_from_package([tmp_path], ["nfs_file_read"])
    assert data["btf"] is None and "no .BTF section" in data["unavailable"]["btf"]
    assert any("no .BTF section" in note for note in data["package"]["notes"])
    assert KernelProfile(data).function_modules("nfs_file_read") == {"nfs"}
    res = _probes("compat", str(REPO / "probes" / "specs" / "nfs.toml"), "--kernel", str(tmp_path))
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert "no .BTF section" in res.stdout
    assert "no kernel BTF" in res.stdout and "(~)" in res.stdout  # the picks attach, without names/offsets


def test_corrupt_module_is_a_note(tmp_path: Path) -> None:
    """One damaged .ko.xz in a real 6.12 package: the others are read, the report names the bad one."""
    _extract(ABI_612, tmp_path, lambda p: p.startswith("boot/") or p.endswith(("/nfs.ko.xz", "/nfsv4.ko.xz")))
    nfsv4 = next(tmp_path.rglob("nfsv4.ko.xz"))
    nfsv4.write_bytes(nfsv4.read_bytes()[:20000])
    data = profile_from_package([tmp_path], ["nfs_file_read"])
    assert any("1 module(s) unreadable" in n and "nfsv4.ko.xz" in n for n in data["package"]["notes"])
    assert KernelProfile(data).function_modules("nfs_file_read") == {"nfs"}


def test_compat_on_damaged_packages_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROBEKIT_PROFILE_CACHE", str(tmp_path / "profiles"))
    cut = tmp_path / "cut.deb"
    with open(_deb(), "rb") as src:
        cut.write_bytes(src.read(20 << 20))
    bad = tmp_path / "bad.deb"
    raw = bytearray(_deb().read_bytes())
    raw[5 << 20:(5 << 20) + 4096] = bytes(4096)
    bad.write_bytes(bytes(raw))
    for deb, word in ((cut, "truncated"), (bad, "corrupt")):
        res = _probes("compat", str(REPO / "probes" / "specs" / "nfs.toml"), "--kernel", str(deb))
        assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
        last = res.stderr.strip().splitlines()[-1]
        assert last.startswith("probes: error: ") and word in last, res.stderr


@pytest.fixture(scope="module")
def small_deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small real package: 6.1's config and one of its modules, built by dpkg-deb."""
    root = tmp_path_factory.mktemp("small") / "pkg"
    for rel, data in iter_package_files(_deb(), lambda p: p.endswith("/fs/nfs_common/grace.ko") or "boot/config-" in p):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (root / "DEBIAN").mkdir()
    (root / "DEBIAN" / "control").write_text("Package: small\nVersion: 1\nArchitecture: amd64\n"
                                             "Maintainer: probekit tests <tests@probekit>\nDescription: two files\n")
    deb = root.parent / "small.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(root), str(deb)],
                   check=True, capture_output=True)
    return deb


def ctrl_c_at_each_call(deb: Path) -> Tuple[int, List[str]]:
    """The package read once per Python function entry, SIGINT raised at that entry: at how
    many entries one was raised, and where a Ctrl-C was lost (the read went on to its end). A
    read may make fewer calls than the first (subprocess polls the children earlier reads left
    as it starts the next), so the last entries may never be reached."""
    where: Dict[int, str] = {}

    def read(at: int) -> int:
        """Read the package, SIGINT at the `at`-th call (never if 0); the calls counted."""
        calls = 0

        def profile(frame: Any, event: str, _arg: object) -> None:
            nonlocal calls
            if event == "call":
                calls += 1
                if calls == at:
                    where[at] = frame.f_code.co_name
                    signal.raise_signal(signal.SIGINT)

        sys.setprofile(profile)
        try:
            for _member in iter_package_files(deb, lambda p: True):
                pass
        finally:
            sys.setprofile(None)
        return calls

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    unraisable, sys.unraisablehook = sys.unraisablehook, lambda _u: None  # the __del__ one, counted below
    try:
        total = read(0)
        lost = []
        for at in range(1, total + 1):
            try:
                read(at)
                if at in where:  # raised, and the read ran on to its end
                    lost.append(where[at])
            except KeyboardInterrupt:
                pass
            gc.collect()  # what an interrupted read left is finalized now, not in the next read
    finally:
        signal.signal(signal.SIGINT, previous)
        sys.unraisablehook = unraisable
    return len(where), lost


def test_a_ctrl_c_at_any_call_while_a_package_is_read_reaches_the_caller(small_deb: Path) -> None:
    """SIGINT raised at each Python function entry in turn while a package's members are read
    (through xz, as wherever xz-utils is installed). Where a C caller drops what a Python method
    raises (io's BufferedReader asked tarfile's file for tell() and forgot its error, and its
    finalizer closed it and forgot that), the KeyboardInterrupt was lost and kernel-profile ran
    on to the end. Only a finalizer's own entry may keep it (Python prints what a __del__
    raises): tarfile's stream has one, entered at most once per package while it is read.
    In a child of its own: about 500 of the interrupted reads leave their `xz` child's two pipes
    open to the process's exit (subprocess keeps a Popen whose child it could not reap; a tool
    exits on Ctrl-C, and xz with it), ~1000 fds a test run of 1024 could not spare."""
    with multiprocessing.get_context("fork").Pool(1) as pool:
        raised, lost = pool.apply(ctrl_c_at_each_call, (small_deb,))
    assert raised > 300
    assert lost in ([], ["__del__"]), f"{len(lost)} of {raised} calls lost the Ctrl-C: {lost}"

"""Module fentry/fexit targets given by BTF object fd and type id (probes.libbpf.TraceTargets,
probes.core_backend.target_paths), and the fallback to naming them to libbpf.

Why: naming a module function to libbpf (MODULE:FUNCTION) makes it load every module's BTF, the
largest single part of a start beside libbpf-tools (bench/README.md). The structs handed to
libbpf are checked against libbpf-dev's headers on this host; the kernel's side (the load with
the fd and id) only in lab guests, as the host refuses bpf().
"""
from __future__ import annotations

import ctypes
import errno
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from debian_kernels import ABI_612, btf_dir
from discover.spec import load_spec
from probes.backend import Rejected
from probes.build_core import build
from probes.core_backend import CoreBackend, FentryTarget, target_paths
from probes.layout import KernelLayout
from probes.libbpf import (BTF_OBJ_TARGET_CALLS, PROG_TYPE_TRACING, TRACE_FENTRY, TRACE_FEXIT, BpfObject, BtfInfo,
                           Libbpf, LibbpfError, ProgHandlerOpts, ProgLoadOpts, kernel_btf_fds)

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "probes" / "specs" / "nfs.toml"
#: (C expression, the ctypes figure it must equal)
LAYOUT: List[Tuple[str, int]] = [
    ("sizeof(struct libbpf_prog_handler_opts)", ctypes.sizeof(ProgHandlerOpts)),
    *[(f"offsetof(struct libbpf_prog_handler_opts, {name})", getattr(ProgHandlerOpts, name).offset)
      for name, _type in ProgHandlerOpts._fields_],
    *[(f"offsetof(struct bpf_prog_load_opts, {name})", getattr(ProgLoadOpts, name).offset)
      for name, _type in ProgLoadOpts._fields_],
    ("sizeof(struct bpf_btf_info)", ctypes.sizeof(BtfInfo)),
    *[(f"offsetof(struct bpf_btf_info, {name})", getattr(BtfInfo, name).offset) for name, _type in BtfInfo._fields_],
    ("BPF_PROG_TYPE_TRACING", PROG_TYPE_TRACING), ("BPF_TRACE_FENTRY", TRACE_FENTRY),
    ("BPF_TRACE_FEXIT", TRACE_FEXIT),
]


def test_the_structs_handed_to_libbpf_are_its_headers(tmp_path: Path) -> None:
    """Every member the loader reads or writes sits where libbpf-dev's headers put it (both
    structs only grow at their end, so the host's 1.1 headers hold for 1.5 to 1.7 too), the
    load options' head is no longer than libbpf's struct, and the enums are the uapi's."""
    if shutil.which("clang") is None:
        pytest.fail("needs clang (apt-get install clang libbpf-dev)")
    source = tmp_path / "layout.c"
    source.write_text("#include <stddef.h>\n#include <stdio.h>\n#include <bpf/libbpf.h>\n#include <bpf/bpf.h>\n"
                      "int main(void) {\n" + "".join(f'    printf("%zu\\n", (size_t)({expr}));\n' for expr, _ in LAYOUT)
                      + '    printf("%zu\\n", sizeof(struct bpf_prog_load_opts));\n    return 0;\n}\n')
    subprocess.run(["clang", "-o", str(tmp_path / "layout"), str(source)], check=True)
    out = [int(v) for v in subprocess.run([str(tmp_path / "layout")], capture_output=True, text=True,
                                          check=True).stdout.split()]
    assert dict(zip([expr for expr, _ in LAYOUT], out)) == dict(LAYOUT)
    assert ctypes.sizeof(ProgLoadOpts) <= out[-1]


NFS_READ = FentryTarget("nfs", "nfs_file_read", 61234)
TARGETS = {"p0_fentry": NFS_READ, "p0_fexit": NFS_READ, "p9_fentry": FentryTarget("nfsv4", "nfs4_file_open", 70001),
           "p5_fentry": FentryTarget("vmlinux", "vfs_fsync_range", 4321)}


def test_module_targets_go_by_btf_object_and_type_id_vmlinux_ones_by_name() -> None:
    direct, named, notes = target_paths(TARGETS, (), {"nfs": 7, "nfsv4": 8})
    assert direct == {"p0_fentry": (7, 61234), "p0_fexit": (7, 61234), "p9_fentry": (8, 70001)}
    assert named == {"p5_fentry": "vfs_fsync_range"}
    assert notes == ["fentry targets: 3 programs' in nfs, nfsv4 given by BTF object and type id "
                     "(libbpf loads no module's BTF)"]


@pytest.mark.parametrize("lacking, fds, walk_error, type_id, why", [
    (("libbpf_register_prog_handler",), {"nfs": 7, "nfsv4": 8}, "", 61234,
     "libbpf.so.1 lacks libbpf_register_prog_handler"),
    ((), {"nfsv4": 8}, "", 61234, "no loaded BTF object named nfs"),
    ((), {"nfsv4": 8}, "bpf_btf_get_next_id: Operation not permitted",
     61234, "no loaded BTF object named nfs (bpf_btf_get_next_id: Operation not permitted)"),
    ((), {"nfs": 7, "nfsv4": 8}, "", None, "no type id of nfs_file_read in nfs's BTF"),
])
def test_each_missing_piece_falls_back_to_naming_the_target_and_says_why(
        lacking: Tuple[str, ...], fds: Dict[str, int], walk_error: str, type_id: Any, why: str) -> None:
    """The fallback is per program: nfs_file_read's programs are named MODULE:FUNCTION, as before
    this path existed; nfs4_file_open's keep theirs where only nfs' piece is missing."""
    targets = dict(TARGETS, p0_fentry=NFS_READ._replace(type_id=type_id), p0_fexit=NFS_READ._replace(type_id=type_id))
    direct, named, notes = target_paths(targets, lacking, fds, walk_error)
    assert named["p0_fentry"] == named["p0_fexit"] == "nfs:nfs_file_read" and named["p5_fentry"] == "vfs_fsync_range"
    assert ("p9_fentry" in direct) == (not lacking)
    assert notes[-1].startswith("fentry targets: nfs:nfs_file_read") and notes[-1].endswith(f"({why})")
    assert len(notes) == (1 if lacking else 2)


def test_vmlinux_targets_alone_say_nothing() -> None:
    assert target_paths({"p5_fentry": TARGETS["p5_fentry"]}, (), {}) == ({}, {"p5_fentry": "vfs_fsync_range"}, [])


def test_the_calls_are_all_in_libbpf_1_0_and_later() -> None:
    """The host's libbpf1 (bookworm's 1.1) has every call the path needs: it falls back only on
    an older or stripped libbpf.so.1."""
    assert Libbpf().lacking == ()
    assert set(BTF_OBJ_TARGET_CALLS) >= {"libbpf_register_prog_handler", "bpf_btf_get_next_id"}


class FakeBtfCalls:
    """bpf_btf_get_next_id, bpf_btf_get_fd_by_id and bpf_obj_get_info_by_fd over a list of
    (id, name, kernel_btf), each fd a real one (of /dev/null), for the walk alone."""

    def __init__(self, objects: List[Tuple[int, str, int]]) -> None:
        self.objects = {i: (name, kernel) for i, name, kernel in objects}
        #: fd -> the id it was opened for (a closed fd's number is given again)
        self.opened: Dict[int, int] = {}

    def bpf_btf_get_next_id(self, start: int, out: Any) -> int:
        later = [i for i in self.objects if i > start]
        if not later:
            ctypes.set_errno(errno.ENOENT)
            return -1
        out._obj.value = min(later)
        return 0

    def bpf_btf_get_fd_by_id(self, btf_id: int) -> int:
        fd = os.open(os.devnull, os.O_RDONLY)
        self.opened[fd] = btf_id
        return fd

    def bpf_obj_get_info_by_fd(self, fd: int, info: Any, _size: Any) -> int:
        name, kernel = self.objects[self.opened[fd]]
        ctypes.memmove(info._obj.name, name.encode(), len(name))
        info._obj.kernel_btf = kernel
        return 0


def test_the_walk_keeps_the_named_kernel_objects_and_closes_the_rest() -> None:
    """A program's BTF (not the kernel's) of a module's name is passed over; the walk stops once
    all are found or the ids end (lockd is not loaded)."""
    calls = FakeBtfCalls([(1, "vmlinux", 1), (5, "sunrpc", 1), (9, "nfs", 0), (12, "nfs", 1), (40, "nfsv4", 1)])
    before = len(os.listdir("/proc/self/fd"))
    fds, why = kernel_btf_fds(type("Lib", (), {"lib": calls})(), ["nfs", "nfsv4", "lockd"])
    try:
        assert {name: calls.opened[fd] for name, fd in fds.items()} == {"nfs": 12, "nfsv4": 40} and why == ""
        assert len(os.listdir("/proc/self/fd")) == before + 2  # vmlinux's, sunrpc's, the program's closed
    finally:
        for fd in fds.values():
            os.close(fd)


def test_the_walk_on_this_hosts_kernel() -> None:
    """This host's kernel: vmlinux's BTF object is found by its name (the kernel fills BtfInfo
    as laid out here) where it lets the walk run; where it refuses bpf(), nothing is found and
    the reason goes into -v's fallback line. A module not loaded is simply not found."""
    fds, why = kernel_btf_fds(Libbpf(), ["vmlinux", "no_such_module"])
    try:
        assert (set(fds), why == "") == ({"vmlinux"}, True) or (fds == {} and why.startswith("bpf_btf_get_next_id: "))
    finally:
        for fd in fds.values():
            os.close(fd)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(SPEC, tmp_path_factory.mktemp("core") / "nfs.bpf.o")


def test_an_object_under_the_handlers_gives_its_targets_and_leaves_nothing_behind(
        built: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CoreBackend._open with nfs' BTF object found (a stand-in fd): the fentry programs are the
    handlers' (libbpf's own attach refuses them: EOPNOTSUPP, where a standard one wants a loaded
    program: EINVAL), the prepare-load callback writes fd and id into the load options of the
    programs given them and of no other, and close() unregisters the handlers and closes the fd."""
    stand_in = os.open(os.devnull, os.O_RDONLY)
    monkeypatch.setattr("probes.core_backend.kernel_btf_fds", lambda lib, names: ({"nfs": stand_in}, ""))
    lib = Libbpf()
    backend = CoreBackend(load_spec(SPEC), built, lib)
    obj, notes = backend._open(["p0_fentry", "p0_fexit"], {"p0_fentry": NFS_READ, "p0_fexit": NFS_READ})
    progs = obj.programs()
    try:
        assert notes == ["fentry targets: 2 programs' in nfs given by BTF object and type id "
                         "(libbpf loads no module's BTF)"]
        ctypes.set_errno(0)
        assert not lib.lib.bpf_program__attach(progs["p0_fentry"]) and ctypes.get_errno() == errno.EOPNOTSUPP
        with pytest.raises(LibbpfError, match="can't attach before loaded"):  # attach() goes through attach_trace
            obj.attach("p0_fentry")
        other = next(name for name in progs if name.endswith("_fentry") and name != "p0_fentry")
        for name, wanted in (("p0_fexit", (stand_in, 61234)), (other, (0, 0))):
            opts = ProgLoadOpts(sz=ctypes.sizeof(ProgLoadOpts))
            assert lib.trace_targets()._prepare(progs[name], ctypes.byref(opts), 0) == 0
            assert (opts.attach_btf_obj_fd, opts.attach_btf_id) == wanted
    finally:
        obj.close()
    with pytest.raises(OSError):
        os.fstat(stand_in)
    assert lib.trace_targets()._handlers == [] and lib.trace_targets()._targets == {}
    again = BpfObject(lib, built.read_bytes())  # the standard handler again: attach wants a loaded program
    try:
        ctypes.set_errno(0)
        assert not lib.lib.bpf_program__attach(again.programs()["p0_fentry"]) and ctypes.get_errno() == errno.EINVAL
    finally:
        again.close()


def test_without_the_module_object_the_target_is_named_to_libbpf(
        built: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback is today's path: bpf_program__set_attach_target with MODULE:FUNCTION (which
    the host's libbpf 1.1 cannot resolve: one Rejected line, no handler left registered)."""
    monkeypatch.setattr("probes.core_backend.kernel_btf_fds", lambda lib, names: ({}, ""))
    lib = Libbpf()
    backend = CoreBackend(load_spec(SPEC), built, lib)
    named: List[Tuple[str, str]] = []
    monkeypatch.setattr(BpfObject, "set_attach_target", lambda self, program, target: named.append((program, target)))
    obj, notes = backend._open(["p0_fentry"], {"p0_fentry": NFS_READ})
    obj.close()
    assert named == [("p0_fentry", "nfs:nfs_file_read")]
    assert notes == ["fentry targets: nfs:nfs_file_read named to libbpf, which loads every module's BTF for them "
                     "(no loaded BTF object named nfs)"]
    assert lib.trace_targets()._handlers == []
    monkeypatch.undo()
    monkeypatch.setattr("probes.core_backend.kernel_btf_fds", lambda lib, names: ({}, ""))
    with pytest.raises(Rejected, match=r"bpf_program__set_attach_target\(p0_fentry, nfs:nfs_file_read\): "):
        backend._open(["p0_fentry"], {"p0_fentry": NFS_READ})


def test_the_layouts_type_id_is_the_module_blobs_own(tmp_path: Path) -> None:
    """The id a program is given is that of the FUNC record in the module's split BTF, numbered
    after vmlinux's types as the kernel numbers a module's (a real 6.12 kernel's BTF)."""
    where = btf_dir(ABI_612, ("nfs",), tmp_path)
    layout = KernelLayout.live(where, ("nfs",))
    assert layout is not None
    type_id = layout.func_type_id("nfs_file_read")
    blob = layout.modules["nfs"]
    assert type_id is not None and type_id >= blob.first_id  # type: ignore[union-attr]
    assert blob._str(blob._record(type_id)[2]) == "nfs_file_read"  # type: ignore[union-attr]
    assert layout.func_type_id("vfs_read") == layout.vmlinux.func_id("vfs_read")
    assert layout.func_type_id("no_such_function") is None

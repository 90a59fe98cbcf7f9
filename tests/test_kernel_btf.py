"""libbpf's parse of a kernel's BTF (probes.libbpf.KernelBtf) answers the layout as discover's reader does.

Why: a live start reads the BTF through libbpf where libbpf.so.1 loads (in C, without the
Python walk over vmlinux's records) and through discover.btf where it does not (Debian 11):
both must give every tool the same prototypes, offsets and modules. Checked on a real Debian
6.12 kernel's BTF, vmlinux's and the NFS and ext4 modules', on every fourth module function.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Tuple

import pytest

from debian_kernels import ABI_612, btf_dir
from discover.btf import KIND_FUNC, Btf, BtfError
from probes.layout import KernelLayout
from probes.libbpf import KernelBtf, shared

MODULES = ("nfs", "nfsv4", "sunrpc", "nfsd", "ext4")


@pytest.fixture(scope="module")
def layouts(tmp_path_factory: pytest.TempPathFactory) -> Tuple[KernelLayout, KernelLayout]:
    """(libbpf's, discover's) layout of the same BTF files."""
    where = btf_dir(ABI_612, MODULES, tmp_path_factory.mktemp("btf"))
    ours = KernelLayout.live(where, MODULES)
    base = Btf((where / "vmlinux").read_bytes())
    theirs = KernelLayout(base, {m: Btf((where / m).read_bytes(), base=base) for m in MODULES})
    assert ours is not None and isinstance(ours.vmlinux, KernelBtf) and set(ours.modules) == set(MODULES)
    return ours, theirs


def test_every_module_function_has_the_same_prototype_module_and_arguments(
        layouts: Tuple[KernelLayout, KernelLayout]) -> None:
    ours, theirs = layouts
    checked = 0
    for blob in theirs.modules.values():
        assert isinstance(blob, Btf)
        for function in blob.function_names()[::4]:  # a vmlinux look-up is a scan of 112,000 types
            assert ours.btf_module_of(function) == theirs.btf_module_of(function), function
            params = theirs.params(function)
            assert ours.params(function) == params, function
            assert ours.infer_args(function) == theirs.infer_args(function), function
            for name, _type in params or []:
                assert ours.resolve(function, name) == theirs.resolve(function, name), (function, name)
            checked += 1
    assert checked > 1500


def _functions_record_by_record(blob: KernelBtf) -> Dict[str, int]:
    """A module blob's function table as KernelBtf made it before it walked the blob's bytes:
    every record through libbpf (btf__type_by_id, btf__name_by_offset), of several the last."""
    table: Dict[str, int] = {}
    for type_id in range(blob.first_id, int(blob.lib.btf__type_cnt(blob.opened()))):
        _owner, _off, name_off, kind, _vlen, _ref = blob._record(type_id)  # noqa: SLF001
        if kind == KIND_FUNC:
            table[blob._str(name_off)] = type_id  # noqa: SLF001
    return table


def test_a_modules_function_table_is_what_libbpf_reads_record_by_record(
        layouts: Tuple[KernelLayout, KernelLayout]) -> None:
    """The walk over the bytes libbpf parsed gives every FUNC name of each real module blob the
    type id libbpf's own record by record reading gives (and discover's reader of the file),
    names kept in vmlinux's strings (sunrpc's call_start, nfsd's set_client) too."""
    ours, theirs = layouts
    in_base = 0
    for module, blob in ours.modules.items():
        assert isinstance(blob, KernelBtf)
        table = blob.function_ids()
        assert len(table) > 700 and table == _functions_record_by_record(blob), module
        reader = theirs.modules[module]
        assert isinstance(reader, Btf) and table == reader._func_ids, module  # noqa: SLF001
        in_base += sum(off < reader._str_base for off in reader._func_name_offs)  # noqa: SLF001
        assert all(blob.func_id(name) == type_id for name, type_id in table.items())
    assert in_base >= 5 and ours.modules["sunrpc"].func_id("call_start") is not None


def test_vmlinux_offsets_and_functions_are_the_same(layouts: Tuple[KernelLayout, KernelLayout]) -> None:
    ours, theirs = layouts
    assert ours.name_offsets() == theirs.name_offsets() and ours.dev_offsets() == theirs.dev_offsets()
    assert set(ours.dev_offsets()) == {"OFF_FILE_INODE", "OFF_INODE_SB", "OFF_DENTRY_SB", "OFF_SB_DEV", "OFF_INODE_INO"}
    for function, expr in (("vfs_read", "file"), ("nfs_file_read", "iocb->ki_filp"), ("fh_verify", "fhp"),
                           ("ext4_file_write_iter", "iocb->ki_filp")):
        found = ours.resolve(function, expr)
        assert found is not None and found == theirs.resolve(function, expr)
    assert ours.btf_module_of("no_such_function_here") is None
    assert ours.vmlinux.struct_ids(("file", "no_such_struct")) == theirs.vmlinux.struct_ids(("file", "no_such_struct"))


def test_a_file_that_is_not_btf_is_refused_in_one_message(tmp_path: Path) -> None:
    (tmp_path / "vmlinux").write_bytes(b"not BTF at all, just bytes" * 4)
    with pytest.raises(BtfError, match="libbpf cannot parse it"):
        KernelBtf(shared(), tmp_path / "vmlinux")
    assert KernelLayout.live(tmp_path) is None
    assert KernelLayout.live(tmp_path / "absent") is None


def test_a_released_layout_frees_libbpfs_parses_and_answers_the_same_after(tmp_path: Path) -> None:
    """A start releases the layout before the object loads (libbpf parses vmlinux's BTF again
    then); a fallback that generates again looks up in a fresh parse, with the same answers."""
    where = btf_dir(ABI_612, ("nfs", "sunrpc"), tmp_path)
    layout = KernelLayout.live(where, ("nfs", "sunrpc"))
    assert layout is not None
    before = (layout.resolve("nfs_file_read", "iocb->ki_filp"), layout.params("rpc_task_end"),
              layout.btf_module_of("nfs_file_write"), layout.name_offsets(), layout.dev_offsets())
    layout.release()
    blobs = [layout.vmlinux, *layout.modules.values()]
    assert all(isinstance(blob, KernelBtf) and blob.handle is None for blob in blobs)
    layout.release()  # twice is harmless
    fresh = KernelLayout.live(where, ("nfs", "sunrpc"))
    assert fresh is not None
    for one in (layout, fresh):
        assert (one.resolve("nfs_file_read", "iocb->ki_filp"), one.params("rpc_task_end"),
                one.btf_module_of("nfs_file_write"), one.name_offsets(), one.dev_offsets()) == before
    assert isinstance(layout.vmlinux, KernelBtf) and layout.vmlinux.handle  # parsed again to answer

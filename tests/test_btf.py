"""BTF reader on real kernel BTF (the running kernel's /sys/kernel/btf/vmlinux)."""
from __future__ import annotations

from pathlib import Path

import pytest

from discover.btf import Btf, BtfError

VMLINUX = Path("/sys/kernel/btf/vmlinux")
needs_btf = pytest.mark.skipif(not VMLINUX.exists(), reason="this kernel exposes no /sys/kernel/btf/vmlinux")


@needs_btf
def test_vmlinux_prototypes() -> None:
    btf = Btf(VMLINUX.read_bytes())
    vfs_read = btf.function("vfs_read")
    assert vfs_read is not None
    assert vfs_read.return_type == "ssize_t"
    assert [p.name for p in vfs_read.params] == ["file", "buf", "count", "pos"]
    assert vfs_read.params[0].type == "struct file *"
    assert vfs_read.params[3].type == "loff_t *"
    assert vfs_read.prototype().startswith("ssize_t vfs_read(struct file *file, ")
    printk = btf.function("_printk")
    assert printk is not None and printk.variadic
    assert btf.function("no_such_function_anywhere") is None
    assert len(btf.function_names()) > 10000


@needs_btf
def test_function_lookup_by_name_agrees_with_the_full_listing() -> None:
    """func_id finds a name through the string section (a live start looks up a few); the
    listing decodes every FUNC record's name: the two agree on every function, the last
    record of a repeated name included."""
    btf = Btf(VMLINUX.read_bytes())
    lookups = {name: btf.func_id(name) for name in ("vfs_read", "_printk", "no_such_function_anywhere", "")}
    listing = btf._func_ids  # noqa: SLF001
    assert lookups == {"vfs_read": listing["vfs_read"], "_printk": listing["_printk"],
                       "no_such_function_anywhere": None, "": None}
    assert all(btf.func_id(name) == type_id for name, type_id in listing.items())


def test_garbage_is_rejected() -> None:
    with pytest.raises(BtfError):
        Btf(b"\x00" * 64)
    with pytest.raises(BtfError):
        Btf(b"\x9f\xeb")

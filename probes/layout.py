"""Kernel struct layouts for the generated probes, read from BTF (no kernel headers).

Why: bcc compiles the probe C at start-up, and including <linux/fs.h> to follow
`iocb->ki_filp->f_path.dentry->d_name.name` costs most of that time under emulation.
The same chain is a handful of byte offsets, which the running kernel's BTF
(/sys/kernel/btf/vmlinux and /sys/kernel/btf/<module>) states exactly. This module turns
argument expressions (`iocb->ki_filp`, `path->dentry`) into (parameter index, offsets)
and finds the offsets that lead from a file or dentry to its name.
"""
from __future__ import annotations

import struct
from pathlib import Path

from discover.btf import (KIND_CONST, KIND_FUNC_PROTO, KIND_PTR, KIND_RESTRICT, KIND_STRUCT,
                          KIND_TYPE_TAG, KIND_TYPEDEF, KIND_UNION, KIND_VOLATILE, Btf, BtfError)
from discover.spec import add_pointer_roles

TYPE_CHECKING = False  # typing's constant without typing (discover/records.py)
if TYPE_CHECKING:
    from typing import Dict, List, NamedTuple, Optional, Tuple, Union
    from probes.libbpf import KernelBtf

    #: a BTF blob as this module reads it: discover's reader, or libbpf's parse of it
    Blob = Union[Btf, KernelBtf]
else:
    from discover.records import NamedTuple

_SKIP = (KIND_TYPEDEF, KIND_CONST, KIND_VOLATILE, KIND_RESTRICT, KIND_TYPE_TAG)


class ArgSource(NamedTuple):
    """Where a value is read at a kprobe: parameter `param` (0-based), then `derefs`.

    Each offset in `derefs` reads a pointer-sized value at (current + offset); no derefs
    means the parameter itself. `struct_name` names what the final value points to
    (`file`, `dentry`) when it is a struct pointer, for the name look-up.
    """

    param: int
    derefs: Tuple[int, ...]
    struct_name: str


class KernelLayout:
    """Function prototypes and struct member offsets from one kernel's BTF blobs."""

    def __init__(self, vmlinux: Blob, modules: Dict[str, Blob]) -> None:
        self.vmlinux = vmlinux
        self.modules = modules

    @classmethod
    def live(cls, sysfs_btf: Path = Path("/sys/kernel/btf"),
             modules: Tuple[str, ...] = ()) -> Optional["KernelLayout"]:
        """The running kernel's BTF, or None when it has none (then probes carry no names).
        Parsed by libbpf.so.1 where it loads (probes.libbpf.KernelBtf: in C, a quarter of
        the memory), else (Debian 11's bcc-only hosts) by discover.btf's reader."""
        from probes.libbpf import KernelBtf, LibbpfError, shared
        try:
            lib = shared()
        except LibbpfError:
            lib = None
        try:
            base: Blob = (KernelBtf(lib, sysfs_btf / "vmlinux") if lib is not None
                          else Btf((sysfs_btf / "vmlinux").read_bytes()))
        except (OSError, BtfError):
            return None
        blobs: Dict[str, Blob] = {}
        for module in modules:
            path = sysfs_btf / module
            try:
                blobs[module] = (KernelBtf(lib, path, base) if isinstance(base, KernelBtf)
                                 else Btf(path.read_bytes(), base=base))
            except (OSError, BtfError):
                continue
        return cls(base, blobs)

    def release(self) -> None:
        """Free libbpf's parses of the blobs (modules first: each points into vmlinux's) until
        the next look-up parses them again: a start calls it once its look-ups are done, before
        the loader parses vmlinux's BTF itself. discover.btf's blobs are kept."""
        from probes.libbpf import KernelBtf
        for blob in [*self.modules.values(), self.vmlinux]:
            if isinstance(blob, KernelBtf):
                blob.release()

    # raw records ----------------------------------------------------------
    def _blob_for(self, function: str) -> Optional[Blob]:
        name = self.btf_module_of(function)
        return None if name is None else self.modules.get(name, self.vmlinux)

    def btf_module_of(self, function: str) -> Optional[str]:
        """The BTF blob that declares `function` ("vmlinux" or a module): where a fentry
        program's target is looked up (bcc's MODULE_KFUNC_PROBE names it)."""
        for name, blob in list(self.modules.items()) + [("vmlinux", self.vmlinux)]:
            if blob.func_id(function) is not None:
                return name
        return None

    def func_type_id(self, function: str) -> Optional[int]:
        """The type id of `function`'s FUNC record in the BTF that declares it (btf_module_of):
        a fentry program's target as the kernel takes it (a module's ids continue vmlinux's)."""
        blob = self._blob_for(function)
        return None if blob is None else blob.func_id(function)

    @staticmethod
    def _raw(blob: Blob, type_id: int) -> Tuple[Blob, int, int, int, int, int]:
        """(owner, record offset, name_off, kind, vlen, size_or_type) via the reader."""
        return blob._record(type_id)  # noqa: SLF001 - offsets are not in its public API

    def _strip(self, blob: Blob, type_id: int) -> int:
        for _ in range(32):
            if type_id == 0:
                return 0
            _, _, _, kind, _, ref = self._raw(blob, type_id)
            if kind not in _SKIP:
                return type_id
            type_id = ref
        return 0

    def _struct_name(self, blob: Blob, type_id: int) -> str:
        owner, _, name_off, kind, _, _ = self._raw(blob, type_id)
        return owner._str(name_off) if kind in (KIND_STRUCT, KIND_UNION) else ""  # noqa: SLF001

    def params(self, function: str) -> Optional[List[Tuple[str, int]]]:
        """(name, type id) of each parameter of `function`, or None when BTF lacks it."""
        blob = self._blob_for(function)
        if blob is None:
            return None
        func_id = blob.func_id(function)
        assert func_id is not None  # btf_module_of found it there
        proto = self._raw(blob, func_id)[5]
        owner, off, _, kind, vlen, _ = self._raw(blob, proto)
        if kind != KIND_FUNC_PROTO:
            return None
        out = []
        for i in range(vlen):
            name_off, type_id = struct.unpack_from(owner._end + "II", owner._data, off + 12 + 8 * i)  # noqa: SLF001
            out.append((owner._str(name_off), type_id))  # noqa: SLF001
        return out

    def _member(self, blob: Blob, struct_id: int, name: str) -> Optional[Tuple[int, int]]:
        """(byte offset, member type id) of `name` in a struct/union, looking into anonymous members."""
        struct_id = self._strip(blob, struct_id)
        owner, off, _, kind, vlen, _ = self._raw(blob, struct_id)
        if kind not in (KIND_STRUCT, KIND_UNION):
            return None
        kind_flag = struct.unpack_from(owner._end + "I", owner._data, off + 4)[0] >> 31  # noqa: SLF001
        for i in range(vlen):
            name_off, member_type, bits = struct.unpack_from(owner._end + "III", owner._data,  # noqa: SLF001
                                                             off + 12 + 12 * i)
            bit_offset = bits & 0xFFFFFF if kind_flag else bits
            member_name = owner._str(name_off)  # noqa: SLF001
            if member_name == name:
                return bit_offset // 8, member_type
            if not member_name:
                inner = self._member(blob, member_type, name)
                if inner is not None:
                    return bit_offset // 8 + inner[0], inner[1]
        return None

    def _pointee(self, blob: Blob, type_id: int) -> Optional[int]:
        type_id = self._strip(blob, type_id)
        if type_id == 0:
            return None
        _, _, _, kind, _, ref = self._raw(blob, type_id)
        return self._strip(blob, ref) if kind == KIND_PTR else None

    def member_path(self, blob: Blob, struct_id: int, path: List[str]) -> Optional[Tuple[int, int]]:
        """Byte offset of `a.b.c` (embedded members only) inside a struct, and its type id."""
        offset = 0
        type_id = struct_id
        for name in path:
            found = self._member(blob, type_id, name)
            if found is None:
                return None
            offset += found[0]
            type_id = found[1]
        return offset, type_id

    def resolve(self, function: str, expr: str) -> Optional[ArgSource]:
        """`iocb->ki_filp` or `path->dentry` or `file` at `function`'s entry, or None."""
        params = self.params(function)
        if params is None:
            return None
        blob = self._blob_for(function)
        assert blob is not None
        parts = expr.split("->")
        index = next((i for i, (name, _) in enumerate(params) if name == parts[0]), None)
        if index is None:
            return None
        type_id = params[index][1]
        derefs: List[int] = []
        for member in parts[1:]:
            target = self._pointee(blob, type_id)
            if target is None:
                return None
            found = self.member_path(blob, target, member.split("."))
            if found is None:
                return None
            derefs.append(found[0])
            type_id = found[1]
        target = self._pointee(blob, type_id)
        return ArgSource(index, tuple(derefs), self._struct_name(blob, target) if target else "")

    def embedded_struct(self, function: str, expr: str) -> str:
        """The struct type name of the member `expr` ends on (`rqstp->rq_addr`: a struct held
        inside its parent, not a pointer), or "" when it is none."""
        params = self.params(function)
        blob = self._blob_for(function)
        parts = expr.split("->")
        if params is None or blob is None or len(parts) < 2:
            return ""
        type_id = next((tid for name, tid in params if name == parts[0]), None)
        for member in parts[1:]:
            target = self._pointee(blob, type_id) if type_id is not None else None
            found = self.member_path(blob, target, member.split(".")) if target else None
            if found is None:
                return ""
            type_id = found[1]
        return self._struct_name(blob, self._strip(blob, type_id))

    def infer_args(self, function: str) -> Dict[str, str]:
        """Roles from parameter types when the spec names none (it was proposed without BTF).

        Pointer parameters give roles by their struct (discover.spec.ROLES_BY_POINTEE);
        the first match per role wins.
        """
        params = self.params(function)
        blob = self._blob_for(function)
        if params is None or blob is None:
            return {}
        roles: Dict[str, str] = {}
        for name, type_id in params:
            target = self._pointee(blob, type_id)
            if target:
                add_pointer_roles(roles, name, self._struct_name(blob, target))
        return roles

    def name_offsets(self) -> Dict[str, int]:
        """OFF_FILE_PATH_DENTRY (file.f_path.dentry) and OFF_DENTRY_NAME (dentry.d_name.name)."""
        out: Dict[str, int] = {}
        ids = self.vmlinux.struct_ids(("file", "dentry"))
        if "file" in ids:
            found = self.member_path(self.vmlinux, ids["file"], ["f_path", "dentry"])
            if found is not None:
                out["OFF_FILE_PATH_DENTRY"] = found[0]
        if "dentry" in ids:
            found = self.member_path(self.vmlinux, ids["dentry"], ["d_name", "name"])
            if found is not None:
                out["OFF_DENTRY_NAME"] = found[0]
        return out


    def dev_offsets(self) -> Dict[str, int]:
        """Offsets from a struct file * or struct dentry * to its superblock's s_dev (the mount):
        OFF_FILE_INODE (file.f_inode), OFF_INODE_SB (inode.i_sb), OFF_DENTRY_SB (dentry.d_sb),
        OFF_SB_DEV (super_block.s_dev); OFF_INODE_INO (inode.i_ino): a printed line's inode."""
        out: Dict[str, int] = {}
        ids = self.vmlinux.struct_ids(("file", "inode", "dentry", "super_block"))
        for macro, owner, path in (("OFF_FILE_INODE", "file", ["f_inode"]), ("OFF_INODE_SB", "inode", ["i_sb"]),
                                   ("OFF_DENTRY_SB", "dentry", ["d_sb"]), ("OFF_SB_DEV", "super_block", ["s_dev"]),
                                   ("OFF_INODE_INO", "inode", ["i_ino"])):
            found = self.member_path(self.vmlinux, ids[owner], path) if owner in ids else None
            if found is not None:
                out[macro] = found[0]
        return out

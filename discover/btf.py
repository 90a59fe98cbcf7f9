"""A small reader for BPF Type Format (BTF) blobs: function prototypes from vmlinux and modules.

Why our own: no maintained Python library reads kernel BTF, and probekit only needs the
function prototypes (name, linkage, return and parameter types) to say whether fentry/fexit
can attach and which argument holds the file, bytes or offset. It takes bytes, so the same
code reads /sys/kernel/btf/* on a live kernel and the .BTF section of a packaged kernel.

Module BTF is "split" BTF: its type ids continue after the base (vmlinux) blob's, and its
string offsets continue after the base string section. Pass the parsed vmlinux as `base`.
Format reference: the kernel's Documentation/bpf/btf.rst (header, type records, strings).
"""
from __future__ import annotations

import struct
import sys
from array import array

TYPE_CHECKING = False  # typing's constant without typing (discover/records.py)
if TYPE_CHECKING:
    from typing import Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union
else:
    from discover.records import NamedTuple

MAGIC = 0xEB9F

# Kinds (btf_type.info bits 24-28).
KIND_INT, KIND_PTR, KIND_ARRAY, KIND_STRUCT, KIND_UNION, KIND_ENUM = 1, 2, 3, 4, 5, 6
KIND_FWD, KIND_TYPEDEF, KIND_VOLATILE, KIND_CONST, KIND_RESTRICT = 7, 8, 9, 10, 11
KIND_FUNC, KIND_FUNC_PROTO, KIND_VAR, KIND_DATASEC, KIND_FLOAT = 12, 13, 14, 15, 16
KIND_DECL_TAG, KIND_TYPE_TAG, KIND_ENUM64 = 17, 18, 19

#: bytes of kind-specific data after the 12-byte btf_type record: (fixed, per vlen item)
_EXTRA: Dict[int, Tuple[int, int]] = {
    KIND_INT: (4, 0), KIND_PTR: (0, 0), KIND_ARRAY: (12, 0), KIND_STRUCT: (0, 12),
    KIND_UNION: (0, 12), KIND_ENUM: (0, 8), KIND_FWD: (0, 0), KIND_TYPEDEF: (0, 0),
    KIND_VOLATILE: (0, 0), KIND_CONST: (0, 0), KIND_RESTRICT: (0, 0), KIND_FUNC: (0, 0),
    KIND_FUNC_PROTO: (0, 8), KIND_VAR: (4, 0), KIND_DATASEC: (0, 12), KIND_FLOAT: (0, 0),
    KIND_DECL_TAG: (4, 0), KIND_TYPE_TAG: (0, 0), KIND_ENUM64: (0, 12),
}

#: the same, in 4-byte words with the record's own three: (fixed, per vlen item), by kind
#: (None: a kind this reader does not know); every record is a whole number of words
_WORDS: List[Optional[Tuple[int, int]]] = [None] * 32
for _kind, (_fixed, _per) in _EXTRA.items():
    _WORDS[_kind] = (3 + _fixed // 4, _per // 4)

LINKAGE = {0: "static", 1: "global", 2: "extern"}


class BtfError(ValueError):
    """The bytes are not a BTF blob this reader understands."""


def sections(data: Union[bytes, memoryview]) -> Tuple[str, int, int, int, int]:
    """(struct's byte order, the type section's start and length, the string section's start and
    length) from a blob's header, checked. Why shared: probes.libbpf walks the records of
    libbpf's parse of a module's blob with index_types too."""
    if len(data) < 24:
        raise BtfError("too short for a BTF header")
    if struct.unpack_from("<H", data, 0)[0] == MAGIC:
        end = "<"
    elif struct.unpack_from(">H", data, 0)[0] == MAGIC:
        end = ">"
    else:
        raise BtfError("bad BTF magic")
    _, version, _flags, hdr_len = struct.unpack_from(end + "HBBI", data, 0)
    if version != 1:
        raise BtfError(f"unsupported BTF version {version}")
    type_off, type_len, str_off, str_len = struct.unpack_from(end + "IIII", data, 8)
    types_start = hdr_len + type_off
    strs_start = hdr_len + str_off
    if types_start + type_len > len(data) or strs_start + str_len > len(data):
        raise BtfError("BTF sections run past the end of the data")
    return end, types_start, type_len, strs_start, str_len


def index_types(data: Union[bytes, memoryview], end: str, start: int, length: int,
                first_id: int) -> Tuple[List[int], Dict[int, int]]:
    """Each record's offset in `data`, and the FUNC records' name offsets -> the last such
    record's id, in one pass over the type section (`length` bytes at `start`, its first record
    `first_id`) read as 4-byte words (a vmlinux has 100,000+ records: the pass is most of its
    parse)."""
    if length % 4:
        raise BtfError("BTF type section ends inside a type record")
    words = array("I")  # C's unsigned int: 4 bytes on Linux
    words.frombytes(data[start:start + length])
    if (end == "<") != (sys.byteorder == "little"):
        words.byteswap()
    offsets: List[int] = []
    funcs: Dict[int, int] = {}
    append, sizes = offsets.append, _WORDS
    next_id, i, count = first_id, 0, len(words)
    try:
        while i < count:
            info = words[i + 1]
            kind = (info >> 24) & 0x1F
            size = sizes[kind]
            if size is None:
                raise BtfError(f"unknown BTF kind {kind} at type id {next_id}")
            append(start + 4 * i)
            if kind == KIND_FUNC:
                funcs[words[i]] = next_id
            i += size[0] + size[1] * (info & 0xFFFF)
            next_id += 1
    except IndexError:
        raise BtfError("BTF type section ends inside a type record") from None
    if i != count:
        raise BtfError("BTF type section ends inside a type record")
    return offsets, funcs


def func_names(name_offs: Dict[int, int], name_of: Callable[[int], str]) -> Dict[str, int]:
    """FUNC records' names -> ids from index_types' name offsets, `name_of` decoding one: of
    several records of a name (at one offset or several), the last."""
    names: Dict[str, int] = {}
    for off, type_id in name_offs.items():
        name = name_of(off)
        if names.get(name, 0) < type_id:  # a compare, not max(): a call a name costs a quarter of the table
            names[name] = type_id
    return names


def string_at(strs: bytes, off: int) -> str:
    """The string at `off` in a string section (its own numbering), up to its NUL."""
    end = strs.find(b"\0", off)
    return strs[off:end if end >= 0 else None].decode("utf-8", "replace")


class BtfParam(NamedTuple):
    name: str
    type: str


class BtfMember(NamedTuple):
    name: str
    type: str
    offset: int  # bytes from the start of the struct
    size: int
    signed: bool


class BtfFunction(NamedTuple):
    """One FUNC record: what fentry/fexit would see."""

    name: str
    linkage: str  # static | global | extern
    return_type: str
    params: Tuple[BtfParam, ...]
    variadic: bool

    def prototype(self) -> str:
        """C-like one-line prototype, e.g. `ssize_t nfs_file_read(struct kiocb *iocb, ...)`."""
        args = [_declare(p.type, p.name) for p in self.params]
        if self.variadic:
            args.append("...")
        ret = self.return_type
        sep = "" if ret.endswith("*") else " "
        return f"{ret}{sep}{self.name}({', '.join(args) or 'void'})"


def _declare(type_str: str, name: str) -> str:
    if not name:
        return type_str
    if "(*)" in type_str:
        return type_str.replace("(*)", f"(*{name})", 1)
    return f"{type_str}{'' if type_str.endswith('*') else ' '}{name}"


class Btf:
    """Parsed BTF: type records indexed by id (base types first when split)."""

    def __init__(self, data: bytes, base: Optional["Btf"] = None) -> None:
        self._end, types_start, type_len, strs_start, str_len = sections(data)
        self._data = data
        self._strs = data[strs_start:strs_start + str_len]
        self.base = base
        self._first_id = base.type_count if base is not None else 1
        self._str_base = base._strings_end() if base is not None else 0
        #: each record's offset; FUNC records' name offsets -> the last such record's id (names
        #: are decoded only when looked up (func_id) or listed (_func_ids): a live start looks
        #: up a handful of the 50,000+ functions of vmlinux)
        self._offsets, self._func_name_offs = index_types(data, self._end, types_start, type_len, self._first_id)
        self._func_names: Optional[Dict[str, int]] = None
        self._looked_up: Dict[str, Optional[int]] = {}
        self._name_cache: Dict[int, str] = {}

    @property
    def type_count(self) -> int:
        """Ids in use including the base's and id 0 (void): the next split blob's first id."""
        return self._first_id + len(self._offsets)

    def _strings_end(self) -> int:
        base_end = self.base._strings_end() if self.base is not None else 0
        return base_end + len(self._strs)

    def _name_offsets(self, name: bytes) -> Iterator[int]:
        """Every string offset (this blob's numbering, the base's strings first) where `name` is
        a whole string."""
        if self.base is not None:
            yield from self.base._name_offsets(name)
        strs, wanted = self._strs, b"\0" + name + b"\0"
        if strs.startswith(name + b"\0"):
            yield self._str_base
        at = strs.find(wanted)
        while at >= 0:
            yield self._str_base + at + 1
            at = strs.find(wanted, at + 1)

    def func_id(self, name: str) -> Optional[int]:
        """The type id of this blob's (not its base's) FUNC record called `name` (of several,
        the last), or None: found through the string section, not by decoding every name."""
        if self._func_names is not None:
            return self._func_names.get(name)
        if name not in self._looked_up:
            ids = [self._func_name_offs[off] for off in self._name_offsets(name.encode())
                   if off in self._func_name_offs]
            self._looked_up[name] = max(ids) if ids else None
        return self._looked_up[name]

    @property
    def _func_ids(self) -> Dict[str, int]:
        """Every FUNC record's name -> its id (of several, the last), in type-id order of first use."""
        if self._func_names is None:
            self._func_names = func_names(self._func_name_offs, self._str)
        return self._func_names

    def _str(self, off: int) -> str:
        if off < self._str_base:
            assert self.base is not None
            return self.base._str(off)
        return string_at(self._strs, off - self._str_base)

    def _record(self, type_id: int) -> Tuple["Btf", int, int, int, int, int]:
        """(owner blob, offset, name_off, kind, vlen, size_or_type) for a type id."""
        if type_id < self._first_id:
            if self.base is None:
                raise BtfError(f"type id {type_id} is void or out of range")
            return self.base._record(type_id)
        idx = type_id - self._first_id
        if idx >= len(self._offsets):
            raise BtfError(f"type id {type_id} out of range")
        off = self._offsets[idx]
        name_off, info, size_or_type = struct.unpack_from(self._end + "III", self._data, off)
        return self, off, name_off, (info >> 24) & 0x1F, info & 0xFFFF, size_or_type

    def type_name(self, type_id: int) -> str:
        """C spelling of a type: `struct kiocb *`, `const char *`, `u64`, `int (*)(int)`."""
        if type_id == 0:
            return "void"
        cached = self._name_cache.get(type_id)
        if cached is None:
            cached = self._spell(type_id, 0)
            self._name_cache[type_id] = cached
        return cached

    def _spell(self, type_id: int, depth: int) -> str:
        if type_id == 0:
            return "void"
        if depth > 32:
            return "?"
        owner, off, name_off, kind, vlen, ref = self._record(type_id)
        name = owner._str(name_off)
        if kind in (KIND_INT, KIND_FLOAT, KIND_TYPEDEF):
            return name
        if kind in (KIND_STRUCT, KIND_UNION, KIND_ENUM, KIND_ENUM64, KIND_FWD):
            word = {KIND_STRUCT: "struct", KIND_UNION: "union", KIND_FWD: "struct"}.get(kind, "enum")
            if kind == KIND_FWD:
                word = "union" if (struct.unpack_from(owner._end + "I", owner._data, off + 4)[0] >> 31) else "struct"
            return f"{word} {name or '(anon)'}"
        if kind == KIND_PTR:
            target = self._resolve_kind(ref)
            if target == KIND_FUNC_PROTO:
                return self._spell_proto(ref, depth + 1, "(*)")
            inner = self._spell(ref, depth + 1)
            return inner + ("*" if inner.endswith("*") else " *")
        if kind in (KIND_CONST, KIND_VOLATILE, KIND_RESTRICT):
            word = {KIND_CONST: "const", KIND_VOLATILE: "volatile", KIND_RESTRICT: "restrict"}[kind]
            inner = self._spell(ref, depth + 1)
            return f"{inner} {word}" if inner.endswith("*") else f"{word} {inner}"
        if kind in (KIND_TYPE_TAG, KIND_DECL_TAG, KIND_VAR, KIND_FUNC):
            return self._spell(ref, depth + 1)
        if kind == KIND_ARRAY:
            elem, _index_type, nelems = struct.unpack_from(owner._end + "III", owner._data, off + 12)
            return f"{self._spell(elem, depth + 1)}[{nelems}]"
        if kind == KIND_FUNC_PROTO:
            return self._spell_proto(type_id, depth + 1, "")
        return name or "?"

    def _resolve_kind(self, type_id: int) -> int:
        """Kind after skipping typedef-free modifiers (to spot function pointers)."""
        for _ in range(32):
            if type_id == 0:
                return 0
            _, _, _, kind, _, ref = self._record(type_id)
            if kind not in (KIND_CONST, KIND_VOLATILE, KIND_RESTRICT, KIND_TYPE_TAG):
                return kind
            type_id = ref
        return 0

    def _spell_proto(self, proto_id: int, depth: int, declarator: str) -> str:
        ret, params, variadic = self._proto(proto_id, depth)
        args = [p.type for p in params] + (["..."] if variadic else [])
        return f"{ret} {declarator}({', '.join(args) or 'void'})"

    def _proto(self, proto_id: int, depth: int = 0) -> Tuple[str, Tuple[BtfParam, ...], bool]:
        owner, off, _, kind, vlen, ret_id = self._record(proto_id)
        if kind != KIND_FUNC_PROTO:
            raise BtfError(f"type id {proto_id} is not a FUNC_PROTO")
        params: List[BtfParam] = []
        variadic = False
        pos = off + 12
        for i in range(vlen):
            name_off, type_id = struct.unpack_from(owner._end + "II", owner._data, pos + 8 * i)
            if type_id == 0 and name_off == 0 and i == vlen - 1:
                variadic = True
                continue
            params.append(BtfParam(owner._str(name_off), self._spell(type_id, depth + 1)))
        return self._spell(ret_id, depth + 1), tuple(params), variadic

    def function(self, name: str) -> Optional[BtfFunction]:
        """The FUNC record called `name` in this blob (not its base), or None."""
        type_id = self.func_id(name)
        if type_id is None:
            return None
        _, _, _, _, vlen, proto_id = self._record(type_id)
        ret, params, variadic = self._proto(proto_id)
        return BtfFunction(name, LINKAGE.get(vlen, str(vlen)), ret, params, variadic)

    def function_names(self) -> List[str]:
        """Names of every FUNC in this blob (not its base), in type-id order."""
        return list(self._func_ids)

    def named_types(self, kind: int, prefix: str = "") -> Iterator[Tuple[str, int]]:
        """(name, type id) of this blob's (not its base's) types of one kind, names starting with prefix.

        Kernel packages need it for `btf_trace_<event>` typedefs (the tracepoints a blob
        defines) and `trace_event_raw_<class>` structs (their record fields).
        """
        unpack = struct.Struct(self._end + "III").unpack_from
        for idx, off in enumerate(self._offsets):
            name_off, info, _ = unpack(self._data, off)
            if (info >> 24) & 0x1F == kind and name_off:
                name = self._str(name_off)
                if name.startswith(prefix):
                    yield name, self._first_id + idx

    def struct_ids(self, names: Sequence[str]) -> Dict[str, int]:
        """Type ids of this blob's complete structs by name (the first of each name), in one
        pass (forward declarations are not structs)."""
        wanted = set(names)
        out: Dict[str, int] = {}
        for name, type_id in self.named_types(KIND_STRUCT):
            if name in wanted and name not in out:
                out[name] = type_id
                if len(out) == len(wanted):
                    break
        return out

    def referenced(self, type_id: int) -> int:
        """The type a typedef, pointer or modifier refers to (a typedef's target)."""
        return self._record(type_id)[5]

    def members(self, type_id: int) -> List["BtfMember"]:
        """Members of a struct or union (name, C type, byte offset, size, signed); empty for other kinds."""
        owner, off, _, kind, vlen, _ = self._record(type_id)
        if kind not in (KIND_STRUCT, KIND_UNION):
            return []
        kind_flag = (struct.unpack_from(owner._end + "I", owner._data, off + 4)[0] >> 31) & 1
        out = []
        for i in range(vlen):
            name_off, member_type, offset = struct.unpack_from(owner._end + "III", owner._data, off + 12 + 12 * i)
            bits = offset & 0xFFFFFF if kind_flag else offset
            size, signed = self.size_of(member_type)
            out.append(BtfMember(owner._str(name_off), self._spell(member_type, 1), bits // 8, size, signed))
        return out

    def size_of(self, type_id: int) -> Tuple[int, bool]:
        """(bytes, signed) of a type, through typedefs and modifiers (0 for void and functions)."""
        for _ in range(32):
            if type_id == 0:
                return 0, False
            owner, off, _, kind, _vlen, ref = self._record(type_id)
            if kind == KIND_INT:
                encoding = struct.unpack_from(owner._end + "I", owner._data, off + 12)[0] >> 24
                return ref, bool(encoding & 1)
            if kind in (KIND_STRUCT, KIND_UNION, KIND_ENUM, KIND_ENUM64, KIND_FLOAT):
                return ref, False
            if kind == KIND_PTR:
                return 8, False
            if kind == KIND_ARRAY:
                elem, _index_type, nelems = struct.unpack_from(owner._end + "III", owner._data, off + 12)
                return self.size_of(elem)[0] * nelems, False
            if kind not in (KIND_TYPEDEF, KIND_CONST, KIND_VOLATILE, KIND_RESTRICT, KIND_TYPE_TAG):
                return 0, False
            type_id = ref
        return 0, False

    def functions(self) -> Iterator[BtfFunction]:
        for name in self._func_ids:
            func = self.function(name)
            if func is not None:
                yield func

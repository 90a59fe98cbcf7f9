"""A thin ctypes binding of Debian's libbpf (libbpf.so.1): what loading a prebuilt probe needs.

Why ctypes: the client then needs libbpf1 (385 kB) and Python, not LLVM, clang or bcc, and
no Python binding of libbpf on PyPI is maintained. Only the calls the CO-RE backend makes
are bound, each as libbpf >= 1.0 declares it (NULL or a negative errno on failure, errno
set). Map keys and values come back as ctypes structs built from the object's own BTF, so
a reader writes `key.op` whichever loader produced the key.
"""
from __future__ import annotations

import ctypes
import errno
import os
import struct
from contextlib import contextmanager
from pathlib import Path

from discover.btf import (KIND_ARRAY, KIND_FUNC, KIND_STRUCT, KIND_UNION, Btf, BtfError, func_names,
                          index_types, sections, string_at)

TYPE_CHECKING = False  # typing's constant without typing (discover/records.py)
if TYPE_CHECKING:
    from typing import Any, Callable, Collection, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

_p, _i, _u32, _sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_size_t
#: (name, result type, argument types) of every libbpf function used here
_SIGNATURES: Tuple[Tuple[str, Any, Tuple[Any, ...]], ...] = (
    ("libbpf_major_version", _u32, ()), ("libbpf_minor_version", _u32, ()),
    ("libbpf_set_print", _p, (_p,)),
    ("bpf_object__open_mem", _p, (_p, _sz, _p)), ("bpf_object__load", _i, (_p,)),
    ("bpf_object__close", None, (_p,)), ("bpf_object__btf", _p, (_p,)),
    ("bpf_object__next_program", _p, (_p, _p)), ("bpf_object__next_map", _p, (_p, _p)),
    ("bpf_program__name", ctypes.c_char_p, (_p,)), ("bpf_program__section_name", ctypes.c_char_p, (_p,)),
    ("bpf_program__set_autoload", _i, (_p, ctypes.c_bool)), ("bpf_program__autoload", ctypes.c_bool, (_p,)),
    ("bpf_program__fd", _i, (_p,)), ("bpf_program__attach", _p, (_p,)),
    ("bpf_program__set_attach_target", _i, (_p, _i, ctypes.c_char_p)),
    ("bpf_link__destroy", _i, (_p,)), ("bpf_link__fd", _i, (_p,)),
    ("bpf_obj_get_info_by_fd", _i, (_i, _p, ctypes.POINTER(_u32))),
    ("bpf_map__name", ctypes.c_char_p, (_p,)), ("bpf_map__fd", _i, (_p,)),
    ("bpf_map__set_max_entries", _i, (_p, _u32)), ("bpf_map__max_entries", _u32, (_p,)),
    ("bpf_map__set_map_flags", _i, (_p, _u32)), ("bpf_map__map_flags", _u32, (_p,)),
    ("bpf_program__insns", _p, (_p,)), ("bpf_program__insn_cnt", _sz, (_p,)),
    ("bpf_program__set_insns", _i, (_p, _p, _sz)), ("bpf_map__value_size", _u32, (_p,)),
    ("bpf_map__key_size", _u32, (_p,)), ("bpf_map__reuse_fd", _i, (_p, _i)),
    ("bpf_map__btf_key_type_id", _u32, (_p,)), ("bpf_map__btf_value_type_id", _u32, (_p,)),
    ("btf__raw_data", _p, (_p, ctypes.POINTER(_u32))),
    ("btf__parse_raw", _p, (ctypes.c_char_p,)), ("btf__parse_raw_split", _p, (ctypes.c_char_p, _p)),
    ("btf__load_vmlinux_btf", _p, ()),
    ("btf__free", None, (_p,)), ("btf__type_cnt", _u32, (_p,)), ("btf__type_by_id", _p, (_p, _u32)),
    ("btf__name_by_offset", ctypes.c_char_p, (_p, _u32)), ("btf__find_by_name_kind", ctypes.c_int32, (_p, ctypes.c_char_p, _u32)),
    ("bpf_map_lookup_elem", _i, (_i, _p, _p)), ("bpf_map_update_elem", _i, (_i, _p, _p, ctypes.c_uint64)),
    ("bpf_map_delete_elem", _i, (_i, _p)), ("bpf_map_get_next_key", _i, (_i, _p, _p)),
    ("bpf_map_lookup_batch", _i, (_i, _p, _p, _p, _p, ctypes.POINTER(_u32), _p)),
    ("ring_buffer__new", _p, (_i, _p, _p, _p)), ("ring_buffer__poll", _i, (_p, _i)),
    ("ring_buffer__consume", _i, (_p,)), ("ring_buffer__free", None, (_p,)),
)
#: calls bound where libbpf.so.1 has them (all of them from 1.0): naming a module's fentry/fexit
#: target by BTF object fd and type id (TraceTargets); BTF_OBJ_TARGET_CALLS says which it needs
_OPTIONAL_SIGNATURES: Tuple[Tuple[str, Any, Tuple[Any, ...]], ...] = (
    ("libbpf_register_prog_handler", _i, (ctypes.c_char_p, _i, _i, _p)),
    ("libbpf_unregister_prog_handler", _i, (_i,)),
    ("bpf_btf_get_next_id", _i, (_u32, ctypes.POINTER(_u32))), ("bpf_btf_get_fd_by_id", _i, (_u32,)),
    ("bpf_program__attach_trace", _p, (_p,)),
)
BTF_OBJ_TARGET_CALLS = tuple(name for name, _restype, _argtypes in _OPTIONAL_SIGNATURES)
#: libbpf's ring_buffer_sample_fn
SAMPLE_FN = ctypes.CFUNCTYPE(_i, _p, _p, _sz)
#: libbpf's libbpf_print_fn_t; the va_list goes on to vsnprintf as it came
PRINT_FN = ctypes.CFUNCTYPE(_i, _i, ctypes.c_char_p, _p)
#: enum libbpf_print_level's LIBBPF_DEBUG (WARN 0, INFO 1)
LIBBPF_DEBUG = 2
#: every printer given to libbpf, never freed: libbpf keeps the last one set for the whole
#: process, and a freed one would be called on its next line (a Libbpf dropped, another kept)
_PRINTERS: List[Any] = []
#: the library loaded: Debian's libbpf1 (bookworm 1.1, trixie 1.5)
SONAME = "libbpf.so.1"
#: the oldest libbpf the loader is written against (NULL-and-errno returns, open_mem's opts)
MIN_VERSION = (1, 0)


#: enum bpf_link_type's BPF_LINK_TYPE_PERF_EVENT: a kprobe attached through a perf event
LINK_TYPE_PERF_EVENT = 7
#: enum bpf_perf_event_type: the kinds whose link info carries the kprobe's missed count (6.7+)
PERF_EVENT_KINDS = {3: "kprobe", 4: "kretprobe"}


class PerfLinkInfo(ctypes.Structure):
    """The head of struct bpf_link_info as far as its perf_event.kprobe member (uapi bpf.h):
    the kernel fills no more than the length it is given."""

    _fields_ = [("type", _u32), ("id", _u32), ("prog_id", _u32), ("_pad0", _u32),
                ("perf_type", _u32), ("_pad1", _u32), ("func_name", ctypes.c_uint64), ("name_len", _u32),
                ("offset", _u32), ("addr", ctypes.c_uint64), ("missed", ctypes.c_uint64),
                ("cookie", ctypes.c_uint64)]


#: enum bpf_prog_type's BPF_PROG_TYPE_TRACING; enum bpf_attach_type's BPF_TRACE_FENTRY and
#: BPF_TRACE_FEXIT (uapi bpf.h)
PROG_TYPE_TRACING, TRACE_FENTRY, TRACE_FEXIT = 26, 24, 25
#: the object's fentry and fexit sections (probes.generate.Program.section: `fentry/FUNCTION`) as
#: libbpf matches a handler's section: one ending in "/" takes every section that starts so
TRACE_SECTIONS = (("fentry/", TRACE_FENTRY), ("fexit/", TRACE_FEXIT))


class ProgLoadOpts(ctypes.Structure):
    """struct bpf_prog_load_opts (bpf.h) as far as attach_btf_obj_fd: libbpf only appends
    members (`sz` says how many a caller has), and these have been where they are since 0.6."""

    _fields_ = [("sz", _sz), ("attempts", _i), ("expected_attach_type", _i), ("prog_btf_fd", _u32),
                ("prog_flags", _u32), ("prog_ifindex", _u32), ("kern_version", _u32),
                ("attach_btf_id", _u32), ("attach_prog_fd", _u32), ("attach_btf_obj_fd", _u32)]


#: libbpf_prog_prepare_load_fn_t: (program, its load options, the handler's cookie)
PREPARE_LOAD_FN = ctypes.CFUNCTYPE(_i, _p, ctypes.POINTER(ProgLoadOpts), ctypes.c_long)


class ProgHandlerOpts(ctypes.Structure):
    """struct libbpf_prog_handler_opts (libbpf.h: the same members from 1.0 to 1.7)."""

    _fields_ = [("sz", _sz), ("cookie", ctypes.c_long), ("prog_setup_fn", _p),
                ("prog_prepare_load_fn", PREPARE_LOAD_FN), ("prog_attach_fn", _p)]


class BtfInfo(ctypes.Structure):
    """struct bpf_btf_info (uapi bpf.h; name and kernel_btf from 5.11). `btf` left 0: the kernel
    then copies no blob, only the name."""

    _fields_ = [("btf", ctypes.c_uint64), ("btf_size", _u32), ("id", _u32), ("name", ctypes.c_uint64),
                ("name_len", _u32), ("kernel_btf", _u32)]


class LibbpfError(OSError):
    """A libbpf call failed; the message names the call and what libbpf logged before it."""


#: path -> the one Libbpf of this process that loaded it (shared())
_SHARED: Dict[Optional[str], "Libbpf"] = {}


class Libbpf:
    """libbpf.so.1's functions, typed; `log` keeps what libbpf printed since the last take_log()."""

    def __init__(self, path: Optional[str] = None) -> None:
        # the soname, not find_library("bpf"): that finds bullseye's libbpf.so.0 (0.3) as readily
        name = path or SONAME
        try:
            self.lib = ctypes.CDLL(name, use_errno=True)
        except OSError as exc:
            raise LibbpfError(0, f"cannot load {name}: {exc}: apt-get install libbpf1") from None
        for function, restype, argtypes in _SIGNATURES:
            try:
                func = getattr(self.lib, function)
            except AttributeError:
                raise LibbpfError(0, f"{name} has no {function}: older than libbpf "
                                  f"{'.'.join(map(str, MIN_VERSION))}") from None
            func.restype, func.argtypes = restype, list(argtypes)
        #: the optional calls this libbpf.so.1 lacks
        self.lacking = tuple(function for function, _restype, _argtypes in _OPTIONAL_SIGNATURES
                             if not hasattr(self.lib, function))
        for function, restype, argtypes in _OPTIONAL_SIGNATURES:
            if function not in self.lacking:
                func = getattr(self.lib, function)
                func.restype, func.argtypes = restype, list(argtypes)
        self.version = (int(self.lib.libbpf_major_version()), int(self.lib.libbpf_minor_version()))
        self.log: List[str] = []
        libc = ctypes.CDLL(None)
        #: glibc's malloc_trim (None elsewhere): trim_heap
        self._malloc_trim = getattr(libc, "malloc_trim", None)
        self._vsnprintf = libc.vsnprintf
        self._vsnprintf.argtypes = [ctypes.c_char_p, _sz, ctypes.c_char_p, _p]

        def printer(level: int, fmt: bytes, args: int) -> int:
            if level >= LIBBPF_DEBUG:  # hundreds of lines per open; a refusal comes at WARN
                return 0
            buf = ctypes.create_string_buffer(1 << 20)  # a verifier log is one message
            self._vsnprintf(buf, len(buf), fmt, args)
            self.log.append(buf.value.decode("utf-8", "replace"))
            return 0
        self._printer = PRINT_FN(printer)
        _PRINTERS.append(self._printer)  # libbpf's printer is the process's: it outlives this object
        self.lib.libbpf_set_print(ctypes.cast(self._printer, _p))
        self._trace_targets: Optional[TraceTargets] = None

    def trace_targets(self) -> "TraceTargets":
        """The process's one set of fentry/fexit section handlers (libbpf's are process-wide)."""
        if self._trace_targets is None:
            self._trace_targets = TraceTargets(self)
        return self._trace_targets

    def trim_heap(self) -> None:
        """The heap's free pages back to the kernel (glibc's malloc_trim): before libbpf parses
        the kernel's BTF, whose ~11 MiB at its height come on top of what the process holds then
        (a start's peak memory), what Python freed since its imports is not held too."""
        if self._malloc_trim is not None:
            self._malloc_trim(0)

    @contextmanager
    def printer_off(self) -> Iterator[None]:
        """libbpf prints nothing inside: for calls whose every line would be dropped (the cost
        is the calls from C into Python, one per line)."""
        self.lib.libbpf_set_print(None)
        try:
            yield
        finally:
            self.lib.libbpf_set_print(ctypes.cast(self._printer, _p))

    def take_log(self) -> str:
        text, self.log = "".join(self.log), []
        return text

    def fail(self, call: str) -> LibbpfError:
        """The error of the call that just failed, with libbpf's last log lines."""
        err = ctypes.get_errno()
        lines = [line for line in self.take_log().splitlines() if line.strip()]
        # a refused program: the verifier's last lines say why (its log ends at this marker)
        end = next((i for i, line in enumerate(lines) if "END PROG LOAD LOG" in line), len(lines))
        tail = lines[max(end - 6, 0):end] + lines[end + 1:][-4:]
        return LibbpfError(err, f"{call}: {os.strerror(err) if err else 'failed'}" +
                           ("\n" + "\n".join(tail) if tail else ""))


def shared(path: Optional[str] = None) -> Libbpf:
    """The process's one Libbpf for `path` (LibbpfError where it does not load). Why one:
    libbpf's print callback is process-wide, so a second instance would take the first's log."""
    if path not in _SHARED:
        _SHARED[path] = Libbpf(path)
    return _SHARED[path]


class TraceTargets:
    """Handlers of the object's fentry/fexit sections (libbpf_register_prog_handler, libbpf >= 1.0)
    whose prepare-load callback gives a program the target set here: a kernel BTF object's fd and
    a type id in it, in the load options. Why: libbpf has no setter of a program's BTF object,
    and naming a module function to it (set_attach_target) loads every module's BTF. Registered
    while any object opened under them lives (hold, drop), not per object: libbpf matches an
    object's sections to handlers when it opens it, and each program keeps a pointer into
    libbpf's array of handlers, which every registration and removal reallocates. A program
    under them that is given no target here loads with what set_attach_target gave it."""

    def __init__(self, lib: Libbpf) -> None:
        self.lib = lib
        self._handlers: List[int] = []
        self._holders = 0
        #: program handle -> (BTF object fd, type id)
        self._targets: Dict[int, Tuple[int, int]] = {}
        self._prepare = PREPARE_LOAD_FN(self._prepare_load)  # kept: libbpf calls it while registered

    def _prepare_load(self, prog: Optional[int], opts: Any, _cookie: int) -> int:
        target = self._targets.get(prog or 0)
        if target is not None:
            opts.contents.attach_btf_obj_fd, opts.contents.attach_btf_id = target
        return 0

    def hold(self) -> None:
        """Registered from now until the last holder drops them; LibbpfError where libbpf refuses."""
        if not self._holders:
            for section, attach_type in TRACE_SECTIONS:
                opts = ProgHandlerOpts(sz=ctypes.sizeof(ProgHandlerOpts), prog_prepare_load_fn=self._prepare)
                handler = int(self.lib.lib.libbpf_register_prog_handler(section.encode(), PROG_TYPE_TRACING,
                                                                        attach_type, ctypes.byref(opts)))
                if handler <= 0:
                    error = self.lib.fail(f"libbpf_register_prog_handler({section})")
                    self._unregister()
                    raise error
                self._handlers.append(handler)
        self._holders += 1

    def drop(self) -> None:
        self._holders -= 1
        if not self._holders:
            self._unregister()

    def _unregister(self) -> None:
        for handler in self._handlers:
            self.lib.lib.libbpf_unregister_prog_handler(handler)
        self._handlers = []

    def set(self, prog: int, btf_fd: int, type_id: int) -> None:
        self._targets[prog] = (btf_fd, type_id)

    def forget(self, progs: Iterable[int]) -> None:
        for prog in progs:
            self._targets.pop(prog, None)


def kernel_btf_fds(lib: Libbpf, names: Collection[str]) -> Tuple[Dict[str, int], str]:
    """An fd of each loaded kernel BTF object named in `names` (a module's: `nfs`), found by
    walking the kernel's BTF objects and reading each one's name, no blob (libbpf's
    load_module_btfs parses every module's); the caller closes them. With why the walk ended
    early ("" when it did not): the kernel refused it (bpf() needs CAP_SYS_ADMIN)."""
    found: Dict[str, int] = {}
    name = ctypes.create_string_buffer(64)  # MODULE_NAME_LEN
    current = _u32(0)
    while set(names) - set(found):
        after = _u32()
        if lib.lib.bpf_btf_get_next_id(current.value, ctypes.byref(after)) != 0:
            err = ctypes.get_errno()
            return found, "" if err == errno.ENOENT else f"bpf_btf_get_next_id: {os.strerror(err)}"
        current = after
        fd = int(lib.lib.bpf_btf_get_fd_by_id(after.value))
        if fd < 0:  # unloaded since, or not ours to see
            continue
        ctypes.memset(name, 0, len(name))
        info = BtfInfo(name=ctypes.addressof(name), name_len=len(name))
        size = _u32(ctypes.sizeof(info))
        seen = name.value.decode("utf-8", "replace") if lib.lib.bpf_obj_get_info_by_fd(
            fd, ctypes.byref(info), ctypes.byref(size)) == 0 and info.kernel_btf else ""
        if seen in names and seen not in found:
            found[seen] = fd
        else:
            os.close(fd)
    return found, ""


#: the running kernel's BTF, as the kernel exposes it
LIVE_VMLINUX = Path("/sys/kernel/btf/vmlinux")


class KernelBtf:
    """A kernel BTF blob (vmlinux's, or a module's split on it) parsed and indexed by libbpf,
    read as probes.layout reads a discover.btf.Btf: records by type id, strings by offset,
    functions and structs by name. Why: the Python walk over vmlinux's 100,000+ records
    cost a start 0.5 s and 23 MiB in a 6.12 TCG guest; libbpf does it in C, in 6 MiB."""

    _end = "<"

    def __init__(self, lib: Libbpf, path: Path, base: Optional["KernelBtf"] = None) -> None:
        self.lib, self.base, self.path = lib.lib, base, path
        self.handle: Optional[int] = None
        self._open()
        #: this blob's first type id (a split blob's ids continue its base's)
        self.first_id = int(self.lib.btf__type_cnt(base.opened())) if base is not None else 1
        #: vmlinux's names looked up so far; a module's functions, once listed
        self._found: Dict[str, Optional[int]] = {}
        self._functions: Optional[Dict[str, int]] = None

    def _open(self) -> None:
        """Parse the blob: at the start, and again at the first look-up after release(). The
        running kernel's vmlinux blob is libbpf's own (btf__load_vmlinux_btf), which libbpf 1.6+
        maps where the kernel lets it: its pages are then the kernel's, not held by this process,
        where a parse of the file reads it and copies it (the start's peak memory)."""
        ctypes.set_errno(0)
        if self.base is not None:
            handle = self.lib.btf__parse_raw_split(str(self.path).encode(), self.base.opened())
        elif self.path == LIVE_VMLINUX and self.path.exists():
            handle = self.lib.btf__load_vmlinux_btf()
        else:
            handle = self.lib.btf__parse_raw(str(self.path).encode())
        if not handle:
            raise BtfError(f"{self.path}: libbpf cannot parse it: {os.strerror(ctypes.get_errno())}")
        self.handle = handle
        size = _u32()
        self._raw = self.lib.btf__raw_data(handle, ctypes.byref(size))
        #: the blob as parsed: every record of this blob lies in it (a view, not a copy)
        self._data = (ctypes.c_char * size.value).from_address(self._raw)

    def opened(self) -> int:
        """libbpf's handle of the blob, parsed again if release() freed it."""
        if not self.handle:
            self._open()
        assert self.handle
        return self.handle

    def release(self) -> None:
        """Free libbpf's parse until the next look-up. Why: a start's look-ups are over before
        libbpf loads the object, which parses vmlinux's BTF again; holding both made vmlinux's
        the largest part of a tool's peak memory. A split blob must be released before its base
        (it points into it): KernelLayout.release does."""
        if self.handle:
            self.lib.btf__free(self.handle)
            self.handle = None
            del self._data

    def __del__(self) -> None:
        self.release()

    def _record(self, type_id: int) -> Tuple["KernelBtf", int, int, int, int, int]:
        """(owner blob, offset in its _data, name_off, kind, vlen, size_or_type), as Btf._record."""
        if type_id < self.first_id:
            if self.base is None:
                raise BtfError(f"type id {type_id} is void or out of range")
            return self.base._record(type_id)  # noqa: SLF001 - the same class
        ptr = self.lib.btf__type_by_id(self.opened(), type_id)
        if not ptr:
            raise BtfError(f"type id {type_id} out of range")
        off = ptr - self._raw
        name_off, info, size_or_type = struct.unpack_from("<III", self._data, off)
        return self, off, name_off, (info >> 24) & 0x1F, info & 0xFFFF, size_or_type

    def _str(self, off: int) -> str:
        name = self.lib.btf__name_by_offset(self.opened(), off)
        return name.decode("utf-8", "replace") if name else ""

    def func_id(self, name: str) -> Optional[int]:
        """The type id of this blob's (not its base's) FUNC record called `name`, or None:
        vmlinux's found by libbpf (a scan in C), a module's from a table of its own
        functions made on first use (libbpf 1.1 searches a split blob only with its base,
        a whole vmlinux scan per module asked)."""
        if self.base is None:
            if name not in self._found:
                type_id = int(self.lib.btf__find_by_name_kind(self.opened(), name.encode(), KIND_FUNC))
                self._found[name] = type_id if type_id > 0 else None
            return self._found[name]
        if self._functions is None:
            self._functions = self.function_ids()
        return self._functions.get(name)

    def function_ids(self) -> Dict[str, int]:
        """Each of this blob's (not its base's) FUNC names -> its type id (of several, the last,
        as discover.btf's). Why not record by record through libbpf: two ctypes calls a record
        cost a 6.12 TCG guest's start 0.12 s for nfs, nfsv4 and sunrpc. discover.btf's walk
        reads the blob libbpf parsed (_data: this blob's header, records and own strings) as
        words instead; a name in the base's strings (a split blob's offsets below its own
        strings') is left to libbpf."""
        self.opened()
        data = memoryview(self._data)
        end, types_start, type_len, strs_start, str_len = sections(data)
        _offsets, name_offs = index_types(data, end, types_start, type_len, self.first_id)
        own, own_start = data[strs_start:strs_start + str_len].tobytes(), self._strings_start()
        return func_names(name_offs, lambda off: string_at(own, off - own_start) if off >= own_start
                          else self._str(off))

    def _strings_start(self) -> int:
        """The offset this blob's own strings are numbered from: a split blob's follow its
        base's (libbpf's start_str_off, discover.btf's _str_base)."""
        if self.base is None:
            return 0
        self.base.opened()
        return self.base._strings_start() + sections(memoryview(self.base._data))[4]  # noqa: SLF001 - the same class

    def struct_ids(self, names: Sequence[str]) -> Dict[str, int]:
        """Type ids of complete structs by name (the first of each name)."""
        found = {name: int(self.lib.btf__find_by_name_kind(self.opened(), name.encode(), KIND_STRUCT))
                 for name in names}
        return {name: type_id for name, type_id in found.items() if type_id > 0}


def ctype_of(btf: Btf, type_id: int) -> Any:
    """A ctypes type with the layout BTF gives `type_id`: structs with their member names,
    arrays, and integers of the right size and sign (pointers as u64)."""
    type_id = _strip(btf, type_id)
    _owner, off, _name, kind, vlen, ref = btf._record(type_id)  # noqa: SLF001 - kinds are not public
    if kind in (KIND_STRUCT, KIND_UNION):
        fields: List[Tuple[str, Any]] = []
        at = 0
        for member, member_id in zip(btf.members(type_id), _member_ids(btf, off, vlen)):
            if member.offset > at:
                fields.append((f"_pad{at}", ctypes.c_uint8 * (member.offset - at)))
            fields.append((member.name or f"_anon{member.offset}", ctype_of(btf, member_id)))
            at = member.offset + ctypes.sizeof(fields[-1][1])
        if ref > at:
            fields.append((f"_pad{at}", ctypes.c_uint8 * (ref - at)))
        base = ctypes.Union if kind == KIND_UNION else ctypes.Structure
        return type(f"btf_{type_id}", (base,), {"_fields_": fields, "_pack_": 1})
    if kind == KIND_ARRAY:
        elem, _index, count = btf_array(btf, off)
        return ctype_of(btf, elem) * count
    size, signed = btf.size_of(type_id)
    return {1: (ctypes.c_uint8, ctypes.c_int8), 2: (ctypes.c_uint16, ctypes.c_int16),
            4: (ctypes.c_uint32, ctypes.c_int32), 8: (ctypes.c_uint64, ctypes.c_int64)}[size][signed]


def _strip(btf: Btf, type_id: int) -> int:
    """Through typedefs and modifiers to the type that has a layout."""
    from discover.btf import KIND_CONST, KIND_RESTRICT, KIND_TYPE_TAG, KIND_TYPEDEF, KIND_VOLATILE
    for _ in range(32):
        kind = btf._record(type_id)[3]  # noqa: SLF001
        if kind not in (KIND_TYPEDEF, KIND_CONST, KIND_VOLATILE, KIND_RESTRICT, KIND_TYPE_TAG):
            return type_id
        type_id = btf.referenced(type_id)
    return type_id


def _member_ids(btf: Btf, off: int, vlen: int) -> Iterator[int]:
    for i in range(vlen):
        yield struct.unpack_from(btf._end + "I", btf._data, off + 12 + 12 * i + 4)[0]  # noqa: SLF001


def btf_array(btf: Btf, off: int) -> Tuple[int, int, int]:
    return struct.unpack_from(btf._end + "III", btf._data, off + 12)  # noqa: SLF001


class Map:
    """One map of a loaded object (probes.backend.MapView): keys and values as ctypes structs."""

    def __init__(self, lib: Libbpf, name: str, fd: int, key_type: Any, value_type: Any) -> None:
        self.lib, self.name, self.fd = lib.lib, name, fd
        self.key_type, self.value_type = key_type, value_type
        #: whether the kernel answers bpf_map_lookup_batch for this map (until it first refuses)
        self._batch_ok = True

    #: entries asked per bpf_map_lookup_batch call (one system call each; more where a hash
    #: bucket holds more)
    BATCH = 1024

    def items(self) -> List[Tuple[Any, Any]]:
        batch = self._batch()
        if batch is not None:
            return batch
        out = []
        for key in self.keys():
            value = self.value_type()
            if self.lib.bpf_map_lookup_elem(self.fd, ctypes.byref(key), ctypes.byref(value)) == 0:
                out.append((key, value))
        return out

    def _batch(self) -> Optional[List[Tuple[Any, Any]]]:
        """Every entry in a few system calls (the kernel's batch lookup, 5.6+), where the walk
        key by key takes two per entry: 14,000 a scrape of 100 NFS mounts. None where the
        kernel or the map type has no batch lookup (the caller walks instead)."""
        if not self._batch_ok:
            return None
        size = max(ctypes.sizeof(self.key_type), 8)  # a hash's token is a u32, an array's a key
        token_in, token_out = ctypes.create_string_buffer(size), ctypes.create_string_buffer(size)
        out: List[Tuple[Any, Any]] = []
        first, chunk = True, self.BATCH
        while True:
            keys, values, count = (self.key_type * chunk)(), (self.value_type * chunk)(), _u32(chunk)
            ret = self.lib.bpf_map_lookup_batch(self.fd, None if first else token_in, token_out, keys, values,
                                                ctypes.byref(count), None)
            err = ctypes.get_errno() if ret else 0
            if err == errno.ENOSPC and chunk < (1 << 20):  # one hash bucket holds more than asked
                chunk *= 4
                continue
            if err and err != errno.ENOENT:  # ENOENT: the last entries came with it
                if first and not out:
                    self._batch_ok = False
                    return None
                raise OSError(err, f"{self.name}: bpf_map_lookup_batch: {os.strerror(err)}")
            got = count.value
            out.extend(zip(_elements(self.key_type, keys, got), _elements(self.value_type, values, got)))
            if err:
                return out
            ctypes.memmove(token_in, token_out, size)
            first = False

    def keys(self) -> List[Any]:
        out: List[Any] = []
        prev: Optional[Any] = None
        while True:
            key = self.key_type()
            if self.lib.bpf_map_get_next_key(self.fd, None if prev is None else ctypes.byref(prev),
                                             ctypes.byref(key)) != 0:
                return out
            out.append(key)
            prev = key

    def delete(self, key: Any) -> None:
        self.lib.bpf_map_delete_elem(self.fd, ctypes.byref(key))

    def at(self, index: int) -> Any:
        key, value = ctypes.c_uint32(index), self.value_type()
        if self.lib.bpf_map_lookup_elem(self.fd, ctypes.byref(key), ctypes.byref(value)) != 0:
            raise KeyError(index)
        return value

    def all_values(self, count: int) -> List[Any]:
        batch = self._batch()
        if batch is not None:
            return [value for _key, value in batch][:count]
        return [self.at(i) for i in range(count)]

    def key(self, value: int) -> Any:
        return self.key_type(value)

    def set(self, index: int, value: int) -> None:
        """An array element from an integer (a cgroup array takes a directory fd)."""
        key, val = ctypes.c_uint32(index), ctypes.c_uint32(value)
        if self.lib.bpf_map_update_elem(self.fd, ctypes.byref(key), ctypes.byref(val), 0) != 0:
            raise OSError(ctypes.get_errno(), f"{self.name}[{index}]: {os.strerror(ctypes.get_errno())}")


def _elements(kind: Any, array: Any, count: int) -> List[Any]:
    """The first `count` elements of a ctypes array as `kind` instances: a struct element is
    one already (a view into the array), a scalar comes out as an int and is wrapped again,
    so readers write `.value` as on a single lookup."""
    items = array[:count]
    if isinstance(kind, type) and issubclass(kind, (ctypes.Structure, ctypes.Union, ctypes.Array)):
        return items
    return [kind(item) for item in items]


class BpfObject:
    """One BPF object opened from memory: choose programs and sizes, fill read-only data,
    load, attach, read. close() destroys every link and the object (also after a failure)."""

    def __init__(self, lib: Libbpf, data: bytes, btf_fds: Sequence[int] = ()) -> None:
        """`btf_fds`: kernel BTF objects that programs' targets are given in (set_attach_btf):
        the object holds the process's fentry/fexit handlers (TraceTargets) while it lives and
        closes the fds once loaded, or closed, or here if the open fails."""
        self.lib = lib
        self._btf_fds = list(btf_fds)
        self._traced: Optional[TraceTargets] = None
        self.obj: Optional[int] = None
        self.links: List[int] = []
        #: program -> its link (the kernel's counts of what it skipped are the link's)
        self._link_of: Dict[str, int] = {}
        self._rings: List[Tuple[int, Any]] = []
        self._programs: Dict[str, int] = {}
        try:
            if self._btf_fds:  # before the open: libbpf matches sections to handlers there
                lib.trace_targets().hold()
                self._traced = lib.trace_targets()
            lib.take_log()
            # no copy kept: libbpf reads the ELF during the open alone (bpf_object__elf_finish).
            # Opened without the printer: libbpf says ~15,000 debug lines while it opens a whole
            # spec's object, each a call into Python to be dropped there; a failed open is
            # opened again with it, to say why.
            with lib.printer_off():
                self.obj = lib.lib.bpf_object__open_mem(data, len(data), None)
            if not self.obj:
                self.obj = lib.lib.bpf_object__open_mem(data, len(data), None)
                if not self.obj:
                    raise lib.fail("bpf_object__open_mem")
        except LibbpfError:
            self.close()
            raise
        size = _u32()
        raw = lib.lib.btf__raw_data(lib.lib.bpf_object__btf(self.obj), ctypes.byref(size))
        #: the object's own BTF: the layout of every map key and value
        self.btf = Btf(ctypes.string_at(raw, size.value))
        # walked once: a whole spec's object has hundreds of programs, each step a ctypes
        # call (a 6.12 TCG guest under cProfile spent 3 s walking them again per lookup)
        self._programs = self._walk(lib.lib.bpf_object__next_program, lib.lib.bpf_program__name)
        self._maps = self._walk(lib.lib.bpf_object__next_map, lib.lib.bpf_map__name)

    def _walk(self, next_handle: Any, name_of: Any) -> Dict[str, int]:
        out: Dict[str, int] = {}
        handle = next_handle(self.obj, None)
        while handle:
            out[name_of(handle).decode()] = handle
            handle = next_handle(self.obj, handle)
        return out

    def programs(self) -> Dict[str, int]:
        """Program name -> its libbpf handle, in the object's order."""
        return dict(self._programs)

    def section(self, program: str) -> str:
        return self.lib.lib.bpf_program__section_name(self._programs[program]).decode()

    def maps(self) -> Dict[str, int]:
        return dict(self._maps)

    def autoload_only(self, names: List[str]) -> None:
        """Load these programs and no other (the others' targets may not exist here)."""
        wanted = set(names)
        for name, prog in self._programs.items():
            self.lib.lib.bpf_program__set_autoload(prog, name in wanted)
        missing = wanted - set(self._programs)
        if missing:
            raise LibbpfError(0, f"no program {', '.join(sorted(missing))} in the object")

    def set_attach_target(self, program: str, target: str) -> None:
        """A fentry/fexit program's target named to libbpf: FUNCTION, looked up in vmlinux's BTF
        (then in each module's); MODULE:FUNCTION (libbpf >= 1.5), in that module's BTF alone,
        though libbpf loads every module's BTF to find it (set_attach_btf does not). A bare name
        of a module's function costs a whole vmlinux scan per module BTF: 3 s per program in a
        6.12 TCG guest with 74 module BTFs."""
        if self.lib.lib.bpf_program__set_attach_target(self._programs[program], 0, target.encode()) != 0:
            raise self.lib.fail(f"bpf_program__set_attach_target({program}, {target})")

    def set_attach_btf(self, program: str, btf_fd: int, type_id: int) -> None:
        """A fentry/fexit program's target as the kernel takes it: one of the BTF objects this
        object was opened with (its fd) and the function's type id there. libbpf then looks up
        no BTF for it (set_attach_target's MODULE:FUNCTION loads every module's)."""
        assert self._traced is not None, "opened without btf_fds"
        self._traced.set(self._programs[program], btf_fd, type_id)

    def set_map_flags(self, map_name: str, flags: int) -> None:
        if self.lib.lib.bpf_map__set_map_flags(self._maps[map_name], flags) != 0:
            raise self.lib.fail(f"bpf_map__set_map_flags({map_name})")

    def set_max_entries(self, map_name: str, entries: int) -> None:
        if self.lib.lib.bpf_map__set_max_entries(self._maps[map_name], entries) != 0:
            raise self.lib.fail(f"bpf_map__set_max_entries({map_name})")

    def reuse_maps(self, other: "BpfObject") -> None:
        """Share every map of `other` (loaded from the same object): this object's programs
        then read and write the maps the running ones use."""
        for name, handle in self._maps.items():
            fd = int(self.lib.lib.bpf_map__fd(other._maps[name]))  # noqa: SLF001 - the same object's map
            if self.lib.lib.bpf_map__reuse_fd(handle, fd) != 0:
                raise self.lib.fail(f"bpf_map__reuse_fd({name})")

    def program_insns(self, program: str) -> bytes:
        """A program's instructions as libbpf holds them before the load (as the object has
        them: relocations are applied at the load)."""
        prog = self._programs[program]
        count = self.lib.lib.bpf_program__insn_cnt(prog)
        return ctypes.string_at(self.lib.lib.bpf_program__insns(prog), count * 8)

    def set_program_insns(self, program: str, insns: bytes) -> None:
        """Replace a program's instructions before the load, as many as it had: libbpf's
        relocations, applied at the load, name instructions by their index."""
        prog = self._programs[program]
        count = self.lib.lib.bpf_program__insn_cnt(prog)
        if len(insns) != count * 8:
            raise LibbpfError(0, f"{program}: {len(insns) // 8} instructions for {count}")
        buf = ctypes.create_string_buffer(insns, len(insns))
        if self.lib.lib.bpf_program__set_insns(prog, buf, count) != 0:
            raise self.lib.fail(f"bpf_program__set_insns({program})")

    def load(self) -> None:
        self.lib.take_log()
        self.lib.trim_heap()
        try:
            if self.lib.lib.bpf_object__load(self.obj) != 0:
                raise self.lib.fail("bpf_object__load")
        finally:
            self._close_btf_fds()  # each loaded program holds its target's BTF object itself

    def _close_btf_fds(self) -> None:
        for fd in self._btf_fds:
            os.close(fd)
        self._btf_fds = []

    def attach(self, program: str) -> None:
        # a fentry/fexit program opened while TraceTargets' handlers were registered (by this
        # object or another one alive) is theirs, and they have no attach callback for libbpf's
        # bpf_program__attach; bpf_program__attach_trace is what libbpf's own handler calls
        tracing = (self.section(program).startswith(tuple(s for s, _ in TRACE_SECTIONS))
                   and "bpf_program__attach_trace" not in self.lib.lacking)
        attach = self.lib.lib.bpf_program__attach_trace if tracing else self.lib.lib.bpf_program__attach
        link = attach(self._programs[program])
        if not link:
            raise self.lib.fail(f"attach {program} ({self.section(program)})")
        self.links.append(link)
        self._link_of[program] = link

    def kprobe_link(self, program: str) -> Optional[Tuple[str, str, int]]:
        """(kprobe | kretprobe, function, missed) from the program's BPF link info; None when it
        has no perf-event link (not a kprobe, or attached through a bare perf event fd where
        the kernel has no perf link) or the kernel says nothing of it (before 6.6). The kernel
        fills `missed` from 6.7: the caller knows the release."""
        link = self._link_of.get(program)
        if link is None:
            return None
        name = ctypes.create_string_buffer(256)
        info = PerfLinkInfo(func_name=ctypes.addressof(name), name_len=len(name))
        size = _u32(ctypes.sizeof(info))
        if self.lib.lib.bpf_obj_get_info_by_fd(self.lib.lib.bpf_link__fd(link), ctypes.byref(info),
                                               ctypes.byref(size)) != 0:
            return None
        if info.type != LINK_TYPE_PERF_EVENT or info.perf_type not in PERF_EVENT_KINDS:
            return None
        return PERF_EVENT_KINDS[info.perf_type], name.value.decode("utf-8", "replace"), int(info.missed)

    def program_fd(self, program: str) -> int:
        return int(self.lib.lib.bpf_program__fd(self._programs[program]))

    def map(self, name: str) -> Map:
        handle = self._maps[name]
        key_id, value_id = (self.lib.lib.bpf_map__btf_key_type_id(handle),
                            self.lib.lib.bpf_map__btf_value_type_id(handle))
        key_type = ctype_of(self.btf, key_id) if key_id else ctypes.c_uint8 * self.lib.lib.bpf_map__key_size(handle)
        value_type = (ctype_of(self.btf, value_id) if value_id else
                      ctypes.c_uint8 * self.lib.lib.bpf_map__value_size(handle))
        return Map(self.lib, name, int(self.lib.lib.bpf_map__fd(handle)), key_type, value_type)

    def open_ring(self, map_name: str, handle: Callable[[bytes], None]) -> None:
        """Deliver each record of a ring buffer map to `handle` on poll()."""
        def sample(_ctx: Any, data: int, size: int) -> int:
            handle(ctypes.string_at(data, size))
            return 0
        callback = SAMPLE_FN(sample)
        ring = self.lib.lib.ring_buffer__new(self.lib.lib.bpf_map__fd(self._maps[map_name]),
                                             ctypes.cast(callback, _p), None, None)
        if not ring:
            raise self.lib.fail(f"ring_buffer__new({map_name})")
        self._rings.append((ring, callback))

    def poll(self, timeout_ms: int) -> None:
        for ring, _callback in self._rings:
            self.lib.lib.ring_buffer__poll(ring, timeout_ms)
            self.lib.lib.ring_buffer__consume(ring)

    def close(self) -> None:
        """Destroy every link, ring and the object, close the BTF objects' fds and drop the
        handlers (the last object under them removes them); safe to call twice."""
        for link in self.links:
            self.lib.lib.bpf_link__destroy(link)
        self.links = []
        self._link_of = {}
        for ring, _callback in self._rings:
            self.lib.lib.ring_buffer__free(ring)
        self._rings = []
        if self.obj:
            self.lib.lib.bpf_object__close(self.obj)
            self.obj = None
        self._close_btf_fds()
        if self._traced is not None:
            self._traced.forget(self._programs.values())
            self._traced.drop()
            self._traced = None

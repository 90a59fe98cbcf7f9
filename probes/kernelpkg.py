"""Kernel profiles from Debian kernel packages, without booting them.

Why: a compatibility report must cover kernels nobody runs here (5.10 .. 7.x). A Debian
kernel package holds almost everything a live profile has: the config, BTF in the kernel
image (`.BTF` of the vmlinux ELF inside the compressed vmlinuz) and in each module (split
BTF on top of vmlinux), and the modules' symbol tables. What it lacks, and how the profile
says so (in "unavailable" and "package.notes"):

- vmlinux symbols: Debian strips vmlinuz and ships no real System.map (only the -dbg
  package has one), so vmlinux functions come from BTF (pahole only encodes functions
  ftrace can attach to), and vmlinux compiler copies (.isra/.constprop) are invisible;
- modules loaded, mounts, tracefs, kprobe blacklist: properties of a running system;
- 5.10 modules carry no BTF: their functions come from the symbol table and have no
  prototypes.

Module functions are "traceable" when the module's `__mcount_loc` table holds a call site
inside them (the same table ftrace builds available_filter_functions from) outside
`.init.text` (freed after loading). On Debian 6.1.0-50 this reproduces the live
available_filter_functions of nfs, nfsv3, nfsv4 and sunrpc exactly (tests/test_kernelpkg.py). Module
tracepoints come from `__tracepoint_<event>` symbols; their system and event class are
read by following `__event_<event>` -> trace_event_call.class -> trace_event_class.system
through the module's relocations; their record fields from BTF `trace_event_raw_<class>`.

Speed: decompression is most of the cost (`data.tar.xz`, and on 6.12+ every `.ko.xz`), so
data.tar goes through `xz -T0` in a child process and compressed modules through a process
pool; with a Lookup (what `probes compat` passes) only the modules whose string table names
one of the report's functions or tracepoints are read in full, the rest are only listed.

Output: the profile format of discover/profile.py (schema version 1) with `source.how =
"package"` and an extra `package` section (files read, every module shipped, notes, and
the lookup the profile answers for).
"""
from __future__ import annotations

import bisect
import datetime
import gzip
import hashlib
import io
import json
import lzma
import os
import re
import shutil
import struct
import subprocess
import tarfile
from pathlib import Path
from typing import IO, Any, Dict, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Set, Tuple

from discover.btf import KIND_STRUCT, KIND_TYPEDEF, Btf, BtfError
from discover.errors import UserError, release, spawn
from discover.profile import SCHEMA, VERSION, check_profile

#: ELF symbol types and bindings we read
STT_OBJECT, STT_FUNC, STT_SECTION = 1, 2, 3
STB_LOCAL = 0
_SYM = struct.Struct("<IBBHQQ")
_RELA = struct.Struct("<QQq")
#: byte offset of `class` in struct trace_event_call (after `struct list_head list`), and of
#: `system` in struct trace_event_class (first member): unchanged since 2.6.x
_CALL_CLASS_OFFSET, _CLASS_SYSTEM_OFFSET = 16, 0

_MODULE_SUFFIXES = (".ko", ".ko.xz", ".ko.zst", ".ko.gz")
_VMLINUZ_RE = re.compile(r"(?:^|/)(?:boot/vmlinuz-[^/]+|lib/modules/[^/]+/vmlinuz(?:\.unsigned)?)$")
_CONFIG_RE = re.compile(r"(?:^|/)(?:boot/config-[^/]+|lib/modules/[^/]+/config)$")
_RELEASE_RE = re.compile(r"lib/modules/([^/]+)/|boot/(?:vmlinuz|config)-(.+)$")


class PackageError(UserError):
    """A package that cannot be read (truncated, corrupt, not a kernel package)."""


# --------------------------------------------------------------------------- containers

def _deb_data_member(fh: IO[bytes], origin: str) -> Tuple[str, int, int]:
    """(name, offset, size) of data.tar.* inside a .deb (an `ar` archive)."""
    if fh.read(8) != b"!<arch>\n":
        raise PackageError(f"{origin}: not a Debian package (no ar header)")
    while True:
        header = fh.read(60)
        if not header:
            raise PackageError(f"{origin}: no data.tar member (truncated package?)")
        if len(header) < 60 or header[58:60] != b"`\n":
            raise PackageError(f"{origin}: corrupt ar header (truncated package?)")
        name = header[:16].decode("ascii", "replace").strip().rstrip("/")
        try:
            size = int(header[48:58].decode("ascii").strip())
        except ValueError:
            raise PackageError(f"{origin}: corrupt ar member size") from None
        offset = fh.tell()
        if name.startswith("data.tar"):
            return name, offset, size
        fh.seek(size + (size & 1), io.SEEK_CUR)


class _Limited(io.RawIOBase):
    """A read-only window on a file (one ar member), so decompressors stop at its end."""

    def __init__(self, fh: IO[bytes], offset: int, size: int) -> None:
        self._fh, self._left = fh, size
        fh.seek(offset)

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        want = min(len(buf), self._left)
        if want <= 0:
            return 0
        data = self._fh.read(want)
        buf[:len(data)] = data
        self._left -= len(data)
        return len(data)


#: data.tar compressions a system tool decompresses in a parallel process; --single-stream
#: stops at the end of the member (ar padding and later members follow it in the file)
_TAR_TOOLS = {"xz": ["xz", "-dc", "-T0", "--single-stream"]}


def _zstd() -> Any:
    """A zstandard decompressor: the module is the `lab` extra's, an NFS client does not need it."""
    try:
        import zstandard
    except ImportError:
        raise UserError("reading .zst packages needs the zstandard module (pip install 'probekit[lab]')") from None
    return zstandard.ZstdDecompressor()


def _open_tar_stream(raw: IO[bytes], compression: str, origin: str) -> tarfile.TarFile:
    if compression == "zst":
        stream: IO[bytes] = _zstd().stream_reader(raw)  # type: ignore[assignment]
        return tarfile.open(fileobj=stream, mode="r|")
    modes = {"xz": "r|xz", "gz": "r|gz", "bz2": "r|bz2", "": "r|"}
    if compression not in modes:
        raise PackageError(f"{origin}: unsupported data.tar compression {compression!r}")
    return tarfile.open(fileobj=raw, mode=modes[compression])


class _ToolStream:
    """data.tar decompressed by `xz -T0` in a child process reading the .deb from the member on.

    Why: liblzma in a separate process decompresses while Python parses the modules (and
    `xz -T0` uses every core on Debian's multi-block data.tar.xz), instead of one after the
    other in the interpreter. The tool reads the file itself: no pipe of ours feeds it, so
    worker processes forked meanwhile hold nothing that keeps its input open.
    """

    def __init__(self, tool: List[str], path: Path, offset: int) -> None:
        with open(path, "rb") as member:
            member.seek(offset)
            self.proc = spawn(tool, stdin=member, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def error(self) -> Optional[str]:
        """The tool's complaint after the stream ended, None when it succeeded."""
        assert self.proc.stdout is not None and self.proc.stderr is not None
        while self.proc.stdout.read(1 << 20):  # tar padding after the end-of-archive blocks
            pass
        err = self.proc.stderr.read().decode("utf-8", "replace").strip()
        if self.proc.wait() != 0:
            return (err.splitlines() or [f"exit status {self.proc.returncode}"])[-1]
        return None

    def close(self) -> None:
        release(self.proc)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


def _member_bytes(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    """A regular member's bytes, read from the archive's stream where they start.

    Why not tar.extractfile(): the io.BufferedReader it makes asks tarfile's Python file for
    tell() and drops whatever that raises, and closes it in a finalizer that drops errors too:
    a Ctrl-C or SIGTERM whose handler ran there was lost, and the command ran on to the end.
    """
    if member.sparse is not None:
        extracted = tar.extractfile(member)
        assert extracted is not None
        with extracted:
            return extracted.read()
    assert tar.fileobj is not None
    tar.fileobj.seek(member.offset_data)
    data = tar.fileobj.read(member.size)
    if len(data) != member.size:
        raise tarfile.ReadError("unexpected end of data")
    return data


def _tar_members(tar: tarfile.TarFile, wanted) -> Iterator[Tuple[str, bytes]]:
    for member in tar:
        if not member.isfile():
            continue
        rel = member.name[2:] if member.name.startswith("./") else member.name
        if wanted(rel):
            yield rel, _member_bytes(tar, member)


def iter_package_files(path: Path, wanted) -> Iterator[Tuple[str, bytes]]:
    """(path inside the package, bytes) of the members `wanted(path)` accepts.

    `path` is a .deb, a directory of .deb files (as `probes fetch-kernel` caches them) or a
    directory of extracted packages (boot/, lib/modules/ or usr/lib/modules/ below it).
    """
    if path.is_dir():
        debs = sorted(path.glob("*.deb"))
        if debs:
            for deb in debs:
                yield from iter_package_files(deb, wanted)
            return
        for file in sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink()):
            rel = file.relative_to(path).as_posix()
            if wanted(rel):
                yield rel, file.read_bytes()
        return
    origin = path.name
    try:
        with open(path, "rb") as fh:
            name, offset, size = _deb_data_member(fh, origin)
            if offset + size > os.fstat(fh.fileno()).st_size:
                raise PackageError(f"{origin}: truncated package ({name} runs past the end of the file)")
            compression = name[len("data.tar"):].lstrip(".")
            tool = _TAR_TOOLS.get(compression)
            if tool is not None and shutil.which(tool[0]):
                stream = _ToolStream(tool, path, offset)
                try:
                    try:
                        with tarfile.open(fileobj=stream.proc.stdout, mode="r|") as tar:
                            yield from _tar_members(tar, wanted)
                        why = stream.error()
                    except (tarfile.TarError, EOFError, OSError) as exc:
                        why = stream.error() or f"{exc.__class__.__name__}: {exc}"
                    if why:
                        raise PackageError(f"{origin}: corrupt or truncated package ({tool[0]}: {why})")
                finally:
                    stream.close()
                return
            raw = io.BufferedReader(_Limited(fh, offset, size), 1 << 20)
            with _open_tar_stream(raw, compression, origin) as tar:
                yield from _tar_members(tar, wanted)
    except FileNotFoundError:
        raise UserError(f"{path}: no such package or directory") from None
    except (tarfile.TarError, lzma.LZMAError, EOFError, OSError, zlib_error()) as exc:
        raise PackageError(f"{origin}: corrupt or truncated package ({exc.__class__.__name__}: {exc})") from None
    except Exception as exc:  # zstandard.ZstdError has no stable import path across versions
        if exc.__class__.__name__ == "ZstdError":
            raise PackageError(f"{origin}: corrupt or truncated package (zstd: {exc})") from None
        raise


def zlib_error() -> type:
    import zlib
    return zlib.error


# --------------------------------------------------------------------------- kernel image

_PAYLOAD_MAGICS = ((b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zst"), (b"\x1f\x8b\x08", "gz"),
                   (b"\x5d\x00\x00", "lzma"))


def decompress_vmlinuz(data: bytes, origin: str) -> bytes:
    """The vmlinux ELF inside a bzImage (signed or not): the setup header locates the payload."""
    if len(data) < 0x250 or data[0x202:0x206] != b"HdrS":
        raise PackageError(f"{origin}: not an x86 bzImage (no HdrS setup header)")
    setup_sects = data[0x1F1] or 4
    payload_offset, payload_length = struct.unpack_from("<II", data, 0x248)
    start = (setup_sects + 1) * 512 + payload_offset
    payload = data[start:start + payload_length]
    for magic, kind in _PAYLOAD_MAGICS:
        if payload.startswith(magic):
            break
    else:
        raise PackageError(f"{origin}: unknown kernel compression (payload starts {payload[:6].hex()})")
    try:
        if kind in ("xz", "lzma"):
            dec = lzma.LZMADecompressor(lzma.FORMAT_XZ if kind == "xz" else lzma.FORMAT_ALONE)
            out = dec.decompress(payload)
        elif kind == "gz":
            out = gzip.GzipFile(fileobj=io.BytesIO(payload)).read()
        else:
            out = _zstd().decompressobj().decompress(payload)
    except (lzma.LZMAError, OSError, EOFError, zlib_error()) as exc:
        raise PackageError(f"{origin}: corrupt kernel payload ({exc})") from None
    except Exception as exc:
        if exc.__class__.__name__ == "ZstdError":
            raise PackageError(f"{origin}: corrupt kernel payload ({exc})") from None
        raise
    if not out.startswith(b"\x7fELF"):
        raise PackageError(f"{origin}: decompressed kernel is not an ELF file")
    return out


def _decompress_module(name: str, data: bytes) -> bytes:
    if name.endswith(".xz"):
        return lzma.decompress(data)
    if name.endswith(".zst"):
        return _zstd().decompressobj().decompress(data)
    if name.endswith(".gz"):
        return gzip.decompress(data)
    return data


# --------------------------------------------------------------------------- ELF reading

class Elf:
    """The few sections probekit reads from a little-endian ELF64 kernel file or module.

    Section headers are parsed with struct rather than pyelftools: pyelftools costs ~8 ms
    per module in header parsing alone, 30 s for the 4000 modules of one kernel package.
    """

    _EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
    _SHDR = struct.Struct("<IIQQQQIIQQ")

    def __init__(self, data: bytes, origin: str) -> None:
        self.data = data
        if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            raise PackageError(f"{origin}: not a little-endian 64-bit ELF file")
        fields = self._EHDR.unpack_from(data, 0)
        shoff, shentsize, shnum, shstrndx = fields[6], fields[11], fields[12], fields[13]
        if shoff + shnum * shentsize > len(data) or shstrndx >= max(shnum, 1):
            raise PackageError(f"{origin}: corrupt ELF section table (truncated file?)")
        self._sections = [self._SHDR.unpack_from(data, shoff + i * shentsize) for i in range(shnum)]
        strtab = self._sections[shstrndx]
        names = data[strtab[4]:strtab[4] + strtab[5]]
        self.index: Dict[str, int] = {}
        for i, sec in enumerate(self._sections):
            end = names.find(b"\0", sec[0])
            self.index.setdefault(names[sec[0]:end].decode("utf-8", "replace"), i)

    def section_bytes(self, name: str) -> Optional[bytes]:
        idx = self.index.get(name)
        if idx is None:
            return None
        _name, sh_type, _flags, _addr, offset, size = self._sections[idx][:6]
        if sh_type == 8:  # SHT_NOBITS (.bss): no bytes in the file
            return None
        return self.data[offset:offset + size]

    def symbols(self) -> List[Tuple[str, int, int, int, int, int]]:
        """(name, type, bind, shndx, value, size) for every .symtab entry, in table order."""
        table, names = self.section_bytes(".symtab"), self.section_bytes(".strtab")
        if table is None or names is None:
            return []
        out = []
        for st_name, info, _other, shndx, value, size in _SYM.iter_unpack(table[:len(table) - len(table) % 24]):
            end = names.find(b"\0", st_name)
            out.append((names[st_name:end].decode("utf-8", "replace"), info & 0xF, info >> 4, shndx, value, size))
        return out

    def relocations(self, section: str) -> List[Tuple[int, int, int]]:
        """(offset, symbol index, addend) of `.rela<section>`."""
        raw = self.section_bytes(".rela" + section)
        if raw is None:
            return []
        return [(off, info >> 32, addend) for off, info, addend in _RELA.iter_unpack(raw)]


class ModuleInfo(NamedTuple):
    name: str
    path: str
    functions: List[Tuple[str, bool, bool]]  # (name, global, traceable); empty when not read
    traceability_known: bool  # False when the module has no __mcount_loc table
    events: Dict[str, Tuple[Optional[str], Optional[str]]]  # event -> (system, class); empty when not read
    btf: Optional[bytes]  # raw split BTF of a module read in full
    has_btf: bool
    read: bool  # False: only listed (no searched name in its string table), symbols not read


def _module_name(path: str, modinfo: Optional[bytes]) -> str:
    for field in (modinfo or b"").split(b"\0"):
        if field.startswith(b"name="):
            return field[5:].decode()
    base = path.rsplit("/", 1)[-1]
    for suffix in _MODULE_SUFFIXES:
        if base.endswith(suffix):
            base = base[:-len(suffix)]
            break
    return base.replace("-", "_")


class Lookup(NamedTuple):
    """The names a report looks up in a package: only modules defining one of them are read.

    Why: symbol tables, __mcount_loc and tracepoint relocations of ~4000 modules cost more
    than everything else; a report needs only the modules that define one of its names. A
    module defining function F (or a compiler copy F.isra.0, F.cold) or tracepoint E
    (`__tracepoint_E`) has that string in its .strtab, so a byte search there finds every
    module that can change a verdict; the others are only listed (name, path, BTF or not).
    `modules` are read in full whatever they define (the spec's modules, for rename hints).
    """

    functions: Tuple[str, ...]
    events: Tuple[str, ...]  # event names without the system (`nfs_getattr_enter`)
    modules: Tuple[str, ...]

    @classmethod
    def of(cls, functions: Iterable[str] = (), events: Iterable[str] = (), modules: Iterable[str] = ()) -> "Lookup":
        return cls(tuple(sorted(set(functions))), tuple(sorted({e.rpartition(":")[2] for e in events})),
                   tuple(sorted(set(modules))))

    def covers(self, other: "Lookup") -> bool:
        return all(set(mine) >= set(theirs) for mine, theirs in zip(self, other))

    def union(self, other: "Lookup") -> "Lookup":
        return Lookup.of(self.functions + other.functions, self.events + other.events, self.modules + other.modules)

    def as_dict(self) -> Dict[str, List[str]]:
        return {"functions": list(self.functions), "events": list(self.events), "modules": list(self.modules)}


class Search(NamedTuple):
    """A Lookup compiled for the module workers: one regex over each module's .strtab."""

    pattern: "re.Pattern[bytes]"
    modules: frozenset

    @classmethod
    def of(cls, lookup: Lookup) -> "Search":
        alternatives = [re.escape(f.encode()) + rb"[\0.]" for f in lookup.functions]
        alternatives += [b"__tracepoint_" + re.escape(e.encode()) + b"\0" for e in lookup.events]
        pattern = re.compile(rb"\0(?:" + b"|".join(alternatives) + rb")") if alternatives else re.compile(rb"(?!)")
        return cls(pattern, frozenset(lookup.modules))

    def wants(self, name: str, strtab: Optional[bytes]) -> bool:
        return name in self.modules or (strtab is not None and self.pattern.search(strtab) is not None)


def read_module(path: str, data: bytes, search: Optional[Search] = None) -> ModuleInfo:
    """Functions, traceability, tracepoints and raw BTF of one module ELF.

    With `search`, a module it does not want is only listed: name, BTF and __mcount_loc
    present or not, from the section headers alone.
    """
    elf = Elf(data, path)
    name = _module_name(path, elf.section_bytes(".modinfo"))
    if search is not None and not search.wants(name, elf.section_bytes(".strtab")):
        return ModuleInfo(name, path, [], ".rela__mcount_loc" in elf.index, {}, None, ".BTF" in elf.index, False)
    syms = elf.symbols()
    # functions per section, sorted by start, to map __mcount_loc call sites to functions
    by_section: Dict[int, List[Tuple[int, int, int]]] = {}
    for i, (sname, stype, _bind, shndx, value, size) in enumerate(syms):
        if stype == STT_FUNC and shndx:
            by_section.setdefault(shndx, []).append((value, size, i))
    for entries in by_section.values():
        entries.sort()
    starts = {shndx: [e[0] for e in entries] for shndx, entries in by_section.items()}
    traced: Set[int] = set()
    mcount = elf.relocations("__mcount_loc")
    for _off, symidx, addend in mcount:
        if symidx >= len(syms):
            continue
        _n, stype, _b, shndx, value, _s = syms[symidx]
        addr = value + addend
        entries = by_section.get(shndx)
        if not entries:
            continue
        pos = bisect.bisect_right(starts[shndx], addr) - 1
        if pos >= 0 and entries[pos][0] <= addr < entries[pos][0] + max(entries[pos][1], 1):
            traced.add(entries[pos][2])
    # __init code is freed once the module is loaded, and ftrace drops its call sites with it
    init_sections = {i for n, i in elf.index.items() if n.startswith(".init.")}
    functions = [(s[0], s[2] != STB_LOCAL, i in traced and s[3] not in init_sections)
                 for i, s in enumerate(syms) if s[1] == STT_FUNC and s[3]]
    btf = elf.section_bytes(".BTF")
    return ModuleInfo(name, path, functions, bool(mcount), _module_events(elf, syms), btf, btf is not None, True)


def _module_events(elf: Elf, syms: List[Tuple[str, int, int, int, int, int]]) -> Dict[str, Tuple[Optional[str], Optional[str]]]:
    """event -> (system, class) for each `__tracepoint_<event>` the module defines."""
    events = {s[0][len("__tracepoint_"):]: (None, None) for s in syms
              if s[0].startswith("__tracepoint_") and s[1] == STT_OBJECT and s[3]}
    if not events:
        return events
    relocs: Dict[int, Dict[int, Tuple[int, int]]] = {}  # shndx -> offset -> (sym, addend)
    objects = {(s[3], s[4]): s[0] for s in syms if s[1] == STT_OBJECT and s[3]}
    sec_names = {i: n for n, i in elf.index.items()}

    def pointer(shndx: int, offset: int) -> Optional[Tuple[int, int]]:
        """(symbol index, addend) the relocation at section+offset points to."""
        if shndx not in relocs:
            relocs[shndx] = {off: (sym, add) for off, sym, add in elf.relocations(sec_names.get(shndx, "?"))}
        return relocs[shndx].get(offset)

    def string_at(symidx: int, addend: int) -> Optional[str]:
        _n, _t, _b, shndx, value, _s = syms[symidx]
        raw = elf.section_bytes(sec_names.get(shndx, "?"))
        if raw is None:
            return None
        start = value + addend
        end = raw.find(b"\0", start)
        return raw[start:end].decode("utf-8", "replace") if end >= 0 else None

    for sname, stype, _bind, shndx, value, _size in syms:
        if not sname.startswith("__event_") or stype != STT_OBJECT:
            continue
        event = sname[len("__event_"):]
        call = pointer(shndx, value)
        if call is None or event not in events:
            continue
        call_sym = syms[call[0]]
        klass = pointer(call_sym[3], call_sym[4] + call[1] + _CALL_CLASS_OFFSET)
        if klass is None:
            continue
        class_sym = syms[klass[0]]
        class_addr = class_sym[4] + klass[1]
        # relocations name a local object by its section symbol plus an addend
        class_label = objects.get((class_sym[3], class_addr), "")
        class_name = class_label[len("event_class_"):] if class_label.startswith("event_class_") else None
        system_ptr = pointer(class_sym[3], class_addr + _CLASS_SYSTEM_OFFSET)
        system = string_at(*system_ptr) if system_ptr else None
        events[event] = (system, class_name)
    return events


# --------------------------------------------------------------------------- the profile

def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _parse_config(text: str) -> Dict[str, str]:
    options = {}
    for line in text.splitlines():
        if line.startswith("CONFIG_") and "=" in line:
            key, _, value = line.partition("=")
            options[key] = value
    return options


def _btf_record(func, module: Optional[str]) -> Dict[str, Any]:
    return {"module": module, "prototype": func.prototype(), "return": func.return_type,
            "params": [[p.name, p.type] for p in func.params], "linkage": func.linkage}


def _field(member) -> Dict[str, Any]:
    """A trace_event_raw_<class> member as a tracefs format field (the common_* header excluded)."""
    name, ftype = member.name, member.type
    if name.startswith("__data_loc_"):  # dynamic arrays/strings: a u32 offset/length word
        name, ftype = name[len("__data_loc_"):], f"__data_loc {ftype}"
    return {"name": name, "type": ftype, "offset": member.offset, "size": member.size,
            "signed": member.signed, "common": False}


def _tracepoint_records(btf: Btf, events: Dict[str, Optional[str]]) -> Dict[str, Dict[str, Any]]:
    """Per event: TP_PROTO from `btf_trace_<event>`, record fields from `trace_event_raw_<class>`."""
    protos = dict(btf.named_types(KIND_TYPEDEF, "btf_trace_"))
    raws = dict(btf.named_types(KIND_STRUCT, "trace_event_raw_"))
    out = {}
    for event, klass in events.items():
        proto_id = protos.get(f"btf_trace_{event}")
        raw_id = raws.get(f"trace_event_raw_{klass or event}")
        out[event] = {
            "proto": btf.type_name(btf.referenced(proto_id)) if proto_id else None,
            "fields": None if raw_id is None else [_field(m) for m in btf.members(raw_id) if m.name not in ("ent", "__data")],
        }
    return out


class _Collected:
    """Everything read from one kernel's packages before the profile is assembled."""

    def __init__(self) -> None:
        self.files: List[str] = []
        self.release: Optional[str] = None
        self.config_text: Optional[str] = None
        self.vmlinuz: Optional[Tuple[str, bytes]] = None
        self.modules: List[ModuleInfo] = []
        self.builtin: List[str] = []
        self.bad_modules: List[str] = []


def _wanted(path: str) -> bool:
    return bool(_VMLINUZ_RE.search(path) or _CONFIG_RE.search(path)
                or path.endswith("/modules.builtin")
                or ("lib/modules/" in path and path.endswith(_MODULE_SUFFIXES)))


def _module_or_error(rel: str, data: bytes, search: Optional[Search]) -> Tuple[Optional[ModuleInfo], Optional[str]]:
    """read_module on (maybe compressed) bytes; runs in worker processes, so errors come back as text."""
    try:
        return read_module(rel, _decompress_module(rel, data), search), None
    except (PackageError, lzma.LZMAError, OSError, EOFError) as exc:
        return None, f"{rel}: {exc}"
    except Exception as exc:  # zstandard.ZstdError, without importing zstandard here
        if exc.__class__.__name__ == "ZstdError":
            return None, f"{rel}: {exc}"
        raise


#: compressed module bytes per child: a fork of the parent (~350 MB by then) costs ~10 ms of
#: system time, so ~25 children for Debian's 92 MB of 6.12 modules, and enough to share out
BATCH_BYTES = 4 << 20


def _collect(paths: Sequence[Path], workers: int, search: Optional[Search]) -> _Collected:
    """Stream the packages; compressed modules (decompression dominates) go to `workers` children
    in batches (probes.forked: each batch is the parent's memory at the fork, nothing is sent).

    Uncompressed modules are read here: most get only a section-header scan, cheaper than a fork.
    """
    from probes.forked import Forked
    got = _Collected()
    results: List[Any] = []  # per batch, in package order: a list of results, or None for the children's next
    batch: List[Tuple[str, bytes]] = []

    def work(modules: List[Tuple[str, bytes]]) -> List[Tuple[Optional[ModuleInfo], Optional[str]]]:
        return [_module_or_error(rel, data, search) for rel, data in modules]

    def what(modules: List[Tuple[str, bytes]]) -> str:
        first, last = (os.path.basename(rel) for rel, _data in (modules[0], modules[-1]))
        return f"{', '.join(p.name for p in paths)}: the analysis of {len(modules)} modules ({first} to {last})"

    with Forked(work, workers, what) as children:
        def flush() -> None:
            if batch:
                children.submit(list(batch))
                results.append(None)
                batch.clear()

        for path in paths:
            for rel, data in iter_package_files(path, _wanted):
                got.files.append(rel)
                m = _RELEASE_RE.search(rel)
                if m and got.release is None:
                    got.release = m.group(1) or m.group(2)
                if _VMLINUZ_RE.search(rel):
                    got.vmlinuz = (rel, data)
                elif _CONFIG_RE.search(rel):
                    got.config_text = data.decode("utf-8", "replace")
                elif rel.endswith("/modules.builtin"):
                    got.builtin = [_module_name(line, None) for line in data.decode().split()]
                elif workers <= 1 or rel.endswith(".ko"):
                    flush()
                    results.append(work([(rel, data)]))
                else:
                    batch.append((rel, data))
                    if sum(len(d) for _r, d in batch) >= BATCH_BYTES:
                        flush()
        flush()
        answers = children.answers()
        for result in results:
            for info, error in (next(answers) if result is None else result):
                _keep(got, info, error)
    return got


def _keep(got: _Collected, info: Optional[ModuleInfo], error: Optional[str]) -> None:
    if info is not None:
        got.modules.append(info)
    else:
        got.bad_modules.append(error or "?")


def profile_from_package(paths: Sequence[Path], btf_functions: Iterable[str] = (),
                         btf_modules: Iterable[str] = (), workers: Optional[int] = None,
                         lookup: Optional[Lookup] = None) -> Dict[str, Any]:
    """A kernel profile (dict) from one kernel's packages.

    `btf_functions`: names whose BTF prototypes to record (wherever they live);
    `btf_modules`: modules all of whose BTF functions to record; `workers`: processes
    decompressing modules (default: one per core); `lookup`: read only the modules that
    define these names (recorded in package.lookup; the prototypes asked for are added to
    it), None = read every module (a complete profile).
    """
    origin = ", ".join(p.name for p in paths)
    if lookup is not None:
        lookup = lookup.union(Lookup.of(btf_functions, (), btf_modules))
    got = _collect(paths, workers if workers is not None else (os.cpu_count() or 1),
                   Search.of(lookup) if lookup is not None else None)
    if got.vmlinuz is None and not got.modules:
        raise PackageError(f"{origin}: no kernel image and no modules: not a Debian kernel package")
    notes: List[str] = []
    unavailable: Dict[str, str] = {
        "modules": "a package has no running system: nothing is loaded (package.modules lists every module shipped)",
        "mounts": "a package has no running system",
        "tracers": "a package has no tracefs",
        "kprobe_blacklist": "the kprobe blacklist needs the running kernel (debugfs kprobes/blacklist)",
    }
    vmlinux_btf: Optional[Btf] = None
    uname_version = "?"
    if got.vmlinuz is None:
        unavailable["vmlinux"] = "no kernel image in the packages given (on 6.19+/7.x add linux-binary-*)"
        notes.append(unavailable["vmlinux"])
    else:
        rel, data = got.vmlinuz
        vmlinux = decompress_vmlinuz(data, rel)
        banner = re.search(rb"Linux version [^\n\0]+", vmlinux)
        if banner:
            uname_version = banner.group(0).decode("utf-8", "replace")
        raw_btf = Elf(vmlinux, rel).section_bytes(".BTF")
        if raw_btf is None:
            unavailable["btf"] = "the kernel image has no .BTF section (CONFIG_DEBUG_INFO_BTF off)"
            notes.append(unavailable["btf"])
        else:
            try:
                vmlinux_btf = Btf(raw_btf)
            except BtfError as exc:
                unavailable["btf"] = f"vmlinux BTF unreadable: {exc}"
                notes.append(unavailable["btf"])
        del vmlinux
    notes.append("vmlinux functions come from BTF: Debian strips the image and ships no real System.map, "
                 "so vmlinux compiler copies (.isra/.constprop/.part) and notrace functions are not visible")
    if got.bad_modules:
        notes.append(f"{len(got.bad_modules)} module(s) unreadable, first: {got.bad_modules[0]}")

    filter_functions: List[List[Optional[str]]] = []
    symbols: Dict[str, str] = {}
    btf_funcs: Dict[str, Dict[str, Any]] = {}
    wanted_funcs = set(btf_functions)
    if vmlinux_btf is not None:
        for fname in vmlinux_btf.function_names():
            filter_functions.append([fname, None])
            if fname in wanted_funcs:
                func = vmlinux_btf.function(fname)
                if func is not None:
                    btf_funcs[fname] = _btf_record(func, None)
                    symbols[fname] = "T" if func.linkage == "global" else "t"

    events: Dict[str, Dict[str, Dict[str, Any]]] = {}
    module_files: Dict[str, Dict[str, Any]] = {}
    wanted_modules = set(btf_modules)
    no_btf, no_mcount = [], []
    btf_read = ["vmlinux"] if vmlinux_btf is not None else []
    for mod in got.modules:
        names_here = {f[0] for f in mod.functions}
        module_files[mod.name] = {"path": mod.path, "btf": mod.has_btf, "read": mod.read,
                                  "events": len(mod.events) if mod.read else None}
        if not mod.traceability_known:
            no_mcount.append(mod.name)
        for fname, is_global, traceable in mod.functions:
            listed = traceable or not mod.traceability_known
            if listed:
                filter_functions.append([fname, mod.name])
            if fname in wanted_funcs or mod.name in wanted_modules:
                # "notrace": in the symbol table without an ftrace call site (compat reports it)
                if listed or fname not in symbols:
                    symbols[fname] = ("T" if is_global else "t") if listed else "notrace"
        mod_btf: Optional[Btf] = None
        needs_btf = mod.events or mod.name in wanted_modules or (names_here & wanted_funcs)
        if not mod.has_btf:
            no_btf.append(mod.name)
        elif needs_btf and vmlinux_btf is not None and mod.btf is not None:  # None: listed only
            try:
                mod_btf = Btf(mod.btf, base=vmlinux_btf)
                btf_read.append(mod.name)
            except BtfError as exc:
                notes.append(f"{mod.name}: module BTF unreadable ({exc})")
        if mod_btf is not None:
            names = mod_btf.function_names() if mod.name in wanted_modules else sorted(names_here & wanted_funcs)
            for fname in names:
                func = mod_btf.function(fname)
                if func is not None and fname not in btf_funcs:
                    btf_funcs[fname] = _btf_record(func, mod.name)
        described = _tracepoint_records(mod_btf, {e: c for e, (_s, c) in mod.events.items()}) if mod_btf else {}
        for event, (system, klass) in mod.events.items():
            record: Dict[str, Any] = {"id": None, "print_fmt": None, "fields": None, "proto": None,
                                      "module": mod.name, "class": klass}
            record.update(described.get(event, {}))
            events.setdefault(system or f"?{mod.name}", {})[event] = record
    if vmlinux_btf is not None:
        # vmlinux tracepoints: stripped image, so no system names; keep them under "?vmlinux"
        for name, type_id in vmlinux_btf.named_types(KIND_TYPEDEF, "btf_trace_"):
            event = name[len("btf_trace_"):]
            events.setdefault("?vmlinux", {})[event] = {
                "id": None, "print_fmt": None, "fields": None, "module": None, "class": None,
                "proto": vmlinux_btf.type_name(vmlinux_btf.referenced(type_id))}
    if got.modules and len(no_btf) == len(got.modules):
        notes.append("modules carry no BTF (before Debian 6.x, e.g. 5.10): module functions come from the "
                     "symbol tables, without prototypes; tracepoint fields unknown")
    elif no_btf:
        notes.append(f"{len(no_btf)} module(s) without BTF, e.g. {', '.join(sorted(no_btf)[:3])}")
    if no_mcount:
        notes.append(f"{len(no_mcount)} module(s) without __mcount_loc: all their functions are listed as traceable")
    if lookup is not None:
        read = sum(1 for m in got.modules if m.read)
        notes.append(f"functions and tracepoints of {read} of {len(got.modules)} modules read: those defining one of "
                     f"the {len(lookup.functions)} functions and {len(lookup.events)} tracepoints looked up "
                     f"(package.lookup), or named; other names need a new analysis")

    release = got.release or "?"
    data: Dict[str, Any] = {
        "schema": SCHEMA, "version": VERSION, "created": _now(),
        "source": {"how": "package", "host": None, "tool": "probes kernelpkg", "packages": [p.name for p in paths]},
        "uname": {"sysname": "Linux", "release": release, "version": uname_version, "machine": "x86_64"},
        "config": _parse_config(got.config_text) if got.config_text else None,
        "modules": {}, "mounts": [], "tracers": None,
        "filter_functions": filter_functions, "kprobe_blacklist": None,
        "events": events, "symbols": symbols,
        "btf": {"modules": btf_read, "functions": btf_funcs} if vmlinux_btf is not None else None,
        "unavailable": unavailable,
        "package": {"subset": True, "files": len(got.files), "modules": module_files,
                    "builtin": got.builtin, "notes": notes,
                    "lookup": lookup.as_dict() if lookup is not None else None},
    }
    if got.config_text is None:
        unavailable["config"] = "no boot/config-* or lib/modules/*/config in the packages"
    return check_profile(data, origin)


# --------------------------------------------------------------------------- cache

def _cache_key(paths: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for path in paths:
        if path.is_dir():
            files = sorted(path.glob("*.deb")) or sorted(f for f in path.rglob("*") if f.is_file())
        else:
            files = [path]
        for f in files:
            st = f.stat()
            h.update(f"{f.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    h.update(b"kernelpkg-3")
    return h.hexdigest()[:24]


def profile_cache_dir() -> Path:
    """Where analysed packages' profiles are kept: PROBEKIT_PROFILE_CACHE, else the cache's
    profiles/. A variable that cannot name a directory is said by its name (mkdir's bare
    "File exists" named neither); load_kernels asks first, before any download or analysis."""
    from probes.fetch import cache_root
    value = os.environ.get("PROBEKIT_PROFILE_CACHE")
    if not value:
        return cache_root() / "profiles"
    path = Path(value)
    existing = path
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    problem = ("" if existing.is_dir() and os.access(existing, os.W_OK | os.X_OK)
               else "cannot write in it" if existing.is_dir()
               else "is a file, not a directory" if existing.is_file() else "is not a directory")
    if problem:
        where = "" if existing == path else f": {existing}"
        raise UserError(f"PROBEKIT_PROFILE_CACHE={value}{where} {problem}; point it at a directory "
                        f"(or unset it for {cache_root() / 'profiles'})")
    return path


def _cached(target: Path) -> Optional[Dict[str, Any]]:
    """A cached profile that can still be read (a broken entry is dropped)."""
    if not target.is_file():
        return None
    try:
        return check_profile(json.loads(target.read_text()), str(target))
    except (ValueError, UserError):
        target.unlink()
        return None


def _lookup_of(data: Dict[str, Any]) -> Optional[Lookup]:
    """The lookup a cached profile was analysed for; None = every module was read."""
    recorded = data["package"].get("lookup")
    return None if recorded is None else Lookup.of(recorded["functions"], recorded["events"], recorded["modules"])


def profile_is_cached(paths: Sequence[Path], lookup: Lookup) -> bool:
    """True when these packages were analysed before for (at least) these names."""
    data = _cached(profile_cache_dir() / f"{_cache_key(paths)}.json")
    if data is None:
        return False
    had = _lookup_of(data)
    return had is None or had.covers(lookup)


def cached_profile_from_package(paths: Sequence[Path], lookup: Lookup, cache_dir: Optional[Path] = None,
                                workers: Optional[int] = None) -> Dict[str, Any]:
    """profile_from_package for a lookup (prototypes of its functions), memoised on disk.

    Keyed by file identity (path, size, mtime). An entry analysed for other names is
    analysed again for the union of both lookups, and replaced, so the cache never answers
    for a name its analysis did not look for.
    """
    cache_dir = cache_dir or profile_cache_dir()
    target = cache_dir / f"{_cache_key(paths)}.json"
    data = _cached(target)
    if data is not None:
        had = _lookup_of(data)
        if had is None or had.covers(lookup):
            return data
        lookup = lookup.union(had)
    data = profile_from_package(paths, lookup.functions, (), workers, lookup)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".{os.getpid()}.tmp")  # several runs (CI, tests) may fill it at once
    tmp.write_text(json.dumps(data))
    tmp.replace(target)
    return data

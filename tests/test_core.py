"""The CO-RE backend on the host: the object built from nfs.toml, opened (not loaded: the host
refuses bpf()) through probes.libbpf, and the settings the loader would write for the
6.1.0-50 lab kernel's choice. Loading and attaching are proven in lab guests only."""
from __future__ import annotations

import ctypes
import gzip
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import types
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from discover.errors import UserError
from discover.profile import KernelProfile
from discover.spec import OPS, load_spec
from probes.build_core import build
from probes.backend import Rejected
from probes.core_backend import MODULE_TARGET_VERSION, CoreBackend
from probes.generate_core import CFG_MARK, CTX_MARK, cfg_format, core_table, generate_core, settings_inlined, slots_needed
from probes.model import CFG_FIELDS, Tool, point_fields
from probes.objects import MIN_KERNEL
from probes.kernelpkg import Elf
from probes.libbpf import PRINT_FN, BpfObject, Libbpf, LibbpfError
from probes.runtime import RealtimeReads, Session, module_live
from probes.select import KernelFacts, late_points, select

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "probes" / "specs" / "nfs.toml"
PROFILE = REPO / "tests" / "fixtures" / "6.1.0-50-amd64" / "profile.json.gz"
#: the object path of a backend that these tests never open
UNREAD = REPO / "probes" / "objects" / "unread.bpf.o"


@pytest.fixture(scope="module")
def spec() -> Dict[str, Any]:
    return load_spec(SPEC)


@pytest.fixture(scope="module")
def profile() -> KernelProfile:
    return KernelProfile(json.loads(gzip.decompress(PROFILE.read_bytes())))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("clang") is None or shutil.which("llvm-strip") is None:
        pytest.fail("building the CO-RE object needs clang and llvm (apt-get install clang llvm libbpf-dev)")
    return build(SPEC, tmp_path_factory.mktemp("core") / "nfs.bpf.o")


def formats_of(profile: KernelProfile) -> Any:
    events = profile.data["events"]

    def fields(event: str) -> Optional[List[Dict[str, Any]]]:
        system, _, name = event.partition(":")
        info = events.get(system, {}).get(name)
        return info["fields"] if info else None
    return fields


def test_the_object_holds_every_candidate_point_and_the_maps_the_readers_use(spec: Dict[str, Any],
                                                                              built: Path) -> None:
    source = generate_core(spec)
    obj = BpfObject(Libbpf(), built.read_bytes())
    try:
        sections = {name: obj.section(name) for name in obj.programs()}
        assert sections == {program.name: program.section for program in source.programs}
        for point in source.table.points:
            if point.kind == "fentry":
                assert sections[f"p{point.id}_fentry"] == f"fentry/{point.entry}"
                assert sections[f"p{point.id}_fexit"] == f"fexit/{point.exit}"
            if point.kind in ("fentry", "kprobe"):  # the fallback of a fentry point too
                assert sections[f"p{point.id}_kprobe"] == f"kprobe/{point.entry}"
                assert sections[f"p{point.id}_kretprobe"] == f"kretprobe/{point.exit}"
            else:
                for event in (point.entry, point.exit):
                    system, _, name = event.partition(":")
                    assert f"tp/{system}/{name}" in sections.values()
        maps = obj.maps()
        readers = ("dist", "op_totals", "counters", "inflight", "async_starts", "starts", "task_starts", "events",
                   "top_stats", "top_hist", "cgroup_ids", "cgroup_filter", "requests", "server_stats", "server_hist")
        for name in readers:
            assert name in maps, name
        lib = obj.lib.lib
        # no global data: the settings are the instructions' own (settings_inlined)
        assert not {name for name in maps if name.startswith(".")}
        # the ctypes layouts built from the object's BTF are the sizes the kernel will check
        for name in ("dist", "op_totals", "inflight", "async_starts", "top_stats", "top_hist", "counters",
                     "requests", "server_stats", "server_hist"):
            view = obj.map(name)
            assert ctypes.sizeof(view.key_type) == lib.bpf_map__key_size(maps[name]), name
            assert ctypes.sizeof(view.value_type) == lib.bpf_map__value_size(maps[name]), name
        assert [f[0] for f in obj.map("dist").key_type._fields_] == ["op", "slot", "dev", "pad", "cgroup"]
        assert [f[0] for f in obj.map("op_totals").key_type._fields_] == ["op", "dev", "cgroup"]
        assert "s" in dict(obj.map("inflight").value_type._fields_)
    finally:
        obj.close()
        obj.close()  # twice: nothing left, no error


def test_the_object_holds_nothing_of_the_bytes_it_was_opened_from(built: Path) -> None:
    """Neither BpfObject nor libbpf keeps the ELF past the open (a start's peak memory would hold
    it twice, with the kernel's BTF parsed on top): an object whose buffer is zeroed once open
    still names every program, section and map as one opened from the file's bytes."""
    data = built.read_bytes()
    references = sys.getrefcount(data)
    expected = BpfObject(Libbpf(), data)
    buffer = ctypes.create_string_buffer(data, len(data))
    zeroed = BpfObject(Libbpf(), buffer)  # type: ignore[arg-type]
    try:
        assert sys.getrefcount(data) == references
        ctypes.memset(buffer, 0, len(data))
        assert {n: zeroed.section(n) for n in zeroed.programs()} == {n: expected.section(n) for n in expected.programs()}
        lib = zeroed.lib.lib
        assert ({n: (lib.bpf_map__key_size(m), lib.bpf_map__value_size(m)) for n, m in zeroed.maps().items()}
                == {n: (lib.bpf_map__key_size(m), lib.bpf_map__value_size(m)) for n, m in expected.maps().items()})
    finally:
        zeroed.close()
        expected.close()


def test_an_object_opens_without_libbpfs_printer_and_a_refused_one_says_why(built: Path) -> None:
    """The open runs without libbpf's printer (its ~15,000 debug lines cost a call into Python
    each); a refused object is opened again with it, and the error carries libbpf's own line.
    The printer is back after either: what a later load fails on is still said."""
    lib = Libbpf()
    calls = []
    original = lib._printer  # noqa: SLF001

    def counted(level: int, fmt: bytes, args: int) -> int:
        calls.append(level)
        return original(level, fmt, args)

    lib._printer = PRINT_FN(counted)  # noqa: SLF001
    lib.lib.libbpf_set_print(ctypes.cast(lib._printer, ctypes.c_void_p))  # noqa: SLF001
    BpfObject(lib, built.read_bytes()).close()
    assert calls == []
    truncated = built.read_bytes()[:4096]
    with pytest.raises(LibbpfError) as refused:
        BpfObject(lib, truncated)
    assert "bpf_object__open_mem: " in str(refused.value) and "\nlibbpf: elf: " in str(refused.value)
    assert calls  # the second open, printed
    calls.clear()
    with pytest.raises(LibbpfError) as again:
        BpfObject(lib, truncated)
    assert "\nlibbpf: elf: " in str(again.value) and calls


def test_the_heap_freed_before_a_load_goes_back_to_the_kernel() -> None:
    """BpfObject.load trims the heap first (glibc's malloc_trim): freed memory below the heap's
    top, which free() alone keeps, is not under the peak of libbpf's parse of the kernel's BTF."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]

    def rss_mib() -> float:
        return int(re.search(r"VmRSS:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) / 1024

    blocks = [libc.malloc(4096) for _ in range(8192)]  # 32 MiB in pieces below the mmap threshold
    for block in blocks:
        ctypes.memset(block, 1, 4096)
    top = libc.malloc(64)  # allocated last: the heap cannot shrink from its end
    for block in blocks:
        libc.free(block)
    freed = rss_mib()
    Libbpf().trim_heap()
    assert rss_mib() < freed - 24
    libc.free(top)


def test_struct_reads_are_co_re_relocations(built: Path) -> None:
    """.BTF.ext carries CO-RE relocation records (the kernel struct members read through BTF)."""
    obj = BpfObject(Libbpf(), built.read_bytes())
    obj.close()
    ext = Elf(built.read_bytes(), str(built)).section_bytes(".BTF.ext")
    assert ext is not None
    magic, _version, _flags, hdr_len = struct.unpack_from("<HBBI", ext)
    assert magic == 0xEB9F and hdr_len >= 32
    _fi_off, _fi_len, _li_off, _li_len, core_off, core_len = struct.unpack_from("<6I", ext, 8)
    assert core_len > 1000  # dozens of records per program that follows a file or dentry
    names = {"file", "inode", "dentry", "super_block", "qstr", "pt_regs"}
    assert names <= {n for n, _ in obj.btf.named_types(4)}  # BTF_KIND_STRUCT


def test_the_object_keeps_no_branch_labels(built: Path) -> None:
    """Its symbol table names sections, programs and maps only: libbpf's open walks every symbol
    once per program section, and clang leaves a local label (LBB0_1...) at every branch
    target; still every program opens, under its section."""
    symbols = Elf(built.read_bytes(), str(built)).symbols()
    local_notype = [name for name, kind, bind, *_ in symbols if kind == 0 and bind == 0 and name]  # STT_NOTYPE, STB_LOCAL
    assert local_notype == []
    obj = BpfObject(Libbpf(), built.read_bytes())
    try:
        functions = {name for name, kind, *_ in symbols if kind == 2}  # STT_FUNC
        assert set(obj.programs()) <= functions and len(obj.programs()) > 100
    finally:
        obj.close()


#: the kernel helpers the object may call (include/uapi/linux/bpf.h's numbers), each with the
#: release that brought it to tracing programs
HELPERS = {1: ("map_lookup_elem", (3, 19)), 2: ("map_update_elem", (3, 19)), 3: ("map_delete_elem", (3, 19)),
           5: ("ktime_get_ns", (4, 1)), 14: ("get_current_pid_tgid", (4, 2)), 16: ("get_current_comm", (4, 2)),
           37: ("current_task_under_cgroup", (4, 9)), 80: ("get_current_cgroup_id", (4, 18)),
           113: ("probe_read_kernel", (5, 5)), 115: ("probe_read_kernel_str", (5, 5)),
           131: ("ringbuf_reserve", (5, 8)), 132: ("ringbuf_submit", (5, 8)), 156: ("task_storage_get", (5, 11)),
           158: ("get_current_task_btf", (5, 11)), 175: ("task_pt_regs", (5, 15))}


def test_the_kernel_floor_is_the_newest_helper_the_programs_call(built: Path) -> None:
    """MIN_KERNEL (the backend choice's kernel check) is where the last helper the object's
    programs call arrived, and the check names it: trampoline arguments are read from the
    context, not through bpf_get_func_arg (5.17)."""
    elf, called = Elf(built.read_bytes(), str(built)), set()
    for name in elf.index:
        if name.startswith(("fentry/", "fexit/", "kprobe/", "kretprobe/", "tp/", "tracepoint/")):
            code = elf.section_bytes(name) or b""
            for at in range(0, len(code), 8):
                if code[at] == 0x85 and code[at + 1] >> 4 == 0:  # BPF_CALL of a helper (src_reg 0)
                    called.add(struct.unpack_from("<i", code, at + 4)[0])
    assert called and called <= set(HELPERS), sorted(called - set(HELPERS))
    name, floor = max((HELPERS[h] for h in called), key=lambda helper: helper[1])
    assert (floor, name) == (MIN_KERNEL, "task_pt_regs")


def test_settings_turn_on_the_chosen_points_with_their_fields(spec: Dict[str, Any], profile: KernelProfile) -> None:
    """On the 6.1.0-50 profile's choice (no module BTF on the host: kprobe pairs, no file
    arguments), the loader names the chosen programs and writes each point's op, slot and
    tracepoint field offsets as the kernel's format gives them."""
    sel = select(spec, KernelFacts.from_profile(profile), list(OPS))
    backend = CoreBackend(spec, UNREAD, Libbpf())
    probe = backend.generate(sel.chosen, Tool(events=True, dist=True), None, formats_of(profile), True, True, ())
    assert backend._plan is not None
    _probe, programs, cfg, sizes = backend._plan
    assert probe.ops == [c.op for c in sel.chosen] and probe.ringbuf and probe.task_storage
    assert "p0_kprobe" in programs and "p0_kretprobe" in programs and "p0_fentry" not in programs
    assert "tp_nfs__nfs_getattr_enter" in programs and "tp_nfs__nfs_commit_done" in programs
    assert set(probe.programs) == set(programs)
    table = core_table(spec)
    on = cfg_points_on(spec, cfg)
    assert sorted(s["id"] for s in on.values()) == list(range(len(probe.points)))
    commit = next(p for p in table.points if p.op == "commit" and p.id in on)
    assert on[commit.id]["keyed"] == 1 and on[commit.id]["op"] == probe.ops.index("commit")
    fields = {f["name"]: f for f in formats_of(profile)(commit.entry) or []}
    assert (on[commit.id]["t_key0_off"], on[commit.id]["t_key0_size"]) == (fields[commit.keys[0]]["offset"],
                                                                           fields[commit.keys[0]]["size"])
    assert sizes["dist"] == len(probe.ops) * 64 and sizes["cgroup_ids"] == 1


def test_only_the_chosen_programs_autoload(spec: Dict[str, Any], profile: KernelProfile, built: Path) -> None:
    """bpf_object__load relocates and the kernel verifies only autoloaded programs: after
    prepare() (open from memory, no bpf()), libbpf's own getter says exactly the programs of
    the 6.1.0-50 choice autoload, and the maps no setting writes were shrunk to one entry."""
    sel = select(spec, KernelFacts.from_profile(profile), list(OPS))
    backend = CoreBackend(spec, built, Libbpf())
    probe = backend.generate(sel.chosen, Tool(events=True, dist=True), None, formats_of(profile), True, True, ())
    obj = backend.prepare(probe)
    try:
        lib = obj.lib.lib
        loaded = {name for name, prog in obj.programs().items() if lib.bpf_program__autoload(prog)}
        assert loaded == set(probe.programs)
        assert 0 < len(loaded) < len(obj.programs()) // 4  # a handful of the object's hundreds
        maps = obj.maps()
        assert lib.bpf_map__max_entries(maps["top_hist"]) == 1 and lib.bpf_map__max_entries(maps["starts"]) == 1
        assert lib.bpf_map__max_entries(maps["async_starts"]) > 1  # commit's keyed tracepoint point
    finally:
        obj.close()


def test_a_watched_point_is_set_to_forget_its_end(spec: Dict[str, Any], profile: KernelProfile) -> None:
    """The RPC layer tracked in flight only (runtime.Session beneath the default ops): the loader
    sets its points' `watch`, which the tracepoint end passes to async_end to delete the start
    instead of recording it, and no asked point's."""
    facts = KernelFacts.from_profile(profile)
    chosen = select(spec, facts, ["read", "commit"]).chosen + \
        [c._replace(watch=True) for c in select(spec, facts, ["rpc"]).chosen]
    backend = CoreBackend(spec, UNREAD, Libbpf())
    probe = backend.generate(chosen, Tool(events=True, inflight=True), None, formats_of(profile), True, True, ())
    assert probe.watched == ("rpc",)
    assert backend._plan is not None
    table = core_table(spec)
    watch = {table.points[core].op: values["watch"] for core, values in cfg_points_on(spec, backend._plan[2]).items()}
    assert watch == {"read": 0, "commit": 0, "rpc": 1}
    assert "async_end(ctx, &k_, p, bytes_);" in generate_core(spec).c_text


def cfg_fields(npoints: int, nkeys: int) -> Dict[int, int]:
    """Byte offset -> size of every field of `struct cfg` as cfg_format packs it, in its order."""
    sizes = [8 if ctype == "u64" else 4 for _name, ctype in CFG_FIELDS] + [4] * len(point_fields(nkeys)) * npoints
    return {sum(sizes[:i]): size for i, size in enumerate(sizes)}


def placeholders(insns: bytes, mark: int = CFG_MARK) -> Dict[int, int]:
    """Instruction index -> the lower half of each 64-bit immediate load marked `mark`."""
    out = {}
    for i in range(0, len(insns) - 8, 8):
        if insns[i] == 0x18 and int.from_bytes(insns[i + 12:i + 16], "little") == mark:
            out[i // 8] = int.from_bytes(insns[i + 4:i + 8], "little")
    return out


@pytest.mark.parametrize("fs", sorted(p.stem for p in SPEC.parent.glob("*.toml")))
def test_every_setting_in_every_spec_object_is_written_from_its_field_of_cfg(fs: str, tmp_path: Path) -> None:
    """Each use of a setting in each program is a placeholder naming a field of `struct cfg` at
    the offset and size cfg_format packs it (the C compiler's offsetof and the packer agree on
    every field: ext4's cfg was once packed 4 bytes short), and settings_inlined writes that
    field's value there; a context slot's placeholder becomes two no-op jumps and writes 8 x its
    setting into the offset of the load after it (0 past the context's 13 slots); no other byte
    changes."""
    spec_path = SPEC.parent / f"{fs}.toml"
    table = core_table(load_spec(spec_path))
    fields = cfg_fields(len(table.points), table.nkeys)
    # every field a value of its own, the u64 ones above 32 bits
    values = {offset: (i + 1) << (33 if size == 8 else 0) for i, (offset, size) in enumerate(fields.items())}
    cfg = cfg_format(len(table.points), table.nkeys).pack(*values.values())
    obj = BpfObject(Libbpf(), build(spec_path, tmp_path / f"{fs}.bpf.o").read_bytes())
    try:
        for name in obj.programs():
            insns = obj.program_insns(name)
            found = placeholders(insns)
            assert found, name  # every program reads settings (its point's at least)
            written = settings_inlined(insns, cfg)
            for index, place in found.items():
                offset, size = place >> 8, place & 0xFF
                assert fields.get(offset) == size, (name, offset, size)
                assert written[index * 8 + 4:index * 8 + 8] == (values[offset] & 0xFFFFFFFF).to_bytes(4, "little")
                assert written[index * 8 + 12:index * 8 + 16] == (values[offset] >> 32).to_bytes(4, "little")
            slots = placeholders(insns, CTX_MARK)
            for index, place in slots.items():
                offset, size = place >> 8, place & 0xFF
                assert fields.get(offset) == size == 4, (name, offset, size)
                assert written[index * 8:index * 8 + 16] == bytes([0x05]) + bytes(7) + bytes([0x05]) + bytes(7)
                load = written[index * 8 + 16:index * 8 + 24]
                assert load[0] == 0x79 and int.from_bytes(load[2:4], "little") == \
                    (8 * values[offset] if values[offset] < 13 else 0), name
            # the two immediate halves: bytes 4-7 of the load's first instruction and of its second
            halves = {index * 8 + at for index in found for at in (4, 5, 6, 7, 12, 13, 14, 15)}
            halves |= {index * 8 + at for index in slots for at in [*range(16), 18, 19]}
            same = [i for i in range(len(insns)) if i not in halves]
            assert bytes(written[i] for i in same) == bytes(insns[i] for i in same), name
    finally:
        obj.close()


def test_a_placeholder_outside_cfg_is_refused_and_a_mark_elsewhere_left_alone() -> None:
    """A placeholder past the struct (an object built from another spec) is a ValueError, which
    the backend turns into one line; the mark's bytes where they are no immediate load's upper
    half are not a setting."""
    mark = CFG_MARK.to_bytes(4, "little")
    load = lambda place: bytes([0x18, 0x01, 0, 0]) + place.to_bytes(4, "little") + bytes(4) + mark
    assert settings_inlined(load(8 << 8 | 4), bytes(8) + b"\x2a\0\0\0") == bytes([0x18, 0x01, 0, 0, 0x2a]) + bytes(11)
    with pytest.raises(ValueError, match="a setting of 4 bytes at 16 of a 16-byte struct cfg"):
        settings_inlined(load(16 << 8 | 4), bytes(16))
    # after an instruction that is no immediate load; a load's bytes 4 off an instruction's start
    for stray in (bytes(12) + mark, bytes(4) + load(0) + bytes(4)):
        assert settings_inlined(stray, bytes(8)) == stray


def test_a_context_slot_is_one_load_at_its_settings_offset() -> None:
    """A trampoline context slot's placeholder (bpf/core.h's CTX_SLOT) and the load after it
    become two no-op jumps, which the verifier removes, and `r2 = *(u64 *)(r1 + 8n)`: one load,
    as bcc's text reads the slot; a slot the context has not (NO_PARAM: where the verifier drops
    the load) reads offset 0; a placeholder without its load is refused."""
    mark = CTX_MARK.to_bytes(4, "little")
    placeholder = bytes([0x18, 0x03, 0, 0]) + (4 << 8 | 4).to_bytes(4, "little") + bytes(4) + mark
    load = bytes([0x79, 0x12, 0, 0]) + bytes(4)
    nops = (bytes([0x05]) + bytes(7)) * 2
    assert settings_inlined(placeholder + load, bytes(4) + (3).to_bytes(4, "little")) == nops + bytes([0x79, 0x12, 24, 0]) + bytes(4)
    assert settings_inlined(placeholder + load, bytes(4) + (0xFFFFFFFF).to_bytes(4, "little")) == nops + load
    with pytest.raises(ValueError, match="context slot's placeholder at instruction 0 without its load"):
        settings_inlined(placeholder + bytes([0xb7, 0x02]) + bytes(6), bytes(8))


def test_histogram_slots_are_bccs(tmp_path: Path) -> None:
    """The probe's log2_slot, compiled as the host's C from bpf/probe.bpf.c's own text, puts
    each value in bcc's bpf_log2l slot: floor(log2 v) + 1, 1 for 0 (slot k holds
    [2^(k-1), 2^k - 1]). A slot lower put a 6.12 guest's 400 ms reads in the 131-262 ms bucket."""
    text = (REPO / "bpf" / "probe.bpf.c").read_text()
    start = text.index("static __always_inline u32 log2_slot(u64 v)")
    function = text[start:text.index("\n}\n", start) + 3].replace("__always_inline ", "")
    values = [0, 1, 2, 3, 4, 7, 8, 1023, 1024, 65535, 65536, (1 << 32) - 1, 1 << 32, 400_000, 3_600_000_000_000]
    source = tmp_path / "log2.c"
    source.write_text("#include <stdio.h>\ntypedef unsigned int u32;\ntypedef unsigned long long u64;\n"
                      + function + "\nint main(void) {\n"
                      + "".join(f"    printf(\"%u\\n\", log2_slot({v}ULL));\n" for v in values) + "    return 0;\n}\n")
    subprocess.run(["clang", "-O2", "-o", str(tmp_path / "log2"), str(source)], check=True)
    out = subprocess.run([str(tmp_path / "log2")], capture_output=True, text=True, check=True).stdout.split()
    assert [int(slot) for slot in out] == [max(v.bit_length(), 1) for v in values]


def test_fentry_only_where_libbpf_names_module_targets(spec: Dict[str, Any], profile: KernelProfile) -> None:
    """libbpf before 1.5 finds a module function's fentry target by scanning every module's BTF
    per program (docs/core.md; measured on 6.1 in bench/README.md): there the core loader
    attaches kprobes, as bcc 0.26 does, and says why. The host's libbpf1 is bookworm's 1.1."""
    lib = Libbpf()
    ok, why = CoreBackend(spec, UNREAD, lib).fentry_support()
    assert ok == (lib.version >= MODULE_TARGET_VERSION)
    version = ".".join(map(str, lib.version))
    assert why.startswith("attach: fentry/fexit" if ok else f"attach: kprobes (libbpf {version} looks ")


def cfg_points_on(spec: Dict[str, Any], cfg: bytes) -> Dict[int, Dict[str, int]]:
    """The settings of each point a `cfg` turns on, by the object's point number."""
    table = core_table(spec)
    values = cfg_format(len(table.points), table.nkeys).unpack(cfg)
    fields = point_fields(table.nkeys)
    on = {}
    for point in table.points:
        start = len(CFG_FIELDS) + point.id * len(fields)
        settings = dict(zip(fields, values[start:start + len(fields)]))
        if settings["on"]:
            on[point.id] = settings
    return on


def without_module(profile: KernelProfile, module: str) -> KernelFacts:
    """The profiled kernel's facts as they were before `module` loaded: its functions, its
    tracepoints (the `nfs4` system for nfsv4) and itself absent."""
    full = KernelFacts.from_profile(profile)
    mine = {name for name, owner in profile.data["filter_functions"] if owner == module}
    systems = {"nfsv4": "nfs4:"}
    return KernelFacts(full.functions - mine, {e for e in full.events if not e.startswith(systems[module])},
                       full.modules - {module}, profile.release, None, full.formats)


def test_a_module_loaded_later_gets_a_second_instance_for_its_points_alone(spec: Dict[str, Any],
                                                                            profile: KernelProfile,
                                                                            built: Path) -> None:
    """A v3-only start of the 6.1.0-50 profile leaves open's optional nfs4_file_open out; once
    nfsv4 is there, late_points finds it alone, and the second instance the loader opens for
    it autoloads only its programs, numbers it after the running points (its own start slot,
    within the object's), and turns on no point but it, with the first cfg's settings."""
    v3 = select(spec, without_module(profile, "nfsv4"), list(OPS))
    full = KernelFacts.from_profile(profile)
    added = [c._replace(points=late_points(c, full), skipped=[]) for c in v3.chosen if late_points(c, full)]
    assert [(c.op, [p["entry"] for p in c.points]) for c in added] == [("open", ["nfs4_file_open"])]
    assert not late_points(added[0]._replace(points=added[0].candidate["attach"]), full)
    backend = CoreBackend(spec, built, Libbpf())
    probe = backend.generate(v3.chosen, Tool(events=True, dist=True), None, formats_of(profile), True, True, ())
    late = backend.late_plan(probe, added, None, ())
    assert late is not None and backend._plan is not None
    points, plan, cfg = late
    assert [(p.id, p.op, p.entry) for p in points] == [(len(probe.points), "open", "nfs4_file_open")]
    core = next(c.id for c in core_table(spec).points
                if (c.op, c.candidate, c.entry) == ("open", added[0].index, "nfs4_file_open"))
    on = cfg_points_on(spec, cfg)
    assert list(on) == [core]
    assert (on[core]["id"], on[core]["slot"], on[core]["op"]) == (len(probe.points),) * 2 + (probe.ops.index("open"),)
    assert on[core]["slot"] < slots_needed(spec)
    head = struct.calcsize("=" + "".join({"u64": "Q", "u32": "I"}[ctype] for _name, ctype in CFG_FIELDS))
    assert cfg[:head] == backend._plan[2][:head]
    assert core not in cfg_points_on(spec, backend._plan[2])  # the first instance never times it
    prepared = backend.prepare_late(probe, added, None, ())
    assert prepared is not None
    extended, obj, programs = prepared
    try:
        lib = obj.lib.lib
        assert {name for name, prog in obj.programs().items() if lib.bpf_program__autoload(prog)} == \
            set(programs) == {f"p{core}_kprobe", f"p{core}_kretprobe"}
        assert extended.points[:-1] == probe.points and extended.points[-1] == points[0]
        assert set(extended.programs) == set(probe.programs) | set(programs) and extended.ops == probe.ops
    finally:
        obj.close()
    # a point whose tracepoint program already runs is not loaded twice: the caller says to restart
    getattr_ = next(c for c in v3.chosen if c.op == "getattr")
    assert backend.late_plan(probe, [getattr_], None, ()) is None


@pytest.mark.parametrize("state, live", [("live\n", True), ("coming\n", False), ("going\n", False), (None, True)])
def test_a_module_counts_as_loaded_once_live(tmp_path: Path, state: Optional[str], live: bool) -> None:
    """/sys/module/NAME appears while the module initialises, before the kernel lets a
    trampoline attach to it: only `live` counts (a built-in module has no initstate)."""
    (tmp_path / "nfsv4").mkdir()
    if state is not None:
        (tmp_path / "nfsv4" / "initstate").write_text(state)
    assert module_live("nfsv4", tmp_path) is live
    assert not module_live("cifs", tmp_path)


def loaded_on_host(backend: CoreBackend, probe: Any) -> None:
    """backend.load(probe) on this host's kernel (bpf() loads; kprobes cannot attach here)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: loads the probe into the host's kernel")
    backend.load(probe)


def session_state(backend: CoreBackend, probe: Any, generate: Any = None) -> Any:
    """The fields of runtime.Session that its methods under test read, around a real loader."""
    state = types.SimpleNamespace(backend=backend, probe=probe, release=os.uname().release, ops=list(probe.ops),
                                  reading=RealtimeReads(), fentry=True, said=[], _generate=generate)
    state.op_name = lambda op_id: probe.ops[op_id]
    state.warn = state.said.append
    return state


def test_missed_causes_reads_counts_only(spec: Dict[str, Any], profile: KernelProfile, built: Path) -> None:
    """A tick's or scrape's missed_causes() re-reads the kernel's counts of the attachments
    listed once after attaching; it neither lists them nor asks for program fds again."""
    backend = CoreBackend(spec, built, Libbpf())
    probe = backend.generate(select(spec, KernelFacts.from_profile(profile), ["read", "write"]).chosen,
                             Tool(dist=True), None, formats_of(profile), True, True, ())
    loaded_on_host(backend, probe)
    try:
        state = session_state(backend, probe)
        Session._read_attachments(state)
        assert sorted((a.kind, a.target, fd > 0, ops) for a, fd, ops in state._attachments) == \
            [("kprobe", "nfs_file_read", True, ("read",)), ("kprobe", "nfs_file_write", True, ("write",)),
             ("kretprobe", "nfs_file_read", True, ("read",)), ("kretprobe", "nfs_file_write", True, ("write",))]
        listed = []
        for name in ("attachments", "program_fds"):
            real = getattr(backend, name)
            setattr(backend, name, lambda *args, _real=real, _name=name: listed.append(_name) or _real(*args))
        for _ in range(3):
            assert Session.missed_causes(state) == {}
        assert listed == []
    finally:
        backend.close()


def test_a_refused_trampoline_closes_the_first_programs_before_kprobes_load(
        spec: Dict[str, Any], profile: KernelProfile, built: Path) -> None:
    """Session._attach's fallback when a trampoline will not attach: the first object (its
    programs and any link attached before the refusal) is closed before the kprobe probe loads,
    so nothing of it stays in the kernel beside the second. The host gets the fentry object as
    far as attaching (nfs' BTF is not here to load it), and its kprobes load but cannot attach."""
    backend = CoreBackend(spec, built, Libbpf())
    chosen = select(spec, KernelFacts.from_profile(profile), ["read"]).chosen
    fentry = [p["entry"] for c in chosen for p in c.points]
    probe = backend.generate(chosen, Tool(dist=True), None, formats_of(profile), True, True, fentry)
    assert set(probe.programs) == {"p0_fentry", "p0_fexit"}
    first = backend.obj = backend.prepare(probe)
    state = session_state(backend, probe, lambda storage, use_fentry: backend.generate(
        chosen, Tool(dist=True), None, formats_of(profile), True, storage, fentry if use_fentry else ()))
    try:
        if os.geteuid() != 0:
            pytest.skip("needs root: loads the kprobe probe into the host's kernel")
        with pytest.raises((UserError, Rejected)):
            Session._attach(state)
        assert first.obj is None and not first.links
        assert backend.obj is not first and set(state.probe.programs) == {"p0_kprobe", "p0_kretprobe"}
        assert state.said[0].startswith("warning: fentry/fexit not attached (") and state.fentry is False
    finally:
        first.close()
        backend.close()

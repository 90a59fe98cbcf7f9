"""The CO-RE emitter: one object per spec, every candidate point's programs, settings as placeholders.

Why whole-spec: the object is compiled once, where the wheel is built, for kernels nobody has
seen yet; so it holds every candidate attach point of every operation (its context points
too) as programs of its own, and the loader autoloads those `select` chooses on the running
kernel. probes.model's settings, which bcc's emitter writes as `#define`s, the loader writes
into the chosen programs' instructions before loading (settings_inlined): each use of one is
an immediate that names its place in `struct cfg`, whose C text and packer come from the same
tables.
"""
from __future__ import annotations

import struct

from probes.generate import Program, c_text, constants, function_programs, tracepoint_programs, types
from probes.model import CFG_FIELDS, off_point, point_fields, spec_nkeys

TYPE_CHECKING = False  # typing's constant without typing (discover/records.py)
if TYPE_CHECKING:
    from typing import Any, Dict, List, Mapping, NamedTuple, Tuple
else:
    from discover.records import NamedTuple

#: the alignment of `struct cfg`: that of its u64 members (x86-64 and BPF alike)
CFG_ALIGN = 8
#: the upper half of a setting's placeholder (bpf/core.h's SETTING): a value no other 64-bit
#: immediate of the probe has (it is no address, size or flag of the probe's)
CFG_MARK = 0x7FC9E4D1
#: the same for a trampoline context slot's placeholder (bpf/core.h's CTX_SLOT): the setting
#: numbers the slot, whose offset the loader writes into the load that follows
CTX_MARK = 0x7FC9E4D2
#: BPF_LD | BPF_IMM | BPF_DW: the first of a 64-bit immediate load's two instructions
_LD_IMM64 = 0x18
#: BPF_LDX | BPF_MEM | BPF_DW: the context slot's load
_LDX_DW = 0x79
#: BPF_JMP | BPF_JA with offset 0: a jump to the next instruction, which the verifier removes
_NOP = bytes([0x05]) + bytes(7)
#: the last slot of a trampoline's context (12 arguments, then the return value)
_CTX_SLOTS = 13
_CFG_MARK_BYTES, _CTX_MARK_BYTES = CFG_MARK.to_bytes(4, "little"), CTX_MARK.to_bytes(4, "little")


class CorePoint(NamedTuple):
    """One candidate attach point of the spec, as the object numbers it."""

    id: int
    op: str
    candidate: int       # index in the op's candidate (or context) list
    kind: str            # fentry | kprobe | tracepoint (the candidate's)
    match: str           # task | keys
    entry: str
    exit: str
    keys: Tuple[str, ...]
    args: Dict[str, str]
    context: bool = False  # one of the op's context candidates (select.Chosen.context)


class CoreTable(NamedTuple):
    """The object's numbering of a spec's points, which `cfg` follows (built and loaded alike)."""

    points: List[CorePoint]
    nkeys: int


class CoreSource(NamedTuple):
    c_text: str
    table: CoreTable
    programs: List[Program]


def spec_points(spec: Dict[str, Any]) -> List[CorePoint]:
    """Every attach point of every candidate (and context candidate) of every op, in the spec's order."""
    points: List[CorePoint] = []
    for op, entry in spec["ops"].items():
        for context, table in ((False, "candidates"), (True, "context")):
            for index, cand in enumerate(entry.get(table, [])):
                for attach in cand["attach"]:
                    points.append(CorePoint(len(points), op, index, cand["kind"], cand["match"], attach["entry"],
                                            attach["exit"], tuple(cand.get("keys", ())),
                                            dict(attach.get("args") or {}), context))
    return points


def core_table(spec: Dict[str, Any]) -> CoreTable:
    return CoreTable(spec_points(spec), spec_nkeys(spec))


def slots_needed(spec: Dict[str, Any]) -> int:
    """Start slots per thread: the most points `select` can choose at once (one candidate per
    op, and the op's context point)."""
    def most(cands: List[Dict[str, Any]]) -> int:
        return max([len(c["attach"]) for c in cands] or [0])
    return max(sum(most(entry["candidates"]) + most(entry.get("context", [])) for entry in spec["ops"].values()), 1)


def cfg_c_struct(npoints: int, nkeys: int) -> str:
    lines = ["struct point_cfg {"] + [f"    u32 {name};" for name in point_fields(nkeys)] + ["};", "struct cfg {"]
    lines += [f"    {ctype} {name};" for name, ctype in CFG_FIELDS]
    lines += [f"    struct point_cfg points[{npoints}];", "};",
              "/* no instance: each use of a setting names its place here (SETTING) */"]
    return "\n".join(lines)


def cfg_format(npoints: int, nkeys: int) -> struct.Struct:
    """The packer of `struct cfg`, from the same tables as cfg_c_struct."""
    codes = {"u64": "Q", "u32": "I"}
    packed = "=" + "".join(codes[t] for _, t in CFG_FIELDS) + "I" * len(point_fields(nkeys)) * npoints
    # the C struct ends padded to its u64 members' alignment
    return struct.Struct(packed + "x" * (-struct.calcsize(packed) % CFG_ALIGN))


def function_program_names(point: CorePoint, kind: str) -> Tuple[str, str]:
    """The object's names of a function point's programs attached as `kind` (kprobe | fentry)."""
    return (f"p{point.id}_fentry", f"p{point.id}_fexit") if kind == "fentry" else \
        (f"p{point.id}_kprobe", f"p{point.id}_kretprobe")


def generate_core(spec: Dict[str, Any]) -> CoreSource:
    """The C text of the spec's CO-RE object. A fentry candidate's point has fentry/fexit
    programs and the kprobe pair it falls back to where a trampoline cannot attach."""
    table = core_table(spec)
    programs: List[Program] = []
    for point in table.points:
        if point.kind == "tracepoint":
            continue
        for kind in (("fentry", "kprobe") if point.kind == "fentry" else ("kprobe",)):
            programs += function_programs(point.id, point, kind, function_program_names(point, kind))
    programs += tracepoint_programs([(p.id, p) for p in table.points if p.kind == "tracepoint"])
    defines = constants(slots_needed(spec), table.nkeys) + [("CFG_MARK", CFG_MARK), ("CTX_MARK", CTX_MARK)]
    type_lines = types(table.nkeys) + [cfg_c_struct(len(table.points), table.nkeys)]
    return CoreSource(c_text("core", defines, type_lines, programs), table, programs)


def cfg_bytes(table: CoreTable, settings: Mapping[str, int], chosen: Mapping[int, Mapping[str, int]]) -> bytes:
    """`struct cfg` as the loader writes it: the probe's settings and, for each point (by the
    object's number) in `chosen`, its own (probes.model.plan_point); every other point is off
    (its programs are not loaded, or skip it where they share a tracepoint)."""
    fields = point_fields(table.nkeys)
    values: List[int] = [settings[name] for name, _ in CFG_FIELDS]
    off = off_point(table.nkeys)
    for point in table.points:
        own = chosen.get(point.id, off)
        values += [own[name] for name in fields]
    return cfg_format(len(table.points), table.nkeys).pack(*values)


def settings_inlined(insns: bytes, cfg: bytes) -> bytes:
    """A program's instructions with each setting's placeholder (a 64-bit immediate load whose
    upper half is CFG_MARK, its lower the setting's offset in `cfg` << 8 | its size) loading
    the setting's value from `cfg` (cfg_bytes) instead; a context slot's (CTX_MARK) turned into
    two no-ops, and the value n written into the load after it as its offset 8n (a slot past
    the context's, NO_PARAM, only stands where the verifier drops it: offset 0). ValueError for
    a placeholder outside `cfg` (an object built from another spec's tables) or a slot's without
    its load."""
    out = bytearray(insns)
    for mark in (_CFG_MARK_BYTES, _CTX_MARK_BYTES):
        at = insns.find(mark)
        while at >= 0:
            start = at - 12  # the first instruction's opcode; its immediate's upper half is the second's imm
            if start >= 0 and start % 8 == 0 and insns[start] == _LD_IMM64 and insns[start + 1] >> 4 == 0:
                value = _setting(insns, start, cfg)
                if mark == _CFG_MARK_BYTES:
                    out[start + 4:start + 8] = (value & 0xFFFFFFFF).to_bytes(4, "little")
                    out[start + 12:start + 16] = (value >> 32).to_bytes(4, "little")
                else:
                    load = start + 16
                    if insns[load:load + 1] != bytes([_LDX_DW]) or insns[load + 2:load + 4] != bytes(2):
                        raise ValueError(f"a context slot's placeholder at instruction {start // 8} without its load")
                    out[load + 2:load + 4] = (8 * value if value < _CTX_SLOTS else 0).to_bytes(2, "little")
                    out[start:start + 16] = _NOP * 2
            at = insns.find(mark, at + 1)
    return bytes(out)


def _setting(insns: bytes, start: int, cfg: bytes) -> int:
    """The value in `cfg` of the placeholder at byte `start`."""
    place = int.from_bytes(insns[start + 4:start + 8], "little")
    offset, size = place >> 8, place & 0xFF
    if size not in (4, 8) or offset % size or offset + size > len(cfg):
        raise ValueError(f"a setting of {size} bytes at {offset} of a {len(cfg)}-byte struct cfg")
    return int.from_bytes(cfg[offset:offset + size], "little")

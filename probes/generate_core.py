"""Generate the CO-RE probe's C from a whole probe spec, and the settings that fill its `cfg`.

Why whole-spec: the object is compiled once, where the wheel is built, for kernels nobody has
seen yet; so it holds every candidate attach point of every operation as programs of its own,
and the loader autoloads those `select` chooses on the running kernel. What bcc's form
(probes.generate) bakes in as #defines, the loader writes into the read-only `cfg` before
loading: `CFG_GLOBALS` and the per-point table below are the one definition of that struct,
giving the C text and the Python packer, as EVENT_FIELDS does for events.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from probes.generate import (COMM_LEN, INFLIGHT_SLOTS, MAX_LAT_NS, NAME_LEN, PTR_KINDS, RINGBUF_PAGES, Tool,
                             event_c_struct)

TEMPLATE = Path(__file__).resolve().parent.parent / "bpf" / "probe.core.bpf.c"
#: the template's line the generated constants and structs replace
GENERATED = "/* GENERATED */"
#: pointer reads from a parameter to the value a role names (`iocb->ki_filp` is one)
MAX_DEREFS = 3
#: cfg.points[].arg[]: the file or dentry pointer, and the file offset
ARG_PTR, ARG_OFFSET = 0, 1
#: a role no parameter gives
NO_PARAM = 0xFFFFFFFF
#: ops an object can count in `untimed` (the spec vocabulary has fewer)
NOPS_MAX = 32
#: the kernel's page size the ring buffer's bytes are counted in
PAGE_SIZE = 4096
#: tracepoint fields a point reads, by role (cfg.points[].tp[]); then NKEYS entry keys and
#: NKEYS exit keys
TP_ROLES = ("fileid", "offset", "bytes", "dev", "name", "exit_bytes", "exit_name")
#: settings of the whole probe: (name, C type); u64 first so the struct has no padding
CFG_GLOBALS: Tuple[Tuple[str, str], ...] = (
    ("min_lat_ns", "u64"), ("dist_unit_ns", "u64"), ("target_tgid", "u32"), ("mount_dev", "u32"),
    ("want_events", "u32"), ("want_dist", "u32"), ("want_top", "u32"), ("want_inflight", "u32"),
    ("want_lat_sum", "u32"), ("want_dev", "u32"), ("want_cgroup_key", "u32"), ("cgroup_filter", "u32"),
    ("dev_at_entry", "u32"), ("task_storage", "u32"),
)
#: the alignment of `struct cfg`: that of its u64 members (x86-64 and BPF alike)
CFG_ALIGN = 8
#: settings of one attach point, before its arg[] and tp[] arrays
POINT_SCALARS = ("on", "id", "op", "slot", "keyed", "ptr_kind", "ret_bytes", "watch")


class CorePoint(NamedTuple):
    """One candidate attach point of the spec, as the object numbers it."""

    id: int
    op: str
    candidate: int       # index in the op's candidate list
    kind: str            # fentry | kprobe | tracepoint (the candidate's)
    match: str           # task | keys
    entry: str
    exit: str
    keys: Tuple[str, ...]
    args: Dict[str, str]


class CoreTable(NamedTuple):
    """The object's numbering of a spec's points, which `cfg` follows (built and loaded alike)."""

    points: List[CorePoint]
    nkeys: int


class CoreSource(NamedTuple):
    c_text: str
    table: CoreTable
    #: program name -> (section, the point ids it starts or ends)
    programs: Dict[str, Tuple[str, Tuple[int, ...]]]


def spec_points(spec: Dict[str, Any]) -> List[CorePoint]:
    """Every attach point of every candidate of every op, in the spec's order."""
    points: List[CorePoint] = []
    for op, entry in spec["ops"].items():
        for index, cand in enumerate(entry["candidates"]):
            for attach in cand["attach"]:
                points.append(CorePoint(len(points), op, index, cand["kind"], cand["match"], attach["entry"],
                                        attach["exit"], tuple(cand.get("keys", ())),
                                        dict(attach.get("args") or {})))
    return points


def core_table(spec: Dict[str, Any]) -> CoreTable:
    points = spec_points(spec)
    return CoreTable(points, max([len(p.keys) for p in points if p.match == "keys"] or [1]))


def slots_needed(spec: Dict[str, Any]) -> int:
    """Start slots per thread: the most points `select` can choose at once (one candidate per op)."""
    return max(sum(max(len(c["attach"]) for c in entry["candidates"]) for entry in spec["ops"].values()), 1)


def tp_slots(nkeys: int) -> List[str]:
    """The names of cfg.points[].tp[] in index order."""
    return list(TP_ROLES) + [f"key{i}" for i in range(nkeys)] + [f"exit_key{i}" for i in range(nkeys)]


def cfg_c_struct(npoints: int, nkeys: int) -> str:
    lines = ["struct arg_src {", "    u32 param;", "    u32 nderefs;", f"    u32 off[{MAX_DEREFS}];", "};",
             "struct tp_field {", "    u16 off;", "    u16 size;", "    u32 is_signed;", "};",
             "struct point_cfg {"]
    lines += [f"    u32 {name};" for name in POINT_SCALARS]
    lines += ["    struct arg_src arg[2];", f"    struct tp_field tp[{len(tp_slots(nkeys))}];", "};", "struct cfg {"]
    lines += [f"    {ctype} {name};" for name, ctype in CFG_GLOBALS]
    lines += [f"    struct point_cfg points[{npoints}];", "};"]
    return "\n".join(lines)


def _point_format(nkeys: int) -> str:
    return "I" * len(POINT_SCALARS) + ("II" + "I" * MAX_DEREFS) * 2 + "HHI" * len(tp_slots(nkeys))


def cfg_format(npoints: int, nkeys: int) -> struct.Struct:
    """The packer of `struct cfg`, from the same tables as cfg_c_struct."""
    codes = {"u64": "Q", "u32": "I"}
    packed = "=" + "".join(codes[t] for _, t in CFG_GLOBALS) + _point_format(nkeys) * npoints
    # the C struct ends padded to its u64 members' alignment (ext4's object: 3568 bytes, not 3564)
    return struct.Struct(packed + "x" * (-struct.calcsize(packed) % CFG_ALIGN))


def _section(end: str, function: str) -> str:
    return f"{end}/{function}"


def _function_programs(point: CorePoint) -> List[Tuple[str, str, str]]:
    """(name, section, C text) of a function point's programs: fentry/fexit for a fentry
    candidate, and a kprobe pair for every function point (the fallback where a trampoline
    cannot attach)."""
    p = point.id
    ret_bytes = f"cfg.points[{p}].ret_bytes ? (ret > 0 ? ret : 0) : -1"
    kprobe = [
        (f"p{p}_kprobe", _section("kprobe", point.entry),
         f"int p{p}_kprobe(struct pt_regs *ctx)\n{{\n"
         f"    function_start({p}, kprobe_arg(ctx, cfg.points[{p}].arg[ARG_PTR].param),\n"
         f"                   kprobe_arg(ctx, cfg.points[{p}].arg[ARG_OFFSET].param));\n"
         f"    return 0;\n}}\n"),
        (f"p{p}_kretprobe", _section("kretprobe", point.exit),
         f"int p{p}_kretprobe(struct pt_regs *ctx)\n{{\n"
         f"    s64 ret = kprobe_ret(ctx);\n"
         f"    task_end({p}, {ret_bytes}, 0);\n"
         f"    return 0;\n}}\n"),
    ]
    if point.kind != "fentry":
        return kprobe
    return [
        (f"p{p}_fentry", _section("fentry", point.entry),
         f"int p{p}_fentry(u64 *ctx)\n{{\n"
         f"    u64 ptr = 0, offset = 0;\n"
         f"    bpf_get_func_arg(ctx, cfg.points[{p}].arg[ARG_PTR].param, &ptr);\n"
         f"    bpf_get_func_arg(ctx, cfg.points[{p}].arg[ARG_OFFSET].param, &offset);\n"
         f"    function_start({p}, ptr, offset);\n"
         f"    return 0;\n}}\n"),
        (f"p{p}_fexit", _section("fexit", point.exit),
         f"int p{p}_fexit(u64 *ctx)\n{{\n"
         f"    u64 raw = 0;\n"
         f"    s64 ret;\n"
         f"    bpf_get_func_ret(ctx, &raw);\n"
         f"    ret = (s64)raw;\n"
         f"    task_end({p}, {ret_bytes}, 0);\n"
         f"    return 0;\n}}\n"),
    ] + kprobe


def tracepoint_program(event: str) -> str:
    """The program name of one tracepoint's handler (every point starting or ending there)."""
    return "tp_" + event.replace(":", "__")


def generate_core(spec: Dict[str, Any], template: Path = TEMPLATE) -> CoreSource:
    """The C text of the spec's CO-RE object: every candidate point's programs after the template."""
    table = core_table(spec)
    points, nkeys = table
    defines = [("NPOINTS", len(points)), ("NSLOTS", slots_needed(spec)), ("NKEYS", nkeys),
               ("MAX_DEREFS", MAX_DEREFS), ("NAME_LEN", NAME_LEN), ("COMM_LEN", COMM_LEN),
               ("INFLIGHT_SLOTS", INFLIGHT_SLOTS), ("RINGBUF_BYTES", RINGBUF_PAGES * PAGE_SIZE),
               ("NOPS_MAX", NOPS_MAX), ("MAX_LAT_NS", MAX_LAT_NS), ("ARG_PTR", ARG_PTR), ("ARG_OFFSET", ARG_OFFSET),
               ("NO_PARAM", NO_PARAM)]
    defines += [(f"PTR_{name.upper()}", value) for name, value in PTR_KINDS.items()]
    defines += [(f"TP_{name.upper()}", i) for i, name in enumerate(tp_slots(nkeys))]
    head = ["/* generated by probes/generate_core.py from the probe spec: do not edit */"]
    head += [f"#define {name} {value}{'ULL' if name.endswith('_NS') or value > 0x7FFFFFFF else ''}"
             for name, value in defines]
    head += [event_c_struct(), cfg_c_struct(len(points), nkeys)]
    programs: Dict[str, Tuple[str, Tuple[int, ...]]] = {}
    texts: List[str] = []
    tp_bodies: Dict[str, List[str]] = {}
    for point in points:
        if point.kind in ("fentry", "kprobe"):
            for name, section, text in _function_programs(point):
                programs[name] = (section, (point.id,))
                texts.append(f'SEC("{section}")\n{text}')
            continue
        guard = f"    if (cfg.points[{point.id}].on)\n        "
        tp_bodies.setdefault(point.entry, []).append(f"{guard}tp_start(ctx, {point.id});")
        tp_bodies.setdefault(point.exit, []).append(f"{guard}tp_end(ctx, {point.id});")
    for event, body in tp_bodies.items():
        system, _, name = event.partition(":")
        program = tracepoint_program(event)
        ids = tuple(p.id for p in points if p.kind == "tracepoint" and event in (p.entry, p.exit))
        programs[program] = (f"tp/{system}/{name}", ids)
        texts.append(f'SEC("tp/{system}/{name}")\nint {program}(void *ctx)\n{{\n' + "\n".join(body) +
                     "\n    return 0;\n}\n")
    c_text = template.read_text().replace(GENERATED, "\n".join(head), 1) + "\n" + "\n".join(texts)
    return CoreSource(c_text, table, programs)


class PointSettings(NamedTuple):
    """What the loader writes into cfg for one chosen point (cfg_bytes)."""

    id: int              # the point's number in the Probe (what map keys and slots carry)
    op: int
    slot: int
    ptr_kind: int
    ret_bytes: bool
    args: Tuple[Optional[Tuple[int, Tuple[int, ...]]], Optional[Tuple[int, Tuple[int, ...]]]]
    tp: Dict[str, Tuple[int, int, bool]]   # role -> (offset, size, signed)
    watch: bool = False  # tracked in flight only (generate.Point.watch)


def cfg_bytes(table: CoreTable, tool: Tool, task_storage: bool, chosen: Dict[int, PointSettings]) -> bytes:
    """`struct cfg` as the loader writes it: the tool's settings and, for each point id in
    `chosen`, its op, start slot, pointer kind and where its values are read; every other
    point stays off (its programs are not loaded, or prune it where they share a tracepoint)."""
    values: List[int] = [tool.min_lat_ns, tool.dist_unit_ns, tool.tgid, tool.mount_dev, int(tool.events),
                         int(tool.dist), int(tool.top), int(tool.inflight), int(tool.lat_sum), int(tool.per_mount),
                         int(tool.cgroup_limit > 0), int(tool.cgroup_filter), int(tool.dev_at_entry), int(task_storage)]
    roles = tp_slots(table.nkeys)
    for point in table.points:
        settings = chosen.get(point.id)
        if settings is None:
            values += [0] * len(POINT_SCALARS) + ([NO_PARAM, 0] + [0] * MAX_DEREFS) * 2 + [0, 0, 0] * len(roles)
            continue
        values += [1, settings.id, settings.op, settings.slot, int(point.match == "keys"), settings.ptr_kind,
                   int(settings.ret_bytes), int(settings.watch)]
        for arg in settings.args:
            if arg is None:
                values += [NO_PARAM, 0] + [0] * MAX_DEREFS
            else:
                param, derefs = arg
                if len(derefs) > MAX_DEREFS:
                    raise ValueError(f"{point.entry}: {len(derefs)} pointer reads, the object follows {MAX_DEREFS}")
                values += [param, len(derefs)] + list(derefs) + [0] * (MAX_DEREFS - len(derefs))
        for role in roles:
            offset, size, signed = settings.tp.get(role, (0, 0, False))
            values += [offset, size, int(signed)]
    return cfg_format(len(table.points), table.nkeys).pack(*values)

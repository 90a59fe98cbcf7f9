"""The probe's C text, and bcc's emitter: bpf/probe.bpf.c with the settings as constants.

Why generated: the kernel side is one C source (bpf/probe.bpf.c) for both loaders; what it
does not decide itself comes from probes.model's settings, and its programs are one per
attach point end. This module writes what both loaders share (the constants, the types, the
programs, each a call of one of the source's bodies) and, for bcc, the settings as
`#define`s for the points chosen on this kernel: bcc compiles the text at start-up.
probes.generate_core writes the same for the CO-RE object, every setting a placeholder the
loader fills from `struct cfg`.
"""
from __future__ import annotations

import re
from pathlib import Path

from discover.spec import SERVER_OPS
from probes.layout import KernelLayout
from probes.model import (COMM_LEN, COUNTERS, INFLIGHT_SLOTS, MAX_LAT_NS, NAME_LEN, NO_PARAM, PROC_LEN, PTR_KINDS,
                          Point, Probe, Tool, check_tool, event_c_struct, map_flags, map_sizes, off_point,
                          plan_point, points_of, probe_settings, program_ops)
from probes.select import Chosen

TYPE_CHECKING = False  # typing's constant without typing (discover/records.py)
if TYPE_CHECKING:
    from typing import Collection, Dict, List, NamedTuple, Optional, Protocol, Sequence, Tuple
    from probes.model import Formats
else:
    from discover.records import NamedTuple
    Protocol = object  # the protocols below are type checkers' alone

BPF_DIR = Path(__file__).resolve().parent.parent / "bpf"
#: the probe's logic, written once
SOURCE = BPF_DIR / "probe.bpf.c"
#: each loader's layer: how it spells settings, maps, field reads and programs
LAYERS = {"bcc": BPF_DIR / "bcc.h", "core": BPF_DIR / "core.h"}
#: the struct member offsets bcc's layer reads at (probes.layout's names; -1 where unknown)
OFFSETS = ("OFF_FILE_PATH_DENTRY", "OFF_DENTRY_NAME", "OFF_FILE_INODE", "OFF_INODE_SB", "OFF_DENTRY_SB",
           "OFF_SB_DEV", "OFF_INODE_INO")


#: bcc's spelling of the source's map operations: MAP_X(map, ...) is map.method(...) (bpf/bcc.h)
BCC_METHODS = {"MAP_LOOKUP": "lookup", "MAP_UPDATE": "update", "MAP_INSERT": "insert", "MAP_DELETE": "delete",
               "MAP_TASK_STORAGE_GET": "task_storage_get", "MAP_UNDER_CGROUP": "check_current_task",
               "MAP_RINGBUF_RESERVE": "ringbuf_reserve", "MAP_RINGBUF_SUBMIT": "ringbuf_submit"}
_MAP_CALL = re.compile(r"\b(MAP_[A-Z_]+)\((\w+), ")


class AttachPoint(Protocol):
    """What a program's text needs of a point (probes.model.Point, or one of a spec's candidates)."""

    op: str
    kind: str
    entry: str
    exit: str
    args: Dict[str, str]
    context: bool


class Program(NamedTuple):
    name: str
    kind: str        # kprobe | kretprobe | fentry | fexit | tracepoint
    target: str      # the function, or SYSTEM:EVENT
    text: str
    points: Tuple[int, ...]  # the settings' numbers of the points it starts or ends

    @property
    def section(self) -> str:
        """libbpf's section name, which says how to attach it."""
        if self.kind == "tracepoint":
            system, _, event = self.target.partition(":")
            return f"tp/{system}/{event}"
        return f"{self.kind}/{self.target}"


def constants(nslots: int, nkeys: int) -> List[Tuple[str, int]]:
    """The constants both loaders' text starts with."""
    out = [("NSLOTS", max(nslots, 1)), ("NKEYS", nkeys), ("NAME_LEN", NAME_LEN), ("COMM_LEN", COMM_LEN),
           ("PROC_LEN", PROC_LEN), ("INFLIGHT_SLOTS", INFLIGHT_SLOTS), ("MAX_LAT_NS", MAX_LAT_NS),
           ("NO_PARAM", NO_PARAM)]
    out += [(f"COUNTER_{name.upper()}", index) for index, name in enumerate(COUNTERS)]
    return out + [(f"PTR_{name.upper()}", value) for name, value in PTR_KINDS.items()]


def types(nkeys: int) -> List[str]:
    """The types and macros that follow the layer: the event record and TP_KEYS (a keyed
    point's key fields at its start or end)."""
    keys = " ".join(f"key_.k[{i}] = TPF(p, kind##{i});" for i in range(nkeys))
    return [event_c_struct(), f"#define TP_KEYS(p, key_, kind) do {{ {keys} }} while (0)"]


def point_selectors(ids: Sequence[int], nkeys: int) -> List[str]:
    """bcc's P(p, name), one macro per setting: P_<id>_<name> of the point numbered p. The
    probe's functions take a point's number and read its settings where they use them; each
    caller passes a constant, which the compiler folds the choice with."""
    out = []
    for name, off in off_point(nkeys).items():
        choice = "".join(f"(p) == {i} ? P_{i}_{name} : " for i in ids)
        out.append(f"#define P_{name}(p) ({choice}{off})")
    return out


def define(name: str, value: int) -> str:
    suffix = "ULL" if value > 0x7FFFFFFF or name.endswith("_ns") or name.endswith("_NS") else ""
    return f"#define {name} {value}{suffix}"


def c_text(loader: str, defines: Sequence[Tuple[str, int]], type_lines: Sequence[str],
           programs: Sequence[Program]) -> str:
    head = [f"/* generated by probes/generate.py for {loader} from the probe spec: do not edit */"]
    return "\n".join(head + [define(name, value) for name, value in defines]
                     + [LAYERS[loader].read_text()] + list(type_lines) + [SOURCE.read_text()]
                     + [program.text for program in programs])


def bcc_spelling(text: str, task_storage: bool) -> str:
    """The text with each map operation written as bcc's method call, which bcc's rewriter
    turns into the helper call it is (it refuses one that a macro expands to). Without task
    storage the map does not exist: its calls, compiled out, are NO_TASK_STORAGE."""
    def method(match: "re.Match[str]") -> str:
        operation, name = match.groups()
        if operation not in BCC_METHODS:  # a declaration: bcc.h's macros make it
            return match.group(0)
        if operation == "MAP_TASK_STORAGE_GET" and not task_storage:
            return "NO_TASK_STORAGE("
        return f"{name}.{BCC_METHODS[operation]}("
    return _MAP_CALL.sub(method, text)


def _serves(point: AttachPoint) -> bool:
    """A point whose body is the server's request when the tool serves requests (CFG(want_server))."""
    return point.op == "rpc" and "client" in point.args and not point.context


def _function_bodies(p: int, point: AttachPoint, get: str, ret: str) -> Tuple[str, str]:
    """(entry, exit) bodies of a function point numbered `p`; `get`: how its programs read a
    parameter, `ret`: the return value."""
    if point.context:
        return f"CONTEXT_ENTRY({p}, {get});", f"CONTEXT_EXIT({p});"
    timed = (f"TIMED_ENTRY({p}, {get});", f"s64 ret = {ret};\n    TIMED_EXIT({p}, ret);")
    if not _serves(point):
        return timed
    return (f"if (CFG(want_server))\n        REQUEST_ENTRY({p}, {get});\n    else\n        {timed[0]}",
            f"s64 ret = {ret};\n    if (CFG(want_server))\n        REQUEST_EXIT({p});\n    else\n"
            f"        TIMED_EXIT({p}, ret);")


#: per way of attaching a function point: (entry kind, exit kind, context type, parameter getter, return value)
_FUNCTION_KINDS = {
    "kprobe": ("kprobe", "kretprobe", "struct pt_regs *ctx", "kprobe_arg", "kprobe_ret(ctx)"),
    "fentry": ("fentry", "fexit", "unsigned long long *ctx", "fentry_arg", "fexit_ret(ctx, {p})"),
}


def function_programs(p: int, point: AttachPoint, kind: str, names: Tuple[str, str]) -> List[Program]:
    """The entry and exit programs of function point `p` attached as `kind` (kprobe | fentry)."""
    entry_kind, exit_kind, ctx, get, ret = _FUNCTION_KINDS[kind]
    bodies = _function_bodies(p, point, get, ret.format(p=p))
    out = []
    for name, prog_kind, target, body in zip(names, (entry_kind, exit_kind), (point.entry, point.exit), bodies):
        section = Program(name, prog_kind, target, "", (p,)).section
        out.append(Program(name, prog_kind, target,
                           f'PROGRAM({name}, "{section}", {ctx})\n{{\n    {body}\n    return 0;\n}}\n', (p,)))
    return out


def tracepoint_program_name(event: str) -> str:
    """The program of one tracepoint (every point starting or ending there)."""
    return "tp_" + event.replace(":", "__")


def tracepoint_programs(points: Sequence[Tuple[int, AttachPoint]]) -> List[Program]:
    """One program per tracepoint of these (number, point) pairs, running each point's start or
    end there while the point is on."""
    bodies: Dict[str, List[Tuple[int, str]]] = {}
    for p, point in points:
        if point.op in SERVER_OPS:  # one event: each operation's end, inside a server's request
            bodies.setdefault(point.exit, []).append((p, f"if (P({p}, on) && CFG(want_server))\n        OPERATION({p});"))
            continue
        bodies.setdefault(point.entry, []).append((p, f"if (P({p}, on))\n        TP_ENTRY({p});"))
        bodies.setdefault(point.exit, []).append((p, f"if (P({p}, on))\n        TP_EXIT({p});"))
    out = []
    for event, parts in bodies.items():
        name = tracepoint_program_name(event)
        section = Program(name, "tracepoint", event, "", ()).section
        text = (f'PROGRAM({name}, "{section}", void *ctx)\n{{\n    ' + "\n    ".join(body for _, body in parts)
                + "\n    return 0;\n}\n")
        out.append(Program(name, "tracepoint", event, text, tuple(sorted({p for p, _ in parts}))))
    return out


def fentry_program(point: Point, end: str, layout: KernelLayout) -> str:
    """bcc's name for a fentry (entry) or fexit (exit) program: it attaches the program to the
    function this name gives, in the BTF of the module it names."""
    function = point.entry if end == "entry" else point.exit
    return f"{'kfunc' if end == 'entry' else 'kretfunc'}__{layout.btf_module_of(function)}__{function}"


def generate(chosen: Sequence[Chosen], tool: Tool, layout: Optional[KernelLayout], formats: Formats,
             ringbuf: bool = False, task_storage: bool = False, fentry: Collection[str] = (),
             nkeys: Optional[int] = None) -> Probe:
    """bcc's C text for the chosen points, and what the front end needs to attach and decode.

    `ringbuf`: slow events go through the BPF ring buffer (the only buffer the probe has:
    kernel >= 5.8, bcc >= 0.16). `task_storage`: same-thread start times in task local storage (kernel >= 5.11,
    bcc >= 0.24), else a hash map keyed by (thread, attach point). `fentry`: functions of fentry
    candidates to attach with fentry/fexit (model.points_of); bcc attaches those itself.
    `formats`: the running kernel's tracepoint fields (the programs read them at their offsets).
    `nkeys`: the spec's key width (model.spec_nkeys: the CO-RE object's), else the chosen points'.
    """
    ops = check_tool(chosen, tool)
    points = points_of(chosen, layout, fentry)
    nkeys = nkeys or max([len(p.keys) for p in points if p.match == "keys"] or [1])
    plans = [plan_point(point, ops.index(point.op), point.id, nkeys, tool.server, layout, formats)
             for point in points]
    offsets: Dict[str, int] = {}
    if layout is not None:
        offsets.update(layout.name_offsets())
        offsets.update(layout.dev_offsets())
    keyed = any(p.match == "keys" for p in points)
    defines = constants(len(points), nkeys)
    defines += [(f"CFG_{name}", value) for name, value in probe_settings(tool, task_storage, ops).items()]
    defines += [(f"SIZE_{name}", value) for name, value in map_sizes(tool, len(ops), task_storage, keyed).items()]
    defines += [(f"FLAGS_{name}", value) for name, value in map_flags(tool).items()]
    defines += [(name, offsets.get(name, -1)) for name in OFFSETS]
    for point, plan in zip(points, plans):
        defines += [(f"P_{point.id}_{name}", value) for name, value in plan.values.items()]
    programs: List[Program] = []
    attach: List[Tuple[str, str, str]] = []
    for point in points:
        if point.kind == "tracepoint":
            continue
        if point.kind == "fentry":
            assert layout is not None, "fentry points need BTF (runtime.fentry_can_attach)"
            names = (fentry_program(point, "entry", layout), fentry_program(point, "exit", layout))
        else:
            names = (f"p{point.id}_kprobe", f"p{point.id}_kretprobe")
        made = function_programs(point.id, point, point.kind, names)
        programs += made
        if point.kind == "kprobe":
            attach += [(prog.kind, prog.target, prog.name) for prog in made]
    tracepoints = tracepoint_programs([(p.id, p) for p in points if p.kind == "tracepoint"])
    programs += tracepoints
    attach += [("tracepoint", prog.target, prog.name) for prog in tracepoints]
    type_lines = types(nkeys) + point_selectors([point.id for point in points], nkeys)
    text = bcc_spelling(c_text("bcc", defines, type_lines, programs), task_storage)
    by_ops = {prog.name: tuple(sorted({op for p in prog.points for op in program_ops(points[p], tool.server)}))
              for prog in programs}
    mountless = sorted({point.op for point, plan in zip(points, plans) if plan.mountless})
    return Probe(text, ops, [c.letter for c in chosen if not c.context], points, attach, bool(layout and
                 layout.name_offsets()), ringbuf and tool.events, task_storage, mountless, by_ops,
                 tuple(c.op for c in chosen if c.watch))


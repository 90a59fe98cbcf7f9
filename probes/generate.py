"""Generate the probe's eBPF C and its event decoder from a probe-spec selection.

Why generated: the operation ids, letters and the event layout must agree between the
kernel side and Python. Both come from here, once: `EVENT_FIELDS` gives the C
`struct event` and the Python decoder; the operation table gives `#define OP_*` and the
letters. The C template (bpf/probe.bpf.c) holds the shared kernel logic; this module
adds the constants in front and one small handler per attach point after it.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, Collection, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple

from discover.errors import UserError
from probes.layout import ArgSource, KernelLayout
from probes.select import Chosen

TEMPLATE = Path(__file__).resolve().parent.parent / "bpf" / "probe.bpf.c"

NAME_LEN = 32   # bytes of file name kept per event (bcc's nfsslower keeps 32 too)
#: bytes of an NFS server procedure's name kept (the longest, NFSv3's READDIRPLUS, is 11)
PROC_LEN = 16
#: requests in progress an NFS server probe holds at once (one per nfsd thread busy)
REQUEST_SLOTS = 4096
COMM_LEN = 16   # TASK_COMM_LEN
#: deltas above this are dropped as impossible (a wrapped or unmatched start), not printed
MAX_LAT_NS = 3600 * 10**9
#: in-flight slots, one per thread by thread id (a power of two: the index is a mask);
#: threads that share a slot while both are in flight are counted, not shown
INFLIGHT_SLOTS = 1024
#: ring buffer size for slow events (a power of two): 1 MiB holds ~9,300 events, i.e. what
#: arrives between two reads of user space (backend.RINGBUF_READ_MS) at ~90,000 events/s
RINGBUF_PAGES = 256
#: mounts a per-mount histogram has room for (dist keys are op x mount x slot)
MAX_MOUNTS = 64
#: with cgroup keys, histogram room per (op, cgroup): this many mounts of this many slots
#: on average (a cgroup uses a few NFS mounts; nanosecond latencies fill ~30 slots); a
#: key that does not fit is counted as untimed, never dropped unseen
CGROUP_MOUNTS, CGROUP_SLOTS = 4, 40

#: (field, C type, array length): the one definition of the slow-event record.
#: u64 first, then u32, then byte arrays, so the C struct has no implicit padding.
EVENT_FIELDS: Tuple[Tuple[str, str, int], ...] = (
    ("end_ns", "u64", 0), ("lat_ns", "u64", 0), ("bytes", "u64", 0), ("offset", "u64", 0),
    ("fileid", "u64", 0), ("dev", "u64", 0), ("cgroup", "u64", 0), ("pid", "u32", 0), ("op", "u32", 0),
    ("comm", "char", COMM_LEN), ("name", "char", NAME_LEN),
)
_PY_CODES = {"u64": "Q", "u32": "I", "char": "s"}
_C_SIZES = {"u64": 8, "u32": 4, "char": 1}

PTR_KINDS = {"none": 0, "file": 1, "dentry": 2}


def event_c_struct() -> str:
    lines = ["struct event {"]
    for name, ctype, length in EVENT_FIELDS:
        lines.append(f"    {ctype} {name}[{length}];" if length else f"    {ctype} {name};")
    lines.append("};")
    return "\n".join(lines)


def event_format() -> struct.Struct:
    """Python decoder of `struct event`, built from the same table as the C struct."""
    fmt = "=" + "".join(f"{length}s" if length else _PY_CODES[ctype] for _, ctype, length in EVENT_FIELDS)
    size = sum(_C_SIZES[ctype] * (length or 1) for _, ctype, length in EVENT_FIELDS)
    decoder = struct.Struct(fmt)
    assert decoder.size == size and size % 8 == 0, "EVENT_FIELDS would need padding"
    return decoder


def decode_event(raw: bytes) -> Dict[str, Any]:
    """One perf-buffer record as a dict keyed by EVENT_FIELDS names (strings decoded)."""
    values = event_format().unpack_from(raw)
    out: Dict[str, Any] = {}
    for (name, ctype, _), value in zip(EVENT_FIELDS, values):
        out[name] = value.split(b"\0", 1)[0].decode("utf-8", "replace") if ctype == "char" else value
    return out


class Tool(NamedTuple):
    """Which kernel-side outputs one command needs (each costs BPF time per event)."""

    events: bool = False
    dist: bool = False
    top: bool = False
    tgid: int = 0
    min_lat_ns: int = 0
    dist_unit_ns: int = 1000
    #: keep operations in flight readable (stalled-operation lines, nfstop's in-flight columns)
    inflight: bool = False
    #: histograms keyed by mount too (the superblock's dev): nfsdist --per-mount, nfs-exporter
    per_mount: bool = False
    #: the sum of latencies per op (one more atomic add per event): a Prometheus histogram's _sum
    lat_sum: bool = False
    #: only operations on this superblock dev (kernel encoding; 0 = every mount): --mount-point
    mount_dev: int = 0
    #: only tasks in the cgroup v2 subtree whose directory fd user space puts in cgroup_filter[0]
    cgroup_filter: bool = False
    #: histograms keyed by the task's cgroup too, for at most this many cgroups (the rest
    #: share one overflow series); 0 = not keyed. Needs per_mount (nfs-exporter --cgroup-label)
    cgroup_limit: int = 0
    #: an NFS server's requests counted per (client address, procedure), those in progress
    #: readable (nfsdtop): the `rpc` op's points read its `client` and `name`, reads and
    #: writes inside a request add their bytes to it
    server: bool = False

    @property
    def dev_at_entry(self) -> bool:
        """Each operation's mount is found when it starts (for keys or the mount filter), not
        only for printed events: two or three more pointer reads per kprobe start."""
        return self.per_mount or self.mount_dev != 0


def dist_entries(tool: Tool, nops: int) -> int:
    """Room of the histogram map: every (op, mount, slot), or with cgroup keys the average
    use per admitted cgroup and the overflow series (allocated as used, not up front)."""
    mounts = MAX_MOUNTS if tool.per_mount else 1
    if tool.cgroup_limit:
        return max(nops, 1) * CGROUP_SLOTS * CGROUP_MOUNTS * (tool.cgroup_limit + 1)
    return max(nops, 1) * 64 * mounts


def total_entries(tool: Tool, nops: int) -> int:
    """Room of the per-(op, mount[, cgroup]) byte and latency totals: every combination."""
    mounts = MAX_MOUNTS if tool.per_mount else 1
    return max(nops, 1) * mounts * (tool.cgroup_limit + 1)


class Point(NamedTuple):
    """One attach point as the generator uses it."""

    id: int
    op: str
    kind: str            # tracepoint | kprobe | fentry (fentry at entry, fexit at exit)
    match: str           # task | keys
    entry: str
    exit: str
    keys: Tuple[str, ...]
    args: Dict[str, str]  # role -> expression (spec's, or inferred from BTF)
    #: tracked in flight only (select.Chosen.watch): its end forgets the start, records nothing
    watch: bool = False
    #: names what its op's request works on, times nothing (select.Chosen.context)
    context: bool = False


class Probe(NamedTuple):
    c_text: str
    ops: List[str]               # op id -> name
    letters: List[str]           # op id -> letter
    points: List[Point]
    kprobes: List[Tuple[str, str, str]]  # (function, "entry"|"exit", handler name); fentry programs bcc attaches itself
    names: bool                  # file names available (BTF offsets found)
    ringbuf: bool                # events go through a BPF ring buffer (else the perf buffer)
    task_storage: bool           # start times in task local storage (else a hash map by thread)
    mountless: List[str]         # ops with an attach point that cannot tell its mount (no file, dentry or dev)
    programs: Dict[str, Tuple[str, ...]]  # BPF function name -> the ops it starts or ends (missed runs)
    #: ops tracked in flight only (select.Chosen.watch): no completion of theirs is recorded
    watched: Tuple[str, ...] = ()


def points_of(chosen: Sequence[Chosen], layout: Optional[KernelLayout],
              fentry: Collection[str] = ()) -> List[Point]:
    """The attach points of the chosen candidates. A fentry candidate's point is a fentry
    point when both its functions are in `fentry` (runtime.fentry_can_attach passed them),
    else a kprobe pair on the same functions. bcc names a fentry program after its
    function alone, so a function gets one entry and one exit program: a second point on
    it is a kprobe pair."""
    points: List[Point] = []
    allowed = set(fentry)
    taken: Set[Tuple[str, str]] = set()
    for choice in chosen:
        cand = choice.candidate
        kind = "kprobe" if cand["kind"] in ("kprobe", "fentry") else "tracepoint"
        for attach in choice.points:
            ends = {("entry", attach["entry"]), ("exit", attach["exit"])}
            point_kind = kind
            if cand["kind"] == "fentry" and {attach["entry"], attach["exit"]} <= allowed and not ends & taken:
                point_kind = "fentry"
                taken |= ends
            args = dict(attach.get("args") or {})
            if kind == "kprobe" and layout is not None and not args:
                args = layout.infer_args(attach["entry"])
                if choice.op in ("read", "write"):
                    args.setdefault("bytes", "retval")
            if choice.watch and cand["match"] != "keys":
                raise ValueError(f"{choice.op}: only asynchronous (keys) points can be tracked in flight only")
            points.append(Point(len(points), choice.op, point_kind, cand["match"], attach["entry"],
                                attach["exit"], tuple(cand.get("keys", ())), args, choice.watch, choice.context))
    return points


def _param_expr(src: ArgSource, fentry: bool) -> str:
    """A parameter as u64 at the entry: from the registers (kprobe) or the trampoline's
    argument array (fentry), then followed through src.derefs."""
    expr = f"(u64)ctx[{src.param}]" if fentry else f"(u64)PT_REGS_PARM{src.param + 1}(ctx)"
    for offset in src.derefs:
        expr = f"read_ptr({expr} + {offset})"
    return expr


def fentry_program(point: Point, end: str, layout: KernelLayout) -> str:
    """bcc's name for a fentry (entry) or fexit (exit) program: it attaches the program
    to the function this name gives, in the BTF of the module it names."""
    function = point.entry if end == "entry" else point.exit
    return f"{'kfunc' if end == 'entry' else 'kretfunc'}__{layout.btf_module_of(function)}__{function}"


def _function_handlers(point: Point, op_macro: str, layout: Optional[KernelLayout],
                       dev_at_entry: bool = False) -> Tuple[str, str, Tuple[str, str]]:
    """(C text, pointer kind, (entry, exit) program names) for a kprobe/kretprobe or a
    fentry/fexit pair timed on the same thread."""
    fentry = point.kind == "fentry"
    body = ["    struct start_val v;", "    __builtin_memset(&v, 0, sizeof(v));"]
    ptr_kind = "none"
    if layout is not None:
        for role, field in (("dentry", "ptr"), ("file", "ptr"), ("offset", "offset")):
            expr = point.args.get(role)
            if not expr or (field == "ptr" and ptr_kind != "none") or expr == "retval":
                continue
            src = layout.resolve(point.entry, expr)
            if src is None:
                continue
            body.append(f"    v.{field} = {_param_expr(src, fentry)};")
            if field == "ptr":
                ptr_kind = role
    if dev_at_entry and ptr_kind != "none":
        body.append(f"    v.dev = dev_of(v.ptr, PTR_{ptr_kind.upper()});")
    bytes_end = "ret > 0 ? ret : 0" if point.args.get("bytes") == "retval" else "-1"
    if fentry:
        assert layout is not None, "fentry points need BTF (runtime.fentry_can_attach)"
        names = (fentry_program(point, "entry", layout), fentry_program(point, "exit", layout))
        # the return value follows the arguments in the fexit context
        ret, ctx = f"(s64)ctx[{len(layout.params(point.exit) or ())}]", "unsigned long long *ctx"
    else:
        names = (f"p{point.id}_entry", f"p{point.id}_exit")
        ret, ctx = "PT_REGS_RC(ctx)", "struct pt_regs *ctx"
    text = (f"int {names[0]}({ctx})\n{{\n" + "\n".join(body) +
            f"\n    task_start({point.id}, {op_macro}, &v);\n    return 0;\n}}\n\n"
            f"int {names[1]}({ctx})\n{{\n"
            f"    s64 ret = {ret};\n"
            f"    task_end(ctx, {point.id}, {op_macro}, {bytes_end}, PTR_{ptr_kind.upper()}, 0);\n"
            f"    return 0;\n}}\n")
    return text, ptr_kind, names


def _member_addr(src: ArgSource, fentry: bool) -> str:
    """The address of an embedded struct member (`rqstp->rq_addr`) at the entry: the last
    offset is added, not read through."""
    expr = f"(u64)ctx[{src.param}]" if fentry else f"(u64)PT_REGS_PARM{src.param + 1}(ctx)"
    for offset in src.derefs[:-1]:
        expr = f"read_ptr({expr} + {offset})"
    return f"({expr} + {src.derefs[-1]})" if src.derefs else expr


#: what a `client` role must be: the struct holding the peer's address (docs/probe-spec.md)
CLIENT_STRUCTS = ("__kernel_sockaddr_storage", "sockaddr_storage", "sockaddr")
#: the u32 members of the struct holding the client (struct svc_rqst) naming the request's
#: RPC program and version
REQUEST_NUMBERS = ("rq_prog", "rq_vers")


def _server_handlers(point: Point, layout: Optional[KernelLayout]) -> Tuple[str, Tuple[str, str]]:
    """(C text, (entry, exit) program names) of an NFS server request point (Tool.server):
    the entry reads the client's address and the procedure's name through BTF offsets."""
    fentry = point.kind == "fentry"
    where = f"{point.op} at {point.entry}"
    if point.kind == "tracepoint":
        raise UserError(f"per-client requests need a function for {where} (nfsd_dispatch), not a tracepoint: "
                        "is nfsd's BTF missing?")
    if layout is None:
        raise UserError(f"per-client requests need the kernel's BTF (for {where})")
    client = layout.resolve(point.entry, point.args.get("client", ""))
    if client is None or not client.derefs or layout.embedded_struct(point.entry, point.args["client"]) \
            not in CLIENT_STRUCTS:
        raise UserError(f"cannot read the client's address at {point.entry} on this kernel (BTF of "
                        f"nfsd missing, or the spec's client {point.args.get('client')!r} is not a sockaddr)")
    name = layout.resolve(point.entry, point.args.get("name", ""))
    proc = _param_expr(name, fentry) if name is not None else "0"
    # the request's program and version, beside the procedure's name: NFSv3's GETATTR is not
    # NFSACL's, and NFSv4's work is all COMPOUND (read from the struct the client is in)
    request = point.args["client"].rsplit("->", 1)[0]
    numbers = [layout.resolve(point.entry, f"{request}->{field}") for field in REQUEST_NUMBERS]
    prog, vers = (_member_addr(src, fentry) if src is not None and src.derefs else "0" for src in numbers)
    return _entry_exit(point, layout, f"server_start({_member_addr(client, fentry)}, {proc}, {prog}, {vers})",
                       "server_end()")


def _entry_exit(point: Point, layout: Optional[KernelLayout], at_entry: str, at_exit: str
                ) -> Tuple[str, Tuple[str, str]]:
    """(C text, (entry, exit) program names) of a point whose two programs each make one call."""
    if point.kind == "fentry":
        assert layout is not None
        names = (fentry_program(point, "entry", layout), fentry_program(point, "exit", layout))
        ctx = "unsigned long long *ctx"
    else:
        names, ctx = (f"p{point.id}_entry", f"p{point.id}_exit"), "struct pt_regs *ctx"
    text = (f"int {names[0]}({ctx})\n{{\n    {at_entry};\n    return 0;\n}}\n\n"
            f"int {names[1]}({ctx})\n{{\n    {at_exit};\n    return 0;\n}}\n")
    return text, names


#: from the export (the spec's `export` role, a struct svc_export *) to its root's inode
#: number and superblock dev: what user space matches against the exported paths
EXPORT_ROOT = ("->ex_path.dentry->d_inode->i_ino", "->ex_path.dentry->d_sb->s_dev")


def _server_context_handlers(point: Point, layout: Optional[KernelLayout]) -> Tuple[str, Tuple[str, str]]:
    """(C text, (entry, exit) program names) of the rpc op's context point (fh_verify): the
    entry keeps the file handle for the thread's request, the return reads its export."""
    fentry = point.kind == "fentry"
    export = point.args.get("export", "")
    handle = export.split("->", 1)[0]
    paths = [layout.resolve(point.entry, export + tail) if layout is not None and export else None
             for tail in EXPORT_ROOT]
    fh = layout.resolve(point.entry, handle) if layout is not None and handle else None
    if fh is None or fh.derefs or any(src is None or len(src.derefs) != 4 for src in paths):
        raise UserError(f"cannot read the export at {point.entry} on this kernel (BTF of nfsd missing, or the "
                        f"spec's export {export!r} is not a struct svc_export *)")
    ino, dev = paths
    assert ino is not None and dev is not None
    offsets = ", ".join(str(off) for off in ino.derefs + dev.derefs[2:])
    return _entry_exit(point, layout, f"server_fh({_param_expr(fh, fentry)})", f"server_export({offsets})")


def _tp_string(point: Point, at_exit: bool) -> str:
    """C pointer to the tracepoint's `name` string (a __data_loc char[] field) at this end, or 0."""
    expr = point.args.get("name", "")
    if expr.startswith("exit.") != at_exit or not expr:
        return "0"
    field = expr[len("exit."):] if at_exit else expr
    return f"(const char *)args + (args->data_loc_{field} & 0xFFFF)"


def _tp_start(point: Point, op_macro: str) -> List[str]:
    lines = ["    {", "        struct start_val v;", "        __builtin_memset(&v, 0, sizeof(v));"]
    for role, field in (("fileid", "fileid"), ("offset", "offset"), ("bytes", "bytes"), ("dev", "dev")):
        expr = point.args.get(role)
        if expr and not expr.startswith("exit.") and expr != "retval":
            lines.append(f"        v.{field} = args->{expr};")
    if point.match == "keys":
        lines += ["        struct async_key k;", "        __builtin_memset(&k, 0, sizeof(k));",
                  f"        k.point = {point.id};"]
        lines += [f"        k.k[{i}] = (u64)args->{key};" for i, key in enumerate(point.keys)]
        lines.append(f"        async_start(&k, {op_macro}, &v, {_tp_string(point, False)});")
    else:
        lines.append(f"        task_start({point.id}, {op_macro}, &v);")
    return lines + ["    }"]


def _tp_end(point: Point, op_macro: str) -> List[str]:
    expr = point.args.get("bytes", "")
    bytes_end = f"(s64)args->{expr[len('exit.'):]}" if expr.startswith("exit.") else "-1"
    if point.match == "keys":
        lines = ["    {", "        struct async_key k;", "        __builtin_memset(&k, 0, sizeof(k));",
                 f"        k.point = {point.id};"]
        lines += [f"        k.k[{i}] = (u64)args->{key};" for i, key in enumerate(point.keys)]
        end = "async_forget(&k);" if point.watch else f"async_end(args, &k, {op_macro}, {bytes_end});"
        return lines + [f"        {end}", "    }"]
    return [f"    task_end(args, {point.id}, {op_macro}, {bytes_end}, PTR_NONE, {_tp_string(point, True)});"]


def generate(chosen: Sequence[Chosen], tool: Tool, layout: Optional[KernelLayout],
             template: Path = TEMPLATE, enums: Sequence[str] = (), ringbuf: bool = False,
             task_storage: bool = False, fentry: Collection[str] = ()) -> Probe:
    """The complete C text for bcc plus what the front end needs to attach and decode.

    `ringbuf`: slow events go through a BPF ring buffer (kernel >= 5.8, bcc >= 0.16), else
    through the perf buffer (the backend's ringbuf_support decides). `task_storage`: same-thread
    start times in task local storage (kernel >= 5.11, bcc >= 0.24), else in a hash map keyed
    by (thread, attach point). `fentry`: functions of fentry candidates to attach with
    fentry/fexit (see points_of); bcc attaches those programs itself when it loads them.

    `enums`: enum types named by the chosen tracepoints' formats (KernelFacts.event_enum_types),
    declared so that bcc's generated argument structs compile; a 4-byte placeholder keeps
    the layout, the probes never read those fields.
    """
    if tool.cgroup_limit and not tool.per_mount:
        raise ValueError("cgroup keys are mount keys' refinement: Tool.cgroup_limit needs per_mount")
    if any(c.context for c in chosen) and not tool.server:
        raise ValueError("a context point names a server's requests: Tool.server only")
    ops = [c.op for c in chosen if not c.context]
    if tool.server and "rpc" not in ops:
        raise UserError("per-client requests need the spec's rpc operation, and it cannot be traced here")
    letters = [c.letter for c in chosen if not c.context]
    points = points_of(chosen, layout, fentry)
    offsets = layout.name_offsets() if layout is not None else {}
    dev_offsets = layout.dev_offsets() if layout is not None else {}
    nkeys = max([len(p.keys) for p in points if p.match == "keys"] or [1])
    defines: List[Tuple[str, int]] = [("NPOINTS", len(points)), ("NOPS", max(len(ops), 1))]
    defines += [(f"OP_{op.upper()}", i) for i, op in enumerate(ops)]
    defines += [("TARGET_TGID", tool.tgid), ("MIN_LAT_NS", tool.min_lat_ns), ("MAX_LAT_NS", MAX_LAT_NS),
                ("WANT_EVENTS", int(tool.events)), ("WANT_DIST", int(tool.dist)), ("WANT_TOP", int(tool.top)),
                ("HAVE_ASYNC", int(any(p.match == "keys" for p in points))), ("NKEYS", nkeys),
                ("DIST_UNIT_NS", tool.dist_unit_ns), ("NAME_LEN", NAME_LEN), ("COMM_LEN", COMM_LEN),
                ("USE_RINGBUF", int(ringbuf and tool.events)), ("RINGBUF_PAGES", RINGBUF_PAGES),
                ("USE_TASK_STORAGE", int(task_storage)),
                ("WANT_INFLIGHT", int(tool.inflight)), ("INFLIGHT_SLOTS", INFLIGHT_SLOTS),
                ("HAVE_FILE_NAME", int("OFF_FILE_PATH_DENTRY" in offsets)),
                ("HAVE_DENTRY_NAME", int("OFF_DENTRY_NAME" in offsets)),
                ("WANT_LAT_SUM", int(tool.lat_sum)), ("WANT_DEV", int(tool.per_mount)),
                ("MAX_MOUNTS", MAX_MOUNTS if tool.per_mount else 1), ("MOUNT_DEV", tool.mount_dev),
                ("CGROUP_FILTER", int(tool.cgroup_filter)),
                ("WANT_CGROUP_KEY", int(tool.cgroup_limit > 0)), ("MAX_CGROUPS", max(tool.cgroup_limit, 1)),
                ("WANT_SERVER", int(tool.server)), ("PROC_LEN", PROC_LEN), ("REQUEST_SLOTS", REQUEST_SLOTS),
                ("DIST_ENTRIES", dist_entries(tool, len(ops))), ("TOTAL_ENTRIES", total_entries(tool, len(ops))),
                ("HAVE_FILE_SB", int({"OFF_FILE_INODE", "OFF_INODE_SB", "OFF_SB_DEV"} <= set(dev_offsets))),
                ("HAVE_DENTRY_SB", int({"OFF_DENTRY_SB", "OFF_SB_DEV"} <= set(dev_offsets))),
                ("HAVE_FILE_INO", int({"OFF_FILE_INODE", "OFF_INODE_INO"} <= set(dev_offsets)))]
    defines += [(f"PTR_{name.upper()}", value) for name, value in PTR_KINDS.items()]
    defines += sorted(offsets.items()) + sorted(dev_offsets.items())
    head = ["/* generated by probes/generate.py from the probe spec: do not edit */",
            "#include <uapi/linux/ptrace.h>"]
    head += [f"#define {name} {value}{'ULL' if name.endswith('_NS') else ''}" for name, value in defines]
    head += [f"enum {name} {{ PROBEKIT_{name.upper()}_ANY }};" for name in sorted(set(enums))]
    head.append(event_c_struct())
    handlers: List[str] = []
    kprobes: List[Tuple[str, str, str]] = []
    tp_bodies: Dict[str, List[str]] = {}
    mountless: List[str] = []
    programs: Dict[str, Tuple[str, ...]] = {}
    for point in points:
        op_macro = f"OP_{point.op.upper()}"
        if tool.server and point.op == "rpc":
            text, names = (_server_context_handlers if point.context else _server_handlers)(point, layout)
            handlers.append(text)
            if point.kind == "kprobe":
                kprobes += [(point.entry, "entry", names[0]), (point.exit, "exit", names[1])]
            # a skipped run of a context program loses a name, not a request
            programs.update({name: () if point.context else (point.op,) for name in names})
        elif point.kind in ("kprobe", "fentry"):
            text, ptr_kind, names = _function_handlers(point, op_macro, layout, tool.dev_at_entry)
            if ptr_kind == "none" or not dev_offsets:
                mountless.append(point.op)
            handlers.append(text)
            if point.kind == "kprobe":
                kprobes += [(point.entry, "entry", names[0]), (point.exit, "exit", names[1])]
            programs.update({name: (point.op,) for name in names})
        else:
            if "dev" not in point.args and point.op != "rpc":  # an RPC belongs to no mount
                mountless.append(point.op)
            tp_bodies.setdefault(point.entry, []).extend(_tp_start(point, op_macro))
            tp_bodies.setdefault(point.exit, []).extend(_tp_end(point, op_macro))
    for event, body in tp_bodies.items():
        system, _, name = event.partition(":")
        # bcc's name for a TRACEPOINT_PROBE function
        programs[f"tracepoint__{system}__{name}"] = tuple(sorted({p.op for p in points if event in (p.entry, p.exit)}))
        handlers.append(f"TRACEPOINT_PROBE({system}, {name})\n{{\n" + "\n".join(body) + "\n    return 0;\n}\n")
    c_text = "\n".join(head) + "\n\n" + template.read_text() + "\n" + "\n".join(handlers)
    return Probe(c_text, ops, letters, points, kprobes, bool(offsets), ringbuf and tool.events, task_storage,
                 sorted(set(mountless)), programs, tuple(c.op for c in chosen if c.watch))

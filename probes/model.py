"""The one model of the probe, whichever loader runs it: points, layouts and settings.

Why one: the kernel side (bpf/probe.bpf.c) is written once for bcc and CO-RE, and it reads
every decision it does not make itself from settings: the probe's (CFG) and each attach
point's (P). This module makes those decisions once, from the spec's choice, the kernel's BTF
and its tracepoint formats: what a tool keys and sizes, which parameter or field each role
is read from, which body a point runs, the event record and the map layouts the readers
decode. The two emitters (probes.generate for bcc, probes.generate_core for CO-RE) only
spell the same values, as `#define`s or as the bytes of `struct cfg`, which the CO-RE loader
writes into the instructions.
"""
from __future__ import annotations

import struct

from discover.errors import UserError
from discover.spec import SERVER_OPS
from probes.layout import ArgSource, KernelLayout
from probes.select import Chosen

TYPE_CHECKING = False  # typing's constant without typing (discover/records.py)
if TYPE_CHECKING:
    from typing import Any, Callable, Collection, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple

    #: a tracepoint's fields (name, offset, size, signed) by event, None where it has none
    Formats = Callable[[str], Optional[List[Dict[str, Any]]]]
else:
    from discover.records import NamedTuple

NAME_LEN = 32   # bytes of file name kept per event (bcc's nfsslower keeps 32 too)
#: bytes of an NFS server procedure's or NFSv4 operation's name kept (the longest,
#: NFSv4.1's BIND_CONN_TO_SESSION, is 20)
PROC_LEN = 24
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
#: the kernel's page size, the unit of a ring buffer's size
PAGE_SIZE = 4096
#: mounts a per-mount histogram has room for (dist keys are op x mount x slot)
MAX_MOUNTS = 64
#: with cgroup keys, histogram room per (op, cgroup): this many mounts of this many slots
#: on average (a cgroup uses a few NFS mounts; nanosecond latencies fill ~30 slots); a
#: key that does not fit is counted as untimed, never dropped unseen
CGROUP_MOUNTS, CGROUP_SLOTS = 4, 40
#: starts a hash map holds at once (threads in an operation, or RPCs in flight)
START_ENTRIES = 10240
#: nfstop's and nfsdtop's rows and their histogram buckets
TOP_ENTRIES, TOP_HIST_ENTRIES = 10240, 40960
#: a role no parameter gives; an op id no op has
NO_PARAM = 0xFFFFFFFF
#: pointer reads from a parameter to the value a role names (`iocb->ki_filp` is one)
MAX_DEREFS = 3
#: argument sources per point (P(p, aI_*)): what each holds depends on the point's body
NARGS = 4

PTR_KINDS = {"none": 0, "file": 1, "dentry": 2}
#: the probe's counters of what it could not do, by index in its `counters` map; from
#: COUNTER_UNTIMED on, one per op (operations that could not be timed)
COUNTERS = ("anomalies", "inflight_lost", "lost_events", "untimed")
#: what a program of an attach point does: time an operation, time an NFS server's request
#: (its client, procedure and export), name the export of the request it runs in, or end one
#: NFSv4 operation inside the request (a COMPOUND's)
BODIES = ("timed", "request", "context", "operation")

#: (field, C type, array length): the one definition of the slow-event record.
#: u64 first, then u32, then byte arrays, so the C struct has no implicit padding.
EVENT_FIELDS: Tuple[Tuple[str, str, int], ...] = (
    ("end_ns", "u64", 0), ("lat_ns", "u64", 0), ("bytes", "u64", 0), ("offset", "u64", 0),
    ("fileid", "u64", 0), ("dev", "u64", 0), ("cgroup", "u64", 0), ("pid", "u32", 0), ("op", "u32", 0),
    ("comm", "char", COMM_LEN), ("name", "char", NAME_LEN),
)
_PY_CODES = {"u64": "Q", "u32": "I", "char": "s"}
_C_SIZES = {"u64": 8, "u32": 4, "char": 1}

#: the probe's settings (CFG(name)): (name, C type); u64 first so the struct has no padding
CFG_FIELDS: Tuple[Tuple[str, str], ...] = (
    ("min_lat_ns", "u64"), ("dist_unit_ns", "u64"), ("target_tgid", "u32"), ("mount_dev", "u32"),
    ("want_events", "u32"), ("want_dist", "u32"), ("want_top", "u32"), ("want_inflight", "u32"),
    ("want_lat_sum", "u32"), ("want_dev", "u32"), ("want_cgroup_key", "u32"), ("cgroup_filter", "u32"),
    ("dev_at_entry", "u32"), ("task_storage", "u32"), ("want_server", "u32"),
    ("op_rpc", "u32"), ("op_read", "u32"), ("op_write", "u32"), ("op_v4op", "u32"),
)
#: one point's scalar settings (P(p, name)), before its argument sources and tracepoint fields
POINT_SCALARS = ("on", "id", "op", "slot", "keyed", "watch", "ptr_kind", "ret_bytes", "nargs")
#: the parts of one argument source: parameter, pointer reads, whether the last is an address
ARG_PARTS = ("param", "n", "addr") + tuple(f"off{i}" for i in range(MAX_DEREFS))
#: tracepoint fields a point reads, by role; then its keys at the start and at the end
TP_ROLES = ("fileid", "offset", "bytes", "dev", "name", "exit_bytes", "exit_name")
TP_PARTS = ("off", "size", "signed")
#: tracepoint field roles read at a start from the spec's args (an `exit.` prefix: at the end)
_TP_START_ROLES = ("fileid", "offset", "bytes", "dev")
#: what a `client` role must be: the struct holding the peer's address (docs/probe-spec.md)
CLIENT_STRUCTS = ("__kernel_sockaddr_storage", "sockaddr_storage", "sockaddr")
#: the u32 members of the struct holding the client (struct svc_rqst) naming the request's
#: RPC program and version
REQUEST_NUMBERS = ("rq_prog", "rq_vers")
#: from the export (the spec's `export` role, a struct svc_export *) to its root's inode
#: number and superblock dev: what user space matches against the exported paths
EXPORT_ROOT = ("->ex_path.dentry->d_inode->i_ino", "->ex_path.dentry->d_sb->s_dev")


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
    """One buffer record as a dict keyed by EVENT_FIELDS names (strings decoded)."""
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


def map_sizes(tool: Tool, nops: int, task_storage: bool, keyed: bool) -> Dict[str, int]:
    """Every sized map's entries for this tool: what it writes has room, what it never
    writes holds one entry (preallocated, the unused maps held ~7 MB of kernel memory the
    kernel zeroes at every start)."""
    def used(flag: bool, entries: int) -> int:
        return entries if flag else 1
    return {"starts": used(not task_storage, START_ENTRIES), "async_starts": used(keyed, START_ENTRIES),
            "events": used(tool.events, RINGBUF_PAGES) * PAGE_SIZE,
            "counters": len(COUNTERS) - 1 + max(nops, 1), "dist": dist_entries(tool, nops), "op_totals": total_entries(tool, nops),
            "cgroup_ids": max(tool.cgroup_limit, 1), "top_stats": used(tool.top, TOP_ENTRIES),
            "top_hist": used(tool.top, TOP_HIST_ENTRIES), "requests": used(tool.server, REQUEST_SLOTS),
            "server_stats": used(tool.server, TOP_ENTRIES), "server_hist": used(tool.server, TOP_HIST_ENTRIES)}


def map_flags(tool: Tool) -> Dict[str, int]:
    """The histogram maps' flags: allocated as used (BPF_F_NO_PREALLOC) for cgroup keys, whose
    room is far more than is ever filled; else preallocated, which is also what Linux 5.10 wants
    of a tracing program (it warns of run-time allocation there)."""
    flags = 1 if tool.cgroup_limit else 0  # BPF_F_NO_PREALLOC
    return {"dist": flags, "op_totals": flags}


class Point(NamedTuple):
    """One attach point as the emitters and readers use it."""

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
    c_text: str                  # bcc's C (empty for a prebuilt object)
    ops: List[str]               # op id -> name
    letters: List[str]           # op id -> letter
    points: List[Point]
    #: (kprobe | kretprobe | tracepoint, function or SYSTEM:EVENT, program) the loader attaches
    #: after loading (bcc's fentry programs attach themselves)
    attach: List[Tuple[str, str, str]]
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
    else a kprobe pair on the same functions. A function gets one fentry and one fexit
    program (bcc names them after the function alone): a second point on it is a kprobe pair."""
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


def body_of(point: Point, server: bool) -> str:
    """The program body a point runs (BODIES): a context point names its request's export; the
    rpc op's points of a server spec (a `client` role) time requests when the tool serves them;
    a server-only op's point (an NFSv4 operation's end) adds to the request it runs in."""
    if point.context:
        return "context"
    if point.op in SERVER_OPS:
        return "operation"
    if server and point.op == "rpc" and "client" in point.args:
        return "request"
    return "timed"


def spec_nkeys(spec: Dict[str, Any]) -> int:
    """Key fields of the spec's keyed points at the most: the width of `struct async_key`,
    the same for every tool on the spec, whichever loader runs it."""
    return max([len(cand.get("keys", ())) for entry in spec["ops"].values()
                for cand in entry["candidates"] + entry.get("context", []) if cand["match"] == "keys"] or [1])


def tp_roles(nkeys: int) -> List[str]:
    """The tracepoint field roles of a point, in the settings' order."""
    return list(TP_ROLES) + [f"key{i}" for i in range(nkeys)] + [f"exit_key{i}" for i in range(nkeys)]


def point_fields(nkeys: int) -> List[str]:
    """Every setting of one point (P(p, name)), in the order of `struct point_cfg`."""
    return (list(POINT_SCALARS) + [f"a{i}_{part}" for i in range(NARGS) for part in ARG_PARTS]
            + [f"t_{role}_{part}" for role in tp_roles(nkeys) for part in TP_PARTS])


def off_point(nkeys: int) -> Dict[str, int]:
    """The settings of a point the probe does not run (its programs are not loaded, or skip it)."""
    values = dict.fromkeys(point_fields(nkeys), 0)
    values.update({f"a{i}_param": NO_PARAM for i in range(NARGS)})
    return values


def probe_settings(tool: Tool, task_storage: bool, ops: Sequence[str]) -> Dict[str, int]:
    """CFG's values for a tool on these ops (an absent op's id is NO_PARAM: matched by none)."""
    def op_id(name: str) -> int:
        return ops.index(name) if name in ops else NO_PARAM
    return {"min_lat_ns": tool.min_lat_ns, "dist_unit_ns": tool.dist_unit_ns, "target_tgid": tool.tgid,
            "mount_dev": tool.mount_dev, "want_events": int(tool.events), "want_dist": int(tool.dist),
            "want_top": int(tool.top), "want_inflight": int(tool.inflight), "want_lat_sum": int(tool.lat_sum),
            "want_dev": int(tool.per_mount), "want_cgroup_key": int(tool.cgroup_limit > 0),
            "cgroup_filter": int(tool.cgroup_filter), "dev_at_entry": int(tool.dev_at_entry),
            "task_storage": int(task_storage), "want_server": int(tool.server),
            "op_rpc": op_id("rpc"), "op_read": op_id("read"), "op_write": op_id("write"),
            "op_v4op": op_id("v4op")}


class PointPlan(NamedTuple):
    """A chosen point's settings and what the readers learn of it."""

    values: Dict[str, int]   # P(p, name) for every name of point_fields
    mountless: bool          # its operations cannot tell their mount


def _arg(values: Dict[str, int], index: int, src: ArgSource, where: str, addr: bool = False,
         skip: int = 0) -> None:
    """Argument source `index` from `src` (its first `skip` pointer reads already done)."""
    derefs = src.derefs[skip:]
    if len(derefs) > MAX_DEREFS:
        raise UserError(f"{where}: {len(derefs)} pointer reads, the probe follows {MAX_DEREFS}")
    values[f"a{index}_param"] = src.param
    values[f"a{index}_n"] = len(derefs)
    values[f"a{index}_addr"] = int(addr)
    for i, offset in enumerate(derefs):
        values[f"a{index}_off{i}"] = offset


def _function_args(point: Point, layout: Optional[KernelLayout], values: Dict[str, int]) -> bool:
    """A timed function point's sources: its file or dentry (0) and offset (1). True when its
    operations cannot tell their mount (no file or dentry, or no BTF)."""
    ptr_kind = "none"
    for role in ("dentry", "file", "offset"):
        expr = point.args.get(role)
        if not expr or expr == "retval" or layout is None or (role != "offset" and ptr_kind != "none"):
            continue
        src = layout.resolve(point.entry, expr)
        if src is None:
            continue
        _arg(values, 1 if role == "offset" else 0, src, f"{point.op} at {point.entry}")
        if role != "offset":
            ptr_kind = role
    values["ptr_kind"] = PTR_KINDS[ptr_kind]
    values["ret_bytes"] = int(point.args.get("bytes") == "retval")
    return ptr_kind == "none" or layout is None


def _request_args(point: Point, layout: Optional[KernelLayout], values: Dict[str, int]) -> None:
    """A server request point's sources: the client's address (0, a member's address), the
    procedure's name (1), the request's RPC program (2) and version (3), members of the struct
    the client is in (NFSv3's GETATTR is not NFSACL's; NFSv4's work is all COMPOUND)."""
    where = f"{point.op} at {point.entry}"
    if layout is None:
        raise UserError(f"per-client requests need the kernel's BTF (for {where})")
    client = layout.resolve(point.entry, point.args.get("client", ""))
    if client is None or not client.derefs or layout.embedded_struct(point.entry, point.args["client"]) \
            not in CLIENT_STRUCTS:
        raise UserError(f"cannot read the client's address at {point.entry} on this kernel (BTF of "
                        f"nfsd missing, or the spec's client {point.args.get('client')!r} is not a sockaddr)")
    _arg(values, 0, client, where, addr=True)
    name = layout.resolve(point.entry, point.args.get("name", ""))
    if name is not None:
        _arg(values, 1, name, where)
    request = point.args["client"].rsplit("->", 1)[0]
    for index, field in enumerate(REQUEST_NUMBERS, start=2):
        src = layout.resolve(point.entry, f"{request}->{field}")
        if src is not None and src.derefs:
            _arg(values, index, src, where, addr=True)


def _context_args(point: Point, layout: Optional[KernelLayout], values: Dict[str, int]) -> None:
    """A context point's (fh_verify's) sources: the file handle (0) at entry; at return, from
    the handle to its export (1), and from the export to its root's inode number (2) and
    superblock dev (3)."""
    export = point.args.get("export", "")
    handle = export.split("->", 1)[0]
    fh = layout.resolve(point.entry, handle) if layout is not None and handle else None
    paths = [layout.resolve(point.entry, export + tail) if layout is not None and export else None
             for tail in EXPORT_ROOT]
    exp = layout.resolve(point.entry, export) if layout is not None and export else None
    if fh is None or fh.derefs or exp is None or len(exp.derefs) != 1 \
            or any(src is None or len(src.derefs) != 4 for src in paths):
        raise UserError(f"cannot read the export at {point.entry} on this kernel (BTF of nfsd missing, or the "
                        f"spec's export {export!r} is not a struct svc_export *)")
    where = f"{point.op} at {point.entry}"
    _arg(values, 0, fh, where)
    _arg(values, 1, exp, where)
    for index, src in enumerate(paths, start=2):
        assert src is not None
        _arg(values, index, src, where, skip=1)


def _tp_args(point: Point, formats: Formats, values: Dict[str, int]) -> None:
    """Offsets, sizes and signedness of the tracepoint fields this point reads, from the
    running kernel's format files (a field absent there reads as 0)."""
    entry = {f["name"]: f for f in formats(point.entry) or []}
    exit_ = {f["name"]: f for f in formats(point.exit) or []}

    def put(role: str, fields: Dict[str, Dict[str, Any]], name: str) -> None:
        field = fields.get(name)
        if field is not None:
            values.update({f"t_{role}_off": int(field["offset"]), f"t_{role}_size": int(field["size"]),
                           f"t_{role}_signed": int(bool(field["signed"]))})
    for role in _TP_START_ROLES:
        expr = point.args.get(role, "")
        if expr and not expr.startswith("exit.") and expr != "retval":
            put(role, entry, expr)
    for role, exit_role in (("bytes", "exit_bytes"), ("name", "exit_name")):
        expr = point.args.get(role, "")
        if expr.startswith("exit."):
            put(exit_role, exit_, expr[len("exit."):])
        elif role == "name" and expr:
            put(role, entry, expr)
    for i, key in enumerate(point.keys):
        put(f"key{i}", entry, key)
        put(f"exit_key{i}", exit_, key)


def plan_point(point: Point, op: int, slot: int, nkeys: int, server: bool, layout: Optional[KernelLayout],
               formats: Formats) -> PointPlan:
    """One chosen point's settings: numbered `point.id` in maps, starting in `slot`, counting
    as op `op`; UserError where a server point cannot be read on this kernel."""
    values = off_point(nkeys)
    values.update({"on": 1, "id": point.id, "op": op, "slot": slot, "keyed": int(point.match == "keys"),
                   "watch": int(point.watch)})
    body = body_of(point, server)
    if point.kind == "tracepoint" and body == "operation":
        _tp_args(point, formats, values)
        return PointPlan(values, False)
    if point.kind == "tracepoint":
        if body != "timed":
            raise UserError(f"per-client requests need a function for {point.op} at {point.entry} (nfsd_dispatch), "
                            "not a tracepoint: is nfsd's BTF missing?")
        _tp_args(point, formats, values)
        return PointPlan(values, "dev" not in point.args and point.op != "rpc")  # an RPC belongs to no mount
    if point.kind == "fentry" and layout is not None:
        values["nargs"] = len(layout.params(point.exit) or ())
    if body == "request":
        _request_args(point, layout, values)
        return PointPlan(values, False)
    if body == "context":
        _context_args(point, layout, values)
        return PointPlan(values, False)
    return PointPlan(values, _function_args(point, layout, values))


def check_tool(chosen: Sequence[Chosen], tool: Tool) -> List[str]:
    """The ops a probe counts (the chosen less context points), after the checks a tool's
    settings must pass whichever loader runs it."""
    if tool.cgroup_limit and not tool.per_mount:
        raise ValueError("cgroup keys are mount keys' refinement: Tool.cgroup_limit needs per_mount")
    if any(c.context for c in chosen) and not tool.server:
        raise ValueError("a context point names a server's requests: Tool.server only")
    ops = [c.op for c in chosen if not c.context]
    if tool.server and "rpc" not in ops:
        raise UserError("per-client requests need the spec's rpc operation, and it cannot be traced here")
    return ops


def program_ops(point: Point, server: bool) -> Tuple[str, ...]:
    """The ops a skipped run of one of the point's programs loses (a context point's: none, it
    loses a name, not a request)."""
    return () if body_of(point, server) == "context" else (point.op,)

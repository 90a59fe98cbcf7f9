"""Streaming parser for function_graph text: rebuilds calls per CPU and per task.

Reads what the kernel's function_graph printer writes to `trace` / `trace_pipe`
under any option mix (cpu, proc, abstime, reltime, latency-format, duration with
overhead marks, tail, retval/retaddr, args, overruns, irq markers, context-switch
blocks, comments from other events, lost-event and buffer-start notes) and the
`trace-cmd report` dialect, and aggregates the calls into a calling-context tree
(one CallNode per distinct call path), so memory grows with distinct paths, never
with lines.

Speed: most lines repeat a few shapes. Each lane (a CPU, or CPU+task with the proc
column) remembers the duration of every prefix text it has seen, and each tree node
remembers the exact body texts of its children and of its own exit, so the
dominant lines cost two dict lookups; everything else goes through the general
line parser (`parse_line`), which is the reference the fast path is tested against.
"""
from __future__ import annotations

import gc
import re
from itertools import islice
from typing import AnyStr, Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Union

# ---------------------------------------------------------------------------
# Line kinds returned by parse_line.
ENTRY = "entry"            # f() {
LEAF = "leaf"              # f();
EXIT = "exit"              # }   or   } /* f */
COMMENT = "comment"        # /* text */  (another event, trace_printk, trace_marker)
EVENT = "event"            # trace-cmd report line of a non-graph event
IRQ_IN = "irq-in"          # ==========>
IRQ_OUT = "irq-out"        # <==========
SWITCH = "switch"          # 1)  a-1  =>  b-2
RULE = "rule"              # ------------------------------------------
OVERRUN = "overrun"        # (Overruns: N)
LOST = "lost"              # CPU:N [LOST N EVENTS]
BUFFER_START = "buffer-start"  # ##### CPU N buffer started ####
HEADER = "header"          # '#' lines, trace-cmd preamble
BLANK = "blank"
MALFORMED = "malformed"

CALL_KINDS = (ENTRY, LEAF, EXIT)
# What FuncgraphParser(on_call=...) reports besides ENTRY, LEAF and EXIT:
CUT_START = "cut-start"    # a frame opened whose entry is not in the trace (name known at its EXIT)
CUT_END = "cut-end"        # an open frame closed by the end of the trace (no exit, no time)
MAX_DEPTH = 256  # far beyond the kernel's return-stack depth; deeper indentation is garbage
#: A call that returns on another CPU than its entry's slept or was preempted and woke
#: there: a context switch and a wake-up, microseconds even on fast hardware. An exit
#: shorter than this is never taken for a migrated call's (it is a call cut at the start).
SWITCH_MIN_US = 5.0

_DUR = r"(?P<mark>[ +!#*@$]) (?P<dur>\d+(?:\.\d+)?) us +\|  "
_FILL = r"(?P<fill> {14}\|  )"
# Columns the kernel prints before the function column, each optional, in order
# (trace_functions_graph.c: abs time, rel time, cpu, proc, latency flags, duration).
_KERNEL_HEAD_SRC = (
    r"(?:(?P<abs> *\d+\.\d+) \|  )?"
    r"(?:(?P<rel> *\d+) us \|  )?"
    r"(?P<tend>)"
    r"(?: *(?P<cpu>\d+)\) )?"
    r"(?: *(?P<comm>[^|\s][^|]*?)-(?P<pid>\d+) * \| )?"
    r"(?: (?P<lat>[^\s|]{3,8}) \| )?"
    r"(?:" + _DUR + "|" + _FILL + r")?"
)
# The body part always matches, so the columns split exactly as _KERNEL_HEAD splits them.
_KERNEL_LINE = re.compile(_KERNEL_HEAD_SRC + r"(?P<indent> *)(?P<body>[^\r\n]*)", re.S)
_KERNEL_HEAD = re.compile(_KERNEL_HEAD_SRC, re.S)
# trace-cmd report (and the plain `trace` format of non-graph events).
_TRACECMD_LINE = re.compile(
    r"\s*(?P<comm>[^|]+?)-(?P<pid>\d+)\s+(?:\(\s*[-\d]+\)\s+)?"
    # `[cpu] flags` (trace-cmd report) or the cpu fused with the flags (`report -l`: 0d.h1.)
    r"(?:\[(?P<cpu>\d+)\]\s+(?:(?P<lat>[^\s:]+)\s+)?|(?P<lcpu>\d+)(?P<llat>[.dDXbnNpPhHsSzZ][^\s:]*)\s+)"
    r"(?P<ts>\d+\.\d+):\s+(?P<event>[\w.:-]+?):\s?(?P<rest>[^\r\n]*)",
    re.S,
)
_TRACECMD_GRAPH = re.compile(
    r"\s*(?:(?:(?P<mark>[+!#*@$])\s+)?(?P<dur>\d+(?:\.\d+)?) us\s*)?\|  (?P<indent> *)(?P<body>.*)$", re.S
)
_GRAPH_EVENTS = ("funcgraph_entry", "funcgraph_exit", "fgraph_retaddr_entry")

_CALL = re.compile(
    r"(?P<name>[^\s(){};/\[\]]+)(?: \[(?P<mod>[^\]\s]+)\])?"
    r"\((?P<args>[^()]*(?:\([^()]*\)[^()]*)*)\)"
    r"(?P<kind>;| (?:/\*[^*]*\*/ )?\{)(?P<trail>.*)$",
    re.S,
)
_EXIT = re.compile(
    r"\}(?: /\* (?P<name>[^\s*]+)(?: \[(?P<mod>[^\]\s]+)\])?(?P<note>[^*]*)\*/)?(?P<trail>.*)$", re.S
)
_COMMENT = re.compile(r"/\* ?(?P<text>.*?) ?\*/\s*$", re.S)
_RETVAL = re.compile(r"ret=(?P<ret>-?(?:0x)?[0-9a-fA-F]+)")
_SWITCH = re.compile(
    r"\s*(?P<cpu>\d+)\)\s+(?P<prev>\S.*?)-(?P<ppid>\d+)\s+=>\s+(?P<next>\S.*?)-(?P<npid>\d+)\s*$", re.S
)
_CPU_COLUMN = re.compile(r" *\d+\) ")
_RULE = re.compile(r"\s*-{10,}\s*$")
_OVERRUN = re.compile(r"\s*\(Overruns: (?P<n>\d+)\)\s*$")
_LOST = re.compile(r"\s*CPU:\s*(?P<cpu>\d+)\s*\[(?:LOST (?P<n>\d+) EVENTS|LOST EVENTS|(?P<d>\d+) EVENTS DROPPED)\]")
_BUFFER_START = re.compile(r"#+ CPU (?P<cpu>\d+) buffer started")
# Without the cpu column a call over 1 ms starts with its `#` overhead mark, not a header.
_HASH_MARKED_CALL = re.compile(r"# \d+(?:\.\d+)? us +\|  ")
_TRACECMD_HEADER = re.compile(r"\s*(?:cpus=\d+|version = \d+|CPU \d+ is empty|CPU\d+ data recorded at offset=)")
_IRQ_PROLOGUE = re.compile(r"(?:(?P<abs> *\d+\.\d+) \|  )?(?:(?P<rel> *\d+) us \|  )?(?: *(?P<cpu>\d+)\) )?"
                           r"(?: *(?P<comm>[^|\s][^|]*?)-(?P<pid>\d+) * \| )?")

# Hard-interrupt entry points as function_graph shows them nested in the interrupted
# function (x86: irq_enter_rcu / __sysvec_* / irq_exit_rcu; older x86 smp_*_interrupt,
# do_IRQ; arm64 gic/el1 handlers).
IRQ_ENTRY = re.compile(
    r"(?:irq_enter(?:_rcu)?|irq_exit(?:_rcu)?|_*sysvec_\w+|asm_sysvec_\w+|asm_common_interrupt"
    r"|_*common_interrupt|do_IRQ|smp_\w+_interrupt|gic_handle_irq|handle_arch_irq|el[01]h?_\w*irq\w*"
    r"|el[01]_interrupt|__irq_svc|__irq_usr|do_irq"
    # Xen PV and HVM guests take event-channel interrupts through these
    r"|_*xen_evtchn_do_upcall|xen_hvm_evtchn_do_upcall|exc_xen_hypervisor_callback|xen_pv_evtchn_do_upcall)$"
)
#: The interrupt's end (x86): after it, more of the interrupt return path runs at the
#: interrupted function's depth before the function resumes.
IRQ_EXIT_NAMES = frozenset({"irq_exit", "irq_exit_rcu"})
#: What that return path calls at the same depth on 6.x/7.x (the 7.2 and 7.3 captures:
#: the preemption check, the deferred hrtimer rearm, and the preemption itself): interrupt
#: work when it directly follows irq_exit*, an ordinary call anywhere else.
IRQ_RETURN_NAMES = frozenset({"raw_irqentry_exit_cond_resched", "irqentry_exit_cond_resched",
                              "__hrtimer_rearm_deferred", "preempt_schedule_irq"})
#: Lines whose meaning depends on what came before them: never learnt by the fast path.
_CONTEXT_NAMES = IRQ_EXIT_NAMES | IRQ_RETURN_NAMES | {"irq_enter_rcu"}


class Line:
    """One parsed line (only the fields its kind uses are set; the rest keep the
    class defaults, which keeps the general path cheap)."""

    cpu: Optional[int] = None
    pid: Optional[int] = None
    comm: Optional[str] = None
    ts: Optional[float] = None
    dur: Optional[float] = None
    depth = 0
    name: Optional[str] = None
    module: Optional[str] = None
    tail: Optional[str] = None
    retval: Optional[str] = None
    text: Optional[str] = None
    count = 0
    cacheable = False
    tend = 0
    body_at = -1
    dialect = "kernel"
    timed = False
    FIELDS = ("kind", "cpu", "pid", "comm", "ts", "dur", "depth", "name", "module", "tail",
              "retval", "text", "count", "cacheable", "tend", "body_at", "dialect", "timed")

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.FIELDS
                           if getattr(self, k) not in (None, 0, False, -1, "kernel"))
        return f"Line({fields})"


_IRQ_NAMES: Dict[str, bool] = {}


def is_irq_entry(name: Optional[str]) -> bool:
    """Is this a hard-interrupt entry point (see IRQ_ENTRY)? Memoised: asked per call line."""
    if name is None:
        return False
    known = _IRQ_NAMES.get(name)
    if known is None:
        known = IRQ_ENTRY.match(name) is not None
        if len(_IRQ_NAMES) < 100000:
            _IRQ_NAMES[name] = known
    return known


def _int(text: Optional[str]) -> Optional[int]:
    return int(text) if text is not None else None


def _parse_body(rec: Line, indent: str, body: str) -> Line:
    """Fill rec from the function column; MALFORMED when it is not one of its forms."""
    if len(indent) % 2 or len(indent) > 2 * MAX_DEPTH:
        rec.kind = MALFORMED
        return rec
    rec.depth = len(indent) // 2
    first = body[:1]
    if first == "}":
        m = _EXIT.match(body)
        if m is None:
            rec.kind = MALFORMED
            return rec
        rec.kind = EXIT
        rec.tail, rec.module, note, trail = m.group("name", "mod", "note", "trail")
        if "ret=" in trail or (note and "ret=" in note):
            r = _RETVAL.search((note or "") + trail)
            rec.retval = r.group("ret") if r else None
        rec.cacheable = rec.retval is None
        return rec
    if first == "/" and body.startswith("/*"):
        m = _COMMENT.match(body)
        if m is None:
            rec.kind = MALFORMED
            return rec
        rec.kind = COMMENT
        rec.text = m.group("text")
        return rec
    m = _CALL.match(body)
    if m is None:
        rec.kind = MALFORMED
        return rec
    rec.name, rec.module, kind, args, trail = m.group("name", "mod", "kind", "args", "trail")
    rec.kind = LEAF if kind == ";" else ENTRY
    if "ret=" in trail:
        r = _RETVAL.search(trail)
        rec.retval = r.group("ret") if r else None
    rec.cacheable = not args and rec.retval is None
    return rec


def parse_line(line: str) -> Line:
    """Parse one line of function_graph output (kernel text or trace-cmd report)."""
    stripped = line.rstrip("\r\n")
    if not stripped.strip():
        return Line(BLANK)
    if stripped.startswith("#") and not _HASH_MARKED_CALL.match(stripped):
        m = _BUFFER_START.match(stripped)
        rec = Line(BUFFER_START if m else HEADER)
        if m:
            rec.cpu = int(m.group("cpu"))
        return rec
    m = _KERNEL_LINE.match(line)
    if m is not None and (m.group("dur") is not None or m.group("fill") is not None):
        return _kernel_call_line(m)  # the usual case: a duration column, then the function
    m = _LOST.match(stripped)
    if m:
        rec = Line(LOST)
        rec.cpu = int(m.group("cpu"))
        rec.count = int(m.group("n") or m.group("d") or 0)
        return rec
    if "==========>" in stripped or "<==========" in stripped:
        rec = Line(IRQ_IN if "==========>" in stripped else IRQ_OUT)
        p = _IRQ_PROLOGUE.match(stripped)
        rec.cpu = _int(p.group("cpu"))
        rec.pid = _int(p.group("pid"))
        return rec
    if _RULE.match(stripped):
        return Line(RULE)
    m = _OVERRUN.match(stripped)
    if m:
        rec = Line(OVERRUN)
        rec.count = int(m.group("n"))
        return rec
    m = _SWITCH.match(stripped)
    if m:
        rec = Line(SWITCH)  # pid/comm: the task switched to; count/text: the one before
        rec.cpu = int(m.group("cpu"))
        rec.pid = int(m.group("npid"))
        rec.comm = m.group("next")
        rec.count = int(m.group("ppid"))
        rec.text = m.group("prev")
        return rec
    if _TRACECMD_HEADER.match(stripped):
        return Line(HEADER)
    m = None if _CPU_COLUMN.match(stripped) else _TRACECMD_LINE.match(stripped)
    if m is not None:
        return _parse_tracecmd(m)
    m = _KERNEL_LINE.match(line)
    if m is None:
        return Line(MALFORMED)
    return _kernel_call_line(m)


def _kernel_call_line(m: "re.Match[str]") -> Line:
    rec = Line(MALFORMED)
    cpu, pid, comm, ts, rel, dur, fill, indent, body = m.group(
        "cpu", "pid", "comm", "abs", "rel", "dur", "fill", "indent", "body")
    if cpu is not None:
        rec.cpu = int(cpu)
    if pid is not None:
        rec.pid = int(pid)
        rec.comm = comm
    if ts is not None:
        rec.ts = float(ts)
    elif rel is not None:
        rec.ts = int(rel) / 1e6
    if dur is not None:
        rec.dur = float(dur)
        rec.timed = True
    else:
        rec.dur = 0.0
        rec.timed = fill is not None
    rec.tend = m.end("tend")
    rec.body_at = m.start("indent")
    return _parse_body(rec, indent, body)


def _parse_tracecmd(m: "re.Match[str]") -> Line:
    rec = Line(EVENT)
    rec.dialect = "trace-cmd"
    rec.cpu = int(m.group("cpu") or m.group("lcpu"))
    rec.pid = int(m.group("pid"))
    rec.comm = m.group("comm").strip()
    rec.ts = float(m.group("ts"))
    event = m.group("event")
    rest = m.group("rest")
    if event not in _GRAPH_EVENTS:
        rec.name = event
        rec.text = f"{event}: {rest}"
        return rec
    g = _TRACECMD_GRAPH.match(rest)
    if g is None:
        rec.kind = MALFORMED
        return rec
    dur = g.group("dur")
    rec.dur = float(dur) if dur is not None else 0.0
    rec.timed = True
    _parse_body(rec, g.group("indent"), g.group("body"))
    rec.cacheable = False
    if rec.kind is COMMENT:
        rec.kind = MALFORMED
    return rec


# ---------------------------------------------------------------------------
# Calling-context tree.

class CallNode:
    """One call path (root;...;name) aggregated over every invocation that took it.

    Times are microseconds. `total` and `ctotal` cover completed invocations only
    (those with an exit line); self time = total - ctotal.
    """

    __slots__ = ("name", "module", "irq", "placeholder", "calls", "total", "ctotal", "max",
                 "cut_start", "cut_end", "children", "irqs", "events",
                 "leaves", "entries", "exitkey", "durs", "add", "smaps")

    def __init__(self, name: str, module: Optional[str] = None, irq: bool = False) -> None:
        self.name = name
        self.module = module
        self.irq = irq                      # runs in interrupt context
        self.placeholder = False            # entry not in the trace, name not known yet
        self.calls = 0
        self.total = 0.0
        self.ctotal = 0.0
        self.max = 0.0
        self.cut_start = 0                  # invocations whose entry was not in the trace
        self.cut_end = 0                    # invocations whose exit was not in the trace
        self.children: Dict[object, CallNode] = {}   # own callees
        self.irqs: Dict[object, CallNode] = {}       # interrupt work that hit this function
        self.events: Optional[Dict[str, int]] = None
        # Fast-path memory: exact body texts -> child (see module docstring).
        self.leaves: Dict[str, Callable[[float], None]] = {}
        self.entries: Dict[str, CallNode] = {}
        self.exitkey: Optional[str] = None
        self.durs: List[float] = []
        self.add = self.durs.append
        # The same memory for lines inside an off-by-one interrupt region (see _Task),
        # per shift: [leaves, entries, exitkey].
        self.smaps: Optional[Dict[int, list]] = None

    def shifted_maps(self, shift: int) -> list:
        if self.smaps is None:
            self.smaps = {}
        maps = self.smaps.get(shift)
        if maps is None:
            maps = self.smaps[shift] = [{}, {}, None]
        return maps

    @property
    def self_time(self) -> float:
        return max(self.total - self.ctotal, 0.0)

    def flush(self) -> None:
        """Fold pending durations into the counters."""
        d = self.durs
        if d:
            self.calls += len(d)
            self.total += sum(d)
            m = max(d)
            if m > self.max:
                self.max = m
            d.clear()

    def walk(self) -> Iterator["CallNode"]:
        stack = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())
            stack.extend(node.irqs.values())

    def merge_from(self, other: "CallNode") -> None:
        """Add other's counters and subtree into self (other must be flushed)."""
        self.calls += other.calls
        self.total += other.total
        self.ctotal += other.ctotal
        self.max = max(self.max, other.max)
        self.cut_start += other.cut_start
        self.cut_end += other.cut_end
        if other.events:
            if self.events is None:
                self.events = {}
            for k, v in other.events.items():
                self.events[k] = self.events.get(k, 0) + v
        for attr in ("children", "irqs"):
            mine = getattr(self, attr)
            for key, child in getattr(other, attr).items():
                child.flush()
                if key in mine:
                    mine[key].flush()
                    mine[key].merge_from(child)
                else:
                    mine[key] = child


class TraceEvent:
    """A non-graph event seen in the trace, with the call it fired in."""

    __slots__ = ("lineno", "cpu", "pid", "comm", "ts", "function", "depth", "name", "text")

    def __init__(self, lineno: int, cpu: Optional[int], pid: Optional[int], comm: Optional[str],
                 ts: Optional[float], function: Optional[str], depth: int, name: str, text: str) -> None:
        self.lineno = lineno
        self.cpu = cpu
        self.pid = pid
        self.comm = comm
        self.ts = ts
        self.function = function
        self.depth = depth
        self.name = name
        self.text = text

    def __repr__(self) -> str:
        return (f"TraceEvent(line {self.lineno}, cpu={self.cpu}, pid={self.pid}, in {self.function}"
                f" depth {self.depth}: {self.text})")


class _Task:
    """A task's open calls: `stack` holds (node, child_time) of every frame below `cur`."""

    __slots__ = ("pid", "comm", "cur", "ctime", "stack", "root", "seen", "shift", "irq_base", "irq_height",
                 "irq_run", "irq_tail")

    def __init__(self, pid: Optional[int], comm: Optional[str], root: CallNode) -> None:
        # An interrupt that lands while a function is being entered is printed one level
        # off (same depth as the function just entered, or one deeper than the frame
        # below): while such an interrupt lasts, line depths are shifted by `shift`.
        self.shift = 0
        self.irq_base = 0
        self.irq_height = 0
        self.pid = pid
        self.comm = comm
        self.cur = root
        self.ctime = 0.0
        self.stack: List[Tuple[CallNode, float]] = []
        self.root = root
        self.seen = 0
        # The frame whose current run of interrupt work (one interrupt) is going on, and the
        # frame where an irq_exit* just completed (its return path may follow).
        self.irq_run: Optional[Tuple[CallNode, bool]] = None  # (frame, irq_enter* seen)
        self.irq_tail: Optional[CallNode] = None

    _STACK = ("shift", "irq_base", "irq_height", "cur", "ctime", "stack", "irq_run", "irq_tail")

    def swap_stack(self, other: "_Task") -> None:
        for name in self._STACK:
            mine = getattr(self, name)
            setattr(self, name, getattr(other, name))
            setattr(other, name, mine)


#: on_call(what, task, cpu, node, ts, dur): what is ENTRY, LEAF, EXIT, CUT_START or CUT_END;
#: task is the opaque per-task object (its .pid and .comm may be None), the same for one
#: task's whole life; ts is the line's timestamp in seconds when the trace has one; dur in us.
CallHook = Callable[[str, "_Task", Optional[int], CallNode, Optional[float], float], None]


class _Lane:
    """Lines sharing a prologue layout and an owner (a CPU, or CPU+task with proc)."""

    __slots__ = ("cpu", "pid", "prefixes", "tend", "body_at", "irq_pending", "called")

    def __init__(self, cpu: Optional[int], pid: Optional[int]) -> None:
        self.cpu = cpu
        self.pid = pid
        self.called = False  # a call line of this lane was seen
        self.prefixes: Dict[str, float] = {}
        self.tend = 0
        self.body_at = -1
        self.irq_pending = False


_NO_MATCH: Dict[str, object] = {}
_PREFIX_CACHE_MAX = 1 << 16
MAX_EVENTS_KEPT = 10000
MAX_MALFORMED_KEPT = 50


class FuncgraphParser:
    """Feed it lines (any iterable of str), then call finish() for the CallTree.

    pid/comm restrict aggregation to matching tasks (needs a proc column, context-switch
    banners or trace-cmd). on_event gets every TraceEvent as it is seen. on_call gets every
    call as the stack changes (see CallHook); it turns the fast path off, because the
    fast path never looks at single calls.
    """

    def __init__(self, pid: Optional[int] = None, comm: Optional[str] = None,
                 on_event: Optional[Callable[[TraceEvent], None]] = None,
                 fast: bool = True, batch: int = 65536,
                 on_call: Optional["CallHook"] = None) -> None:
        self.root = CallNode("<root>")
        self._scratch = CallNode("<filtered out>")
        self.pid_filter = pid
        self.comm_filter = comm
        self.on_event = on_event
        self.on_call = on_call
        self.fast = fast and on_call is None
        self.batch = batch
        self.lines = 0
        self.kinds: Dict[str, int] = {}
        self.malformed: List[Tuple[int, str]] = []
        self.malformed_count = 0
        self.events: List[TraceEvent] = []
        self.event_count = 0
        self.lost: Dict[int, int] = {}
        self.lost_unknown = 0
        self.buffer_starts: List[int] = []
        self.overruns = 0
        self.migrations = 0
        #: exits on another CPU that end a call the kernel printed as a leaf (_false_leaf)
        self.false_leaves = 0
        self.resyncs = 0
        self.irq_shifts = 0
        #: interrupts seen: runs of interrupt work in a frame, each one interrupt
        self.interrupts = 0
        #: the first lines that are neither calls nor headers (for "not a function_graph trace")
        self.rejected: List[Tuple[int, str]] = []
        self.cut_start = 0
        self.cut_end = 0
        self.timed = True
        self.saw_pids = False
        self._nodes: List[CallNode] = [self.root]
        self._lanes: Dict[object, _Lane] = {}
        self._tasks: Dict[object, _Task] = {}
        self._anon: List[_Task] = []
        self._unnamed: List[_Task] = []  # filtered runs: tasks first seen without a name
        self._cpu_task: Dict[Optional[int], Optional[_Task]] = {}
        self._lane: Optional[_Lane] = None
        self._task: Optional[_Task] = None
        self._placeholders = 0
        self._tick = 0
        self._finished = False

    # -- hot loop ---------------------------------------------------------
    def feed(self, lines: Iterable[Union[str, bytes]]) -> None:
        """Parse lines in batches; never raises on any text.

        The cyclic garbage collector is paused meanwhile: the parser makes no reference
        cycles, so the collector's repeated passes over the growing tree are pure cost."""
        it = iter(lines)
        collecting = gc.isenabled()
        gc.disable()
        try:
            while True:
                chunk = list(islice(it, self.batch))
                if not chunk:
                    return
                self._run(chunk)
                self.lines += len(chunk)
                self._flush()
                if self.batch < 4 * len(self._nodes):
                    self.batch = 4 * len(self._nodes)
        finally:
            if collecting:
                gc.enable()

    def _run(self, chunk: List[str]) -> None:
        slow = self._slow
        lane = self._lane
        task = self._task
        pfx = lane.prefixes if (lane is not None and lane.body_at >= 0 and self.fast) else _NO_MATCH
        tend = lane.tend if lane is not None else 0
        bat = lane.body_at if lane is not None else 0
        if task is not None:
            cur, ctime, stack = task.cur, task.ctime, task.stack
        else:
            cur, ctime, stack = self.root, 0.0, []
        sh = task.shift if task is not None else 0
        if sh:
            lm, em, xk = cur.shifted_maps(sh)
        else:
            lm, em, xk = cur.leaves, cur.entries, cur.exitkey
        if lane is None or lane.irq_pending or (task is not None and task.irq_tail is not None):
            lm = em = _NO_MATCH  # see _call: these lines need the general path
            xk = None
        base = self.lines
        pos = 0
        learn = self._learn_prefix
        for line in chunk:
            dur = pfx.get(line[tend:bat])
            if dur is None and pfx is not _NO_MATCH:
                dur = learn(line)
            if dur is not None and (not tend or _time_ok(line, tend)):
                body = line[bat:]
                add = lm.get(body)
                if add is not None:  # leaf: the commonest line
                    add(dur)
                    ctime += dur
                    continue
                if body == xk:  # the current call's exit
                    cur.add(dur)
                    cur.ctotal += ctime
                    cur, ctime = stack.pop()
                    ctime += dur
                    if sh:
                        lm, em, xk = cur.shifted_maps(sh)
                    else:
                        lm, em, xk = cur.leaves, cur.entries, cur.exitkey
                    continue
                node = em.get(body)
                if node is not None:  # entry of a call with callees
                    stack.append((cur, ctime))
                    cur, ctime = node, 0.0
                    if sh:
                        lm, em, xk = node.shifted_maps(sh)
                    else:
                        lm, em, xk = node.leaves, node.entries, node.exitkey
                    continue
            # General path: save the task's state, parse the line fully, reload.
            if task is not None:
                task.cur, task.ctime = cur, ctime
            pos = chunk.index(line, pos)  # line number for reports, found only off the fast path
            slow(line, base + pos + 1)
            pos += 1
            lane = self._lane
            task = self._task
            if task is not None:
                cur, ctime, stack = task.cur, task.ctime, task.stack
            if lane is None or lane.body_at < 0 or not self.fast:
                pfx = _NO_MATCH
                tend = bat = 0
            else:
                pfx, tend, bat = lane.prefixes, lane.tend, lane.body_at
            sh = task.shift if task is not None else 0
            if task is None or lane is None or lane.irq_pending or task.irq_tail is not None:
                lm = em = _NO_MATCH
                xk = None
            elif sh:
                lm, em, xk = cur.shifted_maps(sh)
            else:
                lm, em, xk = cur.leaves, cur.entries, cur.exitkey
        if task is not None:
            task.cur, task.ctime = cur, ctime

    def _learn_prefix(self, line: AnyStr) -> Optional[float]:
        """A prefix not seen yet (usually a new duration value) in the current lane's exact
        layout: remember its duration so the body can still take the fast path."""
        lane = self._lane
        text = _text(line)
        if len(text) != len(line):
            return None
        m = _KERNEL_HEAD.match(text)
        if m is None or lane is None or m.end() != lane.body_at or m.end("tend") != lane.tend:
            return None
        dur = m.group("dur")
        if dur is None and m.group("fill") is None:
            return None
        cpu, pid = m.group("cpu"), m.group("pid")
        if (int(cpu) if cpu is not None else None) != lane.cpu or \
                (int(pid) if pid is not None else None) != lane.pid:
            return None
        prefixes = lane.prefixes
        if len(prefixes) >= _PREFIX_CACHE_MAX:
            prefixes.clear()
        value = prefixes[line[lane.tend:lane.body_at]] = float(dur) if dur is not None else 0.0
        return value

    def _flush(self) -> None:
        for node in self._nodes:
            if node.durs:
                node.flush()

    # -- general path -----------------------------------------------------
    def _slow(self, line: AnyStr, lineno: int) -> None:
        text = _text(line)
        try:
            rec = parse_line(text)
        except Exception:  # a regex surprise must not stop a capture: count it
            rec = Line(MALFORMED)
        if len(text) != len(line):  # non-ASCII bytes: column offsets differ, do not remember
            rec.cacheable = False
        kind = rec.kind
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        if kind not in CALL_KINDS and kind is not HEADER and kind is not BLANK and len(self.rejected) < 3:
            self.rejected.append((lineno, text.rstrip("\r\n")[:100]))
        if kind in CALL_KINDS:
            self._call(rec, line)
        elif kind is COMMENT or kind is EVENT:
            self._event(rec, lineno)
        elif kind is SWITCH:
            self._switch(rec)
        elif kind is IRQ_IN:
            lane = self._lane_for(rec)
            lane.irq_pending = True
            self._lane = lane
            self._task = self._task_for(rec, lane)
        elif kind is IRQ_OUT:
            lane = self._lane_for(rec)
            lane.irq_pending = False
        elif kind is LOST:
            if rec.count:
                self.lost[rec.cpu] = self.lost.get(rec.cpu, 0) + rec.count
            else:
                self.lost_unknown += 1
        elif kind is BUFFER_START:
            self.buffer_starts.append(lineno)
        elif kind is OVERRUN:
            self.overruns += rec.count
        elif kind is MALFORMED:
            self.malformed_count += 1
            if len(self.malformed) < MAX_MALFORMED_KEPT:
                self.malformed.append((lineno, text.rstrip("\r\n")[:200]))

    def _lane_for(self, rec: Line) -> _Lane:
        key: object = (rec.cpu, rec.pid) if rec.pid is not None else rec.cpu
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane(rec.cpu, rec.pid)
        return lane

    def _new_task(self, pid: Optional[int], comm: Optional[str]) -> _Task:
        """Under a pid/comm filter, a task not yet named (no proc column, before its CPU's
        first switch banner) collects calls in a root of its own: the banner that names it
        may come later, and finish() then keeps or drops them."""
        if self.pid_filter is None and self.comm_filter is None:
            return _Task(pid, comm, self.root)
        if pid is None:
            task = _Task(None, None, CallNode("<task not yet named>"))
            self._unnamed.append(task)
            return task
        return _Task(pid, comm, self.root if self._matches_filter(pid, comm) else self._scratch)

    def _task_for(self, rec: Line, lane: _Lane) -> _Task:
        if rec.pid is not None:
            self.saw_pids = True
            tkey: object = rec.pid if rec.pid != 0 else ("idle", rec.cpu)
            task = self._tasks.get(tkey)
            if task is None:
                task = self._tasks[tkey] = self._new_task(rec.pid, rec.comm)
            self._cpu_task[rec.cpu] = task
            return task
        task = self._cpu_task.get(rec.cpu)
        if task is None:
            task = self._new_task(None, None)
            self._anon.append(task)
            self._cpu_task[rec.cpu] = task
        return task

    def _switch(self, rec: Line) -> None:
        """Context-switch banner: the CPU's task so far was prev, from now on it is next."""
        self.saw_pids = True
        cpu = rec.cpu
        prev = self._cpu_task.get(cpu)
        ppid = rec.count
        if prev is not None and prev.pid is not None and prev.pid != ppid:
            named = self._tasks.get(ppid if ppid != 0 else ("idle", cpu))
            if named is not None:
                # a CPU not named yet was bound to the wrong task's stack (_continued):
                # the lines were ppid's, so each task takes the stack it really has
                named.swap_stack(prev)
        if prev is not None and prev.pid is None:
            prev.pid, prev.comm = ppid, rec.text
            if ppid not in self._tasks:
                self._tasks[ppid if ppid != 0 else ("idle", cpu)] = prev
                if prev in self._anon:
                    self._anon.remove(prev)
        tkey: object = rec.pid if rec.pid != 0 else ("idle", cpu)
        task = self._tasks.get(tkey)
        if task is None:
            task = self._tasks[tkey] = self._new_task(rec.pid, rec.comm)
        self._cpu_task[cpu] = task
        if self._lane is not None and self._lane.cpu == cpu and self._lane.pid is None:
            self._task = task

    def _matches_filter(self, pid: int, comm: Optional[str]) -> bool:
        """pid/comm filters; the proc column cuts comm to 7 characters, so a prefix matches."""
        if self.pid_filter is not None and pid != self.pid_filter:
            return False
        if self.comm_filter is not None:
            if comm is None:
                return False
            comm = comm.strip()
            if comm != self.comm_filter and not (len(comm) >= 7 and self.comm_filter.startswith(comm)):
                return False
        return True

    @staticmethod
    def _fits(task: _Task, rec: Line) -> bool:
        depth = len(task.stack) - 1
        if rec.kind is EXIT:
            if depth != rec.depth:
                return False
            return rec.tail is None or task.cur.placeholder or task.cur.name == rec.tail
        return depth == rec.depth - 1

    def _migrated(self, rec: Line, here: _Task) -> Optional[_Task]:
        """Without task ids, find the open call stack this line continues (task migration).
        A stack inside interrupt work is no candidate: an interrupt ends on its own CPU."""
        return self._open_fitting(rec, (t for t in self._all_tasks() if t is not here))

    def _open_fitting(self, rec: Line, tasks: Iterable[_Task]) -> Optional[_Task]:
        """The latest of tasks with an open stack, not inside interrupt work, that rec fits."""
        return self._latest(t for t in tasks if t.stack and not t.cur.irq and self._fits(t, rec))

    def _continued(self, rec: Line, here: _Task) -> Tuple[Optional[_Task], bool]:
        """Without a proc column, the task a line that does not fit its CPU's task goes on
        with, and whether the line only ends a leaf already counted (_false_leaf). An exit
        too short to have spanned a context switch (SWITCH_MIN_US) goes on with nobody.

        The kernel prints a banner whenever a CPU's task changes, so a CPU whose task a
        banner named is still running it: the line is that task's. A CPU not named yet
        (its first lines, or no banners at all) may be running any task: an open stack
        the line fits on another CPU (the task migrated), else another task's leaf, else
        another task's deeper open call."""
        if rec.kind is EXIT and rec.dur is not None and rec.dur < SWITCH_MIN_US:
            return None, False
        if here.pid is not None:
            if rec.kind is EXIT and self._false_leaf(rec, here):
                return here, True
            if not here.stack:  # named now, its earlier lines were on a CPU not named yet
                unnamed = self._open_fitting(rec, self._anon)
                if unnamed is not None:
                    here.swap_stack(unnamed)
                    self._forget(unnamed)
                    return here, False
            return None, False
        leaf = rec.kind is EXIT and rec.tail is not None
        other = self._migrated(rec, here)
        if other is not None:
            return other, False
        if leaf:
            other = self._latest(t for t in self._all_tasks() if t is not here and self._false_leaf(rec, t))
            if other is not None:
                return other, True
        return (self._cut_below(rec, here) if rec.kind is EXIT else None), False

    @staticmethod
    def _false_leaf(rec: Line, task: _Task) -> bool:
        """Whether this `} /* f */` ends the task's leaf `f();` in its current frame.

        The kernel prints an entry as a leaf when the next event in that CPU's buffer is a
        return of the same function by the same task; a task that slept in f and woke on
        another CPU gets a later call's return joined that way, and its own return then
        comes on the other CPU with the name in a comment. That exit ends the leaf already
        counted; it is not a call cut at the trace start. The comment is missing when that
        CPU's last entry at this depth was the same function (another task's), so a task a
        banner named may end any leaf of its frame."""
        return bool(task.stack) and not task.cur.irq and len(task.stack) == rec.depth \
            and (rec.tail in task.cur.children if rec.tail is not None else bool(task.cur.children))

    def _cut_below(self, rec: Line, here: _Task) -> Optional[_Task]:
        """Without task names, the task this exit continues once its deeper open calls are
        cut: their returns went into leaves the kernel joined on this CPU (_false_leaf).
        Only when the line's own CPU has no open call to resync with, and printed calls
        before (the first lines of a CPU whose buffer began later are calls cut there)."""
        if here.stack or not self._lanes[rec.cpu].called:
            return None

        def holds(task: _Task) -> bool:
            if task is here or len(task.stack) - 1 <= rec.depth or task.cur.irq:
                return False
            frame = task.stack[rec.depth + 1][0]
            return not frame.irq and (rec.tail is None or frame.name == rec.tail)
        return self._latest(t for t in self._all_tasks() if holds(t))

    def _all_tasks(self) -> List[_Task]:
        return list(self._tasks.values()) + self._anon

    @staticmethod
    def _latest(tasks: Iterable[_Task]) -> Optional[_Task]:
        return max(tasks, key=lambda t: t.seen, default=None)

    def _unbind(self, task: _Task) -> None:
        for c, bound in list(self._cpu_task.items()):
            if bound is task:
                self._cpu_task[c] = None

    def _forget(self, task: _Task) -> None:
        """A task no CPU runs any more and whose stack went elsewhere."""
        self._unbind(task)
        if task in self._anon:
            self._anon.remove(task)

    def _bind(self, cpu: Optional[int], task: _Task, left: _Task) -> None:
        """The task goes on on this CPU; the stack it left there, if empty, is forgotten."""
        self._unbind(task)
        if not left.stack:
            self._forget(left)
        self._cpu_task[cpu] = task

    def _irq_start(self, rec: Line, lane: _Lane) -> bool:
        return rec.kind is not EXIT and (lane.irq_pending or is_irq_entry(rec.name))

    def _shifted(self, task: _Task, rec: Line, lane: _Lane) -> bool:
        """Apply or end an off-by-one interrupt region (see _Task), or start one (True).

        Whether a line is inside a region depends only on its text and the node it
        follows, so region lines are remembered per node and shift (shifted_maps); the
        line that starts a region is never remembered."""
        if task.shift:
            d = rec.depth
            base = task.irq_base
            inside = d > base or (d == base and (
                len(task.stack) > task.irq_height if rec.kind is EXIT else
                self._irq_start(rec, lane) or (task.irq_tail is task.cur and rec.name in IRQ_RETURN_NAMES)))
            if inside:
                rec.depth = d + task.shift
                return False
            task.shift = 0
        if self._irq_start(rec, lane) and not self._fits(task, rec) and not task.cur.irq:
            shift = len(task.stack) - rec.depth
            if shift in (-1, 1):
                task.shift, task.irq_base, task.irq_height = shift, rec.depth, len(task.stack)
                rec.depth += shift
                self.irq_shifts += 1
                return True
        return False

    def _call(self, rec: Line, line: str) -> None:
        if not rec.timed:
            self.timed = False
        lane = self._lane_for(rec)
        task = self._task_for(rec, lane)
        started = self._shifted(task, rec, lane)
        if not self._fits(task, rec):
            other, ended = self._continued(rec, task) if rec.pid is None else (None, False)
            if other is not None and other is not task:
                self.migrations += 1
                self._bind(rec.cpu, other, task)
            if ended:
                self.false_leaves += 1
                lane.called = True
                self._tick += 1
                other.seen = self._tick
                self._lane, self._task = lane, other
                return
            if other is not None:
                task = other
                if not self._fits(task, rec):
                    self._resync(task, rec)
            else:
                self.resyncs += 1
                self._resync(task, rec)
        self._tick += 1
        task.seen = self._tick
        lane.called = True
        self._lane, self._task = lane, task
        cacheable = rec.cacheable and rec.dialect == "kernel" and not lane.irq_pending and not started
        if cacheable:
            if lane.body_at != rec.body_at or lane.tend != rec.tend:
                lane.prefixes.clear()
                lane.body_at, lane.tend = rec.body_at, rec.tend
            if len(lane.prefixes) >= _PREFIX_CACHE_MAX:
                lane.prefixes.clear()
            lane.prefixes[line[rec.tend:rec.body_at]] = rec.dur
        cur = task.cur
        maps = cur.shifted_maps(task.shift) if task.shift else None
        dur = rec.dur if rec.dur is not None else 0.0
        if rec.kind is EXIT:
            node = cur
            if node.placeholder:
                node = self._name_placeholder(task, rec)
                node.cut_start += 1
                self.cut_start += 1
            node.add(dur)
            node.ctotal += task.ctime
            if self.on_call is not None:
                self._report(EXIT, task, rec.cpu, node, rec.ts, dur)
            task.cur, task.ctime = task.stack.pop()
            task.ctime += dur
            if task.irq_tail is node:
                task.irq_tail = None  # the frame the return path ran in has ended
            elif node.name in IRQ_EXIT_NAMES and node.irq and not task.cur.irq:
                task.irq_tail = task.cur
            if cacheable and node.name not in IRQ_EXIT_NAMES:
                body = line[rec.body_at:]
                if maps is not None:
                    if node is cur and maps[2] is None:
                        maps[2] = body
                elif node.exitkey is None:
                    node.exitkey = body
            return
        name = rec.name or "?"
        irq = lane.irq_pending or (not cur.irq and is_irq_entry(name))
        if task.irq_tail is cur:
            if name in IRQ_RETURN_NAMES:
                irq = irq or not cur.irq
            else:
                task.irq_tail = None
        lane.irq_pending = False
        top_irq = irq and not cur.irq
        if top_irq:
            self._count_interrupt(task, cur, name)
        elif name == "irq_enter_rcu" and cur.irq:
            self.interrupts += 1  # x86 enters every interrupt here: one nested in interrupt work
        node = self._child(cur, name, rec.module, irq)
        if self.on_call is not None:
            self._report(rec.kind, task, rec.cpu, node, rec.ts, dur)
        # interrupt entries are counted, and the return path is told apart, only here
        remember = cacheable and not top_irq and name not in _CONTEXT_NAMES
        if rec.kind is LEAF:
            node.add(dur)
            task.ctime += dur
            if top_irq and name in IRQ_EXIT_NAMES:
                task.irq_tail = cur
            if remember:
                (maps[0] if maps is not None else cur.leaves)[line[rec.body_at:]] = node.add
        else:
            task.stack.append((cur, task.ctime))
            task.cur, task.ctime = node, 0.0
            if remember:
                (maps[1] if maps is not None else cur.entries)[line[rec.body_at:]] = node

    def _count_interrupt(self, task: _Task, frame: CallNode, name: str) -> None:
        """One interrupt per run of interrupt work in a frame: x86 shows irq_enter*, the
        handler and irq_exit* side by side, older x86, arm64 and Xen one handler with the
        rest inside. An irq_exit* or handler with no irq_enter* before it is an interrupt
        whose start the trace lost (a handler is followed by its own irq_exit*)."""
        run = task.irq_run
        here = run is not None and run[0] is frame
        if name in IRQ_EXIT_NAMES:
            if not here:
                self.interrupts += 1
            task.irq_run = None
        elif name in IRQ_RETURN_NAMES:
            return
        elif name.startswith("irq_enter"):
            self.interrupts += 1
            task.irq_run = (frame, True)
        elif not (here and run[1]):  # type: ignore[index]
            self.interrupts += 1
            task.irq_run = (frame, False)

    def _report(self, what: str, task: _Task, cpu: Optional[int], node: CallNode, ts: Optional[float],
                dur: float) -> None:
        """on_call, for the calls the tree counts (a pid/comm filter's other tasks stay out)."""
        if task.root is self.root:
            self.on_call(what, task, cpu, node, ts, dur)  # type: ignore[misc]

    def _child(self, parent: CallNode, name: object, module: Optional[str], irq: bool) -> CallNode:
        table = parent.irqs if irq and not parent.irq else parent.children
        node = table.get(name)
        if node is None:
            node = table[name] = CallNode(name if isinstance(name, str) else "?", module,
                                          irq or parent.irq)
            self._nodes.append(node)
        elif module and not node.module:
            node.module = module
        return node

    def _resync(self, task: _Task, rec: Line) -> None:
        """Make the stack fit a line whose calls were partly lost or cut by the buffer."""
        target = rec.depth if rec.kind is EXIT else rec.depth - 1
        while len(task.stack) - 1 > target:
            self._cut_end(task)
        if rec.kind is EXIT and len(task.stack) - 1 == target and rec.tail is not None \
                and not task.cur.placeholder and task.cur.name != rec.tail:
            self._cut_end(task)
        while len(task.stack) - 1 < target:
            self._placeholders += 1
            node = self._child(task.cur, ("?", self._placeholders), None, False)
            node.placeholder = True
            if self.on_call is not None:
                self._report(CUT_START, task, rec.cpu, node, None, 0.0)
            task.stack.append((task.cur, task.ctime))
            task.cur, task.ctime = node, 0.0

    def _cut_end(self, task: _Task) -> None:
        """Pop a frame whose exit never appeared: counted as a call, no time."""
        node = task.cur
        if node.placeholder:
            node = self._name_placeholder(task, None)
            node.cut_start += 1
            self.cut_start += 1
        node.calls += 1
        node.cut_end += 1
        self.cut_end += 1
        if self.on_call is not None:
            self._report(CUT_END, task, None, node, None, 0.0)
        task.cur, task.ctime = task.stack.pop()

    def _name_placeholder(self, task: _Task, rec: Optional[Line]) -> CallNode:
        """A frame opened before the trace began is closing: give it its name (tail) or '?'."""
        node = task.cur
        parent = task.stack[-1][0]
        name = rec.tail if rec is not None and rec.tail else "?"
        module = rec.module if rec is not None else None
        for table in (parent.children, parent.irqs):
            for key, child in list(table.items()):
                if child is node:
                    del table[key]
        node.flush()
        irq = not parent.irq and IRQ_ENTRY.match(name) is not None
        if irq:  # an interrupt already running when the trace began
            counted = bool(node.irqs)  # an irq_exit* inside it was taken for one already
            _into_interrupt(node)
            if counted:
                task.irq_run = None if name in IRQ_EXIT_NAMES else (parent, False)
            else:
                self._count_interrupt(task, parent, name)
        table = parent.irqs if irq else parent.children
        existing = table.get(name)
        node.placeholder = False
        node.leaves, node.entries, node.exitkey, node.smaps = {}, {}, None, None
        if existing is None:
            node.name, node.module = name, module
            node.irq = irq or parent.irq
            table[name] = node
            return node
        existing.flush()
        existing.merge_from(node)
        node.calls = 0
        node.total = node.ctotal = node.max = 0.0
        node.children, node.irqs = {}, {}
        task.cur = existing
        return existing

    def _event(self, rec: Line, lineno: int) -> None:
        lane = self._lane_for(rec) if rec.cpu is not None or rec.pid is not None else self._lane
        task = None
        if lane is not None:
            task = self._task_for(rec, lane)
        function = None
        depth = -1
        node = None
        if task is not None:
            node = task.cur
            depth = len(task.stack) - 1
            function = node.name if node is not task.root else None
        text = rec.text or ""
        name = rec.name or (text.split(":", 1)[0] if ":" in text and " " not in text.split(":", 1)[0]
                            else "message")
        event = TraceEvent(lineno, rec.cpu, task.pid if task else rec.pid, task.comm if task else rec.comm,
                           rec.ts, function, depth, name, text)
        self.event_count += 1
        if node is not None and (task is None or task.root is self.root):
            if node.events is None:
                node.events = {}
            node.events[name] = node.events.get(name, 0) + 1
        if len(self.events) < MAX_EVENTS_KEPT:
            self.events.append(event)
        if self.on_event is not None:
            self.on_event(event)

    # -- end --------------------------------------------------------------
    def finish(self) -> "CallTree":
        """Close every open call as cut at the end of the trace and return the tree."""
        if not self._finished:
            self._finished = True
            for task in list(self._tasks.values()) + self._anon + self._unnamed:
                while task.stack:
                    self._cut_end(task)
            self._flush()
            for task in self._unnamed:
                named = task.pid is not None and self._matches_filter(task.pid, task.comm)
                (self.root if named else self._scratch).merge_from(task.root)
        return CallTree(self.root, self)


def _into_interrupt(top: CallNode) -> None:
    """A subtree turns out to run in interrupt context: every node is interrupt work, and
    what was kept apart as interrupts inside it is its own calls (as _child files them)."""
    for node in list(top.walk()):
        node.irq = True
        for key, child in list(node.irqs.items()):
            del node.irqs[key]
            child.flush()
            if key in node.children:
                node.children[key].flush()
                node.children[key].merge_from(child)
            else:
                node.children[key] = child


def _text(line: AnyStr) -> str:
    return line.decode("utf-8", "replace") if isinstance(line, bytes) else line


def _time_ok(line: AnyStr, tend: int) -> bool:
    """Fast-path check of the abs/rel time columns the prefix cache skips over."""
    text = _text(line[:tend])
    return text[tend - 3:tend] == "|  " and not text[:tend - 4].strip(" 0123456789.us|")


class CallTree:
    """The aggregated calls of one trace, plus what the parser had to say about it."""

    def __init__(self, root: CallNode, parser: FuncgraphParser) -> None:
        self.root = root
        self.parser = parser

    def nodes(self) -> Iterator[CallNode]:
        return (n for n in self.root.walk() if n is not self.root)

    @property
    def filtered_out(self) -> bool:
        """Calls were seen but all belonged to tasks the pid/comm filter dropped."""
        scratch = self.parser._scratch
        return bool(scratch.children or scratch.irqs)

    def is_empty(self) -> bool:
        return not self.root.children and not self.root.irqs


def parse_lines(lines: Iterable[Union[str, bytes]], **options: object) -> CallTree:
    """Parse an iterable of lines (str, or bytes as read from a file in binary mode: no
    decoding on the fast path) into a CallTree (options: see FuncgraphParser)."""
    parser = FuncgraphParser(**options)  # type: ignore[arg-type]
    parser.feed(lines)
    return parser.finish()


def parse_file(path: str, **options: object) -> CallTree:
    """Parse a saved trace file (read as bytes; undecodable bytes are replaced, never fatal)."""
    with open(path, "rb") as fh:
        return parse_lines(fh, **options)

"""Call graphs built from a parsed trace: networkx DiGraph, pruning, and the output formats.

The calling-context tree (funcgraph.CallNode) is the aggregate: one node per call
path, so memory is O(distinct paths). The DiGraph folds paths into one node per
function and one edge per caller->callee pair. Interrupt work is kept apart all the
way: in the tree it hangs in `irqs` (never among a function's own callees), in the
DiGraph it is counted in separate `irq_*` edge attributes.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import networkx as nx

from discover.errors import UserError, run_child
from discover.funcgraph import CallNode

FORMAT_VERSION = 1


# ---------------------------------------------------------------------------
# Selecting and pruning.

def _copy(node: CallNode) -> CallNode:
    twin = CallNode(node.name, node.module, node.irq)
    twin.calls, twin.total, twin.ctotal, twin.max = node.calls, node.total, node.ctotal, node.max
    twin.cut_start, twin.cut_end = node.cut_start, node.cut_end
    twin.events = dict(node.events) if node.events else None
    return twin


def _clone(node: CallNode) -> CallNode:
    twin = _copy(node)
    for table, out in ((node.children, twin.children), (node.irqs, twin.irqs)):
        for key, child in table.items():
            out[key] = _clone(child)
    return twin


def select(root: CallNode, functions: Sequence[str]) -> CallNode:
    """A new root whose children are the merged subtrees of every outermost call of each
    function (wherever it sits in the trace). Raises LookupError for a function the trace
    never calls."""
    found: Dict[str, CallNode] = {}
    wanted = set(functions)

    def visit(node: CallNode, inside: frozenset) -> None:
        for table in (node.children, node.irqs):
            for child in table.values():
                if child.name in wanted and child.name not in inside:
                    twin = _clone(child)
                    twin.irq = False
                    if child.name in found:
                        found[child.name].merge_from(twin)
                    else:
                        found[child.name] = twin
                    visit(child, inside | {child.name})
                else:
                    visit(child, inside)

    visit(root, frozenset())
    missing = [f for f in functions if f not in found]
    if missing:
        top = sorted({c.name for c in root.children.values()})
        raise LookupError(f"{', '.join(missing)} not called in this trace "
                          f"(top-level functions: {', '.join(top[:8]) or 'none'})")
    new_root = CallNode("<root>")
    for name in functions:
        new_root.children[name] = found[name]
    return new_root


def prune(root: CallNode, max_depth: Optional[int] = None, min_time: float = 0.0,
          min_calls: int = 0) -> CallNode:
    """Copy of the tree without paths deeper than max_depth (roots are depth 0), nor
    nodes under min_time microseconds total or min_calls calls."""
    def keep(node: CallNode) -> bool:
        return node.total >= min_time and node.calls >= min_calls

    def visit(node: CallNode, depth: int) -> CallNode:
        twin = _copy(node)
        if max_depth is not None and depth >= max_depth:
            return twin
        for table, out in ((node.children, twin.children), (node.irqs, twin.irqs)):
            for key, child in table.items():
                if keep(child):
                    out[key] = visit(child, depth + 1)
        return twin

    new_root = _copy(root)
    for table, out in ((root.children, new_root.children), (root.irqs, new_root.irqs)):
        for key, child in table.items():
            if keep(child):
                out[key] = visit(child, 0)
    return new_root


# ---------------------------------------------------------------------------
# The DiGraph.

def to_digraph(root: CallNode, **graph_attrs: Any) -> nx.DiGraph:
    """One node per function, one edge per caller->callee pair, summed over all paths.

    Node: calls, total_us (outermost calls only, so recursion is not counted twice),
    self_us, max_us, all_us (every timed call's time, recursive ones too), timed_calls
    (calls with an exit), module, min_depth, irq (seen only as interrupt work), cut_start,
    cut_end, events. Edge: calls, total_us, avg_us, max_us for direct calls;
    irq_calls, irq_total_us, irq_max_us for interrupts that hit the caller.
    """
    graph = nx.DiGraph(**graph_attrs)
    graph.graph["roots"] = sorted({n.name for n in root.children.values()} |
                                  {n.name for n in root.irqs.values()})

    def add_node(node: CallNode, depth: int, recursive: bool) -> None:
        if node.name not in graph:
            graph.add_node(node.name, calls=0, total_us=0.0, self_us=0.0, max_us=0.0, all_us=0.0,
                           timed_calls=0, module=node.module, min_depth=depth, irq=True, cut_start=0,
                           cut_end=0, events={})
        attrs = graph.nodes[node.name]
        attrs["calls"] += node.calls
        attrs["timed_calls"] += node.calls - node.cut_end
        attrs["all_us"] += node.total
        if not recursive:
            attrs["total_us"] += node.total
        attrs["self_us"] += node.self_time
        attrs["max_us"] = max(attrs["max_us"], node.max)
        attrs["min_depth"] = min(attrs["min_depth"], depth)
        attrs["irq"] = attrs["irq"] and node.irq
        attrs["cut_start"] += node.cut_start
        attrs["cut_end"] += node.cut_end
        if node.module and not attrs["module"]:
            attrs["module"] = node.module
        for name, count in (node.events or {}).items():
            attrs["events"][name] = attrs["events"].get(name, 0) + count

    def add_edge(caller: str, node: CallNode, interrupt: bool) -> None:
        if not graph.has_edge(caller, node.name):
            graph.add_edge(caller, node.name, calls=0, total_us=0.0, max_us=0.0,
                           irq_calls=0, irq_total_us=0.0, irq_max_us=0.0)
        attrs = graph.edges[caller, node.name]
        prefix = "irq_" if interrupt else ""
        attrs[prefix + "calls"] += node.calls
        attrs[prefix + "total_us"] += node.total
        attrs[prefix + "max_us"] = max(attrs[prefix + "max_us"], node.max)

    def visit(node: CallNode, depth: int, open_names: Dict[str, int]) -> None:
        for interrupt, table in ((False, node.children), (True, node.irqs)):
            for child in table.values():
                add_node(child, depth + 1, open_names.get(child.name, 0) > 0)
                if node is not root:
                    add_edge(node.name, child, interrupt)
                open_names[child.name] = open_names.get(child.name, 0) + 1
                visit(child, depth + 1, open_names)
                open_names[child.name] -= 1

    visit(root, -1, {})
    for _, _, attrs in graph.edges(data=True):
        attrs["avg_us"] = attrs["total_us"] / attrs["calls"] if attrs["calls"] else 0.0
        attrs["kind"] = ("call+interrupt" if attrs["calls"] and attrs["irq_calls"]
                         else "interrupt" if attrs["irq_calls"] else "call")
    return graph


# ---------------------------------------------------------------------------
# Output formats.

def fmt_us(us: float) -> str:
    """Human time from microseconds."""
    if us >= 1e6:
        return f"{us / 1e6:.3g} s"
    if us >= 1e3:
        return f"{us / 1e3:.3g} ms"
    return f"{us:.3g} us"


def _label(node: CallNode) -> str:
    name = node.name + (f" [{node.module}]" if node.module else "")
    parts = [f"{node.calls}x"]
    timed = node.calls - node.cut_end
    if node.total:
        parts.append(f"total {fmt_us(node.total)}")
        if timed > 0:
            parts.append(f"avg {fmt_us(node.total / timed)}")
        if node.ctotal:
            parts.append(f"self {fmt_us(node.self_time)}")
    if node.cut_start:
        parts.append(f"{node.cut_start} cut at trace start")
    if node.cut_end:
        parts.append(f"{node.cut_end} cut at trace end")
    if node.events:
        parts.append("events: " + ", ".join(f"{k} x{v}" for k, v in sorted(node.events.items())))
    return f"{name}  " + "  ".join(parts)


def _heaviest(table: Dict[object, CallNode]) -> List[CallNode]:
    return sorted(table.values(), key=lambda n: (-n.total, -n.calls, n.name))


def render_tree(root: CallNode, title: str, expand_irqs: bool = False) -> Any:
    """A rich Tree: own callees heaviest first; interrupt work in its own branch under the
    function it interrupted (collapsed to the handlers unless expand_irqs)."""
    from rich.markup import escape
    from rich.tree import Tree

    tree = Tree(escape(title))

    def add(branch: Any, node: CallNode, irq_depth: Optional[int]) -> None:
        for child in _heaviest(node.children):
            style = "" if not child.irq else "dim "
            sub = branch.add(f"[{style}bold]{escape(child.name)}[/]" + escape(_label(child)[len(child.name):]))
            if irq_depth is None or expand_irqs:
                add(sub, child, irq_depth)
        if node.irqs:
            calls = sum(n.calls for n in node.irqs.values())
            total = sum(n.total for n in node.irqs.values())
            irq_branch = branch.add(f"[yellow]interrupt work[/] ({calls} calls, {fmt_us(total)}; "
                                    "not part of this function's own calls)")
            for child in _heaviest(node.irqs):
                sub = irq_branch.add(f"[yellow]{escape(child.name)}[/]" + escape(_label(child)[len(child.name):]))
                if expand_irqs:
                    add(sub, child, 1)

    add(tree, root, None)
    return tree


def to_node_link(graph: nx.DiGraph) -> Dict[str, Any]:
    """networkx node-link layout (readable by nx.node_link_graph), written without the
    helper so networkx 2.5 (Debian bullseye) and 3.x produce the same file."""
    return {
        "directed": True,
        "multigraph": False,
        "graph": dict(graph.graph, format="probekit-callgraph", version=FORMAT_VERSION),
        "nodes": [dict(attrs, id=name) for name, attrs in graph.nodes(data=True)],
        "links": [dict(attrs, source=u, target=v) for u, v, attrs in graph.edges(data=True)],
    }


def to_json(graph: nx.DiGraph) -> str:
    return json.dumps(to_node_link(graph), indent=1, sort_keys=True)


def _dot_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


#: Functions a DOT/SVG picture draws unless told otherwise: a full read graph (hundreds of
#: functions) stays readable at this size; --max-nodes 0 draws everything.
DEFAULT_MAX_NODES = 60


def prune_graph(graph: nx.DiGraph, max_nodes: int) -> Tuple[nx.DiGraph, Optional[str]]:
    """The heaviest max_nodes functions (by total time, then calls) still connected to a
    root, and a one-line note on what was left out (None when nothing was)."""
    if max_nodes <= 0 or graph.number_of_nodes() <= max_nodes:
        return graph, None
    ranked = sorted(graph.nodes, key=lambda n: (-graph.nodes[n]["total_us"], -graph.nodes[n]["calls"], n))
    chosen = set(ranked[:max_nodes])
    sub = graph.subgraph(chosen)
    kept = set()
    for root in graph.graph.get("roots", []):
        if root in sub:
            kept |= {root} | nx.descendants(sub, root)
    if not kept:  # no root among the heaviest: keep them as they are
        kept = chosen
    left = [n for n in graph.nodes if n not in kept]
    calls = sum(graph.nodes[n]["calls"] for n in left)
    top = max(graph.nodes[n]["total_us"] for n in left)
    note = (f"{len(left)} of {graph.number_of_nodes()} functions left out ({calls} calls; the heaviest "
            f"of them took {fmt_us(top)} in total); --max-nodes 0 draws them all")
    pruned = graph.subgraph(kept).copy()
    return pruned, note


def _share_colour(share: float) -> str:
    """White (no self time) to full red (the largest self-time share), as Graphviz HSV."""
    return f"0.000 {min(max(share, 0.0), 1.0):.3f} 1.000"


def to_dot(graph: nx.DiGraph, note: Optional[str] = None) -> str:
    """Graphviz DOT: node colour by its share of all self time, edge width by time;
    interrupt-only functions in a cluster of their own, interrupt edges dashed."""
    lines = ["digraph callgraph {", "  rankdir=LR;",
             '  node [shape=box, fontname="monospace", fontsize=10, style=filled, fillcolor=white];',
             '  edge [fontname="monospace", fontsize=9];']
    if note:
        lines.append(f"  labelloc=b; label={_dot_quote(note)};")
    self_total = sum(a["self_us"] for _, a in graph.nodes(data=True)) or 1.0
    top_share = max((a["self_us"] / self_total for _, a in graph.nodes(data=True)), default=0.0) or 1.0
    top_edge = max((a["total_us"] + a["irq_total_us"] for _, _, a in graph.edges(data=True)), default=0.0) or 1.0

    def node_line(name: str, attrs: Dict[str, Any]) -> str:
        mod = f" [{attrs['module']}]" if attrs.get("module") else ""
        share = attrs["self_us"] / self_total
        label = f"{name}{mod}\n{attrs['calls']} calls, {fmt_us(attrs['total_us'])}, self {share:.0%}"
        return (f"{_dot_quote(name)} [label={_dot_quote(label)}, "
                f"fillcolor={_dot_quote(_share_colour(share / top_share))}];")

    irq_only = [(n, a) for n, a in graph.nodes(data=True) if a.get("irq")]
    for name, attrs in graph.nodes(data=True):
        if not attrs.get("irq"):
            lines.append("  " + node_line(name, attrs))
    if irq_only:
        lines += ["  subgraph cluster_interrupts {",
                  '    label="interrupt work (not the callers\' own calls)"; style=dashed; color=orange;']
        lines += ["    " + node_line(name, attrs) for name, attrs in irq_only]
        lines.append("  }")
    for u, v, attrs in graph.edges(data=True):
        if attrs["calls"]:
            label = f"{attrs['calls']}x {fmt_us(attrs['total_us'])}"
            width = 1 + 5 * (attrs["total_us"] / top_edge) ** 0.5
            lines.append(f"  {_dot_quote(u)} -> {_dot_quote(v)} [label={_dot_quote(label)}, penwidth={width:.2f}];")
        if attrs["irq_calls"]:
            label = f"irq {attrs['irq_calls']}x {fmt_us(attrs['irq_total_us'])}"
            width = 1 + 5 * (attrs["irq_total_us"] / top_edge) ** 0.5
            lines.append(f"  {_dot_quote(u)} -> {_dot_quote(v)} "
                         f"[label={_dot_quote(label)}, style=dashed, color=orange, penwidth={width:.2f}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_svg(dot_text: str) -> bytes:
    """Render DOT with Graphviz; RuntimeError with a one-line reason when it cannot."""
    dot = shutil.which("dot")
    if dot is None:
        raise RuntimeError("SVG needs Graphviz `dot` (apt-get install graphviz); "
                           "or use --format dot and render it elsewhere")
    proc = run_child([dot, "-Tsvg"], input=dot_text.encode(), stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE)  # its own process group: ended if we are
    if proc.returncode != 0:
        reason = proc.stderr.decode(errors="replace").strip().splitlines()
        raise RuntimeError(f"dot failed: {reason[0] if reason else 'exit ' + str(proc.returncode)}")
    return proc.stdout


def folded(root: CallNode) -> Iterator[str]:
    """Folded stacks (flamegraph.pl / speedscope): `a;b;c <self time in ns>` per call
    path; interrupt work appears under a `[irq]` frame of the function it hit."""
    def visit(node: CallNode, path: Tuple[str, ...]) -> Iterator[str]:
        for interrupt, table in ((False, node.children), (True, node.irqs)):
            for child in table.values():
                here = path + (("[irq]",) if interrupt else ()) + (child.name,)
                value = round(child.self_time * 1000)
                if value > 0:
                    yield ";".join(here) + f" {value}"
                yield from visit(child, here)

    return visit(root, ())


PROFILE_SORTS = ("total", "self", "calls", "avg", "max", "name")


def profile(graph: nx.DiGraph, sort: str = "total") -> List[Dict[str, Any]]:
    """Per-function totals over every call path (the flat view of `perf ftrace profile`):
    calls, total (outermost calls), self, avg and max per timed call, heaviest first."""
    rows = []
    for name, a in graph.nodes(data=True):
        avg = a["all_us"] / a["timed_calls"] if a["timed_calls"] else 0.0
        rows.append(dict(function=name, module=a.get("module"), calls=a["calls"], total_us=a["total_us"],
                         self_us=a["self_us"], avg_us=avg, max_us=a["max_us"], irq=a["irq"],
                         cut_start=a["cut_start"], cut_end=a["cut_end"]))
    if sort == "name":
        rows.sort(key=lambda r: r["function"])
    else:
        key = "calls" if sort == "calls" else f"{sort}_us"
        rows.sort(key=lambda r: (-r[key], r["function"]))
    return rows


def render_profile(rows: List[Dict[str, Any]], note: str) -> str:
    """The profile as an aligned text table; interrupt-only functions are marked (irq)."""
    out = [f"# {note}", f"# {'total':>10} {'self':>10} {'avg':>10} {'max':>10} {'calls':>8}  function"]
    for r in rows:
        name = r["function"] + (f" [{r['module']}]" if r["module"] else "") + ("  (irq)" if r["irq"] else "")
        cut = r["cut_start"] + r["cut_end"]
        if cut:
            name += f"  ({cut} cut by the trace's start or end)"
        out.append(f"  {fmt_us(r['total_us']):>10} {fmt_us(r['self_us']):>10} {fmt_us(r['avg_us']):>10} "
                   f"{fmt_us(r['max_us']):>10} {r['calls']:>8}  {name}")
    return "\n".join(out) + "\n"


class ChromeTrace:
    """Trace Event Format (the JSON the Perfetto UI, chrome://tracing and speedscope open),
    built from the parser's call stream: FuncgraphParser(on_call=chrome.on_call).

    One complete ("X") slice per call with an exit; a call the trace's end cut is a begin
    ("B") slice without end. Each task's own calls nest on the task's track (without a
    proc column: one track per CPU); interrupt work goes to a separate "interrupt work"
    process, one track per CPU. Timestamps are the trace's (abstime column, trace-cmd)
    or, without any, laid out back to back from the durations (`synthetic_time`).
    With `functions`, only calls inside one of them (as named at its entry) are kept.
    """

    TASKS_PID = 1
    IRQ_PID = 2

    def __init__(self, functions: Sequence[str] = ()) -> None:
        self.functions = set(functions)
        self.synthetic_time = False
        self._slices: Dict[int, List[Dict[str, Any]]] = {}   # tid -> events
        self._open: List[Dict[str, Any]] = []               # B events (cut at trace end)
        self._frames: Dict[int, List[list]] = {}            # id(task) -> [start, irq, inside, cpu]
        self._clock: Dict[int, float] = {}
        self._tracks: Dict[Tuple[Any, ...], int] = {}
        self._names: Dict[int, Tuple[int, str]] = {}

    def _track(self, task: Any, cpu: Optional[int], irq: bool) -> Tuple[int, int]:
        if irq:
            key: Tuple[Any, ...] = ("irq", cpu)
            label = f"cpu{cpu}" if cpu is not None else "cpu ?"
        elif task.pid is not None:
            key = ("task", task.pid, cpu if task.pid == 0 else None)
            label = f"{(task.comm or '').strip() or '?'}-{task.pid}" + (f" (cpu{cpu})" if task.pid == 0 else "")
        else:
            key = ("task", id(task))
            label = "task not shown (no funcgraph-proc)" + (f", first on cpu{cpu}" if cpu is not None else "")
        tid = self._tracks.get(key)
        if tid is None:
            tid = self._tracks[key] = len(self._tracks) + 1
            self._names[tid] = (self.IRQ_PID if irq else self.TASKS_PID, label)
        return (self.IRQ_PID if irq else self.TASKS_PID), tid

    def on_call(self, what: str, task: Any, cpu: Optional[int], node: CallNode,
                ts: Optional[float], dur: float) -> None:
        from discover.funcgraph import CUT_END, CUT_START, ENTRY, EXIT, LEAF

        key = id(task)
        frames = self._frames.setdefault(key, [])
        if ts is None:
            self.synthetic_time = self.synthetic_time or what in (ENTRY, LEAF, EXIT)
            now = self._clock.get(key, 0.0)
        else:
            now = ts * 1e6
        outer = frames[-1] if frames else None
        inside = outer[2] if outer else not self.functions
        if what is ENTRY or what is CUT_START:
            here = inside or (what is ENTRY and node.name in self.functions)
            if cpu is None and outer is not None:
                cpu = outer[3]
            frames.append([now, what is ENTRY, here, cpu])
            return
        if what is LEAF:
            if inside or node.name in self.functions:
                self._emit(task, cpu, node, "X", now, dur, {})
            self._clock[key] = now + dur
            return
        if not frames:
            return
        start, known, here, fcpu = frames.pop()
        if what is CUT_END:
            if here and known:
                self._emit(task, fcpu, node, "B", start, 0.0, {"cut": "no exit before trace end"})
            return
        if ts is None:  # laid out: the call spans its callees and at least its own duration
            end = max(start + dur, now)
            dur = end - start
        elif not known:
            start = now - dur
        self._clock[key] = start + dur
        if here or node.name in self.functions:
            self._emit(task, fcpu, node, "X", start, dur, {} if known else {"cut": "entry before trace start"})

    def _emit(self, task: Any, cpu: Optional[int], node: CallNode, ph: str, ts: float, dur: float,
              args: Dict[str, Any]) -> None:
        pid, tid = self._track(task, cpu, node.irq)
        event: Dict[str, Any] = dict(name=node.name, cat="interrupt" if node.irq else "call", ph=ph,
                                     ts=round(ts, 3), pid=pid, tid=tid)
        if ph == "X":
            event["dur"] = round(dur, 3)
        if node.module:
            args = dict(args, module=node.module)
        if args:
            event["args"] = args
        (self._open if ph == "B" else self._slices.setdefault(tid, [])).append(event)

    def events(self) -> List[Dict[str, Any]]:
        """Metadata, then each track's slices sorted and nested (a slice that would end after
        the one enclosing it, by the printed durations' rounding, is trimmed to fit)."""
        out: List[Dict[str, Any]] = []
        for pid, name in ((self.TASKS_PID, "tasks"), (self.IRQ_PID, "interrupt work")):
            out.append(dict(name="process_name", ph="M", pid=pid, tid=0, args={"name": name}))
        for tid, (pid, label) in sorted(self._names.items()):
            out.append(dict(name="thread_name", ph="M", pid=pid, tid=tid, args={"name": label}))
        for tid, slices in sorted(self._slices.items()):
            slices.sort(key=lambda e: (e["ts"], -e["dur"]))
            ends: List[float] = []
            for event in slices:
                while ends and ends[-1] <= event["ts"]:
                    ends.pop()
                if ends and event["ts"] + event["dur"] > ends[-1]:
                    event["dur"] = round(ends[-1] - event["ts"], 3)
                ends.append(event["ts"] + event["dur"])
                out.append(event)
        out.extend(self._open)
        return out

    def to_json(self, note: str) -> str:
        data = {"traceEvents": self.events(), "displayTimeUnit": "ns",
                "otherData": {"producer": "probekit discover callgraph", "summary": note,
                              "timestamps": "synthetic (laid out from durations)" if self.synthetic_time
                              else "from the trace"}}
        return json.dumps(data, separators=(",", ":")) + "\n"


# ---------------------------------------------------------------------------
# Saved graphs and diffs.

def load_json(text: str, origin: str = "<call graph>") -> nx.DiGraph:
    """Read a graph written by to_json ("links", or networkx 3.4's "edges"); ValueError when
    it is not JSON, UserError naming the first bad field when it is not a probekit call graph."""
    from discover.schema import (CALLGRAPH_LINK, CALLGRAPH_NODE, AtLeast, OneOf, Record, node_link_parts,
                                 validate)

    data = json.loads(text)
    validate(data, Record({"graph": Record({"format": OneOf("probekit-callgraph")}, {"version": AtLeast(int, 1)})}),
             origin, "not a probekit call graph JSON (write one with `discover callgraph --format json`)")
    version = data["graph"].get("version", FORMAT_VERSION)
    if version > FORMAT_VERSION:
        raise UserError(f"{origin}: call graph format version {version} is newer than this probekit reads "
                        f"(version {FORMAT_VERSION}); upgrade probekit, or write the graph with this one")
    nodes, links = node_link_parts(data, origin, CALLGRAPH_NODE, CALLGRAPH_LINK, closed=True)
    graph = nx.DiGraph(**data["graph"])
    for node in nodes:
        attrs = dict(node)
        graph.add_node(attrs.pop("id"), **attrs)
    for link in links:
        attrs = dict(link)
        graph.add_edge(attrs.pop("source"), attrs.pop("target"), **attrs)
    return graph


def diff(before: nx.DiGraph, after: nx.DiGraph) -> Dict[str, List[Dict[str, Any]]]:
    """Direct-call edges added and removed, and the time shift of edges in both."""
    def calls(graph: nx.DiGraph) -> Dict[Tuple[str, str], Dict[str, Any]]:
        return {(u, v): a for u, v, a in graph.edges(data=True) if a.get("calls")}

    a, b = calls(before), calls(after)
    added = [dict(caller=u, callee=v, calls=b[u, v]["calls"], total_us=b[u, v]["total_us"])
             for u, v in b.keys() - a.keys()]
    removed = [dict(caller=u, callee=v, calls=a[u, v]["calls"], total_us=a[u, v]["total_us"])
               for u, v in a.keys() - b.keys()]
    shifted = []
    for key in a.keys() & b.keys():
        ea, eb = a[key], b[key]
        shifted.append(dict(caller=key[0], callee=key[1], calls_before=ea["calls"], calls_after=eb["calls"],
                            avg_before_us=ea["avg_us"], avg_after_us=eb["avg_us"],
                            avg_shift_us=eb["avg_us"] - ea["avg_us"],
                            total_shift_us=eb["total_us"] - ea["total_us"]))
    added.sort(key=lambda e: (-e["total_us"], e["caller"], e["callee"]))
    removed.sort(key=lambda e: (-e["total_us"], e["caller"], e["callee"]))
    shifted.sort(key=lambda e: (-abs(e["total_shift_us"]), e["caller"], e["callee"]))
    return {"added": added, "removed": removed, "shifted": shifted}


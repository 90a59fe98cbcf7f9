"""Call graphs from the real captures: DiGraph counts, pruning, outputs, diffs; lab captures."""
from __future__ import annotations

import gzip
import json
import re
import shutil
from collections import Counter

import networkx as nx
import pytest

from discover import callgraph as cg
from discover import funcgraph as fg
from funcgraph_fixtures import LAB, LAB50, READ, WRITE, flat, lines, naive_direct_calls, naive_direct_calls_any

EVENTS_FG = LAB / "6.1.0-50-amd64" / "function_graph" / "nfs-ops.events.trace.gz"


def graph_of(path):
    return cg.to_digraph(fg.parse_file(str(path)).root)


def test_direct_callee_edges_equal_the_calls_in_the_trace():
    graph = graph_of(READ)
    direct, entered = naive_direct_calls(READ, "nfs_file_read")
    assert graph.nodes["nfs_file_read"]["calls"] == entered
    own = {v: a["calls"] for _, v, a in graph.out_edges("nfs_file_read", data=True) if a["calls"]}
    assert own == {k: v for k, v in direct.items() if not fg.IRQ_ENTRY.match(k)}


def test_interrupt_edges_are_kept_apart():
    graph = graph_of(READ)
    into = [a for _, _, a in graph.in_edges("__sysvec_apic_timer_interrupt", data=True)]
    assert into and all(a["kind"] == "interrupt" and a["calls"] == 0 for a in into)
    assert sum(a["irq_calls"] for a in into) == sum(
        1 for t in lines(READ) if "__sysvec_apic_timer_interrupt() {" in t)
    assert graph.nodes["__sysvec_apic_timer_interrupt"]["irq"] is True
    assert graph.graph["roots"] == ["nfs_file_read"]


def test_prune_by_depth_calls_and_time():
    root = fg.parse_file(str(WRITE)).root
    pruned = cg.prune(root, max_depth=1)
    assert all(not c.children for top in pruned.children.values() for c in top.children.values())
    busy = cg.prune(root, min_calls=100)
    assert all(n.calls >= 100 for n in busy.walk() if n is not busy)
    slow = cg.prune(root, min_time=1000.0)
    assert all(n.total >= 1000.0 for n in slow.walk() if n is not slow)


def test_json_round_trip_and_networkx_reads_it():
    graph = graph_of(WRITE)
    text = cg.to_json(graph)
    back = cg.load_json(text)
    assert set(back.edges) == set(graph.edges)
    assert back.nodes["nfs_file_write"]["calls"] == graph.nodes["nfs_file_write"]["calls"]
    data = json.loads(text)
    try:
        again = nx.node_link_graph(data, edges="links")
    except TypeError:  # networkx < 3.4
        again = nx.node_link_graph(data)
    assert set(again.edges) == set(graph.edges)


def test_folded_stacks_add_up_to_the_root_time():
    tree = fg.parse_file(str(READ))
    rows = list(cg.folded(tree.root))
    assert all(re.match(r"^[^ ]+ \d+$", r) for r in rows)
    assert any(";[irq];__sysvec_apic_timer_interrupt" in r for r in rows)
    total_ns = sum(int(r.rsplit(" ", 1)[1]) for r in rows)
    root_ns = tree.root.children["nfs_file_read"].total * 1000
    # Self time is clamped at 0 where the tracer timed children a little longer than their
    # parent, so the stacks can only add up to slightly more than the root's time.
    assert root_ns - len(rows) <= total_ns <= root_ns * 1.005


def test_dot_and_svg():
    dot = cg.to_dot(graph_of(READ))
    assert dot.startswith("digraph callgraph {") and '"nfs_file_read" -> "generic_file_read_iter"' in dot
    assert "style=dashed" in dot
    if shutil.which("dot"):  # a small graph: dot's layout time grows fast with size
        small = cg.to_digraph(cg.prune(fg.parse_file(str(READ)).root, max_depth=3))
        assert b"<svg" in cg.to_svg(cg.to_dot(small))


def test_diff_read_against_write():
    a, b = graph_of(READ), graph_of(WRITE)
    report = cg.diff(a, b)
    ea = {(u, v) for u, v, d in a.edges(data=True) if d["calls"]}
    eb = {(u, v) for u, v, d in b.edges(data=True) if d["calls"]}
    assert {(e["caller"], e["callee"]) for e in report["added"]} == eb - ea
    assert {(e["caller"], e["callee"]) for e in report["removed"]} == ea - eb
    assert len(report["shifted"]) == len(ea & eb)


def test_lab_capture_with_nfs_events_as_comments():
    """6.1.0-50 lab capture: function_graph with the nfs events on, seven graph functions,
    starting in the middle of calls. Events are kept with the function they fired in."""
    text = gzip.open(EVENTS_FG, "rt").readlines()
    tree = fg.parse_lines(text)
    parser = tree.parser
    assert parser.malformed_count == 0
    comments = [t for t in text if re.search(r"\|  +/\* \w+: ", t)]
    assert parser.event_count == len(comments) > 0
    inside = [e for e in parser.events if e.name == "nfs_getattr_enter"]
    assert inside and all(e.function in ("nfs_getattr", None) for e in inside)
    assert any(e.function == "nfs_getattr" for e in inside)
    getattr_events = sum(n.events.get("nfs_getattr_enter", 0) for n in tree.root.walk()
                         if n.name == "nfs_getattr" and n.events)
    assert getattr_events == sum(1 for e in inside if e.function == "nfs_getattr")
    assert sum(n.cut_start for n in tree.root.walk()) >= 1
    names = {n.name for n in tree.root.walk()}
    assert "?" not in names or parser.cut_start > 0


def _naive_top_calls_per_pid(text):
    """(pid, function) -> calls at depth 0, with the task of each CPU taken from the
    context-switch banners alone."""
    task = {}
    counts = Counter()
    for line in text:
        m = re.match(r"^ *(\d+)\) +\S+-\d+ +=> +\S+-(\d+) *$", line)
        if m:
            task[m.group(1)] = int(m.group(2))
            continue
        m = re.match(r"^ *(\d+)\) [^|]*\|  (\S+?)(?: \[\w+\])?\(\)( \{|;)$", line.rstrip("\n"))
        if m and m.group(1) in task:
            counts[task[m.group(1)], m.group(2)] += 1
    return counts


def test_lab_capture_context_switch_banners_give_tasks():
    text = gzip.open(EVENTS_FG, "rt").readlines()
    banners = [t for t in text if "=>" in t]
    recs = [fg.parse_line(t) for t in banners]
    assert recs and all(r.kind == fg.SWITCH for r in recs)
    rules = [fg.parse_line(t) for t in text if re.match(r"^ -{20,}$", t.rstrip("\n"))]
    assert len(rules) == 2 * len(banners) and all(r.kind == fg.RULE for r in rules)
    naive = _naive_top_calls_per_pid(text)
    for pid in (524, 525, 526):
        tree = fg.parse_lines(text, pid=pid)
        got = {name: node.calls for name, node in tree.root.children.items()}
        assert got == {name: n for (p, name), n in naive.items() if p == pid} and got


@pytest.mark.parametrize("capture,function", [
    ("nfs3.nfs_file_read.default", "nfs_file_read"),
    ("nfs3.nfs_file_read.latency", "nfs_file_read"),            # latency-format flag column
    ("nfs3.nfs_file_read.proc", "nfs_file_read"),               # comm-pid column
    ("nfs42.nfs_file_read.abstime", "nfs_file_read"),           # absolute time column
    ("nfs3.nfs_file_read.trace-cmd", "nfs_file_read"),          # trace-cmd report dialect
    ("nfs3.nfs_file_read.ctxsw-nfsd_read", "nfs_file_read"),    # two tasks, switch banners
    ("nfs3.nfs_file_read.ctxsw-nfsd_read", "nfsd_read"),
    ("nfs42.nfs_file_write.proc-abstime-tail", "nfs_file_write"),
    ("nfs3.nfs_file_write.irqs", "nfs_file_write"),
    ("nfs3.nfs_getattr.tail", "nfs_getattr"),                   # } /* f */ on every exit
    ("nfs3.nfs_getattr.events-nfs_getattr", "nfs_getattr"),     # /* event */ comments inside
])
def test_lab_option_mixes_give_the_calls_in_the_trace(capture, function):
    path = LAB50 / f"{capture}.trace"
    tree = fg.parse_file(str(path))
    assert tree.parser.malformed_count == 0
    assert flat(tree.root, digits=9) == flat(fg.parse_file(str(path), fast=False).root, digits=9)
    direct, entered = naive_direct_calls_any(path, function)
    top = tree.root.children[function]
    assert top.calls == entered > 0
    assert {k: v.calls for k, v in top.children.items()} == \
        {k: n for k, n in direct.items() if not fg.is_irq_entry(k)}


def test_lab_line_forms_latency_trace_cmd_lost():
    lat = next(t for t in lines(LAB50 / "nfs3.nfs_file_read.latency.trace") if "+ " in t and "();" in t)
    rec = fg.parse_line(lat)
    assert rec.kind == fg.LEAF and rec.dur == float(re.search(r"(\d+\.\d+) us", lat).group(1))
    tc = [t for t in lines(LAB50 / "nfs3.nfs_file_read.trace-cmd.trace") if "funcgraph_" in t]
    recs = [fg.parse_line(t) for t in tc]
    assert all(r.kind in fg.CALL_KINDS and r.dialect == "trace-cmd" and r.pid and r.ts for r in recs)
    lost_line = next(t for t in lines(LAB50 / "nfs3.nfs_file_write.tinybuf-trace_pipe.trace") if "LOST" in t)
    n = int(re.search(r"LOST (\d+) EVENTS", lost_line).group(1))
    rec = fg.parse_line(lost_line)
    assert (rec.kind, rec.count) == (fg.LOST, n)
    tree = fg.parse_file(str(LAB50 / "nfs3.nfs_file_write.tinybuf-trace_pipe.trace"))
    assert sum(tree.parser.lost.values()) == n


@pytest.mark.parametrize("capture", ["nfs3.nfs_file_write.tinybuf", "nfs3.nfs_file_write.tinybuf-trace_pipe"])
def test_lab_overrun_buffer_calls_cut_at_start_are_named_and_marked(capture):
    """A 4 KiB buffer lost the oldest entries: exits arrive as `} /* f */` with no entry."""
    tree = fg.parse_file(str(LAB50 / f"{capture}.trace"))
    orphan_exits = [t for t in lines(LAB50 / f"{capture}.trace") if re.search(r"\} /\* \S+", t)]
    assert orphan_exits and tree.parser.cut_start >= 1
    nodes = list(tree.nodes())
    assert "?" not in {n.name for n in nodes}
    assert sum(n.cut_start for n in nodes) == tree.parser.cut_start


def test_lab_events_fire_inside_the_function_that_emits_them():
    tree = fg.parse_file(str(LAB50 / "nfs3.nfs_getattr.events-nfs_getattr.trace"))
    events = tree.parser.events
    comments = [t for t in lines(LAB50 / "nfs3.nfs_getattr.events-nfs_getattr.trace") if "/* nfs_getattr_" in t]
    assert len(events) == len(comments) > 0
    assert {(e.name, e.function) for e in events} == {("nfs_getattr_enter", "nfs_getattr"),
                                                      ("nfs_getattr_exit", "nfs_getattr")}
    node = tree.root.children["nfs_getattr"]
    assert node.events == {"nfs_getattr_enter": len(comments) // 2, "nfs_getattr_exit": len(comments) // 2}

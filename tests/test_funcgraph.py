"""The function_graph parser on real captures: line forms, call rebuilding, fast path == general path."""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Dict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from discover import funcgraph as fg
from funcgraph_fixtures import ALL, EVENTS, LAB, OPEN, READ, WRITE, call_line_count, flat, lines


def first(path, pattern: str) -> str:
    return next(t for t in lines(path) if re.search(pattern, t))


# -- line forms, each taken from a real capture ---------------------------------

def test_header_lines():
    heads = [t for t in lines(READ) if t.startswith("#")]
    assert heads and all(fg.parse_line(t).kind == fg.HEADER for t in heads)


def test_entry_with_module_suffix():
    rec = fg.parse_line(first(READ, r"\|  nfs_file_read \[nfs\]\(\) \{"))
    assert (rec.kind, rec.name, rec.module, rec.depth, rec.cpu) == (fg.ENTRY, "nfs_file_read", "nfs", 0, 1)
    assert rec.cacheable


def test_leaf_with_duration():
    text = first(READ, r"\d us .*__cond_resched\(\);")
    rec = fg.parse_line(text)
    assert rec.kind == fg.LEAF and rec.name == "__cond_resched"
    assert rec.dur == float(re.search(r"(\d+\.\d+) us", text).group(1))


@pytest.mark.parametrize("mark", [" ", "+", "!", "#", "*", "@"])
def test_every_overhead_mark_in_the_captures(mark):
    text = next(t for p in ALL for t in lines(p) if re.match(r" \d\) " + re.escape(mark) + r" \d", t))
    rec = fg.parse_line(text)
    assert rec.kind in (fg.LEAF, fg.EXIT) and rec.dur is not None and rec.dur > 0
    if mark in "+!#*@":
        threshold = {"+": 10, "!": 100, "#": 1000, "*": 10000, "@": 100000}[mark]
        assert rec.dur > threshold


def test_exit_plain_and_with_function_name():
    plain = fg.parse_line(first(READ, r"\|  \}$"))
    assert plain.kind == fg.EXIT and plain.tail is None and plain.depth == 0
    named = fg.parse_line(first(WRITE, r"\} /\* nfs_updatepage \[nfs\] \*/"))
    assert (named.kind, named.tail, named.module) == (fg.EXIT, "nfs_updatepage", "nfs")


def test_non_graph_event_lines_are_events_not_calls():
    recs = [fg.parse_line(t) for t in lines(EVENTS) if not t.startswith("#")]
    assert recs and all(r.kind == fg.EVENT for r in recs)
    assert {r.name for r in recs} >= {"nfs_getattr_enter", "nfs_getattr_exit"}


# -- rebuilding calls ------------------------------------------------------------

@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_every_call_line_becomes_a_call(path):
    tree = fg.parse_file(str(path))
    counts = call_line_count(path)
    nodes = list(tree.nodes())
    assert sum(n.calls for n in nodes) == counts["entry"] + counts["leaf"]
    assert counts["entry"] == counts["exit"]
    assert tree.parser.malformed_count == 0
    assert sum(n.cut_start + n.cut_end for n in nodes) == 0


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_fast_path_agrees_with_general_path(path):
    assert flat(fg.parse_file(str(path)).root) == flat(fg.parse_file(str(path), fast=False).root)


def test_fast_path_agrees_on_batches_and_lines_without_newlines():
    text = lines(WRITE)
    a = flat(fg.parse_lines(text, batch=997).root, digits=6)
    b = flat(fg.parse_lines((t.rstrip("\n") for t in text), fast=False).root, digits=6)
    assert a == b


def test_bytes_lines_from_a_binary_file_parse_like_text():
    as_text = flat(fg.parse_lines(lines(READ)).root)
    with open(READ, "rb") as fh:
        assert flat(fg.parse_lines(fh).root) == as_text


def test_task_migrating_mid_call_is_followed():
    """The write capture's task moves from CPU 1 to CPU 0 inside __cond_resched and its
    exits arrive there as `} /* f */` with no banner."""
    tree = fg.parse_file(str(WRITE))
    assert tree.parser.migrations >= 1
    top = tree.root.children["nfs_file_write"]
    entered = sum(1 for t in lines(WRITE) if re.search(r"\|  nfs_file_write \[nfs\]\(\) \{", t))
    assert top.calls == entered and top.cut_end == 0 and top.cut_start == 0


def test_interrupt_work_is_never_an_own_callee():
    tree = fg.parse_file(str(READ))
    irq_calls = 0
    for node in tree.root.walk():
        if not node.irq:
            assert not any(fg.IRQ_ENTRY.match(c.name) for c in node.children.values()), node.name
        irq_calls += sum(c.calls for c in node.irqs.values() if c.name == "__sysvec_apic_timer_interrupt")
    raw = sum(1 for t in lines(READ) if "__sysvec_apic_timer_interrupt() {" in t)
    assert irq_calls == raw > 0


def test_interrupt_landing_on_a_function_entry_stays_apart():
    """Real output: `policy_node() {`, then the timer interrupt printed at policy_node's own
    depth, then `} /* policy_node */`. The interrupt belongs to policy_node, which is
    closed normally, not cut."""
    tree = fg.parse_file(str(READ))
    assert tree.parser.irq_shifts >= 1
    hit = [n for n in tree.root.walk() if n.name == "policy_node" and n.irqs]
    assert hit and all(n.cut_end == 0 for n in hit)


def test_malformed_lines_are_counted_with_line_numbers():
    text = lines(OPEN)
    text.insert(10, "this is not function_graph output\n")
    text.insert(20, text[15][:9] + "\n")
    parser = fg.FuncgraphParser()
    parser.feed(text)
    parser.finish()
    assert parser.malformed_count == 2
    assert [n for n, _ in parser.malformed] == [11, 21]


def test_pid_filter_without_task_ids_keeps_nothing():
    tree = fg.parse_file(str(OPEN), pid=1)
    assert tree.is_empty() and tree.filtered_out and not tree.parser.saw_pids


def test_trace_cut_at_the_start_is_marked_not_dropped():
    """Start reading the write capture in the middle of calls: the open frames get
    names from their exits and are marked cut at the start."""
    text = lines(WRITE)
    start = next(i for i, t in enumerate(text) if i > 100 and re.search(r"\|          \w", t))
    tree = fg.parse_lines(text[start:])
    nodes = list(tree.nodes())
    assert sum(n.cut_start for n in nodes) >= 1
    assert "nfs_file_write" in tree.root.children
    assert all(not isinstance(k, tuple) for n in tree.root.walk() for k in n.children)


def test_trace_cut_at_the_end_is_marked():
    text = lines(READ)
    tree = fg.parse_lines(text[: len(text) // 2])
    top = tree.root.children["nfs_file_read"]
    assert top.cut_end == 1 and tree.parser.cut_end >= 1


# -- robustness -----------------------------------------------------------------

def _real_sample():
    """Real lines of every layout at hand: default, migration, proc/abstime/tail with
    context switches, comments from nfs events, non-graph events."""
    import gzip
    lab = gzip.open(LAB / "6.1.0-50-amd64" / "function_graph" / "nfs-ops.events.trace.gz", "rt").readlines()
    return ([t for p in (READ, EVENTS) for t in lines(p)[:1500]] + lines(WRITE)[18900:19000]
            + lines(LAB / "6.1.0-57-amd64" / "function_graph" / "vfs_read.proc-abstime-tail.trace")
            + lab[:600])


REAL = _real_sample()


@st.composite
def mutated(draw):
    text = draw(st.sampled_from(REAL))
    how = draw(st.integers(0, 4))
    if how == 0:
        return text
    i = draw(st.integers(0, len(text)))
    if how == 1:
        return text[:i]
    if how == 2:
        return text[:i] + draw(st.text(max_size=20)) + text[i:]
    if how == 3:
        return text[:i] + draw(st.sampled_from(REAL))[i:]
    return draw(st.text(max_size=120))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(mutated(), max_size=60), st.booleans(), st.booleans())
def test_no_exception_escapes_on_any_input(text, fast, as_bytes):
    from discover import callgraph as cg
    fed = [t.encode("utf-8", "surrogatepass") for t in text] if as_bytes else text
    tree = fg.parse_lines(fed, fast=fast, batch=7)
    graph = cg.to_digraph(tree.root)
    list(cg.folded(tree.root))
    cg.to_dot(graph)
    cg.render_tree(tree.root, "t")
    for t in text:
        fg.parse_line(t)


# -- lab capture: funcgraph-proc, funcgraph-abstime, funcgraph-tail (trace_pipe) ---

PROC_ABSTIME_TAIL = LAB / "6.1.0-57-amd64" / "function_graph" / "vfs_read.proc-abstime-tail.trace"


def test_proc_abstime_tail_line_forms():
    text = lines(PROC_ABSTIME_TAIL)
    entry = fg.parse_line(text[0 if "vfs_read() {" in text[0] else 1])
    assert entry.kind == fg.ENTRY and entry.name == "vfs_read"
    stamps = []
    for t in text:
        m = re.match(r"^ *(\d+\.\d+) \| +(\d+)\) +(\S+)-(\d+) +\|", t)
        if not m:
            continue
        rec = fg.parse_line(t)
        assert rec.kind in fg.CALL_KINDS
        assert (rec.ts, rec.cpu, rec.comm, rec.pid) == (float(m.group(1)), int(m.group(2)), m.group(3),
                                                        int(m.group(4)))
        stamps.append(rec.ts)
        tail = re.search(r"\} /\* (\S+) \*/", t)
        if tail:
            assert rec.kind == fg.EXIT and rec.tail == tail.group(1)
    assert stamps == sorted(stamps) and len(stamps) > 300


def test_proc_abstime_tail_calls_per_task():
    text = lines(PROC_ABSTIME_TAIL)
    tree = fg.parse_lines(text)
    assert flat(tree.root) == flat(fg.parse_lines(text, fast=False).root)
    assert tree.parser.malformed_count == 0 and tree.parser.kinds.get(fg.SWITCH, 0) >= 1
    counts = call_line_count(PROC_ABSTIME_TAIL)
    assert sum(n.calls for n in tree.nodes()) == counts["entry"] + counts["leaf"]
    by_comm = Counter(m.group(1) for t in text
                      for m in [re.search(r"\| +(\S+)-\d+ +\| +\|  vfs_read\(\) \{", t)] if m)
    for comm, n in by_comm.items():
        assert fg.parse_lines(text, comm=comm).root.children["vfs_read"].calls == n


_SWITCH = re.compile(r"^ *(\d+)\) +(\S+)-(\d+) +=> +(\S+)-(\d+) *$")
_TOP_ENTRY = re.compile(r"^ *(\d+)\) [^|]*\|  (\w+)(?: \[\w+\])?\(\)(?: \{|;)$")


def _entries_by_banner(path: Path, function: str) -> Counter:
    """pid -> depth-0 entries of function, reading the task off the switch banners: the task
    of a CPU's lines before its first banner is that banner's left side."""
    current: Dict[int, int] = {}
    before_first: Dict[int, int] = {}   # cpu -> entries seen before any banner
    found: Counter = Counter()
    for text in lines(path):
        switch = _SWITCH.match(text.rstrip("\n"))
        if switch:
            cpu = int(switch.group(1))
            if cpu not in current and cpu in before_first:
                found[int(switch.group(3))] += before_first.pop(cpu)
            current[cpu] = int(switch.group(5))
            continue
        entry = _TOP_ENTRY.match(text.rstrip("\n"))
        if entry and entry.group(2) == function:
            cpu = int(entry.group(1))
            if cpu in current:
                found[current[cpu]] += 1
            else:
                before_first[cpu] = before_first.get(cpu, 0) + 1
    return found


_NO_PROC_WITH_BANNERS = sorted(p for p in LAB.glob("*/function_graph/*.default.trace")
                               if any(_SWITCH.match(t.rstrip("\n")) for t in lines(p)))


@pytest.mark.parametrize("path", _NO_PROC_WITH_BANNERS, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_pid_filter_keeps_calls_made_before_the_first_banner(path: Path) -> None:
    """Without a proc column a CPU's task is known only from the switch banners; the calls
    it made before its first banner belong to that banner's `prev` task and must count."""
    function = path.name.split(".")[-3]
    expected = _entries_by_banner(path, function)
    assert expected, f"{path.name}: no {function} entries"
    for pid, count in expected.items():
        node = fg.parse_file(str(path), pid=pid).root.children.get(function)
        assert node is not None and node.calls == count, (pid, count)

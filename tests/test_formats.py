"""--format profile / chrome / dot on real captures, checked against independent readings of
the same files; the progress display off a terminal; the lockdown refusal."""
from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from click.testing import CliRunner

from discover import callgraph as cg
from discover import funcgraph as fg
from discover.cli import discover
from funcgraph_fixtures import LAB, READ, REPO

LAB72 = LAB / "7.2.13+deb14-amd64" / "function_graph"
ABSTIME = LAB72 / "nfs42.nfs_file_read.abstime.trace"
FULL_READ = LAB72 / "nfs3.nfs_file_read.default.trace"
TRACE_CMD = LAB72 / "nfs3.nfs_file_read.trace-cmd.trace"
PROC = LAB72 / "nfs3.nfs_file_read.proc.trace"

# Independent reading of the default layout: " N) [mark] dur us |  indent body".
_LINE = re.compile(r"^(?: *\d+\.\d+ \|  )? *(\d+)\) (?:[ +!#*@$] )?(?:(\d+\.\d+) us)? *\|  +(\S.*)$")


def brace_matched(path: Path) -> Tuple[Dict[str, List[float]], Counter]:
    """Per function, the duration of every call whose entry is in the trace (leaves: their
    own line; entries: the `}` matched per CPU by a brace stack), and the calls without exit."""
    durs: Dict[str, List[float]] = defaultdict(list)
    unclosed: Counter = Counter()
    stacks: Dict[str, List[str]] = defaultdict(list)
    for text in path.read_text().splitlines():
        m = _LINE.match(text)
        if m is None:
            continue
        cpu, dur, body = m.groups()
        name = body.split("(", 1)[0].split(" [", 1)[0]
        if body.endswith(";"):
            durs[name].append(float(dur))
        elif body.endswith("{"):
            stacks[cpu].append(name)
        elif body.startswith("}") and stacks[cpu]:
            durs[stacks[cpu].pop()].append(float(dur))
    for stack in stacks.values():
        unclosed.update(stack)
    return durs, unclosed


def invoke(*args: str) -> str:
    result = CliRunner().invoke(discover, ["callgraph", *args])
    assert result.exit_code == 0, result.output
    return result.output


# --- profile ----------------------------------------------------------------

def test_profile_calls_and_max_match_a_brace_matched_reading():
    durs, unclosed = brace_matched(FULL_READ)
    graph = cg.to_digraph(fg.parse_file(str(FULL_READ)).root)
    rows = {r["function"]: r for r in cg.profile(graph)}
    checked = 0
    for name, row in rows.items():
        if row["cut_start"]:
            continue  # their entry is not in the file: nothing to match them against
        assert row["calls"] == len(durs[name]) + unclosed[name], name
        if durs[name]:
            assert row["max_us"] == max(durs[name]), name
            assert row["avg_us"] == pytest.approx(sum(durs[name]) / len(durs[name])), name
        checked += 1
    assert checked >= 300
    read = rows["nfs_file_read"]
    assert read["total_us"] == pytest.approx(sum(durs["nfs_file_read"]))


@pytest.mark.parametrize("sort,key,reverse", [("calls", "calls", True), ("self", "self_us", True),
                                              ("max", "max_us", True), ("name", "function", False)])
def test_profile_sorts(sort, key, reverse):
    rows = cg.profile(cg.to_digraph(fg.parse_file(str(FULL_READ)).root), sort)
    values = [r[key] for r in rows]
    assert values == sorted(values, reverse=reverse)


def test_profile_command_is_a_table_heaviest_first():
    out = invoke("--from-file", str(READ), "--format", "profile").splitlines()
    assert out[0].startswith("# 36327 lines from")
    assert out[1].split() == ["#", "total", "self", "avg", "max", "calls", "function"]
    first = out[2].split()
    assert first[-2:] == ["nfs_file_read", "[nfs]"] and first[-3] == "17"
    assert any(line.endswith("__sysvec_apic_timer_interrupt  (irq)") for line in out)
    by_calls = invoke("--from-file", str(READ), "--format", "profile", "--sort", "calls").splitlines()
    counts = [int(line.split()[8]) for line in by_calls[2:]]  # four "<value> <unit>" columns, then calls
    assert counts == sorted(counts, reverse=True)


# --- chrome -----------------------------------------------------------------

def chrome(path: Path, *functions: str) -> Tuple[dict, fg.CallTree]:
    trace = cg.ChromeTrace(functions)
    tree = fg.parse_file(str(path), on_call=trace.on_call)
    return json.loads(trace.to_json("test")), tree


def check_trace_event_format(data: dict) -> List[dict]:
    """The fields the Trace Event Format documents for the phases used here (catapult's
    trace-event-format: name, cat, ph, ts in microseconds, pid, tid, dur for X, args;
    M events carry process_name/thread_name in args.name)."""
    assert set(data) == {"traceEvents", "displayTimeUnit", "otherData"}
    assert data["displayTimeUnit"] in ("ms", "ns")
    slices = []
    for event in data["traceEvents"]:
        assert event["ph"] in ("X", "B", "M"), event
        assert isinstance(event["name"], str) and isinstance(event["pid"], int) and isinstance(event["tid"], int)
        if event["ph"] == "M":
            assert event["name"] in ("process_name", "thread_name") and isinstance(event["args"]["name"], str)
            continue
        assert isinstance(event["ts"], (int, float)) and event["cat"] in ("call", "interrupt")
        if event["ph"] == "X":
            assert event["dur"] >= 0
        slices.append(event)
    return slices


def assert_nested(slices: List[dict]) -> None:
    """On each track, complete slices nest: none ends after the one that encloses it."""
    tracks: Dict[Tuple[int, int], List[dict]] = defaultdict(list)
    for e in slices:
        if e["ph"] == "X":
            tracks[e["pid"], e["tid"]].append(e)
    for events in tracks.values():
        ends: List[float] = []
        for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
            while ends and ends[-1] <= e["ts"]:
                ends.pop()
            assert not ends or e["ts"] + e["dur"] <= ends[-1] + 1e-6
            ends.append(e["ts"] + e["dur"])


@pytest.mark.parametrize("path", [ABSTIME, TRACE_CMD, PROC, READ], ids=lambda p: p.name)
def test_chrome_has_one_slice_per_call_and_interrupts_apart(path):
    data, tree = chrome(path)
    slices = check_trace_event_format(data)
    assert_nested(slices)
    graph = cg.to_digraph(tree.root)
    calls = {n: a["calls"] for n, a in graph.nodes(data=True) if n != "?"}
    assert Counter(e["name"] for e in slices) == Counter(calls)
    names = {(e["pid"], e["tid"]): None for e in data["traceEvents"] if e["ph"] == "M" and e["tid"]}
    assert names
    for e in slices:
        irq = graph.nodes[e["name"]]["irq"]
        if e["cat"] == "interrupt":
            assert e["pid"] == cg.ChromeTrace.IRQ_PID
        else:
            assert e["pid"] == cg.ChromeTrace.TASKS_PID and not irq


def test_chrome_timestamps_are_the_traces_own():
    data, _ = chrome(ABSTIME)
    first_entry = next(line for line in ABSTIME.read_text().splitlines() if "nfs_file_read [nfs]() {" in line)
    stamp = float(first_entry.split("|")[0]) * 1e6
    read = sorted((e for e in data["traceEvents"] if e["name"] == "nfs_file_read"), key=lambda e: e["ts"])
    assert read[0]["ts"] == pytest.approx(stamp, abs=1e-3)
    assert data["otherData"]["timestamps"] == "from the trace"
    assert chrome(READ)[0]["otherData"]["timestamps"].startswith("synthetic")


def test_chrome_tracks_are_tasks_with_proc_column():
    data, _ = chrome(PROC)
    labels = {e["args"]["name"] for e in data["traceEvents"] if e["name"] == "thread_name" and e["pid"] == 1}
    pids = {int(m) for m in re.findall(r"^\s*\d+\)\s+\S+-(\d+)\s+\|", PROC.read_text(), re.M)}
    assert {int(label.rsplit("-", 1)[1].split()[0]) for label in labels} <= pids


def test_chrome_with_functions_keeps_only_their_subtrees(tmp_path):
    out = tmp_path / "read.json"
    invoke("nfs_start_io_read", "--from-file", str(ABSTIME), "--format", "chrome", "-o", str(out))
    slices = check_trace_event_format(json.loads(out.read_text()))
    entered = ABSTIME.read_text().count("nfs_start_io_read [nfs]() {")
    assert Counter(e["name"] for e in slices)["nfs_start_io_read"] == entered
    assert {e["name"] for e in slices} <= {"nfs_start_io_read", "down_read_killable", "__cond_resched",
                                           "up_read", "down_read", "_cond_resched"} | \
        {e["name"] for e in slices if e["cat"] == "interrupt"}


# --- dot / svg --------------------------------------------------------------

def test_dot_default_pruning_colour_and_width():
    full = cg.to_digraph(fg.parse_file(str(FULL_READ)).root)
    assert full.number_of_nodes() >= 300  # a full read graph
    graph, note = cg.prune_graph(full, cg.DEFAULT_MAX_NODES)
    assert graph.number_of_nodes() <= cg.DEFAULT_MAX_NODES
    left = full.number_of_nodes() - graph.number_of_nodes()
    assert note.startswith(f"{left} of {full.number_of_nodes()} functions left out")
    for node in graph:  # nothing floats: every drawn function hangs from a root
        assert node in full.graph["roots"] or any(graph.has_edge(p, node) for p in graph.predecessors(node))
    dot = cg.to_dot(graph, note)
    heaviest_self = max(full.nodes, key=lambda n: full.nodes[n]["self_us"])
    assert re.search(rf'"{heaviest_self}" \[label="[^"]*", fillcolor="0.000 1.000 1.000"\]', dot)
    widths = [float(w) for w in re.findall(r"penwidth=([\d.]+)", dot)]
    assert max(widths) == 6.0 and min(widths) >= 1.0
    assert "subgraph cluster_interrupts" in dot
    cluster = dot.split("subgraph cluster_interrupts", 1)[1].split("  }", 1)[0]
    assert "__sysvec_apic_timer_interrupt" in cluster
    assert f"label=\"{note}\"" in dot


def test_max_nodes_zero_draws_everything_and_says_nothing():
    full = cg.to_digraph(fg.parse_file(str(FULL_READ)).root)
    graph, note = cg.prune_graph(full, 0)
    assert graph is full and note is None


@pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz dot")
def test_svg_of_a_full_read_graph_renders_and_notes_what_it_left_out(tmp_path):
    out = tmp_path / "read.svg"
    result = subprocess.run([sys.executable, "-m", "discover", "callgraph", "--from-file", str(FULL_READ),
                             "--format", "svg", "-o", str(out)], cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    svg = html.unescape(out.read_text())
    assert svg.lstrip().startswith("<?xml")
    assert re.search(r"\d+ of \d+ functions left out .*--max-nodes 0 draws them all", svg)


# --- progress off a terminal -------------------------------------------------

def test_progress_off_a_terminal_is_plain_occasional_lines(capsys):
    from rich.console import Console

    from discover.commands import callgraph as command
    from discover.capture import Progress

    console = Console(stderr=True)
    assert not console.is_terminal  # pytest captures stderr
    with command._progress_display(console) as show:
        for tenth in range(1, 251):
            show(Progress(elapsed=tenth / 10, lines=tenth * 100, lost=0))
    err = capsys.readouterr().err
    assert err.splitlines() == [f"discover: capturing: {s:.1f} s, {s * 1000} lines, 0 events lost"
                                for s in (10, 20)]


def test_live_capture_to_a_log_writes_no_padding(tmp_path):
    """The measured defect: ~8 KB of blank padding in a log from the status display."""
    import fake_tracefs

    tracefs = fake_tracefs.build(tmp_path / "root")
    env = dict(os.environ, PROBEKIT_TRACEFS=str(tracefs), PROBEKIT_SYSROOT=str(tmp_path / "root"),
               PROBEKIT_EUID="0")
    log = tmp_path / "stderr.log"
    with open(log, "wb") as err:
        live = subprocess.run(
            [sys.executable, "-m", "discover", "callgraph", "nfs_file_read", "--workload",
             f"sleep 1.5; cat {READ} > {tracefs / 'trace_pipe'}", "--format", "json", "-o", str(tmp_path / "g.json")],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=err, timeout=300, env=env)
    assert live.returncode == 0, log.read_text()
    text = log.read_text()
    assert "\r" not in text and "\x1b" not in text and "          " not in text
    assert len(text) < 1024, text


# --- lockdown ----------------------------------------------------------------

def test_lockdown_refusal_is_one_line_and_nothing_is_written(tmp_path):
    import fake_tracefs

    root = tmp_path / "root"
    tracefs = fake_tracefs.build(root)
    before = fake_tracefs.snapshot(tracefs)
    security = root / "sys" / "kernel" / "security"
    security.mkdir(parents=True)
    # the kernel lists every mode and brackets the active one (security/lockdown/lockdown.c)
    (security / "lockdown").write_text("none integrity [confidentiality]\n")
    env = dict(os.environ, PROBEKIT_TRACEFS=str(tracefs), PROBEKIT_SYSROOT=str(root), PROBEKIT_EUID="0")
    result = subprocess.run([sys.executable, "-m", "discover", "callgraph", "nfs_file_read", "--duration", "1"],
                            cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "discover: error: the kernel is locked down (confidentiality mode, /sys/kernel/security/lockdown) "
        "and refuses tracefs: boot with lockdown=none (and Secure Boot off if it enforces lockdown) to trace, "
        "or run discover --from-file on a trace captured on an unlocked kernel"]
    assert fake_tracefs.snapshot(tracefs) == before
    assert not (root / "var" / "tmp" / ".ftrace-lock").exists()


def test_lockdown_mode_reads_the_bracketed_mode(tmp_path):
    from discover.tracefs import Host, lockdown_mode, lockdown_refusal

    host = Host(sysroot=tmp_path)
    assert lockdown_mode(host) is None and lockdown_refusal(host) is None
    (tmp_path / "sys" / "kernel" / "security").mkdir(parents=True)
    for text, mode in (("[none] integrity confidentiality\n", "none"),
                       ("none [integrity] confidentiality\n", "integrity")):
        (tmp_path / "sys" / "kernel" / "security" / "lockdown").write_text(text)
        assert lockdown_mode(host) == mode
    assert "integrity mode" in str(lockdown_refusal(host))

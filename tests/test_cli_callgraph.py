"""`discover callgraph` / `discover diff` from the command line, on the real captures."""
from __future__ import annotations

import gzip
import os
import re
import subprocess
import sys
import threading

import pytest
from click.testing import CliRunner

from discover.cli import discover
from discover import funcgraph as fg
from funcgraph_fixtures import EVENTS, READ, REPO, WRITE, lines, naive_direct_calls


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "discover", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def test_tree_shows_own_callees_with_trace_counts_and_interrupts_apart():
    """Done-when of issue 2."""
    result = CliRunner().invoke(discover, ["callgraph", "--from-file", str(READ), "--format", "tree"])
    assert result.exit_code == 0, result.output
    out = result.output.splitlines()
    direct, entered = naive_direct_calls(READ, "nfs_file_read")
    top = next(line for line in out if re.match(r"^└── nfs_file_read \[nfs\]", line))
    assert f" {entered}x " in top
    shown = {}
    for line in out:
        m = re.match(r"^    [├└]── (\S+)(?: \[\w+\])?  (\d+)x ", line)
        if m:
            shown[m.group(1)] = int(m.group(2))
    assert shown == {k: v for k, v in direct.items() if not fg.IRQ_ENTRY.match(k)}
    # every timer interrupt sits under an "interrupt work" branch, none among own callees
    timer_lines = [i for i, line in enumerate(out) if "__sysvec_apic_timer_interrupt" in line]
    assert timer_lines
    for i in timer_lines:
        indent = len(out[i]) - len(out[i].lstrip(" │├└─"))
        parent = next(out[j] for j in range(i - 1, -1, -1)
                      if len(out[j]) - len(out[j].lstrip(" │├└─")) < indent)
        assert "interrupt work" in parent
    shown_irqs = sum(int(re.search(r"  (\d+)x ", out[i]).group(1)) for i in timer_lines)
    assert shown_irqs == sum(1 for t in lines(READ) if "__sysvec_apic_timer_interrupt() {" in t)


@pytest.mark.parametrize("fmt,check", [
    ("json", lambda s: '"format": "probekit-callgraph"' in s),
    ("dot", lambda s: s.startswith("digraph")),
    ("folded", lambda s: s.splitlines()[0].startswith("nfs_file_write")),
])
def test_formats(tmp_path, fmt, check):
    target = tmp_path / f"out.{fmt}"
    result = CliRunner().invoke(discover, ["callgraph", "nfs_file_write", "--from-file", str(WRITE),
                                           "--format", fmt, "-o", str(target)])
    assert result.exit_code == 0, result.output
    assert check(target.read_text())


def test_diff_command(tmp_path):
    for name, path in (("a", READ), ("b", WRITE)):
        r = CliRunner().invoke(discover, ["callgraph", "--from-file", str(path), "--format", "json",
                                          "-o", str(tmp_path / f"{name}.json")])
        assert r.exit_code == 0, r.output
    r = CliRunner().invoke(discover, ["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json"])
    assert r.exit_code == 0
    assert '"added"' in r.output and "generic_perform_write" in r.output


@pytest.mark.parametrize("args,message", [
    (["callgraph", "--from-file", "/nonexistent/trace"], "no such file"),
    (["callgraph", "--from-file", str(EVENTS)], "not a function_graph trace"),
    (["callgraph", "no_such_function", "--from-file", str(READ)], "not called in this trace"),
    (["callgraph", "--from-file", str(READ), "--format", "png"], "Invalid value"),
    (["callgraph", "f", "--workload", "true", "--duration", "1"], "not both"),
    (["callgraph", "--from-file", str(READ), "--pid", "1"], "no task ids"),
    (["diff", str(READ), str(WRITE)], "not valid JSON"),
])
def test_bad_input_is_one_line_and_nonzero(args, message):
    result = run(*args)
    assert result.returncode != 0
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "Traceback" not in result.stderr


@pytest.mark.parametrize("command", ["callgraph", "diff"])
def test_help_ends_with_real_examples(command):
    result = CliRunner().invoke(discover, [command, "--help"])
    tail = result.output.rstrip().splitlines()
    start = next(i for i, line in enumerate(tail) if line.strip() == "Examples:")
    examples = tail[start + 1:]
    assert examples and all(line.strip().startswith("discover ") for line in examples)


def test_svg_without_graphviz_is_a_clear_error(tmp_path):
    env = dict(os.environ, PATH=str(tmp_path))  # no `dot` anywhere on PATH
    result = subprocess.run([sys.executable, "-m", "discover", "callgraph", "--from-file", str(READ),
                             "--depth", "2", "--format", "svg", "-o", str(tmp_path / "g.svg")],
                            cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "discover: error: SVG needs Graphviz `dot` (apt-get install graphviz); "
        "or use --format dot and render it elsewhere"]


def test_live_branch_on_a_fake_tracefs_matches_from_file(tmp_path):
    """The live path (discover.capture on a tracefs-shaped directory whose trace_pipe the
    workload feeds with the real read capture) yields the same graph as --from-file."""
    import fake_tracefs

    tracefs = fake_tracefs.build(tmp_path / "root")
    before = fake_tracefs.snapshot(tracefs)
    env = dict(os.environ, PROBEKIT_TRACEFS=str(tracefs), PROBEKIT_SYSROOT=str(tmp_path / "root"),
               PROBEKIT_EUID="0")
    live = subprocess.run(
        [sys.executable, "-m", "discover", "callgraph", "nfs_file_read", "--workload",
         f"cat {READ} > {tracefs / 'trace_pipe'}", "--format", "json", "-o", str(tmp_path / "live.json")],
        cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert live.returncode == 0, live.stderr
    saved = run("callgraph", "--from-file", str(READ), "--format", "json", "-o", str(tmp_path / "file.json"))
    assert saved.returncode == 0, saved.stderr
    from discover.callgraph import load_json
    a = load_json((tmp_path / "live.json").read_text())
    b = load_json((tmp_path / "file.json").read_text())
    assert {e: d["calls"] for e, d in a.edges.items()} == {e: d["calls"] for e, d in b.edges.items()}
    assert a.nodes["nfs_file_read"]["calls"] == b.nodes["nfs_file_read"]["calls"] == 17
    fake_tracefs.assert_restored(before, tracefs)


def _fifo_writer(fifo: str, data: bytes) -> threading.Thread:
    """A writer that feeds the whole capture, then closes (as `<(trace-cmd report)` does)."""
    def write() -> None:
        with open(fifo, "wb") as fh:
            fh.write(data)
    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


#: a capture smaller than a pipe's buffer (the writer is done before the reader opens again)
#: and one larger (the writer still writes: a second open lost the first read's buffer)
SMALL = REPO / "tests" / "fixtures" / "6.1.0-50-amd64" / "function_graph" / "hrtimer_nanosleep.default.trace"


@pytest.mark.parametrize("trace", [SMALL, READ], ids=["small", "large"])
@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
def test_from_file_reads_a_fifo_once_to_its_end(tmp_path, trace, compress):
    """A FIFO can be read once: a peek for the gzip magic and a second open hung after the
    writer closed (and lost the first buffer while it still wrote)."""
    expected = run("callgraph", "--from-file", str(trace), "--format", "folded")
    assert expected.returncode == 0, expected.stderr
    fifo = tmp_path / "trace"
    os.mkfifo(fifo)
    data = trace.read_bytes()
    writer = _fifo_writer(str(fifo), gzip.compress(data) if compress else data)
    got = run("callgraph", "--from-file", str(fifo), "--format", "folded")  # 120 s timeout: a hang fails
    writer.join(5)
    assert got.returncode == 0, got.stderr
    assert got.stdout == expected.stdout


def test_from_file_dev_stdin_from_a_pipe():
    expected = run("callgraph", "--from-file", str(READ), "--format", "folded").stdout
    with open(READ, "rb") as trace:
        feeder = subprocess.Popen(["cat"], stdin=trace, stdout=subprocess.PIPE)
        got = subprocess.run([sys.executable, "-m", "discover", "callgraph", "--from-file", "/dev/stdin",
                              "--format", "folded"], cwd=REPO, stdin=feeder.stdout, capture_output=True, text=True,
                             timeout=120)
        feeder.wait(10)
    assert got.returncode == 0, got.stderr
    assert got.stdout == expected

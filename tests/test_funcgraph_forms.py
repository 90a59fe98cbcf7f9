"""The function_graph parser on the line forms only a targeted capture shows: the `$` mark,
sleep-time off, `(Overruns: N)`, layouts without the cpu or duration column, funcgraph-args.

Captured by labs/capture/capture_more_forms.sh in Debian 6.1 and 7.2 guests (READMEs beside
the files).
Each test checks the parser against a naive reading of the same file: strip the layout's
column prefix with one regex, then count calls by indentation alone."""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Dict, Optional, Tuple

import pytest

from discover import funcgraph as fg
from funcgraph_fixtures import LAB, LAB50, flat, lines

K61 = LAB50
K72 = LAB / "7.2.13+deb14-amd64" / "function_graph"
KERNELS = (K61, K72)

# The column prefix before the function column, per layout (the proc one names the task).
DEFAULT_PREFIX = r"^ *\d+\) [^|]*\|  "
PREFIX = {
    "default": DEFAULT_PREFIX,
    "nosleep-time": DEFAULT_PREFIX,
    "overrun": DEFAULT_PREFIX,
    "args": DEFAULT_PREFIX,
    "nocpu": r"^[^|]*\|  ",
    "noduration": r"^ *\d+\) ",
    "nocpu-noduration-proc": r"^ *\S+-(?P<pid>\d+) +\| ",
}
_BANNER = re.compile(r"^ *\d+\) +\S+-(\d+) +=> +\S+-(\d+) *$")
_CALL = re.compile(r"^( *)([\w.]+)(?: \[\w+\])?\(.*\)( \{|;)$")
_EXIT = re.compile(r"^( *)\}")


def naive(path: Path, function: str) -> Tuple[Counter, Counter]:
    """(entry/leaf/exit line counts, direct callees of `function` at depth 0), by
    indentation, one lane per task (the pid column, else the last task-switch banner)."""
    prefix = re.compile(PREFIX[path.name.split(".")[1]])
    kinds: Counter = Counter()
    direct: Counter = Counter()
    inside: Dict[Optional[str], bool] = {}
    task: Optional[str] = next((m.group(1) for t in lines(path) for m in [_BANNER.match(t)] if m), None)
    for text in lines(path):
        line = text.rstrip("\n")
        banner = _BANNER.match(line)
        if banner:
            task = banner.group(2)
            continue
        m = prefix.match(line)
        if line.startswith("# ") and not re.match(r"# \d", line) or m is None:
            continue
        lane = m.groupdict().get("pid") or task
        body = line[m.end():]
        call = _CALL.match(body)
        if call:
            kinds["entry" if call.group(3) == " {" else "leaf"] += 1
            depth = len(call.group(1)) // 2
            if depth == 0:
                inside[lane] = call.group(2) == function and call.group(3) == " {"
            elif depth == 1 and inside.get(lane):
                direct[call.group(2)] += 1
        elif _EXIT.match(body):
            kinds["exit"] += 1
            if not _EXIT.match(body).group(1):
                inside[lane] = False
    return kinds, direct


def callees(node: fg.CallNode) -> Counter:
    """Direct callees, own and interrupt work alike (the naive reading cannot tell them apart)."""
    out: Counter = Counter()
    for child in list(node.children.values()) + list(node.irqs.values()):
        out[child.name] += child.calls
    return out


CASES = [(k / name, name.split(".")[0]) for k in KERNELS
         for name in ("hrtimer_nanosleep.default.trace", "hrtimer_nanosleep.nosleep-time.trace",
                      "vfs_read.overrun.trace", "vfs_read.nocpu.trace", "vfs_read.noduration.trace",
                      "vfs_read.nocpu-noduration-proc.trace")]
CASES.append((K72 / "vfs_read.args.trace", "vfs_read"))


def case_id(value) -> str:
    return f"{value.parent.parent.name}/{value.name}" if isinstance(value, Path) else value


@pytest.mark.parametrize("path,function", CASES, ids=case_id)
def test_calls_match_a_naive_count(path, function):
    kinds, direct = naive(path, function)
    tree = fg.parse_file(str(path))
    nodes = list(tree.nodes())
    assert tree.parser.malformed_count == 0
    # a frame closed but never opened in the trace is still a call, marked cut at the start
    assert sum(n.calls - n.cut_start for n in nodes) == kinds["entry"] + kinds["leaf"] > 100
    # a task switched in mid-call closes frames the trace never opened, and vice versa
    assert sum(n.cut_end - n.cut_start for n in nodes) == kinds["entry"] - kinds["exit"]
    assert callees(tree.root.children[function]) == direct and direct
    assert flat(tree.root, digits=9) == flat(fg.parse_file(str(path), fast=False).root, digits=9)


@pytest.mark.parametrize("path", [p for p, _ in CASES], ids=case_id)
def test_only_the_leading_comment_block_is_header(path):
    text = lines(path)
    kinds = [fg.parse_line(t).kind for t in text]
    assert kinds[:4] == [fg.HEADER] * 4 and fg.HEADER not in kinds[4:]


def top_durations(path: Path, function: str) -> list:
    """Durations on the closing lines of `function` at depth 0, paired by lane and indentation
    (or named by the kernel: `} /* f */` when its entry was printed before a task switch)."""
    open_at_top: Dict[Optional[str], Optional[str]] = {}
    task: Optional[str] = next((m.group(1) for t in lines(path) for m in [_BANNER.match(t)] if m), None)
    out = []
    for text in lines(path):
        banner = _BANNER.match(text)
        if banner:
            task = banner.group(2)
            continue
        m = re.match(r" *\d+\) (?:. +(\S+) us| +) +\|  (\S.*)$", text.rstrip("\n"))
        if m is None:
            continue
        call = _CALL.match(m.group(2))
        if call and call.group(3) == " {":
            open_at_top[task] = call.group(2)
        elif m.group(2) == "} /* " + function + " */" or m.group(2) == "}" and open_at_top.get(task) == function:
            out.append(float(m.group(1)))
            open_at_top[task] = None
    return out


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.parent.name)
def test_dollar_mark_is_a_call_over_one_second(kernel):
    """`sleep 1.2` under hrtimer_nanosleep with sleep-time on (the default)."""
    path = kernel / "hrtimer_nanosleep.default.trace"
    marked = [t for t in lines(path) if re.match(r" *\d+\) \$ ", t)]
    assert marked
    for text in marked:
        rec = fg.parse_line(text)
        assert rec.kind == fg.EXIT and rec.dur == float(re.search(r"\$ (\d+(?:\.\d+)?) us", text).group(1))
        assert rec.dur > 1_000_000
    top = top_durations(path, "hrtimer_nanosleep")
    node = fg.parse_file(str(path)).root.children["hrtimer_nanosleep"]
    assert node.max == max(top) > 1_200_000
    assert node.total == pytest.approx(sum(top))


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.parent.name)
def test_sleep_time_off_leaves_the_sleep_out(kernel):
    """nosleep-time: the same `sleep 1.2`, but the time off the CPU is not counted."""
    path = kernel / "hrtimer_nanosleep.nosleep-time.trace"
    assert not any(re.match(r" *\d+\) \$ ", t) for t in lines(path))
    top = top_durations(path, "hrtimer_nanosleep")
    node = fg.parse_file(str(path)).root.children["hrtimer_nanosleep"]
    assert node.max == max(top) < 1_000_000
    assert node.total == pytest.approx(sum(top))


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.parent.name)
def test_overrun_line_after_every_exit(kernel):
    path = kernel / "vfs_read.overrun.trace"
    text = lines(path)
    overruns = [i for i, t in enumerate(text) if t.startswith(" (Overruns: ")]
    assert overruns and all(re.search(r"\|  +\}$", text[i - 1]) for i in overruns)
    for i in overruns:
        rec = fg.parse_line(text[i])
        assert rec.kind == fg.OVERRUN and rec.count == int(re.search(r"\d+", text[i]).group())
    tree = fg.parse_file(str(path), fast=False)
    assert tree.parser.kinds[fg.OVERRUN] == len(overruns)


def test_no_cpu_column_hash_mark_is_a_call_not_a_header():
    """Without the cpu column a call over 1 ms starts with its `#` mark."""
    path = K61 / "vfs_read.nocpu.trace"  # the 7.2 capture has no call over 1 ms
    hashed = [t for t in lines(path) if re.match(r"# \d", t)]
    assert hashed
    for text in hashed:
        rec = fg.parse_line(text)
        assert rec.kind in (fg.EXIT, fg.LEAF) and rec.cpu is None
        assert rec.dur == float(re.match(r"# (\S+) us", text).group(1)) > 1000


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.parent.name)
def test_no_duration_column_lines(kernel):
    untimed, timed = kernel / "vfs_read.noduration.trace", kernel / "vfs_read.nocpu.trace"
    for text in lines(untimed)[4:]:
        m = re.match(r" *(\d+)\) ( *)(\S+?)\(\)( \{|;)$", text.rstrip("\n"))
        if m:
            rec = fg.parse_line(text)
            assert (rec.cpu, rec.depth, rec.name, rec.timed) == (int(m.group(1)), len(m.group(2)) // 2,
                                                                  m.group(3), False)
    assert fg.parse_file(str(untimed)).parser.timed is False
    assert fg.parse_file(str(timed)).parser.timed is True


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.parent.name)
def test_proc_column_alone_names_each_task(kernel):
    path = kernel / "vfs_read.nocpu-noduration-proc.trace"
    tree = fg.parse_file(str(path))
    by_pid = Counter(m.group(1) for t in lines(path)
                     for m in [re.match(r" *\S+-(\d+) +\| vfs_read\(\) \{", t)] if m)
    assert len(by_pid) >= 2
    for pid, n in by_pid.items():
        assert fg.parse_file(str(path), pid=int(pid)).root.children["vfs_read"].calls == n
    assert tree.root.children["vfs_read"].calls == sum(by_pid.values())


def test_funcgraph_args_lines():
    """funcgraph-args (7.2): typed arguments inside the parentheses, enums with their name."""
    path = K72 / "vfs_read.args.trace"
    with_args = 0
    for text in lines(path):
        m = re.match(r" *\d+\) [^|]*\|  ( *)([\w.]+)\((.+)\)( \{|;)$", text.rstrip("\n"))
        if m:
            rec = fg.parse_line(text)
            assert (rec.kind, rec.name, rec.depth) == ({" {": fg.ENTRY, ";": fg.LEAF}[m.group(4)], m.group(2),
                                                       len(m.group(1)) // 2)
            assert not rec.cacheable
            with_args += 1
    assert with_args > 500

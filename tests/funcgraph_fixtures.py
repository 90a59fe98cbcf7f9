"""Paths of the real function_graph captures the parser tests read (never hand-typed)."""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from discover import funcgraph as fg

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "fixtures" / "debian-6.1.0-57-amd64"
FG = SHARED / "function_graph"
READ = FG / "nfs3.nfs_file_read.trace"
WRITE = FG / "nfs3.nfs_file_write.trace"
OPEN = FG / "nfs42.nfs4_file_open.trace"
EVENTS = SHARED / "events_trace" / "nfs3.nfs-nfs4-events.trace"
ALL = (READ, WRITE, OPEN)
LAB = REPO / "tests" / "fixtures"

# An independent, deliberately naive reading of the default layout (" N) dur |  body").
_NAIVE = re.compile(r"^ *\d+\) [^|]*\|  ( *)(\S+?)(?: \[\w+\])?\(\)( \{|;)$")


def lines(path: Path) -> List[str]:
    return path.read_text().splitlines(keepends=True)


def naive_direct_calls(path: Path, function: str) -> Tuple[Counter, int]:
    """Calls made at depth 1 while `function` (depth 0) is open, by indentation alone,
    and how many times `function` was entered."""
    direct: Counter = Counter()
    entered = 0
    inside = False
    for text in lines(path):
        m = _NAIVE.match(text.rstrip("\n"))
        if m is None:
            if inside and re.match(r"^ *\d+\) [^|]*\|  \}", text):
                inside = False
            continue
        depth = len(m.group(1)) // 2
        if depth == 0:
            inside = m.group(2) == function and m.group(3) == " {"
            entered += m.group(2) == function
        elif depth == 1 and inside:
            direct[m.group(2)] += 1
    return direct, entered


def call_line_count(path: Path) -> Dict[str, int]:
    """Entry, leaf and exit lines counted with plain string tests."""
    counts = Counter()
    for text in lines(path):
        body = text.split("|", 1)[-1].rstrip()
        if text.startswith("#") or "|" not in text:
            continue
        if body.endswith("{"):
            counts["entry"] += 1
        elif body.endswith(";"):
            counts["leaf"] += 1
        elif body.lstrip().startswith("}"):
            counts["exit"] += 1
    return counts

LAB50 = LAB / "6.1.0-50-amd64" / "function_graph"
_BANNER = re.compile(r"^ *(\d+)\) +\S+-(\d+) +=> +\S+-(\d+) *$")
_TASK_IN_LINE = re.compile(r"-(\d+) +(?:\||\[\d+\])")
_CPU_IN_LINE = re.compile(r"(?:^ *|\| +)(\d+)\) |\[(\d+)\]")
_BODY_CALL = re.compile(r"^  ( *)(\S+?)(?: \[\w+\])?\(\)( \{|;)$")
_BODY_EXIT = re.compile(r"^  ( *)\}")


def naive_direct_calls_any(path: Path, function: str) -> Tuple[Counter, int]:
    """naive_direct_calls for any column layout (text after the last `|`) and any number
    of tasks (task from the proc/trace-cmd column, else from the last banner on the CPU)."""
    direct: Counter = Counter()
    entered = 0
    inside: Dict[object, bool] = {}
    banner_task: Dict[str, str] = {}
    for text in lines(path):  # before its first banner, a CPU runs that banner's prev task
        m = _BANNER.match(text.rstrip("\n"))
        if m and m.group(1) not in banner_task:
            banner_task[m.group(1)] = m.group(2)
    for text in lines(path):
        line = text.rstrip("\n")
        m = _BANNER.match(line)
        if m:
            banner_task[m.group(1)] = m.group(3)
            continue
        if line.startswith("#") or "|" not in line:
            continue
        own = _TASK_IN_LINE.search(line.rsplit("|", 1)[0] + "|")
        cpu = _CPU_IN_LINE.search(line)
        key = own.group(1) if own else banner_task.get((cpu.group(1) or cpu.group(2)) if cpu else "")
        body = line.rsplit("|", 1)[1]
        call = _BODY_CALL.match(body)
        if call:
            depth = len(call.group(1)) // 2
            if depth == 0:
                inside[key] = call.group(2) == function and call.group(3) == " {"
                entered += call.group(2) == function
            elif depth == 1 and inside.get(key):
                direct[call.group(2)] += 1
        else:
            ex = _BODY_EXIT.match(body)
            if ex and not ex.group(1):
                inside[key] = False
    return direct, entered


def flat(node: fg.CallNode, path: Tuple[str, ...] = (), out: Optional[Dict] = None, digits: int = 12) -> Dict:
    """Every call path with its counters (sums rounded: batch sizes change float sum order)."""
    out = {} if out is None else out
    for tag, table in (("", node.children), ("[irq]", node.irqs)):
        for child in table.values():
            here = path + (tag + child.name,)
            out[here] = (child.calls, round(child.total, digits), round(child.ctotal, digits), child.max,
                         child.cut_start, child.cut_end, child.irq, child.module)
            flat(child, here, out, digits)
    return out

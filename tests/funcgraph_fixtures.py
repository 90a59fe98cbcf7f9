"""Paths of the real function_graph captures the parser tests read (never hand-typed)."""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Dict, List, Tuple

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

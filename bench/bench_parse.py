"""Parse + aggregate throughput of discover.funcgraph against mawk, and peak memory.

Run: .venv/bin/python bench/bench_parse.py [--lines 1500000] [--rounds 3] [--memory]

Throughput: the shared 6.1 captures concatenated to ~1.5M lines in a temp dir; each
round times, side by side, (a) mawk running bench/fgraph_edges.awk (caller->callee
calls and time with a per-CPU brace stack), (b) discover.funcgraph + the networkx
DiGraph (the fast path), (c) the same parser with the fast path off (one general
parse per line, the "plain Python loop"). CPU time (user+sys) is compared, not wall
time, because the machine is shared; the ratio is mawk time / Python time (>1 means
Python is faster). Memory: a child process streams 1M and then 10M lines (the captures
cycled) through the parser and reports its peak RSS; it must not grow with lines.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
FIXTURES = REPO.parent / "shared" / "fixtures" / "debian-6.1.0-57-amd64" / "function_graph"
AWK = REPO / "bench" / "fgraph_edges.awk"


def captures() -> List[Path]:
    paths = sorted(FIXTURES.glob("*.trace"))
    if not paths:
        sys.exit(f"no captures in {FIXTURES}")
    return paths


def build_trace(directory: str, target_lines: int) -> Tuple[str, int]:
    """Concatenate the captures until the file has at least target_lines lines."""
    blocks = [p.read_text() for p in captures()]
    per_round = sum(b.count("\n") for b in blocks)
    rounds = -(-target_lines // per_round)
    path = os.path.join(directory, "big.trace")
    with open(path, "w") as fh:
        for _ in range(rounds):
            for block in blocks:
                fh.write(block)
    return path, rounds * per_round


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_mawk(path: str) -> Tuple[float, int]:
    before = children_cpu()
    out = subprocess.run(["mawk", "-f", str(AWK), path], check=True, stdout=subprocess.PIPE, text=True).stdout
    calls = sum(int(line.split("\t")[2]) for line in out.splitlines())
    return children_cpu() - before, calls


def time_python(path: str, fast: bool) -> Tuple[float, int]:
    from discover.callgraph import to_digraph
    from discover.funcgraph import parse_file

    start = time.process_time()
    tree = parse_file(path, fast=fast)
    graph = to_digraph(tree.root)
    elapsed = time.process_time() - start
    calls = sum(a["calls"] + a["irq_calls"] for _, _, a in graph.edges(data=True))
    calls += sum(n.calls for n in tree.root.children.values()) + sum(n.calls for n in tree.root.irqs.values())
    return elapsed, calls


def peak_rss_streaming(lines: int) -> int:
    """Peak RSS (KiB) of a fresh process that streams `lines` lines through the parser."""
    code = f"""
import itertools, resource, sys
sys.path.insert(0, {str(REPO)!r})
from discover.funcgraph import FuncgraphParser
from discover.callgraph import to_digraph
block = []
for p in {[str(p) for p in captures()]!r}:
    block.extend(open(p).readlines())
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
parser = FuncgraphParser()
parser.feed(itertools.islice(itertools.cycle(block), {lines}))
tree = parser.finish()
to_digraph(tree.root)
print(base, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, parser.lines)
"""
    out = subprocess.run([sys.executable, "-c", code], check=True, stdout=subprocess.PIPE, text=True).stdout
    base, peak, seen = (int(x) for x in out.split())
    assert seen == lines
    return peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_500_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--memory", action="store_true", help="also measure peak RSS at 1M and 10M lines")
    ap.add_argument("--skip-general", action="store_true", help="skip the fast-path-off run")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path, nlines = build_trace(tmp, args.lines)
        print(f"trace: {nlines} lines, {os.path.getsize(path) / 1e6:.0f} MB (shared 6.1 captures concatenated)")
        times: Dict[str, List[float]] = {"mawk": [], "python": [], "general": []}
        calls: Dict[str, int] = {}
        for r in range(args.rounds):
            t, calls["mawk"] = time_mawk(path)
            times["mawk"].append(t)
            t, calls["python"] = time_python(path, fast=True)
            times["python"].append(t)
            if not args.skip_general and r == 0:
                t, calls["general"] = time_python(path, fast=False)
                times["general"].append(t)
            print(f"round {r + 1}: mawk {times['mawk'][-1]:.2f}s  discover {times['python'][-1]:.2f}s CPU"
                  f"  ratio {times['mawk'][-1] / times['python'][-1]:.2f}x")
        mawk = statistics.median(times["mawk"])
        fast = statistics.median(times["python"])
        print(f"calls counted: mawk {calls['mawk']}, discover {calls['python']}")
        print(f"mawk          {mawk:6.2f}s CPU  {nlines / mawk / 1e6:5.2f} M lines/s")
        ratios = sorted(m / p for m, p in zip(times["mawk"], times["python"]))
        print(f"discover      {fast:6.2f}s CPU  {nlines / fast / 1e6:5.2f} M lines/s  ratio {mawk / fast:.2f}x mawk"
              f" (per-round ratios {ratios[0]:.2f}..{ratios[-1]:.2f}, median {statistics.median(ratios):.2f})")
        if times["general"]:
            slow = times["general"][0]
            print(f"general path  {slow:6.2f}s CPU  {nlines / slow / 1e6:5.2f} M lines/s  ratio {mawk / slow:.2f}x mawk"
                  " (fast path off, one run)")
    if args.memory:
        small = peak_rss_streaming(1_000_000)
        big = peak_rss_streaming(10_000_000)
        print(f"peak RSS streaming  1M lines: {small / 1024:6.1f} MiB")
        print(f"peak RSS streaming 10M lines: {big / 1024:6.1f} MiB  ({big / small:.2f}x the 1M peak)")


if __name__ == "__main__":
    main()

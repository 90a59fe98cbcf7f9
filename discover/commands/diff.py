"""`discover diff`: how two call graphs differ (two kernels, NFSv3 vs NFSv4.2, before/after)."""
from __future__ import annotations

import json
from typing import Any, Dict, List

import click
import networkx as nx
from rich.console import Console
from rich.table import Table

from discover import callgraph as cg
from discover.errors import UserError

EXAMPLES = """
\b
Examples:
  discover callgraph --from-file v3-read.trace --format json -o v3.json
  discover callgraph --from-file v42-read.trace --format json -o v42.json
  discover diff v3.json v42.json
  discover diff old-kernel.json new-kernel.json --top 50
  discover diff a.json b.json --json | jq '.added[].callee'
"""


def load(path: str) -> nx.DiGraph:
    """A saved call graph, or a one-line reason it is not one."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise UserError(f"{path}: {exc.strerror or exc}") from None
    if raw[:2] == b"\x1f\x8b":
        raise UserError(f"{path}: gzip-compressed; decompress it first (gunzip -k)")
    try:
        return cg.load_json(raw.decode("utf-8"), origin=path)
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a probekit call graph JSON (not UTF-8 text)") from None
    except (ValueError, RecursionError) as exc:
        raise UserError(f"{path}: not valid JSON ({str(exc).splitlines()[0][:80]})") from None


def render(report: Dict[str, List[Dict[str, Any]]], a: str, b: str, top: int) -> None:
    console = Console()
    added = Table(title=f"calls only in {b} ({len(report['added'])})")
    removed = Table(title=f"calls only in {a} ({len(report['removed'])})")
    for table in (added, removed):
        for col in ("caller", "callee", "calls", "total"):
            table.add_column(col, overflow="fold", justify="right" if col in ("calls", "total") else "left")
    for table, rows in ((added, report["added"]), (removed, report["removed"])):
        for e in rows[:top]:
            table.add_row(e["caller"], e["callee"], str(e["calls"]), cg.fmt_us(e["total_us"]))
    shifted = Table(title=f"time shifts on calls in both (largest total change first, {len(report['shifted'])})")
    for col in ("caller", "callee", "calls", "avg before", "avg after", "avg shift", "total shift"):
        shifted.add_column(col, overflow="fold", justify="left" if col in ("caller", "callee") else "right")
    for e in report["shifted"][:top]:
        sign = "+" if e["avg_shift_us"] >= 0 else "-"
        tsign = "+" if e["total_shift_us"] >= 0 else "-"
        shifted.add_row(e["caller"], e["callee"], f"{e['calls_before']} -> {e['calls_after']}",
                        cg.fmt_us(e["avg_before_us"]), cg.fmt_us(e["avg_after_us"]),
                        sign + cg.fmt_us(abs(e["avg_shift_us"])), tsign + cg.fmt_us(abs(e["total_shift_us"])))
    console.print(added)
    console.print(removed)
    console.print(shifted)


@click.command("diff", epilog=EXAMPLES)
@click.argument("before", metavar="A.json")
@click.argument("after", metavar="B.json")
@click.option("--top", type=click.IntRange(min=1), default=25, show_default=True,
              help="Rows per table.")
@click.option("--json", "as_json", is_flag=True, help="Print the whole diff as JSON.")
def diff(before: str, after: str, top: int, as_json: bool) -> None:
    """Compare two call graphs written by `discover callgraph --format json`: caller->callee
    calls added and removed, and how the time of the calls in both shifted."""
    report = cg.diff(load(before), load(after))
    if as_json:
        click.echo(json.dumps(report, indent=1))
    else:
        render(report, before, after, top)

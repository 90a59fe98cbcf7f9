"""`discover callgraph`: what a kernel function really calls, live or from a saved trace."""
from __future__ import annotations

import gzip
import io
import os
import sys
import zlib
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional, Tuple

import click

from discover import callgraph as cg
from discover.errors import UserError, check_output, write_file
from discover.funcgraph import CallHook, CallTree, FuncgraphParser

FORMATS = ("tree", "profile", "json", "dot", "svg", "folded", "chrome")
#: Without a terminal on stderr (a log, CI, `labs run`) progress is one plain line this often.
PLAIN_PROGRESS_INTERVAL = 10.0

EXAMPLES = """
\b
Examples:
  discover callgraph nfs_file_read --workload 'dd if=/mnt/nfs/f of=/dev/null bs=64k'
  discover callgraph nfs_file_read nfs_file_write --duration 10 --depth 6
  discover callgraph 'nfs4_*' --comm dd --duration 5 --irqs
  discover callgraph nfs_file_read --duration 5 --format json -o read.json
  discover callgraph --from-file nfs3.nfs_file_read.trace            # no root, no tracefs
  discover callgraph --from-file write.trace --format svg -o write.svg
  discover callgraph --from-file read.trace --format profile --sort self     # flat view
  discover callgraph --from-file read.trace --format chrome -o read.json     # open in ui.perfetto.dev
  discover callgraph nfs_file_read --from-file read.trace --format folded | flamegraph.pl > read.svg
"""


def parse_saved(path: str, pid: Optional[int], comm: Optional[str],
                on_call: Optional[CallHook] = None) -> CallTree:
    """Parse a saved trace, or say in one line why it cannot be used."""
    if not os.path.exists(path):
        raise UserError(f"{path}: no such file")
    if os.path.isdir(path):
        raise UserError(f"{path}: is a directory, not a trace file")
    parser = FuncgraphParser(pid=pid, comm=comm, on_call=on_call)
    gzipped = False
    try:
        # opened once and never sought: a FIFO (`<(trace-cmd report)`, /dev/stdin) can be read only once
        with open(path, "rb") as fh:
            gzipped = fh.peek(2)[:2] == b"\x1f\x8b"
            parser.feed(gzip.GzipFile(fileobj=fh) if gzipped else fh)
    except (OSError, EOFError, zlib.error) as exc:
        raise UserError(f"{path}: {'corrupt gzip: ' if gzipped else ''}{getattr(exc, 'strerror', None) or exc}") from None
    tree = parser.finish()
    if tree.is_empty():
        if tree.filtered_out:
            if not parser.saw_pids:
                raise UserError(f"{path}: no task ids in this trace (funcgraph-proc was off), "
                                "cannot filter by --pid/--comm")
            raise UserError(f"{path}: no calls by the task selected with --pid/--comm")
        first = "; ".join(f"line {n}: {text!r}" for n, text in parser.rejected)
        raise UserError(f"{path}: not a function_graph trace (no function entries or exits in "
                        f"{parser.lines} lines" + (f"; first lines not understood: {first})" if first else ")"))
    return tree


def capture_live(functions: Tuple[str, ...], workload: Optional[str], duration: Optional[float],
                 depth: Optional[int], pid: Optional[int], comm: Optional[str], irqs: bool,
                 force: bool, on_call: Optional[CallHook] = None) -> Tuple[CallTree, str]:
    """Trace the functions on this kernel and aggregate while trace_pipe streams; returns
    the tree and a note on how the capture ended."""
    from rich.console import Console

    from discover.capture import CaptureOptions, live_capture

    extra = {} if depth is None else {"depth": depth}
    opts = CaptureOptions(functions=list(functions), workload=workload, duration=duration,
                          pid=pid, comm=comm, irqs=irqs, force=force, **extra)
    console = Console(stderr=True)
    parser = FuncgraphParser(on_call=on_call)
    with _progress_display(console) as progress:
        with live_capture(opts, progress=progress) as lines:
            parser.feed(lines)
    tree = parser.finish()
    result = lines.summary
    note = f"live capture ({result.elapsed:.1f} s, ended by {result.stopped_by}" + \
        (f", {result.lost} events lost in the ring buffer" if result.lost else "") + ")"
    if tree.is_empty():
        raise UserError(f"no calls of {', '.join(functions)} were traced "
                        "(did the workload reach them?)")
    return tree, note


def _progress_text(p: Any) -> str:
    return f"capturing: {p.elapsed:.1f} s, {p.lines} lines, {p.lost} events lost"


@contextmanager
def _progress_display(console: Any) -> Iterator[Callable[[Any], None]]:
    """A live status line on a terminal; elsewhere (a log file, CI, `labs run`) a plain line
    every PLAIN_PROGRESS_INTERVAL seconds, because a status line redrawn into a file is
    kilobytes of padding."""
    if console.is_terminal:
        with console.status("starting capture") as status:
            yield lambda p: status.update(_progress_text(p))
        return
    last = [0.0]

    def plain(p: Any) -> None:
        if p.elapsed - last[0] >= PLAIN_PROGRESS_INTERVAL:
            last[0] = p.elapsed
            click.echo(f"discover: {_progress_text(p)}", err=True)

    yield plain


def summary(tree: CallTree, source: str) -> str:
    p = tree.parser
    notes = [f"{p.lines} lines from {source}"]
    if p.cut_start or p.cut_end:
        notes.append(f"{p.cut_start} calls cut at trace start, {p.cut_end} at trace end")
    if p.migrations:
        notes.append(f"{p.migrations} task migrations followed")
    lost = sum(p.lost.values())
    if lost or p.lost_unknown:
        notes.append(f"{lost} events lost" + (f" (+{p.lost_unknown} unknown)" if p.lost_unknown else ""))
    if p.overruns:
        notes.append(f"{p.overruns} overruns")
    if p.malformed_count:
        first = ", ".join(str(n) for n, _ in p.malformed[:5])
        notes.append(f"{p.malformed_count} malformed lines (first at line {first})")
    irq_calls = irq_time = 0.0
    for node in tree.root.walk():
        for handler in node.irqs.values():
            irq_calls += handler.calls
            irq_time += handler.total
    if irq_calls:
        notes.append(f"interrupt work: {p.interrupts} interrupts ({int(irq_calls)} calls at their top), "
                     f"{cg.fmt_us(irq_time)}, shown apart under the functions they hit")
    if not p.timed:
        notes.append("no duration column: times unavailable")
    return "; ".join(notes)


def write_output(data: Any, output: Optional[str]) -> None:
    """Text or bytes to -o FILE or stdout."""
    if output is None:
        if isinstance(data, bytes):
            sys.stdout.buffer.write(data)
        else:
            sys.stdout.write(data)
        return
    write_file(output, data)


@click.command("callgraph", epilog=EXAMPLES)
@click.argument("functions", nargs=-1, metavar="FUNC...")
@click.option("--workload", metavar="CMD", help="Run CMD and capture until it exits.")
@click.option("--duration", type=float, metavar="S", help="Capture for S seconds.")
@click.option("--depth", type=click.IntRange(min=1), metavar="N",
              help="Call depth: max_graph_depth live, tree depth with --from-file.")
@click.option("--pid", type=int, help="Only this process (every thread).")
@click.option("--comm", metavar="NAME", help="Only tasks with this command name.")
@click.option("--irqs", is_flag=True,
              help="Live: keep interrupts (funcgraph-irqs). Output: expand interrupt work in the tree.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="tree", show_default=True)
@click.option("-o", "--output", metavar="FILE", help="Write here instead of stdout.")
@click.option("--from-file", "from_file", metavar="TRACE",
              help="Read a saved function_graph trace (cat trace, trace_pipe or trace-cmd report).")
@click.option("--min-time", type=click.FloatRange(min=0), default=0.0, metavar="US",
              help="Hide calls under US microseconds in total.")
@click.option("--min-calls", type=click.IntRange(min=0), default=0, metavar="N",
              help="Hide calls made fewer than N times.")
@click.option("--force", is_flag=True, help="Live: take over tracefs even if another tracer is active.")
@click.option("--sort", type=click.Choice(cg.PROFILE_SORTS), default="total", show_default=True,
              help="--format profile: the column to sort by (largest first; name: A-Z).")
@click.option("--max-nodes", type=click.IntRange(min=0), default=cg.DEFAULT_MAX_NODES, show_default=True,
              metavar="N", help="--format dot/svg: draw the N heaviest functions, say what was left out (0: all).")
def callgraph(functions: Tuple[str, ...], workload: Optional[str], duration: Optional[float],
              depth: Optional[int], pid: Optional[int], comm: Optional[str], irqs: bool, fmt: str,
              output: Optional[str], from_file: Optional[str], min_time: float, min_calls: int,
              force: bool, sort: str, max_nodes: int) -> None:
    """Show what FUNC really calls on this kernel: call counts, total/average/self time,
    callees heaviest first, and the interrupt work that landed in it kept apart.

    Live (root): sets up function_graph with set_graph_function=FUNC, streams trace_pipe
    while the workload runs, and restores every tracefs setting afterwards. With
    --from-file no root and no tracefs are needed; FUNC then narrows the output to the
    subtrees of those functions.
    """
    if workload is not None and duration is not None:
        raise UserError("give --workload or --duration, not both")
    if pid is not None and comm is not None:
        raise UserError("give --pid or --comm, not both")
    if fmt == "svg" and output is None and sys.stdout.isatty():
        raise UserError("SVG is binary: use -o FILE.svg")
    if output is not None:  # before a capture: its output has to be writable
        check_output(output, [from_file] if from_file is not None else [])
    chrome = cg.ChromeTrace(functions if from_file is not None else ()) if fmt == "chrome" else None
    if from_file is not None:
        if workload is not None or duration is not None or force:
            raise UserError("--workload/--duration/--force are for live capture, not --from-file")
        tree = parse_saved(from_file, pid, comm, chrome.on_call if chrome else None)
        source = from_file
        prune_depth = depth
    else:
        if not functions:
            raise UserError("name at least one function to trace (or use --from-file TRACE)")
        tree, source = capture_live(functions, workload, duration, depth, pid, comm, irqs, force,
                                    chrome.on_call if chrome else None)
        prune_depth = None
    root = tree.root
    if functions and from_file is not None:
        try:
            root = cg.select(root, functions)
        except LookupError as exc:
            raise UserError(str(exc)) from None
    if prune_depth is not None or min_time or min_calls:
        root = cg.prune(root, max_depth=None if prune_depth is None else prune_depth - 1,
                        min_time=min_time, min_calls=min_calls)
    note = summary(tree, source)
    if fmt == "tree":
        from rich.console import Console

        title = f"calls of {', '.join(functions) or 'every traced function'}"
        rendered = cg.render_tree(root, title, expand_irqs=irqs)
        if output is None:
            console = Console(width=max(Console().width, 160) if not sys.stdout.isatty() else None)
        else:
            console = Console(record=True, width=200, file=io.StringIO())
        console.print(note, markup=False, highlight=False, soft_wrap=True)
        console.print(rendered)
        if output is not None:
            write_output(console.export_text(), output)
        return
    if fmt == "folded":
        write_output("".join(line + "\n" for line in cg.folded(root)), output)
        return
    if chrome is not None:
        write_output(chrome.to_json(note), output)
        return
    graph = cg.to_digraph(root, source=source, functions=list(functions), summary=note)
    if fmt == "json":
        write_output(cg.to_json(graph) + "\n", output)
        return
    if fmt == "profile":
        write_output(cg.render_profile(cg.profile(graph, sort), note), output)
        return
    graph, left_out = cg.prune_graph(graph, max_nodes)  # what was left out is said in the picture
    dot_text = cg.to_dot(graph, left_out)
    if fmt == "dot":
        write_output(dot_text, output)
        return
    if graph.number_of_nodes() > 300:
        click.echo(f"discover: note: {graph.number_of_nodes()} functions; Graphviz may take minutes "
                   "(narrow with --depth, --min-time or --min-calls)", err=True)
    try:
        write_output(cg.to_svg(dot_text), output)
    except RuntimeError as exc:
        raise UserError(str(exc)) from None

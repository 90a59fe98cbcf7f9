"""`discover propose`: where to time each filesystem operation, ranked, with reasons."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from discover.errors import check_output, write_file
from discover.profile import KernelProfile, load_profile
from discover.propose import CallGraphs, Candidate, Proposer, build_spec, check_fs_name
from discover.snapshot import build_profile, find_live_tracefs, host_paths
from discover.spec import OPS, SPEC_OPS, dumps_spec, parse_ops

EXAMPLES = """
\b
Examples:
  discover propose nfs                                   # live kernel, every operation it has
  discover propose nfs --ops read,write -o /tmp/nfs.toml # review, diff with probes/specs/nfs.toml
  discover propose nfs --kernel-profile 6.1.json         # another kernel, no tracefs needed
  discover propose nfs --callgraphs graphs/ --kernel-profile 6.1.json
"""


def render(console: Console, proposer: Proposer, proposals: Dict[str, List[Candidate]]) -> None:
    for op, cands in proposals.items():
        table = Table(title=f"{SPEC_OPS[op]} {op} on {proposer.profile.release} ({proposer.fs}: "
                            f"{', '.join(proposer.modules) or 'built in'})", show_lines=True)
        table.add_column("#", justify="right")
        table.add_column("kind")
        table.add_column("attach (entry -> exit)", overflow="fold")
        table.add_column("why", overflow="fold")
        rank = 0
        for cand in cands:
            if cand.usable:
                rank += 1
            points = "\n".join(f"{a['entry']} -> {a['exit']}" for a in cand.attach) or "(none usable)"
            why = [f"stability: {cand.stability}", f"coverage: {cand.coverage}",
                   f"window: {cand.window}", f"traceability: {cand.traceability}",
                   f"evidence: {cand.evidence}"] + [f"- {r}" for r in cand.reasons]
            table.add_row(str(rank) if cand.usable else "x", f"{cand.kind}\n({cand.layer})", escape(points),
                          escape("\n".join(why)))
        for note in proposer.coverage_notes(op):
            table.caption = escape(note)
        console.print(table)


@click.command("propose", epilog=EXAMPLES)
@click.argument("fs", metavar="FS")
@click.option("--ops", "ops_text",
              help="Comma-separated operations: " + ", ".join(f"{n} ({l})" for n, l in OPS.items())
                   + ". Default: every one the filesystem has an attach point for (the others are named "
                     "on stderr); an operation asked for by name and not found is an error.")
@click.option("--kernel-profile", "profile_path", type=click.Path(dir_okay=False),
              help="Use a profile from `discover snapshot` instead of the live kernel.")
@click.option("--callgraphs", "graphs_dir", type=click.Path(file_okay=False),
              help="Directory of call graphs (`discover callgraph --format json`) as evidence.")
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Write the probe spec (TOML, docs/probe-spec.md) here.")
def propose(fs: str, ops_text: str, profile_path: Optional[str], graphs_dir: Optional[str],
            output: Optional[str]) -> None:
    """Rank attach points for timing each operation of filesystem FS: a tracepoint pair at
    the filesystem layer first, then the filesystem's own entry below VFS (fentry/fexit
    where BTF allows, kprobe/kretprobe otherwise, all NFS version variants and the
    atomic-open path together), then deeper points. Every candidate says why: stability,
    coverage, module, traceability, what falls in the timed window, and the evidence.
    """
    check_fs_name(fs)
    ops = list(SPEC_OPS) if ops_text is None else parse_ops(ops_text)  # the server's too: left out where none
    if output is not None:  # the spec's directory is made if missing (probes/specs/ of a new tree)
        inputs = [Path(profile_path)] if profile_path else []
        check_output(output, inputs + (CallGraphs.graph_files(Path(graphs_dir)) if graphs_dir else []),
                     make_parents=True)
    if profile_path is not None:
        profile = load_profile(Path(profile_path))
    else:
        tracefs = find_live_tracefs(hint="; or pass --kernel-profile PROFILE.json")
        profile = KernelProfile(build_profile(tracefs, **host_paths()), origin="live kernel")
    graphs = CallGraphs.load_dir(Path(graphs_dir)) if graphs_dir is not None else None
    proposer = Proposer(profile, fs, graphs)
    proposals = proposer.propose(ops)
    spec, left_out = build_spec(proposer, proposals, every=ops_text is None)
    if left_out:
        click.echo(f"propose: {fs} has no attach point for {', '.join(left_out)} on {profile.release}: "
                   f"left out of the spec", err=True)
    render(Console(), proposer, {op: cands for op, cands in proposals.items() if op not in left_out})
    if output is not None:
        out_path = Path(output)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        write_file(out_path, dumps_spec(spec))
        click.echo(f"propose: wrote {output}", err=True)

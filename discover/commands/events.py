"""`discover events`: a subsystem's tracepoints, which pairs can time an operation, which cannot."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from discover.events import describe_systems, read_system_from_tracefs, tracefs_systems
from discover.profile import load_profile
from discover.snapshot import find_live_tracefs

EXAMPLES = """
\b
Examples:
  discover events nfs                               # live kernel (reads tracefs)
  discover events nfs nfs4 sunrpc --json
  discover events nfs --kernel-profile 6.1.json     # another kernel, no tracefs needed
"""


def load_events(systems: Tuple[str, ...], profile_path: Optional[Path]) -> Tuple[Dict[str, Any], str]:
    """{system: {event: format}} for the requested systems, and where it came from."""
    if profile_path is not None:
        profile = load_profile(profile_path)
        return profile.events, f"kernel profile {profile_path} ({profile.release})"
    tracefs = find_live_tracefs(hint="; or pass --kernel-profile PROFILE.json")
    known = tracefs_systems(tracefs)
    events = {s: read_system_from_tracefs(tracefs, s) for s in systems if s in known}
    events.update({s: {} for s in known if s not in events})
    return events, f"tracefs {tracefs}"


def render(report: List[Dict[str, Any]], where: str) -> None:
    console = Console()
    for entry in report:
        system = entry["system"]
        pairs = Table(title=f"{system}: tracepoint pairs that bracket an operation ({where})")
        for col in ("operation", "start", "end", "kind", "match end to start on"):
            pairs.add_column(col, overflow="fold")
        for p in entry["pairs"]:
            match = "same task" if p["kind"] == "sync" else ", ".join(p["keys"]) or "?"
            pairs.add_row(p["operation"], p["start"], p["end"], p["kind"], match)
        console.print(pairs)
        singles = Table(title=f"{system}: single points (cannot time anything alone)")
        singles.add_column("event", overflow="fold")
        singles.add_column("fields", overflow="fold")
        for name in entry["singles"]:
            fields = entry["events"].get(name)
            singles.add_row(name, "(format unreadable)" if fields is None else escape(" ".join(fields)))
        console.print(singles)


@click.command("events", epilog=EXAMPLES)
@click.argument("systems", nargs=-1, required=True, metavar="SUBSYS...")
@click.option("--kernel-profile", "profile_path", type=click.Path(dir_okay=False),
              help="Read tracepoints from a profile written by `discover snapshot`.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
def events(systems: Tuple[str, ...], profile_path: Optional[str], as_json: bool) -> None:
    """List a subsystem's tracepoints with their fields, pair the ones that bracket an
    operation (*_enter/*_exit, *_start/*_done, X/X_done, initiate/done) and name the single
    points that cannot time anything alone.

    A "sync" pair fires in the calling task around one call; an "async" pair (initiate/done)
    ends in another task (an RPC completion), so a tool must match it on the shared fields.
    """
    by_system, where = load_events(systems, Path(profile_path) if profile_path else None)
    report = describe_systems(systems, by_system, where)
    if as_json:
        click.echo(json.dumps(report, indent=1))
    else:
        render(report, where)

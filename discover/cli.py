"""`discover`: the command-line entry point; each subcommand lives in discover.commands."""
from __future__ import annotations

import click

from discover.commands.callgraph import callgraph
from discover.commands.diff import diff
from discover.commands.events import events
from discover.commands.propose import propose
from discover.commands.snapshot import snapshot
from discover.errors import run_cli
from discover.version import version_option


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@version_option
def discover() -> None:
    """Find what a kernel function calls and where to time it."""


discover.add_command(snapshot)
discover.add_command(events)
discover.add_command(propose)
discover.add_command(callgraph)
discover.add_command(diff)


def main() -> None:
    run_cli("discover", discover)

"""Command lines of the tracing tools and the exporter: argparse, as bcc's tools parse theirs.

Why not click, which the command groups (discover, probes, labs) use: a tool's start is on
its user's clock, and click's import is a third of a tool's imports and about 3 MiB of its
peak. The help keeps the groups' layout (Usage, the description, Options, then the examples
kept as written), which probes.manpage turns into pages; a usage error is a UsageError,
which the boundary (discover.errors.run_cli) prints as one line and exit status 2.
"""
from __future__ import annotations

import argparse
import math
import os

from discover.errors import UsageError

TYPE_CHECKING = False  # typing's constant without typing (discover/records.py)
if TYPE_CHECKING:
    from typing import Any, Callable, List, NoReturn, Optional, Sequence


class Parser(argparse.ArgumentParser):
    """One command's parser: -h/--help and --version, options in one `Options:` block,
    EXAMPLES printed after it as written."""

    def __init__(self, prog: str, usage: str, description: Optional[str], examples: str = "") -> None:
        super().__init__(prog=prog, usage=f"{prog} {usage}", description=description, allow_abbrev=False,
                         formatter_class=_Formatter, add_help=False)
        self.examples = examples.strip("\n")
        self._optionals.title = "Options"
        self._positionals.title = "Arguments"
        self.add_argument("--version", action=_Version, nargs=0, help="Print probekit's version and exit.")

    def _help_last(self) -> None:
        """-h/--help, added once the command's own options are: listed last, as the groups list it."""
        if not any(action.dest == "help" for action in self._actions):
            self.add_argument("-h", "--help", action="help", help="Show this message and exit.")

    def format_help(self) -> str:
        self._help_last()
        text = super().format_help().replace("usage: ", "Usage: ", 1)
        return f"{text}\n{self.examples}\n" if self.examples else text

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")

    def parse(self, args: Optional[Sequence[str]]) -> argparse.Namespace:
        """The command line (sys.argv's without `args`)."""
        self._help_last()
        return self.parse_args(args)


class _Formatter(argparse.HelpFormatter):
    """Help 80 columns wide at most (narrower where COLUMNS says so), as click lays out the
    groups' help: the man pages and docs/examples show it."""

    def __init__(self, prog: str) -> None:
        columns = os.environ.get("COLUMNS", "")
        width = min(int(columns), 80) if columns.isdigit() and int(columns) > 0 else 80
        super().__init__(prog, max_help_position=32, width=width - 2)

    def _format_action_invocation(self, action: argparse.Action) -> str:
        """`-p, --pid PID` (the value named once), as bcc's users read it in the groups' help."""
        if not action.option_strings or action.nargs == 0:
            return super()._format_action_invocation(action)
        return ", ".join(action.option_strings) + " " + self._format_args(
            action, self._get_default_metavar_for_optional(action))


class _Version(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, *_args: Any) -> None:
        from discover.version import probekit_version

        print(f"{parser.prog} {probekit_version()}")
        parser.exit()


def int_range(low: int, high: Optional[int] = None) -> Callable[[str], int]:
    """An integer within [low, high]: a usage error that says the range otherwise."""
    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a valid integer") from None
        if value < low or (high is not None and value > high):
            bounds = f"{low}<=x<={high}" if high is not None else f"x>={low}"
            raise argparse.ArgumentTypeError(f"{text} is not in the range {bounds}")
        return value
    return parse


def float_at_least(low: float) -> Callable[[str], float]:
    """A finite number >= low."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a valid number") from None
        if not math.isfinite(value) or value < low:
            raise argparse.ArgumentTypeError(f"{text} is not in the range x>={low:g}")
        return value
    return parse


def file_path(text: str) -> str:
    """A file's path: a directory is a usage error (it cannot be the file asked for)."""
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a directory")
    return text

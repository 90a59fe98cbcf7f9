"""One-line errors for command-line users: never a traceback for bad input."""
from __future__ import annotations

import sys
from typing import Callable, NoReturn

import click


class UserError(Exception):
    """A problem the user can fix (bad input, missing privilege, absent kernel feature).

    Commands print it as one line on stderr and exit non-zero.
    """

    exit_code = 1


def run_cli(prog: str, entry: Callable[[], object]) -> NoReturn:
    """Run a command's entry point, turning UserError, usage errors, OS errors and Ctrl-C into one-line exits."""
    try:
        entry()
    except UserError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:  # usage errors: one line too, not a traceback
        print(f"{prog}: error: {exc.format_message()}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    except OSError as exc:  # e.g. an output path in a missing directory: say which file, no traceback
        print(f"{prog}: error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), file=sys.stderr)
        sys.exit(1)
    sys.exit(0)

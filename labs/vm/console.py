"""Guest console watching: a kernel panic, oops or hang ends a lab run with one clear line.

The serial console of every guest goes to a log file; a ConsoleWatch reads what was
appended since its last look and raises GuestFailure on the first line that says the
kernel is in trouble, so a run never ends in a silent timeout.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import List, Optional

from discover.errors import UserError

#: console lines after which the guest cannot be trusted (label, pattern), most specific first
TROUBLE = [
    ("kernel panic", re.compile(r"Kernel panic - not syncing")),
    ("kernel oops", re.compile(r"\bOops(?:: |\s*\[#?\d)|\binvalid opcode: |general protection fault")),
    ("soft lockup", re.compile(r"soft lockup - CPU#")),
    ("hard lockup", re.compile(r"Watchdog detected hard LOCKUP")),
    ("kernel BUG", re.compile(r"\bBUG: ")),
    ("RCU stall", re.compile(r"rcu: INFO: .* detected stalls|rcu_.* detected stalls")),
    ("hung task", re.compile(r"blocked for more than \d+ seconds")),
]


class GuestFailure(UserError):
    """The guest kernel crashed, hung or a lab step could not finish: one line + the console log."""


class ConsoleWatch:
    """Incremental reader of one guest's console log."""

    def __init__(self, node: str, path: Path, offset: int = 0) -> None:
        self.node = node
        self.path = path
        self.offset = offset
        self._partial = b""

    def check(self) -> None:
        """Raise GuestFailure if the console shows trouble since the last check."""
        for line in self.new_lines():
            for label, pattern in TROUBLE:
                if pattern.search(line):
                    raise GuestFailure(f"{self.node}: {label} on the guest console: {line.strip()[:200]!r} "
                                       f"(console log: {self.path})")

    def new_lines(self) -> List[str]:
        """Complete lines appended since the last call."""
        try:
            with self.path.open("rb") as log:
                log.seek(self.offset)
                data = log.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        return [line.decode("utf-8", "replace") for line in lines]

    def contains(self, pattern: "re.Pattern[str]") -> bool:
        """Whether the whole log so far matches (boot progress checks)."""
        try:
            return bool(pattern.search(self.path.read_text(errors="replace")))
        except FileNotFoundError:
            return False

    def tail(self, lines: int = 3) -> str:
        """The last console lines, for hang reports."""
        try:
            text = self.path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def failure(node: str, what: str, watch: Optional[ConsoleWatch]) -> GuestFailure:
    """A GuestFailure for a step that did not finish, with the console's last words."""
    if watch is None:
        return GuestFailure(f"{node}: {what}")
    return GuestFailure(f"{node}: {what}; console ends: {watch.tail()!r} (console log: {watch.path})")

"""The console watcher on real guest consoles (Debian 6.1 lab guests, see the README beside them)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from labs.vm.console import ConsoleWatch, GuestFailure, failure

CONSOLES = Path(__file__).parent / "fixtures" / "6.1.0-50-amd64" / "console"


def test_a_clean_boot_is_not_trouble() -> None:
    watch = ConsoleWatch("lab", CONSOLES / "boot.log")
    watch.check()
    assert watch.offset == (CONSOLES / "boot.log").stat().st_size


def test_soft_lockup_is_reported_with_its_line_and_log() -> None:
    log = CONSOLES / "soft-lockup-ftrace-enable.log"
    with pytest.raises(GuestFailure) as caught:
        ConsoleWatch("lab", log).check()
    message = str(caught.value)
    assert message.startswith("lab: soft lockup on the guest console: ")
    assert "soft lockup - CPU#0 stuck for" in message and str(log) in message
    assert "\n" not in message


def test_panic_after_sysrq_crash_is_reported() -> None:
    log = CONSOLES / "sysrq-crash.log"
    with pytest.raises(GuestFailure) as caught:
        ConsoleWatch("lab", log).check()
    assert "sysrq" in str(caught.value).lower()


def test_watch_reads_only_what_was_appended(tmp_path: Path) -> None:
    boot = (CONSOLES / "boot.log").read_bytes()
    lockup = (CONSOLES / "soft-lockup-ftrace-enable.log").read_bytes()
    live = tmp_path / "console.log"
    live.write_bytes(boot[: len(boot) // 2])
    watch = ConsoleWatch("lab", live)
    watch.check()
    with live.open("ab") as grow:
        grow.write(boot[len(boot) // 2:])
    watch.check()                      # the rest of a clean boot, split mid-line: still fine
    with live.open("ab") as grow:
        grow.write(lockup[lockup.index(b"watchdog: BUG: soft lockup"):])
    with pytest.raises(GuestFailure):
        watch.check()


def test_failure_quotes_the_last_console_lines(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    shutil.copy(CONSOLES / "boot.log", log)
    message = str(failure("lab", "command did not finish in 5 s", ConsoleWatch("lab", log)))
    last = (CONSOLES / "boot.log").read_text(errors="replace").strip().splitlines()[-1].strip()
    assert message.startswith("lab: command did not finish in 5 s; console ends: ")
    assert last in message and str(log) in message

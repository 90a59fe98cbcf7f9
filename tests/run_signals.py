"""How the test run itself takes Ctrl-C and SIGTERM (hooks imported by conftest.py).

A CI job that is stopped (its time limit, a cancel) gets SIGTERM; by default that ends
pytest at once, with no fixture teardown, and leaves guests, libvirt domains and daemons
behind. Taken as Ctrl-C instead, the session ends through its finalizers, which take the
labs down. tests/test_run_signals.py proves both with a pytest run of its own."""
from __future__ import annotations

import signal
from types import FrameType
from typing import Optional

import pytest


def _as_ctrl_c(signum: int, frame: Optional[FrameType]) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    # A run started as a background job of a shell without job control inherits SIGINT
    # ignored, and so would every command it starts: the Ctrl-C cases of the bad-input
    # tests would then test nothing a user sees. Commands started from here get the
    # default disposition back.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _as_ctrl_c)

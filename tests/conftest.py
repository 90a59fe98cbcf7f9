"""Fixtures shared by the unit tests."""
from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Iterator

import pytest

from probes.cgroups import cgroup2_root


def pytest_configure(config: pytest.Config) -> None:
    """A test run started as a background job of a shell without job control inherits
    SIGINT ignored, and so would every command it starts: the Ctrl-C cases would then test
    nothing a user sees. Commands started from here get the default disposition back."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def cgroup() -> Iterator[Path]:
    """A child cgroup of the real cgroup2 root, removed afterwards (as root, like the tools)."""
    root = cgroup2_root()
    assert root is not None, "no cgroup2 mount on this host"
    path = Path(root) / f"probekit-test-{os.getpid()}"
    path.mkdir()
    try:
        yield path
    finally:
        for child in sorted(path.glob("*/"), reverse=True):
            if (child / "cgroup.procs").exists():
                child.rmdir()
        path.rmdir()

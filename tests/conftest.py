"""Fixtures shared by the unit tests."""
from __future__ import annotations

import os
from multiprocessing.context import ForkProcess
from pathlib import Path
from typing import Iterator, List

import pytest

from probes.cgroups import cgroup2_root

from as_nobody import View, view

from run_signals import pytest_configure  # noqa: F401  (a hook: SIGINT and SIGTERM of the run)
from lab_gate import pytest_collection_modifyitems, pytest_terminal_summary  # noqa: F401  (hooks: no QEMU, no lab)


@pytest.fixture(scope="session")
def unprivileged() -> Iterator[View]:
    """Commands run as a user without privileges, from a path that user can read."""
    yield from view()


@pytest.fixture
def cgroup() -> Iterator[Path]:
    """A child cgroup of the real cgroup2 root, removed afterwards (as root, like the tools)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: makes a cgroup under the cgroup2 root, as the tools' --cgroup filter is used")
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


@pytest.fixture
def forked_children(monkeypatch: pytest.MonkeyPatch) -> Iterator[List[ForkProcess]]:
    """The children probes.forked starts, as they start (their exit codes are the tests')."""
    children: List[ForkProcess] = []
    start = ForkProcess.start

    def recorded(process: ForkProcess) -> None:
        start(process)
        children.append(process)

    monkeypatch.setattr(ForkProcess, "start", recorded)
    yield children

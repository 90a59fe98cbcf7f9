"""Outside CI, a machine without QEMU or root leaves the lab tests out with one line.

Why: each lab test would otherwise fail on its own (no QEMU, or 'run them as root'), burying
the unit tier's result under hundreds of failures a contributor can do nothing about. CI
(CI set, as CI services set it) always runs them: there a missing QEMU is a failure."""
from __future__ import annotations

import os
import shutil
from typing import Any, List, Optional

import pytest

#: why this session runs no lab test (said once at the end), when it does not
LAB_NOT_RUN: List[str] = []


def lab_unavailable() -> Optional[str]:
    """Why this machine cannot run the lab tests, or None (always None in CI)."""
    if os.environ.get("CI"):
        return None
    missing = [why for ok, why in ((shutil.which("qemu-system-x86_64"), "no qemu-system-x86_64 on PATH"),
                                   (os.geteuid() == 0, "not root")) if not ok]
    return " and ".join(missing) or None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    """The lab tests deselected, all at once; after -m, so that `-m 'not lab'` says nothing."""
    why = lab_unavailable()
    lab = [item for item in items if item.get_closest_marker("lab")]
    if why is None or not lab:
        return
    config.hook.pytest_deselected(items=lab)
    items[:] = [item for item in items if not item.get_closest_marker("lab")]
    LAB_NOT_RUN.append(f"{len(lab)} lab tests not run: {why} (they boot QEMU guests as root; "
                       "`bash scripts/test` installs QEMU; CI runs them all)")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line in LAB_NOT_RUN:
        terminalreporter.write_line(line, yellow=True)

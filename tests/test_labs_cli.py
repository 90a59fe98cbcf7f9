"""`labs` command line without a VM: one-line errors, state handling, help with examples."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest


def labs(args: List[str], cache: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PROBEKIT_CACHE=str(cache))
    return subprocess.run([sys.executable, "-c", "from labs.cli import main; main()", *args],
                          capture_output=True, text=True, env=env, timeout=60)


def test_run_without_a_lab_is_one_line(tmp_path: Path) -> None:
    res = labs(["run", "--", "uname", "-r"], tmp_path)
    assert res.returncode == 1
    assert res.stderr == "labs: error: no lab 'default' is up (run `labs up` first)\n"


def test_status_and_down_of_an_absent_lab(tmp_path: Path) -> None:
    assert labs(["status"], tmp_path).stdout == "lab: absent\n"
    assert labs(["status", "--json"], tmp_path).stdout == '{"lab": "absent"}\n'
    res = labs(["down"], tmp_path)
    assert res.returncode == 0 and res.stdout == "lab 'default' is not up\n"


def test_unknown_kernel_fails_before_anything_starts(tmp_path: Path) -> None:
    res = labs(["up", "--kernel", "4.19"], tmp_path)
    assert res.returncode == 1
    assert res.stderr.startswith("labs: error: no Debian suite known for kernel '4.19'")
    assert len(res.stderr.splitlines()) == 1
    assert not (tmp_path / "labs" / "default.backend").exists()


@pytest.mark.parametrize("command", ["up", "run", "shell", "status", "down", "test"])
def test_every_command_help_ends_with_examples(tmp_path: Path, command: str) -> None:
    res = labs([command, "--help"], tmp_path)
    assert res.returncode == 0
    text = res.stdout
    examples = text.index("Examples:")
    assert examples > text.index("Options:")
    assert "  labs " + command in text[examples:]

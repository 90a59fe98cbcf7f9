"""A benchmark that boots a lab answers -h and --help with its docstring and boots nothing.

Why: the scripts read their options by hand, and one used to take an option it did not know
as none given: `bench_attach.py --help` booted a 6.12 guest and ran the whole comparison.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
#: every script that boots a lab (run_in_lab) or measures in one
LAB_SCRIPTS = sorted(path.name for path in BENCH.glob("bench_*.py") if "run_in_lab" in path.read_text())


def test_every_lab_script_is_checked() -> None:
    assert {"bench_attach.py", "bench_core.py", "bench_server_scale.py"} <= set(LAB_SCRIPTS)


@pytest.mark.parametrize("script", LAB_SCRIPTS)
@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_prints_the_docstring_and_boots_nothing(script: str, flag: str) -> None:
    doc = ast.get_docstring(ast.parse((BENCH / script).read_text()))
    assert doc
    # a script that booted a lab would still be booting it when the timeout ends the test
    done = subprocess.run([sys.executable, str(BENCH / script), flag], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert doc.splitlines()[0].split("(")[0].strip() in done.stdout
    assert "[lab]" not in done.stdout + done.stderr

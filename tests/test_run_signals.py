"""The test run's own SIGTERM (tests/run_signals.py): a pytest run stopped that way still
tears its session fixtures down, as the lab fixtures need to take guests down."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent

HELD = '''
import os, time
import pytest

@pytest.fixture(scope="session")
def held():
    with open(os.environ["MARK"], "a") as f:
        f.write("setup\\n")
    yield
    with open(os.environ["MARK"], "a") as f:
        f.write("teardown\\n")

def test_waits(held):
    time.sleep(60)
'''


def run_and_terminate(tmp_path: Path, plugin: bool) -> str:
    """A pytest run of one waiting test, SIGTERM once its session fixture is set up; the
    fixture's record of setup and teardown."""
    (tmp_path / "test_held.py").write_text(HELD)
    mark = tmp_path / "mark"
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_held.py"]
    if plugin:
        args[3:3] = ["-p", "run_signals"]
    env = dict(os.environ, MARK=str(mark), PYTHONPATH=str(TESTS))
    proc = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        # the signal waits on the evidence (the fixture set up), however long a loaded host
        # (three TCG guests beside the unit tests) takes to start pytest
        while not (mark.exists() and "setup" in mark.read_text()):
            assert proc.poll() is None, proc.communicate()[0].decode()[-1000:]
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode != 0
    return mark.read_text()


def test_sigterm_tears_the_session_down(tmp_path: Path) -> None:
    assert run_and_terminate(tmp_path, plugin=True) == "setup\nteardown\n"


def test_without_it_sigterm_leaves_the_session_as_it_was(tmp_path: Path) -> None:
    """Why the hook exists: pytest's own answer to SIGTERM skips every teardown."""
    assert run_and_terminate(tmp_path, plugin=False) == "setup\n"

"""Every console script goes through discover.errors.run_cli: a bug, Ctrl-C and SIGTERM
anywhere inside a command end as one stderr line and the boundary's exit status."""
from __future__ import annotations

import importlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest

from discover import errors

REPO = Path(__file__).resolve().parents[1]


def console_scripts() -> Dict[str, str]:
    """[project.scripts] of pyproject.toml: name -> module:function."""
    text = (REPO / "pyproject.toml").read_text()
    section = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    return dict(re.findall(r'^([\w-]+) = "([\w.:]+)"$', section, re.M))


#: a command line per script that reaches a command's own code (a group needs a subcommand)
ARGS = {"discover": ["diff", "a.json", "b.json"], "probes": ["fetch-kernel", "6.1"], "labs": ["status"],
        "nfsslower": [], "nfsdist": [], "nfstop": [], "nfs-exporter": [],
        "fsslower": ["-t", "xfs"], "fsdist": ["-t", "ext4"], "fstop": ["-t", "btrfs"]}

#: raised inside the command, where its own code would run
FAULTS = {
    "bug": "raise RuntimeError('boom')",
    "ctrl-c": "raise KeyboardInterrupt",
    "sigterm": "os.kill(os.getpid(), signal.SIGTERM); time.sleep(5)",
    "undo-step": "errors.at_exit(lambda: open('undone', 'w').close()); raise KeyboardInterrupt",
    "child": "errors.spawn(['sleep', '60']); open('started', 'w').close(); time.sleep(30)",
}


def _driver(target: str, fault: str) -> str:
    """Import the console script's function as its wrapper does, make every click command
    callback fail with `fault`, and call it."""
    module, func = target.split(":")
    return ("import os, signal, sys, time, click\n"
            "from discover import errors\n"
            "def fault(*_a, **_k):\n"
            f"    {FAULTS[fault]}\n"
            "click.Context.invoke = lambda self, callback, *a, **k: fault()\n"
            f"from {module} import {func}\n"
            f"sys.argv = [sys.argv[0]] + sys.argv[1:]\n"
            f"{func}()\n")


def test_every_script_is_listed() -> None:
    assert set(console_scripts()) == set(ARGS)
    for target in console_scripts().values():
        module, func = target.split(":")
        assert callable(getattr(importlib.import_module(module), func))


def _run(name: str, target: str, fault: str, tmp_path: Path, **popen: object) -> subprocess.CompletedProcess:
    env = dict(os.environ, PROBEKIT_CACHE=str(tmp_path / "cache"), PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", _driver(target, fault), *ARGS[name]], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60, **popen)  # type: ignore[arg-type]


def _one_line(res: subprocess.CompletedProcess, name: str) -> str:
    lines: List[str] = res.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert lines[0].startswith(f"{name}: "), res.stderr
    return lines[0]


@pytest.mark.parametrize("name", sorted(ARGS))
def test_a_bug_is_one_line_and_a_log(name: str, tmp_path: Path) -> None:
    res = _run(name, console_scripts()[name], "bug", tmp_path)
    assert res.returncode == errors.EXIT_ERROR
    line = _one_line(res, name)
    assert "internal error: RuntimeError: boom" in line
    log = Path(line.rsplit("details in ", 1)[1].rstrip(")"))
    assert log.parent == tmp_path / "cache" / "logs"
    assert "Traceback" in log.read_text() and "RuntimeError: boom" in log.read_text()


@pytest.mark.parametrize("name", sorted(ARGS))
def test_ctrl_c_is_130_and_undoes(name: str, tmp_path: Path) -> None:
    res = _run(name, console_scripts()[name], "undo-step", tmp_path)
    assert res.returncode == errors.EXIT_SIGINT
    assert "interrupted" in _one_line(res, name)
    assert (tmp_path / "undone").exists()


@pytest.mark.parametrize("name", sorted(ARGS))
def test_sigterm_is_143(name: str, tmp_path: Path) -> None:
    res = _run(name, console_scripts()[name], "sigterm", tmp_path)
    assert res.returncode == errors.EXIT_SIGTERM
    assert "terminated by SIGTERM" in _one_line(res, name)


@pytest.mark.parametrize("name", ["discover", "nfsslower"])
def test_sigterm_ends_children(name: str, tmp_path: Path) -> None:
    """A child started through errors.spawn is ended with its process group on SIGTERM."""
    env = dict(os.environ, PROBEKIT_CACHE=str(tmp_path / "cache"), PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-c", _driver(console_scripts()[name], "child"), *ARGS[name]],
                            cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    for _ in range(400):
        if (tmp_path / "started").exists() or proc.poll() is not None:
            break
        time.sleep(0.05)
    children = subprocess.run(["pgrep", "-P", str(proc.pid), "sleep"], capture_output=True, text=True).stdout.split()
    assert children
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == errors.EXIT_SIGTERM and len(err.splitlines()) == 1, err
    for pid in children:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()


def test_messages_stay_one_line() -> None:
    assert errors.one_line("a\nb\tc\x1b") == "a\\nb\\tc\\x1b"
    assert len(errors.one_line("x" * 10000)) == errors.MAX_LINE


def test_write_file_names_the_path_and_leaves_no_partial(tmp_path: Path) -> None:
    with pytest.raises(errors.UserError, match="cannot write /dev/full"):
        errors.write_file("/dev/full", "x" * 100000)
    with pytest.raises(errors.UserError, match=str(tmp_path / "no" / "x")):
        errors.write_file(tmp_path / "no" / "x", "x")
    assert not (tmp_path / "no").exists()


def test_run_child_ends_its_group_on_error() -> None:
    """An exception while waiting (here a timeout) ends the child's whole process group."""
    with pytest.raises(subprocess.TimeoutExpired):
        errors.run_child(["sh", "-c", "sleep 30 & sleep 30; wait"], timeout=0.5)
    out = subprocess.run(["pgrep", "-f", "sleep 30 & sleep 30"], capture_output=True, text=True).stdout
    assert not out.strip()

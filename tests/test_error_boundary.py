"""Every console script goes through discover.errors.run_cli: a bug, Ctrl-C and SIGTERM
anywhere inside a command end as one stderr line and the boundary's exit status."""
from __future__ import annotations

import importlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, Iterator, List

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
        "nfsslower": [], "nfsdist": [], "nfstop": [], "nfsdtop": [], "nfs-exporter": [],
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
    """Import the console script's function as its wrapper does, make the command's own code
    fail with `fault` (a click command's callback; an argparse tool's code after its command
    line is read), and call it."""
    module, func = target.split(":")
    return ("import os, signal, sys, time, click\n"
            "from discover import arguments, errors\n"
            "def fault(*_a, **_k):\n"
            f"    {FAULTS[fault]}\n"
            "click.Context.invoke = lambda self, callback, *a, **k: fault()\n"
            "arguments.Parser.parse = fault\n"
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


def test_a_commands_end_leaves_another_live_threads_children_alone() -> None:
    """A command's end runs its own thread's undo steps (and those of threads that ended without
    running theirs), not a live thread's: in the test process a unit test's in-process command
    ended a lab thread's xz mid-stream (a 6.12 kernel package then read as truncated)."""
    ready, finish = threading.Event(), threading.Event()
    children: List[subprocess.Popen] = []

    def lab_thread() -> None:
        children.append(errors.spawn(["sleep", "30"]))
        ready.set()
        finish.wait(10)
        errors.release(children[0])

    lane = threading.Thread(target=lab_thread)
    lane.start()
    try:
        assert ready.wait(10)
        ended: List[str] = []
        errors.at_exit(lambda: ended.append("mine"))
        assert not errors.run_cleanups() and ended == ["mine"]
        assert children[0].poll() is None  # the lab thread's child runs on
    finally:
        finish.set()
        lane.join()
    assert children[0].returncode == -signal.SIGTERM  # ended by its own thread's release

    orphan = threading.Thread(target=lambda: children.append(errors.spawn(["sleep", "30"])))
    orphan.start()
    orphan.join()  # ended without undoing: the next command's end does it
    assert not errors.run_cleanups() and children[1].wait(10) == -signal.SIGTERM


def test_a_forked_child_runs_none_of_its_parents_undo_steps() -> None:
    """A worker forked by a command (probes compat's) undoes only what it started: the
    parent's steps (its workers, a child's group) are not the copy's to run."""
    ran: List[str] = []
    step = errors.at_exit(lambda: ran.append("parent's"))
    try:
        pid = os.fork()
        if pid == 0:
            try:
                errors.at_exit(lambda: ran.append("its own"))
                failed = errors.run_cleanups()
                os._exit(0 if ran == ["its own"] and not failed else 1)
            finally:
                os._exit(2)
        assert os.waitpid(pid, 0)[1] == 0
        assert ran == []
    finally:
        errors.forget(step)


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 16 KiB tmpfs (a device that fills up), unmounted after the test; root only."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_device_keeps_the_old_file_whole(tiny_tmpfs: Path) -> None:
    """Written beside and renamed: ENOSPC leaves the previous output as it was, and no partial file."""
    out = tiny_tmpfs / "p.json"
    out.write_text("old\n")
    with pytest.raises(errors.UserError, match=f"cannot write {out}: No space left on device"):
        errors.write_file(out, "x" * 100000)
    assert out.read_text() == "old\n" and sorted(p.name for p in tiny_tmpfs.iterdir()) == ["p.json"]


def test_snapshot_to_a_full_device_is_refused_before_it_starts(tiny_tmpfs: Path, tmp_path: Path) -> None:
    """No progress lines first: the device is full before any section is read."""
    for i in range(64):  # fill it
        try:
            (tiny_tmpfs / f"fill{i}").write_bytes(b"x" * 4096)
        except OSError:
            break
    tracefs = tmp_path / "tracefs"
    tracefs.mkdir()
    (tracefs / "available_events").write_text("")
    env = dict(os.environ, PROBEKIT_TRACEFS=str(tracefs), PROBEKIT_CACHE=str(tmp_path / "cache"),
               PYTHONPATH=str(REPO))
    res = subprocess.run([sys.executable, "-m", "discover", "snapshot", "-o", str(tiny_tmpfs / "p.json")],
                         env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1
    assert res.stderr == f"discover: error: -o {tiny_tmpfs}/p.json: no space left on the device holding {tiny_tmpfs}\n"


def test_check_output_refusals(tmp_path: Path) -> None:
    """The shared pre-check of every -o: inputs (also through a symlink), directories, a
    regular file in the path, missing directories unless they are to be made."""
    (tmp_path / "in.json").write_text("{}")
    (tmp_path / "link.json").symlink_to(tmp_path / "in.json")
    cases = {
        (tmp_path / "link.json", False): f"-o {tmp_path}/link.json: is the input {tmp_path}/in.json",
        (tmp_path, False): f"-o {tmp_path}: is a directory",
        (tmp_path / "in.json" / "sub", False): f"the parent {tmp_path}/in.json is a file, not a directory",
        (tmp_path / "no" / "x", False): f"no directory {tmp_path}/no; create it first",
    }
    for (path, make), line in cases.items():
        with pytest.raises(errors.UserError, match=re.escape(line)):
            errors.check_output(path, [tmp_path / "in.json"], make_parents=make)
    errors.check_output(tmp_path / "no" / "x", [tmp_path / "in.json"], make_parents=True)
    errors.check_output("/dev/null")

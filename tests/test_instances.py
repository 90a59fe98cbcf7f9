"""function_graph in a private tracefs instance (6.11+), on the fake tracefs.

The fake plays the kernel's mkdir/rmdir of an instance with the file listing and
read-backs a real 7.3 guest showed (fake_tracefs.populate_instance); a kernel whose
instances cannot run function_graph is played with a real 6.1 guest's listing.
The lab proof (a real kernel, trace-cmd recording beside) is tests/lab/test_coexist_lab.py.
"""
from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Dict, List

import pytest

import fake_tracefs
import discover.tracefs as tracefs_module
from discover.capture import CaptureOptions, live_capture
from discover.errors import UserError
from discover.tracefs import FTRACE_LOCK, INSTANCE_PREFIX

REPO = fake_tracefs.REPO
INSTANCE_61 = REPO / "tests" / "fixtures" / "6.1.0-50-amd64" / "instance"
SAMPLE_LINES = 2000


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Dict[str, Path]:
    tracefs = fake_tracefs.build(tmp_path / "root")
    instances = fake_tracefs.enable_instances(tracefs)
    sample = tmp_path / "sample.trace"
    with open(fake_tracefs.READ_TRACE) as f:
        sample.write_text("".join(line for _, line in zip(range(SAMPLE_LINES), f)))
    for key, value in {"PROBEKIT_TRACEFS": str(tracefs), "PROBEKIT_SYSROOT": str(tmp_path / "root"),
                       "PROBEKIT_EUID": "0"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr("discover.tracefs.make_instance", fake_tracefs.populate_instance)
    monkeypatch.setattr("discover.tracefs.unmake_instance", shutil.rmtree)
    return {"tracefs": tracefs, "instances": instances, "root": tmp_path / "root", "sample": sample,
            "own": instances / f"{INSTANCE_PREFIX}{os.getpid()}"}


def feed(fake: Dict[str, Path]) -> str:
    """A workload that plays the kernel: the real sample into our instance's trace_pipe."""
    return f"cat {fake['sample']} > {fake['own'] / 'trace_pipe'}"


def test_capture_runs_in_its_instance_beside_a_global_tracer(fake: Dict[str, Path]) -> None:
    (fake["tracefs"] / "current_tracer").write_text("function\n")  # e.g. trace-cmd record -p function
    before = fake_tracefs.snapshot(fake["tracefs"])
    with live_capture(CaptureOptions(functions=["nfs_file_read"], workload=feed(fake))) as lines:
        own = fake["own"]
        assert (own / "current_tracer").read_text() == "function_graph"
        assert (own / "tracing_on").read_text() == "1"
        assert (own / "options" / "funcgraph-proc").read_text() == "1"
        assert (fake["tracefs"] / "current_tracer").read_text() == "function\n"  # untouched
        # the graph filters are global on 6.12/7.3: written at the top, restored after
        assert (fake["tracefs"] / "set_graph_function").read_text() == "nfs_file_read"
        assert (fake["tracefs"] / "max_graph_depth").read_text() == "10"
        assert not fake["root"].joinpath(FTRACE_LOCK.lstrip("/")).exists()  # no global lock
        got = list(lines)
    assert got == fake["sample"].read_text().splitlines(keepends=True)
    assert lines.summary.restore_failures == []
    assert not fake["own"].exists()
    fake_tracefs.assert_restored(before, fake["tracefs"])


def test_a_killed_runs_instance_is_removed_a_live_ones_kept(fake: Dict[str, Path]) -> None:
    dead = 4194303
    while os.path.exists(f"/proc/{dead}"):
        dead -= 1
    stale = fake["instances"] / f"{INSTANCE_PREFIX}{dead}"
    alive = fake["instances"] / f"{INSTANCE_PREFIX}{os.getppid()}"
    other = fake["instances"] / "someone-elses"
    for path in (stale, alive, other):
        fake_tracefs.populate_instance(path)
    for path in (stale, alive, other):  # under /proc of the fake sysroot: mirror the real pids
        pid = path.name.rsplit("-", 1)[-1]
        if pid.isdigit() and os.path.exists(f"/proc/{pid}"):
            (fake["root"] / "proc" / pid).mkdir(parents=True)
    with live_capture(CaptureOptions(functions=["nfs_file_read"], workload=feed(fake))) as lines:
        list(lines)
    assert not stale.exists() and alive.exists() and other.exists()
    assert not fake["own"].exists()


@pytest.mark.parametrize("where", ["global", "instance"])
def test_another_function_graph_user_is_refused_in_one_line(fake: Dict[str, Path], where: str) -> None:
    if where == "global":
        (fake["tracefs"] / "current_tracer").write_text("function_graph\n")
        who = "the global tracer"
    else:
        other = fake["instances"] / f"{INSTANCE_PREFIX}{os.getppid()}"
        fake_tracefs.populate_instance(other)
        (fake["root"] / "proc" / str(os.getppid())).mkdir(parents=True)
        (other / "current_tracer").write_text("function_graph\n")
        who = f"instance {other.name}"
    before = fake_tracefs.snapshot(fake["tracefs"])
    with pytest.raises(UserError) as exc:
        with live_capture(CaptureOptions(functions=["nfs_file_read"], duration=1)):
            pass
    assert str(exc.value).startswith(f"function_graph is already running in {who}; ")
    assert "\n" not in str(exc.value)
    assert fake_tracefs.snapshot(fake["tracefs"]) == before
    assert not fake["own"].exists()


def test_kernel_without_function_graph_in_instances_keeps_the_global_path(
        fake: Dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("discover.tracefs.make_instance",
                        lambda path: fake_tracefs.populate_instance(path, INSTANCE_61))
    before = fake_tracefs.snapshot(fake["tracefs"])
    workload = f"cat {fake['sample']} > {fake['tracefs'] / 'trace_pipe'}"
    with live_capture(CaptureOptions(functions=["nfs_file_read"], workload=workload)) as lines:
        assert (fake["tracefs"] / "current_tracer").read_text() == "function_graph"
        assert fake["root"].joinpath(FTRACE_LOCK.lstrip("/")).read_text() == f"{os.getpid()}\n"
        assert not fake["own"].exists()  # made, found unable, removed before anything was set
        assert len(list(lines)) == SAMPLE_LINES
    fake_tracefs.assert_restored(before, fake["tracefs"])
    assert not fake["root"].joinpath(FTRACE_LOCK.lstrip("/")).exists()


DRIVER = """
import shutil, sys
sys.path.insert(0, {tests!r})
import fake_tracefs
import discover.tracefs as t
t.make_instance = fake_tracefs.populate_instance
t.unmake_instance = shutil.rmtree
from discover.capture import CaptureOptions, live_capture
with live_capture(CaptureOptions(functions=["nfs_file_read"])) as lines:
    for n, line in enumerate(lines):
        if n == 0:
            print("STREAMING", flush=True)
print(f"stopped_by={{lines.summary.stopped_by}}", flush=True)
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_signal_mid_capture_removes_the_instance(fake: Dict[str, Path], signum: int) -> None:
    before = fake_tracefs.snapshot(fake["tracefs"])
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-c", DRIVER.format(tests=str(REPO / "tests"))], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    own = fake["instances"] / f"{INSTANCE_PREFIX}{proc.pid}"

    def feeder() -> None:
        while not (own / "trace_pipe").exists() and proc.poll() is None:
            threading.Event().wait(0.05)
        try:
            with open(own / "trace_pipe", "w") as pipe:
                pipe.write(fake["sample"].read_text())
        except (BrokenPipeError, FileNotFoundError):
            pass

    thread = threading.Thread(target=feeder)
    thread.start()
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "STREAMING"
        assert (own / "current_tracer").read_text() == "function_graph"
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=30)
    finally:
        thread.join(30)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert f"stopped_by={signal.Signals(signum).name}" in out
    assert not own.exists()
    fake_tracefs.assert_restored(before, fake["tracefs"])


def test_an_instance_left_with_our_pid_is_replaced(fake: Dict[str, Path]) -> None:
    fake_tracefs.populate_instance(fake["own"])  # a dead process had our PID
    (fake["own"] / "current_tracer").write_text("function_graph\n")
    with live_capture(CaptureOptions(functions=["nfs_file_read"], workload=feed(fake))) as lines:
        assert (fake["own"] / "current_tracer").read_text() == "function_graph"
        assert len(list(lines)) == SAMPLE_LINES
    assert not fake["own"].exists()


def test_instances_refused_keeps_the_global_path(fake: Dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(path: Path) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr("discover.tracefs.make_instance", refuse)
    workload = f"cat {fake['sample']} > {fake['tracefs'] / 'trace_pipe'}"
    with live_capture(CaptureOptions(functions=["nfs_file_read"], workload=workload)) as lines:
        assert (fake["tracefs"] / "current_tracer").read_text() == "function_graph"
        assert fake["root"].joinpath(FTRACE_LOCK.lstrip("/")).exists()
        assert len(list(lines)) == SAMPLE_LINES


def busy_rmdir(times: int):
    """rmdir as the kernel answers it while another process holds one of the instance's
    files open (EBUSY, seen on a 6.1 guest with `exec 3< instances/x/current_tracer`),
    for the first `times` attempts; then the reader has closed it."""
    calls = []

    def unmake(path: Path) -> None:
        calls.append(path)
        if len(calls) <= times:
            raise OSError(errno.EBUSY, "Device or resource busy", str(path))
        shutil.rmtree(path)
    return unmake, calls


def test_an_instance_busy_for_a_moment_is_still_removed(
        fake: Dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """The 6.1 path: our probe instance is made and removed at once, while a monitor (the lab's
    kill check polling current_tracer) may hold a file of it open: the rmdir is retried."""
    monkeypatch.setattr("discover.tracefs.make_instance",
                        lambda path: fake_tracefs.populate_instance(path, INSTANCE_61))
    unmake, calls = busy_rmdir(3)
    monkeypatch.setattr("discover.tracefs.unmake_instance", unmake)
    before = fake_tracefs.snapshot(fake["tracefs"])
    workload = f"cat {fake['sample']} > {fake['tracefs'] / 'trace_pipe'}"
    with live_capture(CaptureOptions(functions=["nfs_file_read"], workload=workload)) as lines:
        assert len(list(lines)) == SAMPLE_LINES
    assert len(calls) == 4 and not fake["own"].exists()
    assert "could not remove" not in capsys.readouterr().err
    fake_tracefs.assert_restored(before, fake["tracefs"])


def test_an_instance_that_stays_busy_is_named_in_one_line(
        fake: Dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr("discover.tracefs.RMDIR_BUSY_SECONDS", 0.3)
    unmake, calls = busy_rmdir(10 ** 6)
    monkeypatch.setattr("discover.tracefs.unmake_instance", unmake)
    with live_capture(CaptureOptions(functions=["nfs_file_read"], workload=feed(fake))) as lines:
        list(lines)
    err = capsys.readouterr().err.strip().splitlines()
    busy = [line for line in err if "could not remove" in line]
    assert busy == [f"probekit: could not remove tracefs instance {fake['own']}: Device or resource busy; "
                    f"remove it with: rmdir {fake['own']}"]
    assert 2 <= len(calls) <= 20


def test_the_6_1_probe_instance_gets_no_tracer_write(
        fake: Dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """On 6.1 a tracer write into any instance, even nop, marks the ring buffers expanded and
    leaves a never-used global buffer at its boot-time 7 KB: the instance we only made to ask
    whether it runs function_graph must be removed without one."""
    monkeypatch.setattr("discover.tracefs.make_instance",
                        lambda path: fake_tracefs.populate_instance(path, INSTANCE_61))
    written: List[Path] = []
    real_write = tracefs_module._write_file

    def recorded(path: Path, value: str) -> None:
        written.append(Path(path))
        real_write(path, value)
    monkeypatch.setattr("discover.tracefs._write_file", recorded)
    workload = f"cat {fake['sample']} > {fake['tracefs'] / 'trace_pipe'}"
    with live_capture(CaptureOptions(functions=["nfs_file_read"], workload=workload)) as lines:
        list(lines)
    assert fake["own"] / "current_tracer" not in written
    assert fake["tracefs"] / "current_tracer" in written


@pytest.mark.parametrize("before,after,kept", [
    ("7 (expanded: 1408)", "1410", True),   # a fresh 6.1 guest, then one capture (whole pages)
    ("7 (expanded: 1408)", "7", False),     # the same guest before the fix above: stuck at 7 KB
    ("1410", "1410", True),
    ("8195", "1410", False),
])
def test_the_lab_checks_the_ring_buffer_size_kept(before: str, after: str, kept: bool) -> None:
    from labs.integration import ring_buffer_kept
    assert ring_buffer_kept(before, after) is kept

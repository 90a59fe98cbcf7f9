"""live_capture against a tracefs-shaped directory whose trace_pipe is a FIFO fed real lines."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict

import pytest

import fake_tracefs
from discover.capture import CaptureOptions, comm_matches, live_capture
from discover.errors import UserError
from discover.tracefs import FTRACE_LOCK

REPO = fake_tracefs.REPO
SAMPLE_LINES = 3000


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Dict[str, Path]:
    """A fake host whose tracefs the capture will find through the environment, plus a trace sample."""
    tracefs = fake_tracefs.build(tmp_path / "root")
    sample = tmp_path / "sample.trace"
    with open(fake_tracefs.READ_TRACE) as f:
        sample.write_text("".join(line for _, line in zip(range(SAMPLE_LINES), f)))
    env = {"PROBEKIT_TRACEFS": str(tracefs), "PROBEKIT_SYSROOT": str(tmp_path / "root"), "PROBEKIT_EUID": "0"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return {"tracefs": tracefs, "root": tmp_path / "root", "sample": sample}


def feed_workload(fake: Dict[str, Path]) -> str:
    """A workload that plays the kernel: writes the real sample into trace_pipe, then exits 3."""
    return f"cat {fake['sample']} > {fake['tracefs'] / 'trace_pipe'}; exit 3"


def settings(tracefs: Path) -> Dict[str, str]:
    names = ["current_tracer", "tracing_on", "set_graph_function", "max_graph_depth", "buffer_size_kb",
             "options/funcgraph-proc", "options/funcgraph-abstime", "options/funcgraph-tail",
             "options/funcgraph-irqs", "set_ftrace_pid"]
    return {n: (tracefs / n).read_text().strip() for n in names}


def test_workload_capture_streams_everything_and_restores(fake: Dict[str, Path],
                                                          capfd: pytest.CaptureFixture) -> None:
    before = fake_tracefs.snapshot(fake["tracefs"])
    opts = CaptureOptions(functions=["nfs_file_read"], workload=feed_workload(fake))
    with live_capture(opts) as lines:
        during = settings(fake["tracefs"])
        assert fake["root"].joinpath(FTRACE_LOCK.lstrip("/")).read_text() == f"{os.getpid()}\n"
        got = list(lines)
    assert during == {"current_tracer": "function_graph", "tracing_on": "1", "set_graph_function": "nfs_file_read",
                      "max_graph_depth": "10", "buffer_size_kb": "8192", "options/funcgraph-proc": "1",
                      "options/funcgraph-abstime": "1", "options/funcgraph-tail": "1",
                      "options/funcgraph-irqs": "0", "set_ftrace_pid": "no pid"}
    assert got == fake["sample"].read_text().splitlines(keepends=True)
    summary = lines.summary
    assert (summary.stopped_by, summary.workload_status, summary.lines) == ("workload", 3, SAMPLE_LINES)
    assert summary.lost == 0 and summary.restore_failures == []
    fake_tracefs.assert_restored(before, fake["tracefs"])
    assert not fake["root"].joinpath(FTRACE_LOCK.lstrip("/")).exists()
    err = capfd.readouterr().err
    assert "function_graph" in err and "slower" in err  # the overhead warning
    assert "workload exited with status 3" in err


def test_exception_in_caller_restores(fake: Dict[str, Path]) -> None:
    before = fake_tracefs.snapshot(fake["tracefs"])
    opts = CaptureOptions(functions=["nfs_file_read", "nfs_file_write"], workload=feed_workload(fake), depth=4)
    with pytest.raises(ZeroDivisionError):
        with live_capture(opts) as lines:
            assert (fake["tracefs"] / "set_graph_function").read_text() == "nfs_file_read nfs_file_write"
            next(lines)
            1 / 0
    fake_tracefs.assert_restored(before, fake["tracefs"])
    assert not fake["root"].joinpath(FTRACE_LOCK.lstrip("/")).exists()


def test_duration_ends_capture_and_progress_reports(fake: Dict[str, Path]) -> None:
    before = fake_tracefs.snapshot(fake["tracefs"])
    seen = []
    with live_capture(CaptureOptions(functions=["nfs_*"], duration=1.3, irqs=True), progress=seen.append) as lines:
        assert (fake["tracefs"] / "options" / "funcgraph-irqs").read_text() == "1\n"
        got = list(lines)
    assert got == [] and lines.summary.stopped_by == "duration"
    assert lines.summary.elapsed >= 1.3
    assert seen and seen[0].elapsed >= 1.0 and seen[0].lines == 0 and seen[0].lost == 0
    fake_tracefs.assert_restored(before, fake["tracefs"])


def test_lost_events_counted_from_per_cpu_stats_and_warned(fake: Dict[str, Path],
                                                          capfd: pytest.CaptureFixture) -> None:
    """The kernel's overrun counter during the capture (a real overrun on 6.1.0-57) becomes
    summary.lost and a warning naming the CPU."""
    real = REPO / "tests" / "fixtures" / "6.1.0-57-amd64" / "overrun" / "cpu0.stats"
    overrun = int(re.search(r"^overrun: (\d+)$", real.read_text(), re.M).group(1))
    assert overrun > 0
    workload = f"{feed_workload(fake).split(';')[0]}; cp {real} {fake['tracefs'] / 'per_cpu' / 'cpu0' / 'stats'}"
    with live_capture(CaptureOptions(functions=["nfs_file_read"], workload=workload)) as lines:
        assert len(list(lines)) == SAMPLE_LINES
    assert lines.summary.overruns == lines.summary.lost == overrun and lines.summary.dropped == 0
    assert lines.summary.per_cpu[0]["overrun"] == overrun and lines.summary.per_cpu[1]["overrun"] == 0
    err = capfd.readouterr().err
    assert f"warning: {overrun} events lost (cpu0: {overrun})" in err


def test_pid_traces_every_thread(fake: Dict[str, Path]) -> None:
    (fake["root"] / "proc").symlink_to("/proc")
    before = fake_tracefs.snapshot(fake["tracefs"])
    ready = threading.Event()
    done = threading.Event()
    worker = threading.Thread(target=lambda: (ready.set(), done.wait(30)))
    worker.start()
    ready.wait()
    try:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{os.getpid()}/task"))
        assert len(tids) >= 2
        with live_capture(CaptureOptions(functions=["nfs_file_read"], pid=os.getpid(), duration=0.2)) as lines:
            assert (fake["tracefs"] / "set_ftrace_pid").read_text() == " ".join(map(str, tids))
            assert (fake["tracefs"] / "options" / "function-fork").read_text() == "1"
            list(lines)
    finally:
        done.set()
        worker.join()
    fake_tracefs.assert_restored(before, fake["tracefs"])


def test_force_takes_over_and_gives_back_the_active_tracer(fake: Dict[str, Path]) -> None:
    (fake["tracefs"] / "current_tracer").write_text("function\n")
    before = fake_tracefs.snapshot(fake["tracefs"])
    with pytest.raises(UserError) as exc:
        with live_capture(CaptureOptions(functions=["nfs_file_read"], duration=0.2)):
            pass
    assert "current_tracer is function" in str(exc.value)
    assert fake_tracefs.snapshot(fake["tracefs"]) == before
    with live_capture(CaptureOptions(functions=["nfs_file_read"], duration=0.2, force=True)) as lines:
        assert (fake["tracefs"] / "current_tracer").read_text() == "function_graph"
        list(lines)
    assert (fake["tracefs"] / "current_tracer").read_text() == "function\n"
    fake_tracefs.assert_restored(before, fake["tracefs"])


@pytest.mark.parametrize("opts, message", [
    (CaptureOptions(functions=["nfs_file_reed"]), "close matches: nfs_file_read"),
    (CaptureOptions(functions=["nfs_file_read"], buffer_kb=8), "buffer size 8 KB"),
    (CaptureOptions(functions=["nfs_file_read"], pid=1, comm="dd"), "--pid or --comm"),
    (CaptureOptions(functions=["nfs_file_read"], duration=0), "--duration"),
    (CaptureOptions(functions=["nfs_file_read"], duration=float("nan")), "--duration"),
    (CaptureOptions(functions=[]), "at least one"),
])
def test_bad_input_fails_before_any_write(fake: Dict[str, Path], opts: CaptureOptions, message: str) -> None:
    before = fake_tracefs.snapshot(fake["tracefs"])
    with pytest.raises(UserError) as exc:
        with live_capture(opts):
            pass
    assert message in str(exc.value) and "\n" not in str(exc.value)
    assert fake_tracefs.snapshot(fake["tracefs"]) == before
    assert not fake["root"].joinpath(FTRACE_LOCK.lstrip("/")).exists()


def test_not_root_fails_first(fake: Dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROBEKIT_EUID", "1000")
    with pytest.raises(UserError) as exc:
        with live_capture(CaptureOptions(functions=["nfs_file_read"])):
            pass
    assert "root" in str(exc.value)


def _proc_comm(line: str) -> str:
    """The command in a line's ' N) comm-pid |' column ('' when the line has none), read
    independently of capture.py."""
    if "|" not in line:  # banners: dashes, blank, 'N) a-1 => b-2'
        return ""
    column = next(field for field in line.split("|") if ")" in field)
    return column.split(")", 1)[1].strip().rsplit("-", 1)[0]


def test_comm_filter_uses_the_proc_column() -> None:
    traced = (fake_tracefs.LAB_TRACES / "vfs_read.proc-abstime-tail.trace").read_text().splitlines()
    assert {_proc_comm(l) for l in traced} == {"dd", "head", ""}
    banners = [l for l in traced if not _proc_comm(l)]
    assert any("=>" in l for l in banners)  # the real context-switch banners
    for comm in ("dd", "head"):
        kept = [l for l in traced if comm_matches(l, comm)]
        assert kept == [l for l in traced if _proc_comm(l) in (comm, "")]
    assert [l for l in traced if comm_matches(l, "bash")] == banners


# --- signals delivered to a capturing process --------------------------------

DRIVER = """
import sys
from discover.capture import CaptureOptions, live_capture
with live_capture(CaptureOptions(functions=["nfs_file_read"])) as lines:
    for n, line in enumerate(lines):
        if n == 0:
            print("STREAMING", flush=True)
s = lines.summary
print(f"stopped_by={s.stopped_by} lines={s.lines} failures={s.restore_failures}", flush=True)
"""


def _feed(fifo: Path, sample: Path, written: threading.Event, stop: threading.Event) -> None:
    try:
        with open(fifo, "w") as pipe:  # blocks until the capture opens trace_pipe
            pipe.write(sample.read_text())
            pipe.flush()
            written.set()
            stop.wait(60)
    except BrokenPipeError:
        pass  # the capture stopped reading before the whole sample was written


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_signal_mid_capture_restores_everything(fake: Dict[str, Path], signum: int) -> None:
    before = fake_tracefs.snapshot(fake["tracefs"])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")]))
    proc = subprocess.Popen([sys.executable, "-c", DRIVER], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    written = threading.Event()
    stop = threading.Event()
    feeder = threading.Thread(target=_feed, args=(fake["tracefs"] / "trace_pipe", fake["sample"], written, stop))
    feeder.start()
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "STREAMING"
        assert (fake["tracefs"] / "current_tracer").read_text() == "function_graph"
        # The whole sample is in the FIFO or already read: like a ring buffer once
        # tracing_on is 0, so the drain after the signal must deliver all of it.
        assert written.wait(20), "the capture stopped reading trace_pipe"
        started = time.monotonic()
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=20)
        took = time.monotonic() - started
    finally:
        stop.set()
        feeder.join()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    stopped = re.search(r"stopped_by=(\w+) lines=(\d+) failures=(.*)", out)
    assert stopped and stopped.group(1) == signal.Signals(signum).name and stopped.group(3) == "[]", out
    assert int(stopped.group(2)) == SAMPLE_LINES
    assert took < 5
    fake_tracefs.assert_restored(before, fake["tracefs"])
    assert not fake["root"].joinpath(FTRACE_LOCK.lstrip("/")).exists()


def test_signal_during_setup_aborts_and_restores(fake: Dict[str, Path]) -> None:
    """SIGTERM before streaming starts: exit 128+15 with one line, and nothing left changed."""
    before = fake_tracefs.snapshot(fake["tracefs"])
    driver = (
        "import os, signal\n"
        "import discover.tracefs as t\n"
        "real = t._write_file\n"
        "def slow(path, value):\n"
        "    real(path, value)\n"
        "    if path.name == 'max_graph_depth' and value == '10':\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "t._write_file = slow\n"
        "from discover.errors import run_cli\n"
        "from discover.capture import CaptureOptions, live_capture\n"
        "def main():\n"
        "    with live_capture(CaptureOptions(functions=['nfs_file_read'], duration=5)) as lines:\n"
        "        list(lines)\n"
        "run_cli('discover', main)\n")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    res = subprocess.run([sys.executable, "-c", driver], env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 128 + signal.SIGTERM, res.stderr
    assert "discover: error: interrupted by SIGTERM" in res.stderr
    assert "Traceback" not in res.stderr
    fake_tracefs.assert_restored(before, fake["tracefs"])
    assert not fake["root"].joinpath(FTRACE_LOCK.lstrip("/")).exists()

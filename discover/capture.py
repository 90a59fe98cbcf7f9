"""Live function_graph capture: configure ftrace once, stream trace_pipe, restore everything.

How to drive it (the `discover callgraph` command does this):

    opts = CaptureOptions(functions=["nfs_file_read"], workload="dd if=/mnt/f of=/dev/null")
    with live_capture(opts, progress=show) as lines:
        for line in lines:           # trace_pipe text, one line at a time, each ending in "\\n"
            parser.feed(line)
    lines.summary.lost               # events lost (per_cpu/cpuN/stats), also warned about on stderr

The capture ends when the workload exits, when `duration` seconds pass (whichever
comes first when both are given), or on SIGINT/SIGTERM/SIGHUP (with neither, it
runs until Ctrl-C). Ending by a signal is a normal end: the lines already read are
still delivered and `summary.signal` says which signal it was; a second signal
aborts at once. The workload runs through /bin/sh in its own session with stdin
from /dev/null and its stdout sent to our stderr (our stdout stays clean for the
graph); it is terminated if the capture ends before it does.

--comm is filtered here, in user space, on the funcgraph-proc column: the kernel
prints only the first 7 characters of a command name there, so `comm` is compared
on those 7 characters; lines without a proc column (context-switch banners, lost
event notices) always pass. --pid is filtered in the kernel via set_ftrace_pid
with every thread of the process (and function-fork, so threads started later
are followed too).
"""
from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

from discover.errors import UserError, end_process_group
from discover.tracefs import (Host, Interrupted, TraceSession, buffer_kb_limit,
                              find_tracefs, open_session, require_function_graph, require_root,
                              thread_ids, validate_functions)

#: Per-CPU ring buffer (KB) unless asked otherwise: 8 MiB/CPU holds seconds of a busy
#: NFS call graph while the reader catches up, yet stays small on a 1 GiB guest.
DEFAULT_BUFFER_KB = 8192
MIN_BUFFER_KB = 64
PROGRESS_INTERVAL = 1.0
POLL_INTERVAL = 0.2
#: After the end, how long the ring buffer's backlog is still read (seconds).
SIGNAL_DRAIN = 1.0
WORKLOAD_DRAIN = 30.0
#: funcgraph option files and the value a capture needs (the parser rebuilds calls per task).
_FUNCGRAPH_OPTIONS = ("funcgraph-cpu", "funcgraph-duration", "funcgraph-proc", "funcgraph-abstime",
                      "funcgraph-tail")
_PROC_COLUMN = re.compile(r"^\s*(?:\d+\.\d+ \|\s+)?(?:\d+\)\s)?\s*(.+)-(\d+)\s+\| ")
OVERHEAD_WARNING = (
    "WARNING: function_graph hooks every kernel function while it is on: the traced code "
    "runs many times slower and the whole kernel slows down (perf-tools' funcgraph expects "
    "at least 50%). Use it to explore, then measure with low-overhead probes."
)


@dataclass
class CaptureOptions:
    functions: List[str]
    workload: Optional[str] = None
    duration: Optional[float] = None
    depth: int = 10
    pid: Optional[int] = None
    comm: Optional[str] = None
    irqs: bool = False
    force: bool = False
    buffer_kb: int = DEFAULT_BUFFER_KB


@dataclass
class Progress:
    """What progress(obj) receives about once a second."""

    elapsed: float
    lines: int
    lost: int


@dataclass
class CaptureSummary:
    """The capture's outcome, complete once the `with live_capture(...)` block has exited."""

    elapsed: float = 0.0
    lines: int = 0
    #: cpu number -> counters from per_cpu/cpuN/stats (overrun, commit overrun, dropped events, ...)
    per_cpu: Dict[int, Dict[str, int]] = field(default_factory=dict)
    #: why the capture ended: "workload", "duration", "SIGINT", "SIGTERM", "SIGHUP" or "caller"
    stopped_by: str = ""
    signal: Optional[int] = None
    #: the workload's exit status (negative: killed by that signal), None without a workload
    workload_status: Optional[int] = None
    #: True when the backlog left in the ring buffer was not read to the end
    undrained: bool = False
    #: tracefs files that could not be restored (each also reported on stderr)
    restore_failures: List[str] = field(default_factory=list)

    @property
    def overruns(self) -> int:
        return sum(c.get("overrun", 0) + c.get("commit overrun", 0) for c in self.per_cpu.values())

    @property
    def dropped(self) -> int:
        return sum(c.get("dropped events", 0) for c in self.per_cpu.values())

    @property
    def lost(self) -> int:
        return sum(_lost_in(c) for c in self.per_cpu.values())


def _lost_in(counters: Dict[str, int]) -> int:
    """Events one CPU lost: ring buffer overruns (both kinds) plus dropped events."""
    return counters.get("overrun", 0) + counters.get("commit overrun", 0) + counters.get("dropped events", 0)


def read_cpu_stats(tracefs: Path) -> Dict[int, Dict[str, int]]:
    """per_cpu/cpuN/stats as {cpu: {counter: value}} (integer counters only)."""
    stats: Dict[int, Dict[str, int]] = {}
    for path in sorted((tracefs / "per_cpu").glob("cpu*/stats")):
        cpu = int(path.parent.name[3:])
        counters: Dict[str, int] = {}
        for line in path.read_text().splitlines():
            key, _, value = line.partition(":")
            if value.strip().isdigit():
                counters[key.strip()] = int(value)
        stats[cpu] = counters
    return stats


def _subtract(now: Dict[int, Dict[str, int]], base: Dict[int, Dict[str, int]]) -> Dict[int, Dict[str, int]]:
    """Counters accumulated since base (buffer resets zero them; never go negative)."""
    return {cpu: {k: max(0, v - base.get(cpu, {}).get(k, 0)) if k != "entries" else v
                  for k, v in counters.items()}
            for cpu, counters in now.items()}


def comm_matches(line: str, comm: str) -> bool:
    """Keep a line unless its proc column names another command (compared on 7 chars, like the kernel)."""
    match = _PROC_COLUMN.match(line)
    if not match:
        return True
    return match.group(1).strip() == comm[:7]


def check_options(opts: CaptureOptions, host: Host, ncpus: int) -> None:
    """Reject bad options before anything is written."""
    if opts.depth < 0:
        raise UserError("--depth must be 0 (unlimited) or more")
    if opts.duration is not None and not opts.duration > 0:  # NaN too
        raise UserError("--duration must be a positive number of seconds")
    if opts.pid is not None and opts.comm:
        raise UserError("give --pid or --comm, not both")
    if opts.workload is not None and not opts.workload.strip():
        raise UserError("--workload is empty")
    limit = buffer_kb_limit(host, ncpus)
    if not MIN_BUFFER_KB <= opts.buffer_kb <= limit:
        raise UserError(f"buffer size {opts.buffer_kb} KB per CPU is outside {MIN_BUFFER_KB}..{limit} KB "
                        f"({ncpus} CPUs, a quarter of available memory)")


class CaptureStream:
    """The iterator live_capture yields: trace_pipe lines; `.summary` once the block exits."""

    def __init__(self, session: TraceSession, opts: CaptureOptions,
                 progress: Optional[Callable[[Progress], None]]) -> None:
        self.session = session
        self.opts = opts
        self.progress = progress
        self.summary = CaptureSummary()
        self.workload: Optional[subprocess.Popen] = None
        self._fd: Optional[int] = None
        self._phase = "setup"
        self._started = 0.0
        self._base_stats: Dict[int, Dict[str, int]] = {}
        self._lines = self._generate()
        session.on_signal = self._on_signal

    def __iter__(self) -> "CaptureStream":
        return self

    def __next__(self) -> str:
        return next(self._lines)

    # --- signals ---------------------------------------------------------
    def _on_signal(self, signum: int) -> None:
        if self._phase == "setup" or (self._phase == "stream" and self.summary.signal is not None):
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise Interrupted(signum)
        if self.summary.signal is None:
            self.summary.signal = signum

    # --- setup -----------------------------------------------------------
    def configure(self, functions: List[str], tids: Optional[List[int]]) -> None:
        """Write every setting, then switch to function_graph exactly once."""
        s = self.session
        s.write("tracing_on", "0")
        s.write("buffer_size_kb", str(self.opts.buffer_kb))
        # Leftover filters would silently cut the graph short: clear them.
        for name in ("set_ftrace_filter", "set_ftrace_notrace", "set_graph_notrace"):
            if not _list_is_empty(s.read(name)):
                s.write(name, "")
        s.write("set_graph_function", " ".join(functions))
        if tids is not None:
            s.write("set_ftrace_pid", " ".join(str(t) for t in tids))
            self._set_option("function-fork", True)
        else:
            if s.read("set_ftrace_pid").strip() != "no pid":
                s.write("set_ftrace_pid", "")
            self._exclude_self()
        s.write("max_graph_depth", str(self.opts.depth))
        if s.read("tracing_thresh").strip() != "0":
            s.write("tracing_thresh", "0")
        for option in _FUNCGRAPH_OPTIONS:
            self._set_option(option, True)
        self._set_option("funcgraph-irqs", self.opts.irqs)
        self._set_option("context-info", True)
        if s.read("current_tracer").strip() != "function_graph":
            s.write("current_tracer", "function_graph")
        s.clear_buffer()
        self._base_stats = read_cpu_stats(s.tracefs)

    def _exclude_self(self) -> None:
        """Keep our own trace_pipe reads out of the trace (a feedback loop when tracing vfs_read).

        set_ftrace_notrace_pid exists since Linux 5.8. Skipped when function-fork is on:
        the workload we fork would inherit the exclusion.
        """
        s = self.session
        if not s.path_of("set_ftrace_notrace_pid").exists():
            return
        if s.path_of("options/function-fork").exists() and s.read("options/function-fork").strip() != "0":
            return
        s.write("set_ftrace_notrace_pid", str(os.getpid()))

    def _set_option(self, option: str, on: bool) -> None:
        name = f"options/{option}"
        if not self.session.path_of(name).exists():
            self.session.warn(f"probekit: note: this kernel has no {option} option; its output lacks it")
            return
        if self.session.read(name).strip() != ("1" if on else "0"):
            self.session.write(name, "1" if on else "0")

    def start(self) -> None:
        """Open trace_pipe, turn tracing on, start the workload: the stream is live."""
        self._fd = os.open(self.session.tracefs / "trace_pipe", os.O_RDONLY | os.O_NONBLOCK)
        self.session.write("tracing_on", "1")
        self._started = time.monotonic()
        if self.opts.workload is not None:
            self.workload = subprocess.Popen(["/bin/sh", "-c", self.opts.workload], stdin=subprocess.DEVNULL,
                                             stdout=2, start_new_session=True)
        self._phase = "stream"

    # --- streaming -------------------------------------------------------
    def _stop_reason(self) -> Optional[str]:
        if self.summary.signal is not None:
            return signal.Signals(self.summary.signal).name
        if self.workload is not None and self.workload.poll() is not None:
            return "workload"
        if self.opts.duration is not None and time.monotonic() - self._started >= self.opts.duration:
            return "duration"
        return None

    def _generate(self) -> Iterator[str]:
        pending = b""
        drain_until = 0.0
        next_tick = time.monotonic() + PROGRESS_INTERVAL
        draining = False
        while True:
            if not draining:
                reason = self._stop_reason()
                if reason:
                    self.summary.stopped_by = reason
                    self.session.write("tracing_on", "0")
                    draining = True
                    # A signal means "stop now": read what is left for a moment only.
                    drain_until = time.monotonic() + (SIGNAL_DRAIN if self.summary.signal else WORKLOAD_DRAIN)
            elif time.monotonic() > drain_until:
                self.summary.undrained = True
                break
            chunk = self._read_chunk(0.0 if draining else POLL_INTERVAL)
            if chunk:
                pending += chunk
                *complete, pending = pending.split(b"\n")
                for raw in complete:
                    line = raw.decode("utf-8", "replace")
                    if self.opts.comm and not comm_matches(line, self.opts.comm):
                        continue
                    self.summary.lines += 1
                    yield line + "\n"
            elif draining:
                break
            now = time.monotonic()
            if now >= next_tick:
                next_tick = now + PROGRESS_INTERVAL
                self._report_progress(now)
        if pending:
            self.summary.lines += 1
            yield pending.decode("utf-8", "replace")
        self._phase = "cleanup"

    def _read_chunk(self, timeout: float) -> bytes:
        """Up to 64 KiB from trace_pipe; b"" when nothing came within timeout.

        A non-blocking read comes first and select() is only a nap between tries:
        trace_pipe's poll may not report data that a read would return (6.1 passes
        buffer_percent to its poll), so readiness alone would stall or end a drain early.
        """
        data = self._try_read()
        if data is None and timeout:
            assert self._fd is not None
            select.select([self._fd], [], [], timeout)
            data = self._try_read()
        if data == b"" and timeout:
            time.sleep(timeout)  # a FIFO at EOF (tests) reads empty at once: do not spin
        return data or b""

    def _try_read(self) -> Optional[bytes]:
        """Bytes read, b"" at end of file, None when nothing is there yet."""
        assert self._fd is not None
        try:
            return os.read(self._fd, 65536)
        except BlockingIOError:
            return None

    def _report_progress(self, now: float) -> None:
        if self.progress is None:
            return
        self.summary.per_cpu = _subtract(read_cpu_stats(self.session.tracefs), self._base_stats)
        self.progress(Progress(elapsed=now - self._started, lines=self.summary.lines, lost=self.summary.lost))

    # --- end -------------------------------------------------------------
    def finish(self) -> None:
        """Stop the workload, close trace_pipe (the tracer cannot change while it is open), collect stats."""
        self._phase = "cleanup"
        if not self.summary.stopped_by:
            self.summary.stopped_by = "caller"
        if self._started:
            self.summary.elapsed = time.monotonic() - self._started
        if self.workload is not None:
            self.summary.workload_status = end_process_group(self.workload)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        try:
            self.summary.per_cpu = _subtract(read_cpu_stats(self.session.tracefs), self._base_stats)
        except OSError:
            pass


def _list_is_empty(text: str) -> bool:
    return all(not line.strip() or line.startswith("#") for line in text.splitlines())


def _warn(msg: str) -> None:
    try:
        print(msg, file=sys.stderr, flush=True)
    except OSError:
        pass


@contextmanager
def live_capture(opts: CaptureOptions,
                 progress: Optional[Callable[[Progress], None]] = None) -> Iterator[CaptureStream]:
    """Capture function_graph output live; see the module docstring for how to drive it."""
    host = Host.from_env()
    require_root(host)
    tracefs = find_tracefs(host)
    require_function_graph(tracefs, host)
    ncpus = len(list((tracefs / "per_cpu").glob("cpu*"))) or (os.cpu_count() or 1)
    check_options(opts, host, ncpus)
    functions = validate_functions(opts.functions, tracefs, host)
    tids = thread_ids(host, opts.pid) if opts.pid is not None else None
    with open_session(tracefs, host, force=opts.force, warn=_warn) as session:
        _warn(OVERHEAD_WARNING)  # once nothing can refuse any more: a refusal stays one line
        stream = CaptureStream(session, opts, progress)
        try:
            stream.configure(functions, tids)
            stream.start()
            yield stream
        finally:
            stream.finish()
            stream.summary.restore_failures = session.restore()
    _report_end(stream.summary, opts)


def _report_end(summary: CaptureSummary, opts: CaptureOptions) -> None:
    if summary.undrained:
        _warn(f"probekit: note: stopped by {summary.stopped_by} before the ring buffer's backlog was read; "
              "the last events are missing")
    if summary.workload_status is not None:
        _warn(f"probekit: workload exited with status {summary.workload_status}")
    if summary.lost:
        busy = ", ".join(f"cpu{cpu}: {_lost_in(c)}" for cpu, c in sorted(summary.per_cpu.items()) if _lost_in(c))
        _warn(f"probekit: warning: {summary.lost} events lost ({busy}); the call graph is incomplete: "
              f"raise the buffer (now {opts.buffer_kb} KB per CPU), lower --depth or trace fewer functions")

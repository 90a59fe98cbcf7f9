"""The bad-input catalogue's runner: every case a real console script run as a subprocess.

Why a runner of its own: hundreds of subprocesses one after the other would take minutes
on a 2-core host, so the cases selected for a pytest run are started in parallel once
(`run_all`), and each test only asserts on its own result. Every case runs in a fresh
directory with its own HOME and PROBEKIT_CACHE, and carries a marker in its environment:
any process still holding that marker after the command ended (a `dot`, an `xz`, a
workload) was left behind. Real inputs (tests/fixtures, ../shared/fixtures) are the
basis of the valid-but-mangled files.
"""
from __future__ import annotations

import functools
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "6.1.0-50-amd64"
SHARED_FG = REPO.parent / "shared" / "fixtures" / "debian-6.1.0-57-amd64" / "function_graph"
TRACE = FIXTURES / "function_graph" / "nfs3.nfs_file_read.default.trace"
WRITE_TRACE = SHARED_FG / "nfs3.nfs_file_write.trace"
EVENTS_TRACE_GZ = FIXTURES / "function_graph" / "nfs-ops.events.trace.gz"
PROFILE_GZ = FIXTURES / "profile.json.gz"
SPEC = REPO / "probes" / "specs" / "nfs.toml"
GUEST_SPEC = FIXTURES / "nfs.guest.toml"
BIN = Path(sys.executable).parent
MARKER = "PROBEKIT_BAD_INPUT_CASE"
#: parallel subprocesses: the host has 2 cores and each case is mostly interpreter start-up
#: (some cases sleep: a FIFO half fed, a signal timer), so a few more than the cores
WORKERS = max(3, 3 * (os.cpu_count() or 1))

Content = Union[bytes, str, Callable[[Path], None]]


@dataclass
class Case:
    """One command line against one kind of bad input, and what it must answer."""

    id: str
    argv: List[str]                                         # script name first
    code: int = 1                                           # expected exit status
    files: Dict[str, Content] = field(default_factory=dict)  # made in the case directory first
    env: Dict[str, str] = field(default_factory=dict)       # {cwd} in a value: the case directory
    match: Optional[str] = None                             # substring of the stderr line ({cwd}, {home})
    keep: Sequence[str] = ()                                # files the command may create
    lines: Optional[int] = 1                                # stderr lines (None: any, for exit 0)
    fifo: Optional[Tuple[str, bytes, int]] = None           # (name, data, signal once the reader is in)
    signal_on_file: Optional[Tuple[str, int]] = None        # (file that appears, signal to send)
    signal_after: Optional[Tuple[float, int]] = None        # (seconds after start, signal to send)
    signal_on_child: Optional[Tuple[float, int]] = None     # (seconds after its nth child, signal to send)
    kill_child: Optional[Tuple[float, int]] = None          # the same, sent to that child alone
    nth_child: int = 1                                      # n: the fork signal_on_child counts from
    timeout: float = 300.0                                  # a hang's bound, not a verdict: CI runs beside guests


@dataclass
class Result:
    code: int
    stdout: bytes
    stderr: str
    left_files: List[str]
    left_processes: List[str]
    seconds: float
    cwd: str = ""


def shared_inputs(root: Path) -> Dict[str, Path]:
    """Real inputs every case may point at, made once: a call graph JSON from a real trace,
    a real profile cut to the NFS parts (still real data, faster to load), lab results."""
    from discover import callgraph as cg
    from discover.commands.callgraph import parse_saved
    root.mkdir(parents=True, exist_ok=True)
    out = {"trace": TRACE, "write_trace": WRITE_TRACE, "spec": SPEC, "guest_spec": GUEST_SPEC,
           "profile_gz": PROFILE_GZ, "events_trace_gz": EVENTS_TRACE_GZ}
    for name, trace in (("graph", TRACE), ("graph_b", WRITE_TRACE)):
        tree = parse_saved(str(trace), None, None)
        path = root / f"{name}.json"
        path.write_text(cg.to_json(cg.to_digraph(tree.root, source=str(trace), functions=[], summary="")) + "\n")
        out[name] = path
    out["profile"] = root / "profile.json"
    out["profile"].write_text(_small_profile_text())
    out["lab"] = root / "lab.json"
    out["lab"].write_text(json.dumps({"6.1.0-50-amd64": {"read": {"candidate": 0, "ok": True},
                                                         "getattr": {"candidate": 0, "ok": True}}}))
    return out


def small_profile() -> dict:
    """The real 6.1.0-50 profile with only what NFS needs (filesystem and RPC modules, VFS); a fresh copy."""
    return json.loads(_small_profile_text())


@functools.lru_cache(maxsize=None)
def _small_profile_text() -> str:
    with gzip.open(PROFILE_GZ, "rt", encoding="utf-8") as fh:
        data = json.load(fh)
    nfs = ("nfs", "nfsv3", "nfsv4", "sunrpc", "lockd", "grace", "auth_rpcgss", "nfs_acl", "rpcsec_gss_krb5")
    data["filter_functions"] = [f for f in data["filter_functions"]
                                if f[1] in nfs or f[0].startswith(("vfs_", "filemap_", "generic_file", "do_"))]
    data["events"] = {k: v for k, v in data["events"].items() if k in ("nfs", "nfs4", "sunrpc", "writeback")}
    data["btf"]["functions"] = {k: v for k, v in data["btf"]["functions"].items()
                                if v["module"] in nfs or k.startswith("vfs_")}
    data["symbols"] = {k: v for k, v in data["symbols"].items() if k in data["btf"]["functions"]}
    return json.dumps(data)


NUL = b"\0"


def _marked_processes(tag: str) -> List[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if f"{MARKER}={tag}".encode() in (proc / "environ").read_bytes().split(NUL):
                found.append(proc.name + " " + (proc / "cmdline").read_bytes().replace(NUL, b" ").decode())
        except OSError:
            continue
    return found


def _files(root: Path) -> Set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def run_case(case: Case, base: Path) -> Result:
    """Run one case in its own directory; what it printed, and what it left behind."""
    home = base / case.id.replace("/", "_")
    shutil.rmtree(home, ignore_errors=True)
    cwd = home / "cwd"
    cwd.mkdir(parents=True)
    (home / "cache").mkdir()
    for name, content in case.files.items():
        path = cwd / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if callable(content):
            content(path)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    if case.fifo:
        os.mkfifo(cwd / case.fifo[0])
    before = _files(home)
    # the case in this run: the same case of a suite run meanwhile from another checkout on this
    # host is neither "left behind" here nor killed
    tag = str(home)
    env = dict(os.environ, HOME=str(home), PROBEKIT_CACHE=str(home / "cache"), PYTHONPATH=str(REPO),
               **{MARKER: tag})
    env.pop("COLUMNS", None)
    env.update({key: value.replace("{cwd}", str(cwd)) for key, value in case.env.items()})
    argv = [str(BIN / case.argv[0])] + [a.replace("{cwd}", str(cwd)) for a in case.argv[1:]]
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    feeder = None
    if case.fifo:
        feeder = threading.Thread(target=_feed_fifo, args=(proc, cwd / case.fifo[0], case.fifo[1], case.fifo[2]))
        feeder.start()
    if case.signal_after:
        timer = threading.Timer(case.signal_after[0], lambda: _killpg(proc, case.signal_after[1]))  # type: ignore[index]
        timer.start()
    if case.signal_on_file:
        threading.Thread(target=_signal_on_file, args=(proc, cwd / case.signal_on_file[0],
                                                       case.signal_on_file[1], case.timeout)).start()
    for on_child, alone in ((case.signal_on_child, False), (case.kill_child, True)):
        if on_child:
            threading.Thread(target=_signal_on_child, args=(proc, *on_child, case.nth_child, alone,
                                                            case.timeout)).start()
    try:
        out, err = proc.communicate(timeout=case.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    if feeder:
        feeder.join()
    seconds = time.monotonic() - started
    left = []
    for _ in range(20):  # a child ended by the command may need a moment to be reaped by init
        left = _marked_processes(tag)
        if not left:
            break
        time.sleep(0.1)
    for line in left:
        try:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        except OSError:
            pass
    allowed = before | {f"cwd/{k}" for k in case.keep}
    extra = sorted(f for f in _files(home) - allowed if not any(f.startswith(f"cwd/{k}/") for k in case.keep))
    return Result(proc.returncode, out, err.decode("utf-8", "replace"), extra, left, seconds, str(cwd))


def _killpg(proc: "subprocess.Popen[bytes]", signum: int) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signum)


def _feed_fifo(proc: "subprocess.Popen[bytes]", path: Path, data: bytes, signum: int) -> None:
    """Open the FIFO (this blocks until the command opens it to read), write part of an
    input, then signal the command's process group while it waits for the rest."""
    fd = None
    deadline = time.monotonic() + 30
    while fd is None and time.monotonic() < deadline and proc.poll() is None:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # no reader yet
            time.sleep(0.05)
    if fd is None:
        return
    try:
        os.set_blocking(fd, True)
        os.write(fd, data)
        time.sleep(0.3)
        os.killpg(proc.pid, signum)
        time.sleep(0.5)
    except OSError:
        pass
    finally:
        os.close(fd)


def _signal_on_file(proc: "subprocess.Popen[bytes]", path: Path, signum: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists():
            time.sleep(0.2)
            os.killpg(proc.pid, signum)
            return
        time.sleep(0.05)


def _signal_on_child(proc: "subprocess.Popen[bytes]", delay: float, signum: int, nth: int, alone: bool,
                     timeout: float) -> None:
    """Signal the command's group (or that child `alone`) `delay` s after the command forked its
    `nth` child (a worker, a tool): a moment fixed by the command's progress, not by the clock,
    which a busy host stretches."""
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    forked: List[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            forked += [pid for pid in children.read_text().split() if pid not in forked]
        except OSError:  # it ended meanwhile
            return
        if len(forked) >= nth:
            time.sleep(delay)
            if not alone:
                _killpg(proc, signum)
            elif proc.poll() is None:
                os.kill(int(forked[nth - 1]), signum)
            return
        time.sleep(0.001)


def run_all(cases: Sequence[Case], base: Path) -> Dict[str, Result]:
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        futures = {case.id: pool.submit(run_case, case, base) for case in cases}
    return {key: future.result() for key, future in futures.items()}


def check(case: Case, result: Result) -> None:
    """What every case must show: the exit status, one stderr line, no traceback, nothing left."""
    where = f"{case.id}: {' '.join(case.argv)}\nstderr: {result.stderr!r}"
    assert result.code == case.code, where
    assert "Traceback" not in result.stderr, where
    assert "internal error" not in result.stderr, where
    lines = result.stderr.splitlines()
    if case.lines is not None:
        assert len(lines) == case.lines, where
        if case.lines:
            assert lines[-1].split(":")[0] == case.argv[0], where
    if case.match is not None:
        expected = case.match.replace("{cwd}", result.cwd).replace("{home}", str(Path(result.cwd).parent))
        assert expected in result.stderr, where
    assert not result.left_files, f"{where}\nleft behind: {result.left_files}"
    assert not result.left_processes, f"{where}\nstill running: {result.left_processes}"


def tracefs_mounts() -> List[str]:
    return [line for line in Path("/proc/self/mounts").read_text().splitlines()
            if line.split()[2] in ("tracefs", "debugfs")]

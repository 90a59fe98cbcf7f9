"""Operations still in flight: who is stuck, in what, on which file, waiting for which RPC.

Why apart from the tools: a stalled NFS operation never completes, so no latency event
ever reports it (bcc's nfsslower prints nothing while a server is down). The probe keeps
each thread's outermost operation, and each RPC, readable while it lasts
(runtime.Session.in_flight); this module turns those raw entries into stall reports:
which file (from the stuck thread's own system call, read from /proc, so the probe pays
nothing for it), which RPC the thread waits for, and which server that RPC went to.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

TYPE_CHECKING = False  # typing's constant without typing (discover/records.py)
if TYPE_CHECKING:
    from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple
else:
    from discover.records import NamedTuple

#: x86_64 system calls a process can wait in on NFS: number -> (argument holding a file
#: descriptor, or -1; argument holding a path pointer, or -1). From the kernel's
#: arch/x86/entry/syscalls/syscall_64.tbl.
SYSCALL_FILE_ARGS: Dict[int, Tuple[int, int]] = {
    0: (0, -1), 1: (0, -1), 17: (0, -1), 18: (0, -1), 19: (0, -1), 20: (0, -1),  # read write pread pwrite readv writev
    295: (0, -1), 296: (0, -1), 327: (0, -1), 328: (0, -1),                      # preadv pwritev preadv2 pwritev2
    74: (0, -1), 75: (0, -1), 77: (0, -1), 3: (0, -1), 5: (0, -1),               # fsync fdatasync ftruncate close fstat
    217: (0, -1), 78: (0, -1), 285: (0, -1), 40: (1, -1), 326: (0, -1),          # getdents64 getdents fallocate sendfile copy_file_range
    2: (-1, 0), 85: (-1, 0), 257: (-1, 1), 437: (-1, 1),                         # open creat openat openat2
    4: (-1, 0), 6: (-1, 0), 262: (-1, 1), 332: (-1, 1),                          # stat lstat newfstatat statx
    21: (-1, 0), 269: (-1, 1), 439: (-1, 1),                                     # access faccessat faccessat2
    87: (-1, 0), 263: (-1, 1), 82: (-1, 0), 264: (-1, 1), 316: (-1, 1),          # unlink unlinkat rename renameat renameat2
    83: (-1, 0), 258: (-1, 1), 84: (-1, 0), 86: (-1, 0), 265: (-1, 1),           # mkdir mkdirat rmdir link linkat
    88: (-1, 1), 266: (-1, 2), 76: (-1, 0), 90: (-1, 0), 268: (-1, 1),           # symlink symlinkat truncate chmod fchmodat
    92: (-1, 0), 94: (-1, 0), 260: (-1, 1), 280: (-1, 1), 89: (-1, 0), 267: (-1, 1),  # chown lchown fchownat utimensat readlink(at)
}
PATH_MAX_READ = 4096


class InFlight(NamedTuple):
    """One operation started and not yet ended, as the probe holds it."""

    tid: int
    pid: int            # 0 for a thread slot: read from /proc by stalls(), for old entries only
    op: str
    start_ns: int       # bpf_ktime_get_ns(), i.e. CLOCK_MONOTONIC
    comm: str           # "" when the probe did not keep it (thread slots): read from /proc
    name: str           # what the start event named (an RPC's procedure), or ""
    client_id: Optional[int] = None  # an RPC's sunrpc client, for its server address
    dev: int = 0        # the mount's superblock dev, where the probe keeps it (Tool.per_mount)


class Stall(NamedTuple):
    """A stuck operation as the tools print it."""

    tid: int
    pid: int
    comm: str
    op: str
    start_ns: int
    age_ns: int
    file: str
    rpc: Optional[str]
    server: Optional[str]
    dev: int = 0
    client_id: Optional[int] = None  # the sunrpc client of the RPC it waits in (rpc_server)


def _read(path: str, limit: int = 65536) -> Optional[bytes]:
    try:
        with open(path, "rb") as handle:
            return handle.read(limit)
    except OSError:
        return None


def thread_comm(pid: int, tid: int) -> str:
    raw = _read(f"/proc/{pid}/task/{tid}/comm")
    return raw.decode("utf-8", "replace").strip() if raw else "?"


def thread_tgid(tid: int) -> int:
    """The process a thread belongs to (the probe keeps only the thread id), or 0 when gone."""
    raw = _read(f"/proc/{tid}/status", 4096) or b""
    match = re.search(rb"^Tgid:\s*(\d+)", raw, re.M)
    return int(match.group(1)) if match else 0


def thread_alive(pid: int, tid: int) -> bool:
    return os.path.exists(f"/proc/{pid}/task/{tid}")


def _user_string(pid: int, address: int) -> Optional[str]:
    """A NUL-terminated string from a process's memory (the path argument it passed)."""
    try:
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
            mem.seek(address)
            raw = mem.read(PATH_MAX_READ)
    except (OSError, ValueError, OverflowError):
        return None
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace") or None


def file_of(pid: int, tid: int, machine: str = os.uname().machine) -> str:
    """The file a stuck thread's system call names (basename), or "?".

    /proc/PID/task/TID/syscall holds the call's number and arguments while the thread
    sleeps in it: a descriptor resolves through /proc/PID/fd, a path is read from the
    process's memory. Only x86_64 numbers are known; elsewhere the file is "?".
    """
    if machine != "x86_64":
        return "?"
    raw = _read(f"/proc/{pid}/task/{tid}/syscall", 512)
    if not raw:
        return "?"
    parts = raw.decode("ascii", "replace").split()
    if not parts or not parts[0].lstrip("-").isdigit():
        return "?"  # "running": not in a system call right now
    try:
        args = [int(a, 16) for a in parts[1:7]]
        fd_arg, path_arg = SYSCALL_FILE_ARGS[int(parts[0])]
    except (KeyError, ValueError):
        return "?"
    if fd_arg >= 0 and fd_arg < len(args):
        try:
            return os.path.basename(os.readlink(f"/proc/{pid}/fd/{args[fd_arg]}")) or "?"
        except OSError:
            return "?"
    if 0 <= path_arg < len(args):
        path = _user_string(pid, args[path_arg])
        return os.path.basename(path.rstrip("/")) or path if path else "?"
    return "?"


_ADDR = re.compile(rb"^addr:\s*(\S+)", re.M)


def rpc_server(client_id: int, debugfs: Path = Path("/sys/kernel/debug")) -> Optional[str]:
    """The server address of a sunrpc client, from debugfs where it is mounted (else None).

    sunrpc lists each client as rpc_clnt/<id in hex>/, whose `xprt` link leads to the
    transport's `info` (netid, addr, port)."""
    raw = _read(str(debugfs / "sunrpc" / "rpc_clnt" / f"{client_id:x}" / "xprt" / "info"), 4096)
    match = _ADDR.search(raw or b"")
    return match.group(1).decode("ascii", "replace") if match else None


def stalls(entries: Sequence[InFlight], now_ns: int, min_age_ns: int, describe: bool = True) -> List[Stall]:
    """Entries in flight for at least min_age_ns, a thread's RPC folded into its operation.

    An RPC whose issuing thread is itself stuck in an operation is that operation's `rpc`;
    any other RPC (started by a kworker or rpciod for writeback, read-ahead, a lease) is
    reported on its own, as op "rpc", with the file its thread's system call names (a
    process's create or rename stuck in its RPC; "?" for a kworker). Threads that have gone
    are dropped: their slot is stale (a missed return), not a stall. /proc is read only for
    entries old enough; `describe=False` (counts and ages only, as nfstop shows) skips the
    file and server, keeping the RPC's client id for the caller (Stall.client_id).
    """
    rpcs: Dict[int, InFlight] = {}
    for e in entries:
        if e.op == "rpc" and (e.tid not in rpcs or e.start_ns < rpcs[e.tid].start_ns):
            rpcs[e.tid] = e
    folded = set()
    out: List[Stall] = []
    for e in sorted(entries, key=lambda item: item.start_ns):
        age = now_ns - e.start_ns
        if e.op == "rpc" or age < min_age_ns:
            continue
        pid = e.pid or thread_tgid(e.tid)
        if not pid or not thread_alive(pid, e.tid):
            continue
        rpc = rpcs.get(e.tid)
        if rpc is not None:
            folded.add(rpc)
        out.append(Stall(e.tid, pid, e.comm or thread_comm(pid, e.tid), e.op, e.start_ns, age,
                         file_of(pid, e.tid) if describe else "?", rpc.name if rpc else None,
                         rpc_server(rpc.client_id) if describe and rpc and rpc.client_id is not None else None,
                         e.dev, rpc.client_id if rpc else None))
    for e in sorted(entries, key=lambda item: item.start_ns):
        age = now_ns - e.start_ns
        if e.op == "rpc" and e not in folded and age >= min_age_ns:
            file = file_of(e.pid, e.tid) if describe else "?"
            out.append(Stall(e.tid, e.pid, e.comm or thread_comm(e.pid, e.tid), "rpc", e.start_ns, age,
                             (e.name or "?") if file == "?" else file, e.name or None,
                             rpc_server(e.client_id) if describe and e.client_id is not None else None,
                             client_id=e.client_id))
    return sorted(out, key=lambda s: s.start_ns)


def still_in_flight(found: Sequence[Stall], after: Sequence[InFlight]) -> List[Stall]:
    """The stalls whose entry is still in the map read after their files were: an operation
    that ended meanwhile had its thread's /proc read in the next system call, naming a
    file it is not stuck in."""
    live = {(e.tid, e.start_ns) for e in after}
    return [s for s in found if (s.tid, s.start_ns) in live]


class StallReporter:
    """Which stalls to print now: once when an operation crosses the threshold, then at most
    every `interval_s` while it stays stuck (its completion line follows as usual)."""

    def __init__(self, min_age_ns: int, interval_s: float) -> None:
        self.min_age_ns = min_age_ns
        self.interval_ns = int(interval_s * 1e9)
        self._last: Dict[Tuple[int, str, int], int] = {}

    def due(self, found: Sequence[Stall], now_ns: int) -> List[Stall]:
        out = []
        current = set()
        for stall in found:
            key = (stall.tid, stall.op, stall.start_ns)
            current.add(key)
            last = self._last.get(key)
            if last is None or now_ns - last >= self.interval_ns:
                self._last[key] = now_ns
                out.append(stall)
        self._last = {k: v for k, v in self._last.items() if k in current}
        return out

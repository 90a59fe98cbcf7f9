"""Guest side of the fleet check: one NFS server, two clients, one client's load beside the other's.

Runs in each guest of a QEMU fleet (labs/fleet_checks.py drives it from the host), root,
probekit's package installed. The guests meet through the results share: the host writes the
phase (setup, before, heavy, drain, after, stop, end) to /results/fleet/phase, each guest notes
when it saw each phase and leaves markers there (light.tool, server.ready, light.ready,
heavy.ready, heavy.done). Each role prints one JSON document:

  prepare light|heavy   the files the role reads and writes, made before any tool runs
  server                `nfsdtop --by client --json -v 2` from before the clients start until
                        the host says end (every request of theirs printed), the TCP peers of
                        port 2049
  light                 (client-b) one O_DIRECT 64 KiB read at a random offset every 0.1 s,
                        each timed, labelled with the phase seen before and after it; nfsdist
                        --json 1 around them, started before nfsdtop (whatever a tool's start
                        does on the mounts is outside nfsdtop's count); /proc/net/rpc/nfs
                        before and after
  heavy                 (client-a) parallel O_DIRECT writers and readers while the phase is
                        heavy; /proc/net/rpc/nfs before and after

The clients' NFSv3 requests are only their workloads' (nothing else touches /mnt/nfs3), and
the client's RPC counters are read before its first and after its last: so the differences are
what each client issued, request by request, which nfsdtop on the server must show by address.

  python3 labs/guest/fleet_guest.py ROLE
"""
from __future__ import annotations

import json
import mmap
import multiprocessing
import os
import random
import subprocess
import sys
import time
import traceback
from typing import Any, Callable, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nfsdtop_guest import PROC_NAMES, nfs_clients  # noqa: E402
from probes_guest import (EVIDENCE_WAIT_S, MOUNTS, kernel_attachments, nfs_server, stop, tool,  # noqa: E402
                          wait_flushed, wait_ready)

SHARE = "/results/fleet"
BLOCK = 64 * 1024
#: light: a 16 MiB file read at random 64 KiB offsets, one read per LIGHT_GAP_S
LIGHT_BLOCKS, LIGHT_GAP_S = 256, 0.1
#: heavy: this many writers and readers, each on its own 8 MiB file in 256 KiB requests
HEAVY_WRITERS, HEAVY_READERS, HEAVY_BLOCK, HEAVY_BLOCKS = 2, 2, 256 * 1024, 32
#: seconds between two reads of the phase file where nothing else paces the loop
POLL_S = 0.2
#: the phases after which a workload stops
OVER = ("stop", "end")


def work_dir(role: str) -> str:
    return os.path.join(MOUNTS["nfs3"], "work", f"fleet-{role}")


def phase() -> str:
    """The host's phase. The host renames a new phase file into place; a 9p read that meets the
    rename fails (ENODATA seen) and is read again."""
    for _ in range(50):
        try:
            with open(os.path.join(SHARE, "phase")) as handle:
                found = handle.read().strip()
            if found:
                return found
        except OSError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"{SHARE}/phase: unreadable or empty for 1 s")


def watch(seen: List[List[Any]]) -> str:
    """The phase now, noting in `seen` ([phase, wall time]) when a new one was first seen."""
    now = phase()
    if not seen or seen[-1][0] != now:
        seen.append([now, round(time.time(), 3)])
    return now


def wait_phase(seen: List[List[Any]], done: Callable[[str], bool]) -> str:
    deadline = time.monotonic() + EVIDENCE_WAIT_S * 3
    while not done(watch(seen)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the host never moved on from phase {seen[-1][0]!r}")
        time.sleep(POLL_S)
    return seen[-1][0]


def mark(name: str) -> None:
    with open(os.path.join(SHARE, name), "w") as handle:
        handle.write(f"{time.time():.3f}\n")


def wait_marker(name: str) -> None:
    deadline = time.monotonic() + EVIDENCE_WAIT_S * 3
    while not os.path.exists(os.path.join(SHARE, name)):
        if phase() in OVER or time.monotonic() > deadline:
            raise RuntimeError(f"no {name} in {SHARE} (phase {phase()!r})")
        time.sleep(POLL_S)


def rpc_counts() -> Dict[str, int]:
    """This client's NFSv3 calls per procedure (/proc/net/rpc/nfs, named as nfsd names them)."""
    with open("/proc/net/rpc/nfs") as handle:
        for line in handle:
            fields = line.split()
            if fields and fields[0] == "proc3":
                return {f"NFSv3 {name}": int(n) for name, n in zip(PROC_NAMES["proc3"], fields[2:])}
    raise RuntimeError("/proc/net/rpc/nfs has no proc3 line: no NFSv3 mount?")


def delta(before: Dict[str, int], after: Dict[str, int]) -> Dict[str, int]:
    return {key: after[key] - before[key] for key in after if after[key] != before[key]}


def own_address(server: str) -> str:
    """The address this client sends from towards the server (what the server sees)."""
    out = subprocess.run(["ip", "-o", "route", "get", server], stdout=subprocess.PIPE, check=True,
                         universal_newlines=True).stdout.split()
    return out[out.index("src") + 1]


def fill(path: str, blocks: int, size: int) -> None:
    with open(path, "wb") as handle:
        for _ in range(blocks):
            handle.write(os.urandom(size))
        handle.flush()
        os.fsync(handle.fileno())


def prepare(role: str) -> Dict[str, Any]:
    os.makedirs(work_dir(role), exist_ok=True)
    if role == "light":
        fill(os.path.join(work_dir(role), "read.bin"), LIGHT_BLOCKS, BLOCK)
    else:
        for index in range(HEAVY_WRITERS + HEAVY_READERS):
            fill(os.path.join(work_dir(role), f"heavy-{index}.bin"), HEAVY_BLOCKS, HEAVY_BLOCK)
    return {"files": sorted(os.listdir(work_dir(role)))}


def serve() -> Dict[str, Any]:
    """nfsdtop from before the clients start until the host says end, every request printed."""
    seen: List[List[Any]] = []
    before = kernel_attachments()
    log = "/tmp/fleet-nfsdtop.log"
    argv = ["nfsdtop", "--by", "client", "--json", "-v", "2"]
    proc = tool(argv, log)
    try:
        ready_s = wait_ready(proc, log)
        wait_flushed([log], time.time(), "its start")  # a whole interval counted: nothing is missed
        mark("server.ready")
        wait_phase(seen, lambda now: now == "end")
        clients = nfs_clients()  # the host says end after both clients' last request returned
        flushed = wait_flushed([log], time.time(), "the clients' last requests")
    finally:
        result = dict(stop(proc, log), argv=argv)
    return {"nfsdtop": result, "ready_s": round(ready_s, 1), "flushed": flushed, "seen": seen,
            "clients": clients, "attachments": {"before": before, "after": kernel_attachments()}}


def light() -> Dict[str, Any]:
    """Timed O_DIRECT reads, one per LIGHT_GAP_S, until the host says stop, under nfsdist."""
    seen: List[List[Any]] = []
    server = nfs_server()
    log = "/tmp/fleet-nfsdist.log"
    argv = ["nfsdist", "--json", "-v", "1"]
    proc = tool(argv, log)
    reads: List[List[Any]] = []  # [wall start, µs, phase seen before and after ("edge" when they differ)]
    try:
        ready_s = wait_ready(proc, log)
        mark("light.tool")
        wait_marker("server.ready")
        counts_before = rpc_counts()  # before the first request: open's included
        mark("light.ready")
        buf = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT wants
        fd = os.open(os.path.join(work_dir("light"), "read.bin"), os.O_RDONLY | os.O_DIRECT)
        rng = random.Random(12)
        while True:
            before = watch(seen)
            if before in OVER:
                break
            start, mono = time.time(), time.monotonic()
            got = os.preadv(fd, [buf], rng.randrange(LIGHT_BLOCKS) * BLOCK)
            took = time.monotonic() - mono
            after = watch(seen)
            if got != BLOCK:
                raise RuntimeError(f"short O_DIRECT read: {got} bytes")
            reads.append([round(start, 3), round(took * 1e6), before if before == after else "edge"])
            time.sleep(LIGHT_GAP_S)
        os.close(fd)
        counts_after = rpc_counts()
        flushed = wait_flushed([log], time.time(), "the last read")
    finally:
        result = dict(stop(proc, log), argv=argv)
    return {"address": own_address(server), "server": server, "nfsdist": result, "ready_s": round(ready_s, 1),
            "flushed": flushed, "seen": seen, "reads": reads, "issued": delta(counts_before, counts_after)}


def heavy_worker(index: int, writer: bool, halt: Any, done: Any) -> None:
    """One O_DIRECT writer or reader over its own file, whole file in turn, until halted."""
    buf = mmap.mmap(-1, HEAVY_BLOCK)
    if writer:
        buf.write(os.urandom(HEAVY_BLOCK))
    fd = os.open(os.path.join(work_dir("heavy"), f"heavy-{index}.bin"),
                 (os.O_WRONLY if writer else os.O_RDONLY) | os.O_DIRECT)
    count = 0
    try:
        while not halt.is_set():
            offset = (count % HEAVY_BLOCKS) * HEAVY_BLOCK
            moved = os.pwritev(fd, [buf], offset) if writer else os.preadv(fd, [buf], offset)
            if moved != HEAVY_BLOCK:
                raise RuntimeError(f"short O_DIRECT {'write' if writer else 'read'}: {moved} bytes")
            count += 1
    finally:  # the parent waits for every worker's count; a failed one says so by its exit code
        os.close(fd)
        done.put((index, writer, count))


def heavy() -> Dict[str, Any]:
    """Parallel writers and readers for as long as the phase is heavy."""
    seen: List[List[Any]] = []
    server = nfs_server()
    counts_before = rpc_counts()
    mark("heavy.ready")
    ops: List[List[Any]] = []
    if wait_phase(seen, lambda now: now == "heavy" or now in OVER) == "heavy":
        fork = multiprocessing.get_context("fork")
        halt, done = fork.Event(), fork.Queue()
        workers = [fork.Process(target=heavy_worker, args=(i, i < HEAVY_WRITERS, halt, done))
                   for i in range(HEAVY_WRITERS + HEAVY_READERS)]
        for worker in workers:
            worker.start()
        try:
            wait_phase(seen, lambda now: now != "heavy")
        finally:
            halt.set()
            ops = [list(done.get(timeout=EVIDENCE_WAIT_S)) for _ in workers]
            for worker in workers:
                worker.join()
        if any(worker.exitcode for worker in workers):
            raise RuntimeError(f"a heavy worker failed: exit codes {[w.exitcode for w in workers]}")
    counts_after = rpc_counts()
    mark("heavy.done")
    return {"address": own_address(server), "server": server, "seen": seen,
            "workers": [{"index": i, "writer": w, "requests": n} for i, w, n in sorted(ops)],
            "issued": delta(counts_before, counts_after)}


def main() -> int:
    role = sys.argv[1] if len(sys.argv) > 1 else ""
    roles: Dict[str, Callable[[], Dict[str, Any]]] = {
        "server": serve, "light": light, "heavy": heavy,
        "prepare": lambda: prepare(sys.argv[2] if len(sys.argv) > 2 else "")}
    if role not in roles or (role == "prepare" and sys.argv[2:3] not in (["light"], ["heavy"])):
        print("usage: fleet_guest.py server|light|heavy|prepare light|prepare heavy", file=sys.stderr)
        return 2
    try:
        result = {"check": f"fleet-{role}", "ok": True, "data": roles[role]()}
    except Exception as exc:  # reported as data: the host test shows it, and where it was raised
        where = traceback.extract_tb(exc.__traceback__)[-1]
        result = {"check": f"fleet-{role}", "ok": False,
                  "error": f"{type(exc).__name__}: {exc} ({where.name}, line {where.lineno})"}
    # the tools stamp their intervals in local time: the host judging them needs the guest's offset
    result["data"] = dict(result.get("data", {}), release=os.uname().release, gmtoff=time.localtime().tm_gmtoff)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Guest side of the probe lab checks: run nfsslower/nfsdist/nfstop against a known workload.

Runs inside a lab guest (Python 3.9+, root, bcc, /mnt/nfs3 and /mnt/nfs42 mounted) from
the read-only project share, and prints one JSON document with what the tools reported
next to what the workload issued. tests/lab/test_probes_lab.py asserts on it.

  python3 tests/lab/probes_guest.py counts|latency|top|v3only
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

PROJECT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MOUNTS = {"nfs3": "/mnt/nfs3", "nfs42": "/mnt/nfs42"}

#: the known workload: N reads of 64 KiB, M writes of 1 MiB (more than wsize, so the
#: flush is UNSTABLE and the kernel issues COMMIT by itself), K stats, 4 opens (first
#: lookup, cached dentry, 2 creates), 2 fsyncs, and one O_SYNC 4 KiB write whose fsync
#: runs nested inside the write
N_READS, READ_SIZE = 4, 65536
M_WRITES, WRITE_SIZE = 8, 1 << 20
K_STATS = 5
GAP_S = 4.0  # quiet seconds between latency phases


def tool(args: List[str], log: str) -> subprocess.Popen:
    """Start one of our tools; it is ready once its stdout has its first line."""
    out = open(log, "w")
    return subprocess.Popen([sys.executable, "-m", "probes.commands"] + args, cwd=PROJECT,
                            stdout=out, stderr=subprocess.PIPE, universal_newlines=True)


def wait_ready(proc: subprocess.Popen, log: str, timeout: float = 400.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"{log}: tool exited {proc.returncode}: {proc.stderr.read()}")
        with open(log) as handle:
            if handle.readline().endswith("\n"):
                return time.monotonic() - started
        time.sleep(0.5)
    raise RuntimeError(f"{log}: not ready after {timeout} s")


def stop(proc: subprocess.Popen, log: str) -> Dict[str, Any]:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    with open(log) as handle:
        lines = handle.read().splitlines()
    return {"rc": proc.returncode, "stderr": err, "lines": lines}


def drop_caches() -> None:
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as handle:
        handle.write("3\n")


def prepare(mount: str, tag: str) -> None:
    """Create the file the workload reads, before any tool runs (its set-up is not counted)."""
    work = os.path.join(mount, "work", f"probes-{tag}")
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, "read.bin"), "wb") as handle:
        handle.write(os.urandom(N_READS * READ_SIZE))


def workload(mount: str, tag: str) -> Dict[str, int]:
    """Issue a known set of operations on one mount (after prepare); return what was issued."""
    work = os.path.join(mount, "work", f"probes-{tag}")
    src = os.path.join(work, "read.bin")
    drop_caches()
    issued = {"read": 0, "write": 0, "open": 0, "getattr": 0, "fsync": 0, "unstable_fsync": 0,
              "read_bytes": 0, "write_bytes": 0}
    fd = os.open(src, os.O_RDONLY)                               # open of an existing file
    issued["open"] += 1
    for i in range(N_READS):
        issued["read_bytes"] += len(os.pread(fd, READ_SIZE, i * READ_SIZE))
        issued["read"] += 1
    os.close(fd)
    fd = os.open(src, os.O_RDONLY)                               # open of a cached dentry
    issued["open"] += 1
    os.close(fd)
    # an O_SYNC write: the fsync runs nested inside the write, on the same thread
    fd = os.open(os.path.join(work, "sync.bin"), os.O_WRONLY | os.O_CREAT | os.O_SYNC, 0o644)
    issued["open"] += 1
    issued["write_bytes"] += os.write(fd, b"s" * 4096)
    issued["write"] += 1
    issued["fsync"] += 1
    os.close(fd)
    big = os.path.join(work, f"write-{time.monotonic_ns()}.bin")
    fd = os.open(big, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)  # open that creates
    issued["open"] += 1
    block = b"\0" * WRITE_SIZE
    for i in range(M_WRITES):
        issued["write_bytes"] += os.write(fd, block)
        issued["write"] += 1
        if i in (M_WRITES // 2 - 1, M_WRITES - 1):
            os.fsync(fd)
            issued["fsync"] += 1
            issued["unstable_fsync"] += 1  # flushes 4 MiB > wsize: UNSTABLE writes + COMMIT
    os.close(fd)
    for _ in range(K_STATS):
        os.stat(src)
        issued["getattr"] += 1
    return issued


def last_json(lines: List[str]) -> Dict[str, Any]:
    for line in reversed(lines):
        if line.startswith("{") and '"ops"' in line:
            return json.loads(line)
    raise RuntimeError("no histogram JSON in the tool's output")


def check_counts() -> Dict[str, Any]:
    """nfsdist per mount: per-op counts and byte totals against the issued workload."""
    out: Dict[str, Any] = {}
    for name, mount in MOUNTS.items():
        log = f"/tmp/nfsdist-{name}.out"
        prepare(mount, name)
        proc = tool(["nfsdist", "--json", "-v"], log)
        ready = wait_ready(proc, log)
        issued = workload(mount, name)
        time.sleep(3)  # let writeback's COMMIT finish
        res = stop(proc, log)
        out[name] = {"issued": issued, "seen": last_json(res["lines"]), "ready_s": round(ready, 1),
                     "rc": res["rc"], "stderr": res["stderr"]}
    return out


def latency_phase(mount: str, tag: str) -> Dict[str, Any]:
    """One workload run with its wall and monotonic (= bpf_ktime_get_ns) time span."""
    started, mono = time.time(), time.monotonic()
    issued = workload(mount, tag)
    return {"issued": issued, "start": started, "end": time.time(), "mono_start": mono,
            "mono_end": time.monotonic()}


def by_phase(result: Dict[str, Any], phases: Dict[str, Any]) -> None:
    """Label nfsslower events (monotonic end time) and nfsdist intervals (wall second) by phase.

    Phases are GAP_S apart and nothing else touches NFS, so an interval printed at wall
    second T (covering about T-1..T+1) belongs to the delay phase when T >= its start - 1.
    """
    delay_wall = phases["delay"]["start"]
    delay_mono = phases["delay"]["mono_start"]
    for event in result["nfsslower"]["events"]:
        event["phase"] = "delay" if event["end_us"] / 1e6 >= delay_mono else "nodelay"
    for interval in result["nfsdist"]["intervals"]:
        printed = time.mktime(time.strptime(interval["ts"], "%Y-%m-%d %H:%M:%S"))
        interval["phase"] = "delay" if printed >= delay_wall - 1 else "nodelay"


def check_latency(delay_ms: int, threshold_ms: int) -> Dict[str, Any]:
    """nfsslower at a threshold and nfsdist, without and then with netem delay on lo."""
    slower_log, dist_log = "/tmp/nfsslower-lat.out", "/tmp/nfsdist-lat.out"
    for tag in ("nodelay", "delay"):
        prepare(MOUNTS["nfs3"], tag)
    slower = tool(["nfsslower", "--json", str(threshold_ms)], slower_log)
    dist = tool(["nfsdist", "--json", "1"], dist_log)
    ready = [wait_ready(slower, slower_log), wait_ready(dist, dist_log)]
    phases: Dict[str, Any] = {}
    try:
        phases["nodelay"] = latency_phase(MOUNTS["nfs3"], "nodelay")
        time.sleep(GAP_S)
        subprocess.run(["tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", f"{delay_ms}ms"], check=True)
        phases["delay"] = latency_phase(MOUNTS["nfs3"], "delay")
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", "lo", "root"], check=False)
    time.sleep(GAP_S)
    result = {"delay_ms": delay_ms, "threshold_ms": threshold_ms, "ready_s": ready, "phases": phases,
              "nfsslower": stop(slower, slower_log), "nfsdist": stop(dist, dist_log)}
    result["nfsslower"]["events"] = [json.loads(line) for line in result["nfsslower"]["lines"]
                                     if line.startswith("{") and '"lat_us"' in line]
    result["nfsdist"]["intervals"] = [json.loads(line) for line in result["nfsdist"]["lines"]
                                      if line.startswith("{") and '"ops"' in line]
    by_phase(result, phases)
    return result


def check_top() -> Dict[str, Any]:
    """nfstop --json while a child process runs the workload: its pid must show its ops."""
    log = "/tmp/nfstop.out"
    prepare(MOUNTS["nfs3"], "top")
    proc = tool(["nfstop", "--json", "-i", "1"], log)
    started = time.monotonic()
    # nfstop --json prints nothing before its first interval: wait for that line
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline and not open(log).read().strip():
        if proc.poll() is not None:
            raise RuntimeError(f"nfstop exited {proc.returncode}: {proc.stderr.read()}")
        time.sleep(0.5)
    ready = time.monotonic() - started
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "workload-child"])
    child.wait()
    time.sleep(2.5)
    res = stop(proc, log)
    return {"child_pid": child.pid, "ready_s": ready, "result": res}


def check_v3only() -> Dict[str, Any]:
    """With nfsv4 unloaded, every command still starts and sees NFSv3 operations."""
    out: Dict[str, Any] = {}
    subprocess.run(["umount", MOUNTS["nfs42"]], check=True)
    unload = subprocess.run(["modprobe", "-r", "nfsv4"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            universal_newlines=True)
    try:
        out["nfsv4_loaded"] = os.path.exists("/sys/module/nfsv4")
        out["unload"] = unload.stdout
        runs = {"nfsslower": ["nfsslower", "--json", "0", "-v"], "nfsdist": ["nfsdist", "--json", "-v"],
                "nfstop": ["nfstop", "--json", "-i", "1", "-v"]}
        prepare(MOUNTS["nfs3"], "v3only")
        procs = {name: tool(args, f"/tmp/v3only-{name}.out") for name, args in runs.items()}
        for name, proc in procs.items():
            if name != "nfstop":
                wait_ready(proc, f"/tmp/v3only-{name}.out")
        time.sleep(2)
        out["issued"] = workload(MOUNTS["nfs3"], "v3only")
        time.sleep(2.5)
        out["results"] = {name: stop(proc, f"/tmp/v3only-{name}.out") for name, proc in procs.items()}
    finally:
        subprocess.run(["modprobe", "nfsv4"], check=False)
        subprocess.run(["mount", "-t", "nfs", "-o", "vers=4.2", "127.0.0.1:/srv/nfs", MOUNTS["nfs42"]], check=False)
    return out


def main(argv: List[str]) -> int:
    what = argv[1] if len(argv) > 1 else ""
    if what == "workload-child":
        workload(MOUNTS["nfs3"], "top")
        return 0
    checks = {"counts": check_counts, "latency": lambda: check_latency(50, 90), "top": check_top,
              "v3only": check_v3only}
    if what not in checks:
        print(f"usage: {argv[0]} {'|'.join(checks)}", file=sys.stderr)
        return 2
    result: Optional[Dict[str, Any]] = None
    try:
        result = {"check": what, "ok": True, "data": checks[what]()}
    except Exception as exc:  # report the failure as data: the host test shows it
        result = {"check": what, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""Guest side of the probe lab checks: run nfsslower/nfsdist/nfstop against a known workload.

Runs inside a lab guest (Python 3.9+, root, bcc, /mnt/nfs3 and /mnt/nfs42 mounted) from
the read-only project share, and prints one JSON document with what the tools reported
next to what the workload issued. tests/lab/test_probes_lab.py asserts on it; `picks`
alone gives this kernel's --lab-results for `probes compat` (docs/compat.md), for
`labs test --lab-results FILE`.

  python3 labs/checks/probes/guest.py main|v3only|identity|kmiss|picks
"""
from __future__ import annotations

import contextlib
import json
import mmap
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

# run as a script (python3 PATH in the guest): its project tree is not on sys.path by itself
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
from discover.spec import OPS  # noqa: E402
from labs.checks.shared import META_EXACT, attach_kinds, wall  # noqa: E402

MOUNTS = {"nfs3": "/mnt/nfs3", "nfs42": "/mnt/nfs42"}
#: where probekit's Debian package puts its tracing tools (the host installs it after boot)
INSTALLED = "/usr/sbin"

#: the known workload: N reads of 64 KiB, M writes of 1 MiB (more than wsize, so the
#: flush is UNSTABLE and the kernel issues COMMIT by itself), K stats, 4 opens (first
#: lookup, cached dentry, 2 creates), 2 fsyncs, and one O_SYNC 4 KiB write whose fsync
#: runs nested inside the write
N_READS, READ_SIZE = 4, 65536
M_WRITES, WRITE_SIZE = 8, 1 << 20
K_STATS = 5
GAP_S = 5.0  # quiet seconds between workload phases (their COMMITs done)


#: where the package keeps its Python modules (packaging/debian/rules' PRIVATE)
INSTALLED_MODULES = "/usr/lib/probekit"
#: the forced kretprobe miss: MISS_READERS threads read a file with O_DIRECT at once,
#: MISS_READS x 64 KiB each, every read a round trip that netem delays MISS_DELAY_MS per packet,
#: so that more callers are inside nfs_file_read at once than its kretprobe has instances: bcc's
#: made with MISS_MAXACTIVE, core's with the kernel's default (10 on a preemptible kernel)
MISS_READERS, MISS_READS, MISS_DELAY_MS, MISS_MAXACTIVE = 16, 16, 20, 1


def installed(command: str) -> str:
    """A command of probekit's Debian package, as the host installed it (labs.install.install_tools)."""
    path = os.path.join(INSTALLED, command)
    if not os.path.exists(path):
        raise RuntimeError(f"{path} is missing: the host installs probekit's Debian package first "
                           "(labs.install.install_tools)")
    return path


def user_env() -> Dict[str, str]:
    """A user's environment for an installed command: without the lab agent's PYTHONPATH,
    which puts the source share first on sys.path."""
    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


def tool(args: List[str], log: str) -> subprocess.Popen:
    """Start one of our tools, as installed; it is ready once its stdout has its first line. Its
    stderr goes to LOG.err, where what it says while it runs can be waited for (wait_said)."""
    return subprocess.Popen([installed(args[0])] + args[1:], cwd="/", env=user_env(),
                            stdout=open(log, "w"), stderr=open(log + ".err", "w"), universal_newlines=True)


def said(log: str) -> str:
    """What a tool started by tool() has written to its stderr so far."""
    with open(log + ".err") as handle:
        return handle.read()


def wait_ready(proc: subprocess.Popen, log: str, timeout: float = 600.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"{log}: tool exited {proc.returncode}: {said(log)}")
        with open(log) as handle:
            if handle.readline().endswith("\n"):
                return time.monotonic() - started
        time.sleep(0.5)
    raise RuntimeError(f"{log}: the tool never printed its first line (waited {timeout:.0f} s)")


#: BPF program types a tracing tool loads (systemd's cgroup programs come and go by themselves)
TRACING_PROG_TYPES = {"kprobe", "tracepoint", "raw_tracepoint", "tracing", "perf_event"}


def kernel_attachments() -> Dict[str, List[Any]]:
    """What a tool could leave in the kernel: tracing BPF programs and kprobe_events lines."""
    out = subprocess.run(["bpftool", "prog", "show", "--json"], stdout=subprocess.PIPE, check=True,
                         universal_newlines=True).stdout
    tracing = [p for p in json.loads(out) if p.get("type") in TRACING_PROG_TYPES]
    progs = sorted(p["id"] for p in tracing)
    fentry = sum(p["type"] == "tracing" for p in tracing)  # fentry/fexit programs
    kprobes: List[str] = []
    for tracefs in ("/sys/kernel/tracing", "/sys/kernel/debug/tracing"):
        path = os.path.join(tracefs, "kprobe_events")
        if os.path.exists(path):
            with open(path) as handle:
                kprobes = handle.read().splitlines()
            break
    return {"bpf_progs": progs, "fentry_progs": fentry, "kprobe_events": kprobes}


def stop(proc: subprocess.Popen, log: str, sig: int = signal.SIGTERM) -> Dict[str, Any]:
    proc.send_signal(sig)
    proc.wait(timeout=EVIDENCE_WAIT_S)
    with open(log) as handle:
        lines = handle.read().splitlines()
    return {"rc": proc.returncode, "stderr": said(log), "lines": lines}


def json_lines(lines: List[str], key: str) -> List[Dict[str, Any]]:
    """A tool's --json records that carry `key` (nfsslower events: lat_us, nfsdist intervals: ops)."""
    return [json.loads(line) for line in lines if line.startswith("{") and f'"{key}"' in line]


def drop_caches() -> None:
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as handle:
        handle.write("3\n")


def prepare(mount: str, tag: str, size: int = N_READS * READ_SIZE) -> None:
    """Create the file the workload reads, before any tool runs (its set-up is not counted)."""
    work = os.path.join(mount, "work", f"probes-{tag}")
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, "read.bin"), "wb") as handle:
        handle.write(os.urandom(size))


def writes_and_two_fsyncs(fd: int, block: bytes, count: int, issued: Dict[str, int]) -> int:
    """`count` writes of `block`, an fsync after the half and after the last, added to
    `issued`; returns the fsyncs made."""
    for i in range(count):
        issued["write_bytes"] += os.write(fd, block)
        issued["write"] += 1
        if i in (count // 2 - 1, count - 1):
            os.fsync(fd)
            issued["fsync"] += 1
    return 2


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
    # each fsync flushes 4 MiB > wsize: UNSTABLE writes + COMMIT
    issued["unstable_fsync"] += writes_and_two_fsyncs(fd, b"\0" * WRITE_SIZE, M_WRITES, issued)
    os.close(fd)
    for _ in range(K_STATS):
        os.stat(src)
        issued["getattr"] += 1
    return issued


def metadata(mount: str, tag: str) -> Dict[str, int]:
    """Every metadata operation on one mount, in a fresh directory, closed files only (an open
    file's unlink would be a silly-rename); returns what was issued."""
    top = os.path.join(mount, "work", f"probes-{tag}-{time.monotonic_ns()}")
    issued = {op: 0 for op in META_EXACT + ("create",)}
    os.mkdir(top)
    issued["mkdir"] += 1
    name = os.path.join(top, "a")
    os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))  # NFSv3: ->create
    issued["create"] += 1
    os.chmod(name, 0o600)
    issued["setattr"] += 1
    os.link(name, os.path.join(top, "b"))
    issued["link"] += 1
    os.symlink("a", os.path.join(top, "c"))
    issued["symlink"] += 1
    os.rename(os.path.join(top, "b"), os.path.join(top, "d"))
    issued["rename"] += 1
    os.access(name, os.R_OK | os.W_OK)
    os.listdir(top)
    try:
        os.stat(os.path.join(top, "missing"))
    except FileNotFoundError:
        pass
    for entry in ("a", "c", "d"):
        os.unlink(os.path.join(top, entry))
        issued["unlink"] += 1
    os.rmdir(top)
    issued["rmdir"] += 1
    return issued


def picks(stderr: str) -> Dict[str, int]:
    """op -> 0-based spec candidate, from a tool's --verbose lines (`read (R): candidate 2 ...`)."""
    found: Dict[str, int] = {}
    for line in stderr.splitlines():
        match = re.match(r"^\S+: (\w+) \(\w\): candidate (\d+) ", line)
        if match:
            found[match.group(1)] = int(match.group(2)) - 1
    return found


def lab_results(picked: Dict[str, int], recorded: Dict[str, int]) -> Dict[str, Any]:
    """docs/compat.md's --lab-results for this kernel: per op the candidate used and whether it
    attached (the tool ran) and recorded the op (count > 0)."""
    return {os.uname().release: {op: {"candidate": picked.get(op), "ok": op in picked and recorded.get(op, 0) > 0}
                                 for op in OPS}}


def kernel_facts() -> Dict[str, Any]:
    bcc, libbpf = (subprocess.run(["dpkg-query", "-W", "-f", "${Version}", package], stdout=subprocess.PIPE,
                                  universal_newlines=True).stdout for package in ("python3-bpfcc", "libbpf1"))
    with open(f"/proc/self/fdinfo/{sys.stdout.fileno()}") as fdinfo:
        fdinfo_ino = any(line.startswith("ino:") for line in fdinfo)  # Linux 5.14+
    return {"release": os.uname().release, "python": sys.version.split()[0], "bcc": bcc, "libbpf": libbpf,
            "module_btf": os.path.exists("/sys/kernel/btf/nfs"), "fdinfo_ino": fdinfo_ino}


#: upper bound of every wait on evidence (a tool's interval, a scrape, a marker): its expiry is
#: reported as what never happened, never taken as a verdict
EVIDENCE_WAIT_S = 600.0


def printed_intervals(log: str) -> List[Dict[str, Any]]:
    """The complete JSON interval records (with a "ts") a tool has printed to its log so far."""
    with open(log) as handle:
        return [json.loads(line) for line in handle.read().splitlines(keepends=True)
                if line.startswith("{") and line.endswith("\n") and '"ts"' in line]


def wait_said(logs: List[str], text: str, what: str) -> None:
    """Wait until each tool (started by tool()) has said `text` on its stderr: EVIDENCE_WAIT_S at
    most, whose expiry raises, saying which tool never said it."""
    deadline = time.monotonic() + EVIDENCE_WAIT_S
    for log in logs:
        while text not in said(log):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{log}: the tool never said {text!r} after {what} (waited {EVIDENCE_WAIT_S:.0f} s)")
            time.sleep(0.2)


def wait_flushed(logs: List[str], moment: float, what: str) -> float:
    """Wait until each interval tool (nfsdist, fsdist, nfstop, fstop: one JSON record per interval)
    has printed an interval that read its counts after `moment`; return the wall time then.

    A tool reads its counts, stamps the interval and prints it, then reads the next: so the
    interval after the first one stamped later than `moment` read after it, and every operation
    that ended by `moment` is in an interval printed by the returned time. Waits at most
    EVIDENCE_WAIT_S; its expiry raises, saying which tool never printed it."""
    deadline = time.monotonic() + EVIDENCE_WAIT_S
    for log in logs:
        while True:
            stamps = [wall(record["ts"]) for record in printed_intervals(log)]
            later = [i for i, stamp in enumerate(stamps) if stamp > moment]
            if later and later[0] + 1 < len(stamps):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{log}: the tool never printed an interval read after {what} "
                                   f"(waited {EVIDENCE_WAIT_S:.0f} s; last stamps {stamps[-3:]})")
            time.sleep(0.2)
    return time.time()


def phase_of(moment: float, starts: List[Tuple[str, float]]) -> str:
    """The last phase that had started by `moment` ("before" when none)."""
    found = "before"
    for name, start in starts:
        if moment >= start:
            found = name
    return found


def label_phases(result: Dict[str, Any], phases: Dict[str, Any]) -> None:
    """Label nfsslower events (monotonic end time) and nfsdist intervals (wall second) by phase.

    Nothing else touches NFS, and each phase starts GAP_S after nfsdist printed the interval
    that holds the last operations of the one before (wait_flushed), so an interval stamped at
    wall second T (printed before T + 1) belongs to the phase started by T + 1.
    """
    mono = sorted(((name, p["mono_start"]) for name, p in phases.items()), key=lambda item: item[1])
    starts = sorted(((name, p["start"] - 1) for name, p in phases.items()), key=lambda item: item[1])
    for event in result["nfsslower"]["events"]:
        event["phase"] = phase_of(event["end_us"] / 1e6, mono)
    for name in ("nfsdist", "nfsdist_bcc"):
        for interval in (result.get(name) or {}).get("intervals", []):
            interval["phase"] = phase_of(wall(interval["ts"]), starts)


def phase_totals(intervals: List[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """phase -> {"ops": {op: {count, bytes}}, "anomalies": n, "missed": {op: n}}, summed over its
    nfsdist intervals ("missed": what the tool reported not counted in those intervals)."""
    out: Dict[str, Dict[str, Any]] = {}
    for interval in intervals:
        total = out.setdefault(interval["phase"], {"ops": {op: {"count": 0, "bytes": 0} for op in OPS},
                                                   "anomalies": 0, "missed": {}})
        total["anomalies"] += interval["anomalies"]
        for op, n in interval.get("missed", {}).items():
            total["missed"][op] = total["missed"].get(op, 0) + n
        for op, entry in interval["ops"].items():
            total["ops"][op]["count"] += entry["count"]
            total["ops"][op]["bytes"] += entry["bytes"]
    return out


def timed_phase(mount: str, tag: str, work: Callable[[str, str], Dict[str, int]] = workload) -> Dict[str, Any]:
    """One workload run with its wall and monotonic (= bpf_ktime_get_ns) time span."""
    started, mono = time.time(), time.monotonic()
    issued = work(mount, tag)
    return {"issued": issued, "start": started, "end": time.time(), "mono_start": mono,
            "mono_end": time.monotonic()}


def nfs_server() -> str:
    """The server address the NFSv3 mount talks to (127.0.0.1 in one guest, the link address
    of the server guest in a pair)."""
    with open("/proc/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) > 1 and fields[1] == MOUNTS["nfs3"]:
                return fields[0].rpartition(":")[0]
    raise RuntimeError(f"{MOUNTS['nfs3']} is not mounted")


def route_device(address: str) -> str:
    """The client's interface towards an address (lo for 127.0.0.1, the link NIC in a pair)."""
    out = subprocess.run(["ip", "-o", "route", "get", address], stdout=subprocess.PIPE, check=True,
                         universal_newlines=True).stdout.split()
    return out[out.index("dev") + 1]


#: (round trip added by netem, nfsslower threshold) in ms, in one guest and on a pair's link:
#: far above what the host's load alone does to an undelayed operation (between two TCG guests
#: an uncached 64 KiB read took up to 140 ms on a busy host; a 6.12 guest beside a second guest
#: and two CPU hogs read in 92 and 373 ms, when 100 ms was added on lo). With 400 ms added, a
#: 6.12 guest in CI beside the 7.3 fleet's three guests and 6.1's had 7 of the plain phase's 25
#: operations at 262 ms or more, as many as the delay moved there (the seven that wait on the
#: server: 2 reads, the O_SYNC write, a getattr, 3 fsyncs; the same seven in every run since),
#: and the server's own disk under a host-wide writer put plain fsyncs there too
DELAYS = {"lo": (1000, 500), "link": (1000, 500)}


def netem_delay(device: str, rtt_delay_ms: int) -> int:
    """The delay per packet (ms) for netem on the client's interface to the server that adds
    rtt_delay_ms to a round trip: on lo both the request and the reply pass netem (half the
    delay each), on a pair's link only the request does."""
    return rtt_delay_ms // 2 if device == "lo" else rtt_delay_ms


@contextlib.contextmanager
def netem(device: str, delay_ms: int) -> Iterator[None]:
    """netem delay on `device` while the block runs; removed whatever happens."""
    subprocess.run(["tc", "qdisc", "add", "dev", device, "root", "netem", "delay", f"{delay_ms}ms"], check=True)
    try:
        yield
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", device, "root"], check=False)


def check_main() -> Dict[str, Any]:
    """One nfsslower (at a threshold) and one nfsdist (1 s intervals), started once on the
    loader --backend auto picks, around five phases: the workload on NFSv3, on NFSv4.2, the
    metadata operations on each, then the workload on NFSv3 with netem delay on the client's
    interface to the server, adding rtt_delay_ms to every round trip (netem_delay). Where they
    run on core, a second nfsdist on bcc, started once they are ready, watches the same phases:
    the reference the two loaders' counts are compared against."""
    device = route_device(nfs_server())
    rtt_delay_ms, threshold_ms = DELAYS["lo" if device == "lo" else "link"]
    delay_ms = netem_delay(device, rtt_delay_ms)
    slower_log, dist_log, bcc_log = "/tmp/nfsslower-main.out", "/tmp/nfsdist-main.out", "/tmp/nfsdist-bcc-main.out"
    plan = (("nfs3", MOUNTS["nfs3"], workload), ("nfs42", MOUNTS["nfs42"], workload),
            ("meta3", MOUNTS["nfs3"], metadata), ("meta42", MOUNTS["nfs42"], metadata),
            ("delay", MOUNTS["nfs3"], workload))
    for tag, mount, work in plan:
        if work is workload:
            prepare(mount, tag)
    attached_before = kernel_attachments()
    slower = tool(["nfsslower", "--json", "-v", "--ops", "all", str(threshold_ms)], slower_log)
    dist = tool(["nfsdist", "--json", "-v", "--ops", "all", "1"], dist_log)
    ready = [wait_ready(slower, slower_log), wait_ready(dist, dist_log)]
    attached_during = kernel_attachments()
    reference: Optional[subprocess.Popen] = None
    ready_bcc = None
    if attach_kinds(said(dist_log))["backend"] == "core":  # started alone: each loader's start-up is its own
        reference = tool(["nfsdist", "--backend", "bcc", "--json", "-v", "--ops", "all", "1"], bcc_log)
        ready_bcc = wait_ready(reference, bcc_log)
    interval_logs = [dist_log] + ([bcc_log] if reference else [])
    phases: Dict[str, Any] = {}
    for tag, mount, work in plan:
        if tag == "delay":
            with netem(device, delay_ms):
                phases[tag] = timed_phase(mount, tag, work)
        else:
            phases[tag] = timed_phase(mount, tag, work)
        phases[tag]["flushed"] = wait_flushed(interval_logs, phases[tag]["end"], f"the {tag} phase")
        time.sleep(GAP_S)
    result = {"delay_ms": delay_ms, "rtt_delay_ms": rtt_delay_ms, "netem_device": device,
              "threshold_ms": threshold_ms, "ready_s": ready, "ready_bcc_s": ready_bcc, "phases": phases,
              "nfsslower": stop(slower, slower_log), "nfsdist": stop(dist, dist_log, signal.SIGINT),
              "nfsdist_bcc": stop(reference, bcc_log, signal.SIGINT) if reference else None,
              "kernel": kernel_facts()}
    # nfsslower ended by SIGTERM, nfsdist by SIGINT (Ctrl-C): neither may leave anything attached
    result["attached"] = {"before": attached_before, "during": attached_during, "after": kernel_attachments()}
    result["nfsslower"]["events"] = json_lines(result["nfsslower"]["lines"], "lat_us")
    result["nfsdist"]["intervals"] = json_lines(result["nfsdist"]["lines"], "ops")
    if reference:
        result["nfsdist_bcc"]["intervals"] = json_lines(result["nfsdist_bcc"]["lines"], "ops")
    label_phases(result, phases)
    result["seen"] = phase_totals(result["nfsdist"]["intervals"])
    result["seen_bcc"] = phase_totals(result["nfsdist_bcc"]["intervals"]) if reference else None
    result["picks"] = {name: picks(result[name]["stderr"]) for name in ("nfsslower", "nfsdist")}
    result["attach_kinds"] = {name: attach_kinds(result[name]["stderr"]) for name in ("nfsslower", "nfsdist")
                              + (("nfsdist_bcc",) if reference else ())}
    recorded = {op: sum(result["seen"].get(tag, {}).get("ops", {}).get(op, {}).get("count", 0)
                        for tag in ("nfs3", "nfs42", "meta3", "meta42")) for op in OPS}
    result["lab_results"] = lab_results(result["picks"]["nfsdist"], recorded)
    return result


def concurrent_direct_reads(mount: str, tag: str) -> Dict[str, int]:
    """MISS_READERS threads, released together, each reading the file prepare() made for `tag`
    from its start with O_DIRECT (no page cache: every read is an RPC), MISS_READS x 64 KiB."""
    path = os.path.join(mount, "work", f"probes-{tag}", "read.bin")
    start = threading.Barrier(MISS_READERS)
    sizes: List[int] = []

    def reader() -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        buf = mmap.mmap(-1, READ_SIZE)  # page-aligned, as O_DIRECT wants
        try:
            start.wait()
            for i in range(MISS_READS):
                sizes.append(os.preadv(fd, [buf], i * READ_SIZE))
        finally:
            buf.close()
            os.close(fd)
    threads = [threading.Thread(target=reader) for _ in range(MISS_READERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"read": len(sizes), "read_bytes": sum(sizes)}


def nfsdist_with_kretprobe_instances(args: List[str], log: str, maxactive: int) -> subprocess.Popen:
    """nfsdist as installed, its bcc kretprobes made with `maxactive` instances (the module's
    KRETPROBE_MAXACTIVE set before it runs: no option of the tool sets it)."""
    code = (f"import sys; sys.path.insert(0, {INSTALLED_MODULES!r}); from probes import bcc_backend; "
            f"bcc_backend.KRETPROBE_MAXACTIVE = {maxactive}; sys.argv = {['nfsdist'] + args!r}; "
            "from probes.commands import main_nfsdist; main_nfsdist()")
    installed("nfsdist")
    return subprocess.Popen(["python3", "-c", code], cwd="/", env=user_env(), stdout=open(log, "w"),
                            stderr=open(log + ".err", "w"), universal_newlines=True)


def check_forced_miss() -> Dict[str, Any]:
    """nfsdist on kprobes, on bcc with MISS_MAXACTIVE kretprobe instances and on core with the
    kernel's default, started together around concurrent_direct_reads on NFSv3 with netem on
    the client's interface to the server (removed whatever happens): each tool's count plus
    what it reports missed must be the reads issued, and the kernel's kretprobe count must say
    why (issue 34)."""
    device = route_device(nfs_server())
    prepare(MOUNTS["nfs3"], "kmiss", MISS_READS * READ_SIZE)
    args = ["--kprobes", "--json", "-v", "--ops", "read", "1"]
    logs = {"bcc": "/tmp/nfsdist-kmiss-bcc.out", "core": "/tmp/nfsdist-kmiss-core.out"}
    procs = {"bcc": nfsdist_with_kretprobe_instances(["--backend", "bcc"] + args, logs["bcc"], MISS_MAXACTIVE),
             "core": tool(["nfsdist", "--backend", "core"] + args, logs["core"])}
    stopped: Dict[str, Any] = {}
    try:
        ready = {name: wait_ready(proc, logs[name]) for name, proc in procs.items()}
        with netem(device, MISS_DELAY_MS):
            phase = timed_phase(MOUNTS["nfs3"], "kmiss", concurrent_direct_reads)
        phase["flushed"] = wait_flushed(list(logs.values()), phase["end"], "the concurrent reads")
    finally:  # every tool stopped, whatever failed: nothing may stay attached
        for name, proc in procs.items():
            try:
                stopped[name] = stop(proc, logs[name], signal.SIGINT)
            except BaseException:
                proc.kill()
                raise
    for result in stopped.values():
        result["intervals"] = json_lines(result["lines"], "ops")
    qdisc = subprocess.run(["tc", "qdisc", "show", "dev", device], stdout=subprocess.PIPE, check=True,
                           universal_newlines=True).stdout
    return {"device": device, "ready_s": ready, "phase": phase, "nfsdist": stopped, "qdisc_after": qdisc,
            "readers": MISS_READERS, "maxactive": MISS_MAXACTIVE}


def check_picks() -> Dict[str, Any]:
    """The lean lab-results run (`labs test --lab-results`): one nfsdist (every op) around the
    workload and the metadata operations on both mounts."""
    log = "/tmp/nfsdist-picks.out"
    for name, mount in MOUNTS.items():
        prepare(mount, f"picks-{name}")
    proc = tool(["nfsdist", "--json", "-v", "--ops", "all"], log)
    wait_ready(proc, log)
    for name, mount in MOUNTS.items():
        workload(mount, f"picks-{name}")
        metadata(mount, f"picks-{name}")
    time.sleep(GAP_S)
    res = stop(proc, log)
    seen = json_lines(res["lines"], "ops")[-1]
    recorded = {op: entry["count"] for op, entry in seen["ops"].items()}
    return {"rc": res["rc"], "kernel": kernel_facts(), "lab_results": lab_results(picks(res["stderr"]), recorded)}


def mount_v42(server: str) -> None:
    """The NFSv4.2 mount of the lab (client.sh's), if it is not there. Tried twice, as client.sh
    retries at boot: once on a 2-vCPU 5.10 guest, after nfsv4 was unloaded and loaded again,
    mount.nfs gave up after its two minutes (exit 32), and in six runs since it did not; a second
    failure says what mount.nfs and the kernel said."""
    argv = ["mount", "-t", "nfs", "-o", "vers=4.2", f"{server}:/srv/nfs", MOUNTS["nfs42"]]
    for attempt in (1, 2):
        if os.path.ismount(MOUNTS["nfs42"]):
            return
        res = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
        if res.returncode == 0:
            return
        if attempt == 2:
            dmesg = subprocess.run(["dmesg"], stdout=subprocess.PIPE, universal_newlines=True).stdout
            raise RuntimeError(f"{' '.join(argv)}: exit {res.returncode} twice: {res.stdout.strip()[-300:]}; "
                               f"dmesg: {' | '.join(dmesg.splitlines()[-8:])}")
        time.sleep(GAP_S)


@contextlib.contextmanager
def nfsv4_unloaded() -> Iterator[str]:
    """NFSv4.2 unmounted and nfsv4 unloaded (yields modprobe -r's output); both back afterwards,
    whatever happened in between."""
    server = nfs_server()
    if os.path.ismount(MOUNTS["nfs42"]):
        subprocess.run(["umount", MOUNTS["nfs42"]], check=True)
    try:
        unload = subprocess.run(["modprobe", "-r", "nfsv4"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                universal_newlines=True)
        yield unload.stdout
    finally:
        subprocess.run(["modprobe", "nfsv4"], check=False)
        mount_v42(server)


def check_v3only() -> Dict[str, Any]:
    """With nfsv4 unloaded, every command still starts and sees NFSv3 operations; nfstop shows
    the workload's process (a child, which exits before nfstop's last refresh). Then nfsv4 is
    loaded and NFSv4.2 mounted under the same running tools (late_nfsv4)."""
    out: Dict[str, Any] = {}
    with nfsv4_unloaded() as unload:
        out["nfsv4_loaded"] = os.path.exists("/sys/module/nfsv4")
        out["unload"] = unload
        runs = {"nfsslower": ["nfsslower", "--json", "0", "-v"], "nfsdist": ["nfsdist", "--json", "-v"],
                "nfstop": ["nfstop", "--json", "-i", "1", "-v"]}
        prepare(MOUNTS["nfs3"], "v3only")
        prepare(MOUNTS["nfs3"], "v4late")  # the same export as /mnt/nfs42: read there once it is mounted
        before = kernel_attachments()
        logs = {name: f"/tmp/v3only-{name}.out" for name in runs}
        procs = {name: tool(args, logs[name]) for name, args in runs.items()}
        try:
            # nfstop --json prints its first line after its first interval: ready then, too
            out["ready_s"] = {name: wait_ready(proc, logs[name]) for name, proc in procs.items()}
            during = kernel_attachments()
            child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "workload-child"],
                                     stdout=subprocess.PIPE, universal_newlines=True)
            out["issued"] = json.loads(child.communicate()[0])
            out["child_pid"] = child.pid
            # nfstop refreshed after the child's exit: its last operations are in a printed interval
            wait_flushed([logs["nfstop"]], time.time(), "the v3-only workload")
            out["late"] = late_nfsv4(list(logs.values()))
        finally:  # SIGTERM, whatever happened: no tool outlives the check
            out["results"] = {name: stop(proc, logs[name]) for name, proc in procs.items()}
        out["attached"] = {"before": before, "during": during, "late": out["late"].pop("attached"),
                           "after": kernel_attachments()}
    return out


def late_nfsv4(logs: List[str]) -> Dict[str, Any]:
    """nfsv4 loaded and NFSv4.2 mounted under the running tools: on core each says it traces
    nfsv4's points now, and the workload on NFSv4.2 (its cached-dentry open is nfsv4's
    nfs4_file_open) runs under them; on bcc each says to restart. Returns the loader, the
    phase, and what is attached once every tool said it."""
    backend = attach_kinds(said(logs[0]))["backend"]
    subprocess.run(["modprobe", "nfsv4"], check=True)
    mount_v42(nfs_server())
    wait_said(logs, "now traced" if backend == "core" else "restart", "nfsv4 was loaded")
    out: Dict[str, Any] = {"backend": backend, "attached": kernel_attachments()}
    if backend == "core":
        out["phase"] = timed_phase(MOUNTS["nfs42"], "v4late")
        wait_flushed([logs[-1]], out["phase"]["end"], "the late NFSv4.2 workload")  # nfstop's; the others read sooner
        time.sleep(GAP_S)
    return out


#: the identity check's two units: systemd slices (a dash nests: probekit.slice/probekit-a.slice)
#: and the mount each one's workload runs on
IDENTITY_UNITS = {"a": ("probekit-a.slice", "nfs3"), "b": ("probekit-b.slice", "nfs42")}
CGROUP_ROOT = "/sys/fs/cgroup"


def in_scope(slice_name: str, unit: str, argv: List[str], stdout: Any = subprocess.DEVNULL) -> subprocess.Popen:
    """argv in a new transient scope unit of a slice (systemd-run --scope execs it: the pid is argv's)."""
    return subprocess.Popen(["systemd-run", "--scope", "--quiet", f"--slice={slice_name}", f"--unit={unit}"] + argv,
                            stdout=stdout, universal_newlines=True)


def slice_path(slice_name: str) -> str:
    """A slice's cgroup path as /proc/PID/cgroup writes it (each dash is one level down)."""
    parts = slice_name[:-len(".slice")].split("-")
    return "/" + "/".join("-".join(parts[:i + 1]) + ".slice" for i in range(len(parts)))


def check_identity() -> Dict[str, Any]:
    """Two systemd scope units, each running the workload on its own mount (a: NFSv3, b: NFSv4.2),
    one after the other, under nfsslower --cgroup (slice a only, every operation), nfstop --by
    cgroup and nfsdist --per-mount. A holder unit keeps each slice there before the tools start
    (--cgroup needs the directory); the workloads run in scopes of their own below it."""
    stamp = time.monotonic_ns()
    holders = {name: in_scope(slice_name, f"probekit-hold-{name}-{stamp}", ["sleep", "3600"])
               for name, (slice_name, _mount) in IDENTITY_UNITS.items()}
    try:
        for name, (slice_name, _mount) in IDENTITY_UNITS.items():
            wait_for(lambda: os.path.isdir(CGROUP_ROOT + slice_path(slice_name)), f"slice {slice_name}")
        for name, (_slice, mount) in IDENTITY_UNITS.items():
            prepare(MOUNTS[mount], f"identity-{name}")
        only_a = slice_path(IDENTITY_UNITS["a"][0])
        runs = {"nfsslower": ["nfsslower", "--json", "-M", "--cgroup", only_a, "0"],
                "nfstop": ["nfstop", "--json", "-i", "1", "--by", "cgroup"],
                "nfsdist": ["nfsdist", "--json", "--per-mount"]}
        procs = {name: tool(args, f"/tmp/identity-{name}.out") for name, args in runs.items()}
        ready = {name: wait_ready(proc, f"/tmp/identity-{name}.out") for name, proc in procs.items()}
        units: Dict[str, Any] = {}
        for name, (slice_name, mount) in IDENTITY_UNITS.items():
            unit = f"probekit-wl-{name}-{stamp}"
            # the unit stays after its workload, as a service does, until nfstop has refreshed
            # past it: a cgroup removed before that could only be shown by its id (docs/probes.md)
            leave = f"/tmp/probekit-leave-{name}-{stamp}"
            child = in_scope(slice_name, unit, [sys.executable, os.path.abspath(__file__), "workload-on",
                                                MOUNTS[mount], f"identity-{name}", leave], stdout=subprocess.PIPE)
            line = child.stdout.readline() if child.stdout else ""
            if line:
                wait_flushed(["/tmp/identity-nfstop.out"], time.time(), f"unit {name}'s workload")
            with open(leave, "w"):
                pass
            issued = json.loads(line + child.communicate()[0])
            units[name] = {"pid": child.pid, "mount": MOUNTS[mount], "issued": issued, "rc": child.returncode,
                           "cgroup": f"{slice_path(slice_name)}/{unit}.scope"}
            time.sleep(GAP_S)
        results = {name: stop(proc, f"/tmp/identity-{name}.out") for name, proc in procs.items()}
    finally:
        for holder in holders.values():
            holder.terminate()
            holder.wait()
    return {"units": units, "ready_s": ready, "results": results, "filter": only_a, "kernel": kernel_facts()}


def wait_for(ready: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not there after {timeout} s")
        time.sleep(0.2)


def main(argv: List[str]) -> int:
    what = argv[1] if len(argv) > 1 else ""
    if what == "workload-child":
        print(json.dumps(workload(MOUNTS["nfs3"], "v3only")))
        return 0
    if what == "workload-on":  # MOUNT TAG LEAVE_FILE: stays until LEAVE_FILE exists (an hour at most)
        print(json.dumps(workload(argv[2], argv[3])), flush=True)
        deadline = time.monotonic() + 3600
        while not os.path.exists(argv[4]) and time.monotonic() < deadline:
            time.sleep(0.2)
        return 0
    checks = {"main": check_main, "v3only": check_v3only, "identity": check_identity, "kmiss": check_forced_miss,
              "picks": check_picks}
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

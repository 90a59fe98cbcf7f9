"""nfs-exporter's memory and scrape time, side by side with what users run beside it, in one lab guest.

Measured in the same guest, one after the other, on the same workload:
- resident memory: nfs-exporter (all six default operations, per mount) against Debian's
  nfsdist-bpfcc alone (bcc's histogram tool, the closest thing that exists): VmRSS once the
  workload has run and (for the exporter) one scrape was served, and VmHWM, the peak (both
  compile their C with bcc at start, which is most of the peak);
- scrape time with MOUNTS NFSv3 mounts of the export (`nosharecache`: one superblock each)
  and the six operations on each: wall time of a whole /metrics GET, median of SCRAPES,
  against prometheus-node-exporter with its mountstats collector on the same mounts (what a
  fleet already scrapes per client), and the number of sample lines each serves;
- the same scrape with --cgroup-label and the workload issued from CGROUPS cgroups (each
  on one of the mounts, --cgroup-limit above that count so every one has its own series),
  against the exporter without the label on the same mounts.

  python3 bench/bench_exporter.py            # host: boot the QEMU lab (6.1), run, tear down
  python3 bench/bench_exporter.py --lab NAME # host: use a lab that is already up
  python3 bench/bench_exporter.py --in-guest # inside a guest (root, bcc, NFS mounts)
"""
from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional

from lab_run import help_asked, run_in_lab

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPORTER_PORT, NODE_PORT = 19912, 9101
MOUNTS = 50
CGROUPS = 200
CGROUP_DIR = "/sys/fs/cgroup/probekit-bench"
SCRAPES = 20
BASE = "/mnt/bench"
#: one file per mount: write + fsync (WRITE, COMMIT), then open, read, stat
FILE_SIZE = 1 << 20


def status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} for pid {pid}")


def start(argv: List[str], ready: str, log: str, timeout: float = 600, cwd: str = PROJECT) -> subprocess.Popen:
    """A server or tool, once `ready` appears in its output (bcc compiles first: minutes under TCG);
    `cwd`: the checkout whose code `python3 -m` runs."""
    out = open(log, "w")
    proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{argv[0]} exited {proc.returncode}: {open(log).read()[-500:]}")
        if ready in open(log).read():
            return proc
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"{argv[0]}: no {ready!r} after {timeout} s")


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def workload(mount: str) -> None:
    """The six default operations on one mount: write, fsync (and the commit it brings), open,
    read (cache dropped first, by the caller), getattr."""
    path = os.path.join(mount, "bench.bin")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, b"b" * FILE_SIZE)
    os.fsync(fd)
    os.close(fd)
    fd = os.open(path, os.O_RDONLY)
    os.pread(fd, 65536, 0)
    os.close(fd)
    os.stat(path)


def drop_caches() -> None:
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as handle:
        handle.write("3\n")


def scrape_times(port: int, scrapes: int = SCRAPES) -> Dict[str, Any]:
    walls = []
    text = ""
    for _ in range(scrapes):
        started = time.perf_counter()
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60).read().decode()
        walls.append(time.perf_counter() - started)
    samples = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    return {"median_s": statistics.median(walls), "min_s": min(walls), "max_s": max(walls), "samples": samples}


def memory(mount: str) -> Dict[str, Any]:
    """VmRSS after the workload (and a scrape) and VmHWM of each, one after the other."""
    out: Dict[str, Any] = {}
    runs = {"nfsdist-bpfcc": ([sys.executable, "-u", "/usr/sbin/nfsdist-bpfcc", "1"], "Tracing", None),
            "nfs-exporter": ([sys.executable, "-m", "probes.exporter", "--port", str(EXPORTER_PORT)], "probe attached",
                             EXPORTER_PORT)}
    for name, (argv, ready, port) in runs.items():
        proc = start(argv, ready, f"/tmp/bench-{name}.log")
        try:
            drop_caches()
            workload(mount)
            if port:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60).read()
            time.sleep(2)
            out[name] = {"rss_kib": status_kib(proc.pid, "VmRSS"), "hwm_kib": status_kib(proc.pid, "VmHWM")}
        finally:
            stop(proc)
    return out


def in_cgroups(points: List[str]) -> None:
    """The workload once from each of CGROUPS new cgroups (a forked child moves itself into
    its cgroup, then works on mount i % len(points)); scrapes() removes the cgroups."""
    os.makedirs(CGROUP_DIR, exist_ok=True)
    for i in range(CGROUPS):
        cgroup = os.path.join(CGROUP_DIR, f"unit-{i}")
        os.makedirs(cgroup, exist_ok=True)
        pid = os.fork()
        if pid == 0:
            try:
                with open(os.path.join(cgroup, "cgroup.procs"), "w") as procs:
                    procs.write("0")
                workload(bench_dir(points[i % len(points)]))
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
    time.sleep(2)


def bench_dir(point: str) -> str:
    return os.path.join(point, "work", f"bench-{os.path.basename(point)}")


@contextmanager
def nfs_mounts(count: int = MOUNTS) -> Iterator[List[str]]:
    """`count` NFSv3 mounts of /mnt/nfs3's export under BASE (`nosharecache`: a superblock
    each), each with its bench_dir; unmounted on the way out."""
    server = next(line.split()[0] for line in open("/proc/mounts") if line.split()[1] == "/mnt/nfs3")
    mounted: List[str] = []
    try:
        for point in [f"{BASE}/{i}" for i in range(count)]:
            os.makedirs(point, exist_ok=True)
            subprocess.run(["mount", "-t", "nfs", "-o", "vers=3,nosharecache", server, point], check=True)
            mounted.append(point)
            os.makedirs(bench_dir(point), exist_ok=True)
        yield mounted
    finally:
        for point in reversed(mounted):
            subprocess.run(["umount", point], check=False)


def scrapes() -> Dict[str, Any]:
    """MOUNTS mounts; the exporter without and with the cgroup label, each after the workload
    (on every mount; from CGROUPS cgroups), then SCRAPES scrapes of it and of node_exporter."""
    node = None
    out: Dict[str, Any] = {}
    try:
        with nfs_mounts() as points:
            node = start(["prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{NODE_PORT}",
                          "--collector.disable-defaults", "--collector.mountstats"], "Listening",
                         "/tmp/bench-node.log")
            runs = {"nfs-exporter": [], "nfs-exporter --cgroup-label": ["--cgroup-label", "--cgroup-limit",
                                                                        str(CGROUPS + 56)]}
            for name, extra in runs.items():
                exporter = start([sys.executable, "-m", "probes.exporter", "--port", str(EXPORTER_PORT)] + extra,
                                 "probe attached", "/tmp/bench-exporter-scrape.log")
                try:
                    drop_caches()
                    if extra:
                        in_cgroups(points)
                    else:
                        for point in points:
                            workload(bench_dir(point))
                        time.sleep(2)
                    out[name] = scrape_times(EXPORTER_PORT)
                finally:
                    stop(exporter)
            out["node_exporter"] = scrape_times(NODE_PORT)
            out["mounts"], out["cgroups"] = len(points), CGROUPS
            return out
    finally:
        if node is not None:
            stop(node)
        if os.path.isdir(CGROUP_DIR):
            for entry in os.scandir(CGROUP_DIR):
                if entry.is_dir():  # the units (their exited children left them empty)
                    os.rmdir(entry.path)
            os.rmdir(CGROUP_DIR)


def in_guest() -> Dict[str, Any]:
    work = os.path.join("/mnt/nfs3", "work", "bench-memory")
    os.makedirs(work, exist_ok=True)
    res: Dict[str, Any] = {"kernel": os.uname().release, "memory": memory(work), "scrape": scrapes()}
    mem, scr = res["memory"], res["scrape"]
    res["ratios"] = {
        "rss_exporter_over_nfsdist": mem["nfs-exporter"]["rss_kib"] / mem["nfsdist-bpfcc"]["rss_kib"],
        "hwm_exporter_over_nfsdist": mem["nfs-exporter"]["hwm_kib"] / mem["nfsdist-bpfcc"]["hwm_kib"],
        "scrape_exporter_over_node": scr["nfs-exporter"]["median_s"] / scr["node_exporter"]["median_s"],
        "scrape_cgroup_over_plain": scr["nfs-exporter --cgroup-label"]["median_s"] / scr["nfs-exporter"]["median_s"],
    }
    return res


def report(res: Dict[str, Any]) -> str:
    mem, scr, ratio = res["memory"], res["scrape"], res["ratios"]
    ours, bcc = mem["nfs-exporter"], mem["nfsdist-bpfcc"]
    return "\n".join([
        f"bench_exporter on {res['kernel']} (same guest, one after the other)",
        f"  resident memory: nfs-exporter {ours['rss_kib'] / 1024:.1f} MiB (peak {ours['hwm_kib'] / 1024:.1f}), "
        f"nfsdist-bpfcc {bcc['rss_kib'] / 1024:.1f} MiB (peak {bcc['hwm_kib'] / 1024:.1f}) -> ratio "
        f"{ratio['rss_exporter_over_nfsdist']:.2f} (peak {ratio['hwm_exporter_over_nfsdist']:.2f})",
        f"  scrape with {scr['mounts']} NFSv3 mounts: nfs-exporter {scr['nfs-exporter']['median_s'] * 1000:.1f} ms "
        f"({scr['nfs-exporter']['samples']} samples), node_exporter mountstats "
        f"{scr['node_exporter']['median_s'] * 1000:.1f} ms ({scr['node_exporter']['samples']} samples) -> ratio "
        f"{ratio['scrape_exporter_over_node']:.2f} (median of {SCRAPES} each)",
        f"  scrape with --cgroup-label, {scr['cgroups']} cgroups on those mounts: "
        f"{scr['nfs-exporter --cgroup-label']['median_s'] * 1000:.1f} ms "
        f"({scr['nfs-exporter --cgroup-label']['samples']} samples) -> ratio {ratio['scrape_cgroup_over_plain']:.2f} "
        f"of the exporter without the label",
    ])


def on_host(lab_name: Optional[str]) -> int:
    return run_in_lab(lab_name, "bench-exporter", "python3 bench/bench_exporter.py --in-guest", 2400, report)


def main(argv: List[str]) -> int:
    if help_asked(argv, __doc__):
        return 0
    if "--in-guest" in argv:
        print(json.dumps(in_guest()))
        return 0
    return on_host(argv[argv.index("--lab") + 1] if "--lab" in argv else None)


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""Guest side of the pair's fault checks: the tools watch a mixed workload while the server fails.

Runs in the client guest of a QEMU pair (labs/checks/faults/run.py drives it from the host) and prints
one JSON document. nfsslower twice (`--ops all`, and bcc's default operations as a new user
runs it; a threshold below the pause, a short stall interval), nfsdist (`--ops all`, 1 s
intervals), nfstop (its default operations, 1 s intervals) and nfs-exporter (scraped every
second for its per-mount in-flight series) start once, with nfsv4 unloaded and the NFSv4.2
mount gone (the v3-only client of the single-guest probe checks), and watch five phases of
the same mixed workload (creates, lookups, opens, reads, writes, fsyncs, stats):

  plain    on NFSv3, nothing wrong (the baseline latencies)
  loss     on NFSv3 with netem loss on the client's link to the server
  pause    on NFSv3 while the host stops the server's QEMU (SIGSTOP ... SIGCONT)
  restart  on NFSv3 while the host restarts nfs-server in the server guest
  v4late   nfsv4 loaded and NFSv4.2 mounted after the tools started, workload on it

The host is told through the results share (/results, the same directory on the host):
the guest writes PHASE.request once that phase's workload runs, the host acts and writes
PHASE.done; the workload goes on for a few more rounds, then the next phase starts.

  python3 labs/checks/faults/guest.py run
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Any, Dict, List, Optional, Tuple

# run as a script (python3 PATH in the guest): its project tree is not on sys.path by itself
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
from labs.checks.probes import guest as pg  # noqa: E402
from labs.checks.shared import interval_in  # noqa: E402

#: the host <-> guest handshake directory (labs/checks/faults/run.py: results_dir / "faults")
SIGNALS = "/results/faults"
THRESHOLD_MS = 2000       # nfsslower's threshold: far below the 30 s pause
STALL_INTERVAL_S = 5      # re-print a stuck operation at most this often
LOSS_PERCENT = 20
ROUNDS = 10               # rounds of a phase without a host action
ROUNDS_AFTER = 5          # rounds after the host's action is done
ROUND_GAP_S = 0.25
IO_SIZE = 65536
#: this run's directories are new (a boot may run the checks more than once)
RUN = str(time.monotonic_ns())
#: ops the mixed workload issues an exact number of, per round (VFS calls, whatever the cache does)
PER_ROUND = {"open": 2, "create": 1, "write": 1, "fsync": 1, "read": 1, "getattr": 1}
#: ops counted only by a module that may be missing (NFSv4's open is nfs4_file_open, in nfsv4)
V4_MODULE_OPS = ("open",)
#: the exporter's port here (the exporter checks' own exporter uses the default, 19910)
EXPORTER_PORT = 19912
SCRAPE_GAP_S = 1.0
#: the exporter's per-mount in-flight series, as the faults verdicts read them
IN_FLIGHT_SERIES = {"probekit_nfs_mount_ops_in_flight": "in_flight",
                    "probekit_nfs_mount_oldest_in_flight_seconds": "oldest_s"}
_SAMPLE = re.compile(r'^(\w+)\{(.*)\} (\S+)$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


class Tail(threading.Thread):
    """Follow a tool's output file; keep each line with the guest's monotonic time it appeared."""

    def __init__(self, path: str) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.lines: List[Tuple[float, str]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        partial = ""
        with open(self.path) as handle:
            while True:
                chunk = handle.read()
                if chunk:
                    now = time.monotonic()
                    parts = (partial + chunk).split("\n")
                    partial = parts.pop()
                    self.lines.extend((now, line) for line in parts)
                elif self.stopping.is_set():
                    return
                else:
                    time.sleep(0.1)


class Scraper(threading.Thread):
    """Scrape the exporter every SCRAPE_GAP_S; keep each scrape's per-mount in-flight series
    with the guest's monotonic time it was read."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.scrapes: List[Dict[str, Any]] = []
        self.errors: List[str] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(SCRAPE_GAP_S):
            try:
                text = urllib.request.urlopen(self.url, timeout=30).read().decode()
            except OSError as exc:
                self.errors.append(f"{time.monotonic():.1f}: {exc}")
                continue
            series: Dict[str, Dict[str, Any]] = {}
            for line in text.splitlines():
                match = _SAMPLE.match(line)
                if match and match.group(1) in IN_FLIGHT_SERIES:
                    labels = dict(_LABEL.findall(match.group(2)))
                    key = "|".join(labels.get(name, "") for name in ("server", "export", "mountpoint"))
                    entry = series.setdefault(key, {"server": labels.get("server", ""),
                                                     "export": labels.get("export", ""),
                                                     "mountpoint": labels.get("mountpoint", "")})
                    entry[IN_FLIGHT_SERIES[match.group(1)]] = float(match.group(3))
            self.scrapes.append({"mono": time.monotonic(), "series": list(series.values())})


def wait_for(path: str, timeout: float) -> Dict[str, Any]:
    """The host's JSON note at path, once it is there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            with open(path) as handle:
                text = handle.read()
            if text.endswith("\n"):
                return json.loads(text)
        time.sleep(0.1)
    raise RuntimeError(f"the host never wrote {path} (within {timeout:.0f} s)")


def one_round(work: str, i: int, issued: Dict[str, int], files: List[str]) -> None:
    """Create+write+fsync a new file, look up a missing name, open+read an old file, stat it."""
    name = os.path.join(work, f"new-{i}.bin")
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, b"w" * IO_SIZE)
    os.fsync(fd)
    os.close(fd)
    files.append(os.path.basename(name))
    try:
        os.stat(os.path.join(work, f"missing-{i}"))  # a lookup that finds nothing
    except FileNotFoundError:
        pass
    fd = os.open(os.path.join(work, "read.bin"), os.O_RDONLY)
    os.pread(fd, IO_SIZE, (i % 4) * IO_SIZE)
    os.close(fd)
    os.stat(os.path.join(work, "read.bin"))
    for op, count in PER_ROUND.items():
        issued[op] = issued.get(op, 0) + count
    issued["lookup_min"] = issued.get("lookup_min", 0) + 1


def prepare(name: str, mount: str) -> None:
    """A phase's directory and the file it reads, made before the tools start (not counted)."""
    work = os.path.join(mount, "work", f"faults-{RUN}-{name}")
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, "read.bin"), "wb") as handle:
        handle.write(os.urandom(4 * IO_SIZE))


def phase(name: str, mount: str, host_action: bool) -> Dict[str, Any]:
    """One phase of the mixed workload in its own directory; with host_action, ask the host to
    act after the first round and go on until it is done, plus ROUNDS_AFTER rounds."""
    work = os.path.join(mount, "work", f"faults-{RUN}-{name}")
    pg.drop_caches()
    time.sleep(pg.GAP_S)  # nothing in flight from the phase before
    issued: Dict[str, int] = {}
    files: List[str] = []
    out: Dict[str, Any] = {"mount": mount, "start": time.time(), "mono_start": time.monotonic(), "files": files}
    done: Optional[Dict[str, Any]] = None
    i = 0
    after = 0
    while True:
        one_round(work, i, issued, files)
        i += 1
        if host_action and i == 1:
            with open(os.path.join(SIGNALS, f"{name}.request.tmp"), "w") as note:
                note.write(json.dumps({"mono": time.monotonic()}) + "\n")
            os.rename(os.path.join(SIGNALS, f"{name}.request.tmp"), os.path.join(SIGNALS, f"{name}.request"))
        if host_action and done is None and os.path.exists(os.path.join(SIGNALS, f"{name}.done")):
            done = wait_for(os.path.join(SIGNALS, f"{name}.done"), 10)
            done["seen_mono"] = time.monotonic()
        if done is not None or not host_action:
            after += 1
        if after >= (ROUNDS_AFTER if host_action else ROUNDS):
            break
        time.sleep(ROUND_GAP_S)
    if mount != pg.MOUNTS["nfs3"]:
        issued.pop("create")  # NFSv4 creates through ->atomic_open: counted as opens, not creates
    out.update(issued=issued, rounds=i, host=done, end=time.time(), mono_end=time.monotonic())
    return out


def netem_loss(device: str, percent: int) -> None:
    subprocess.run(["tc", "qdisc", "add", "dev", device, "root", "netem", "loss", f"{percent}%"], check=True)


def label(intervals: List[Dict[str, Any]], phases: Dict[str, Any]) -> None:
    """An nfsdist interval belongs to the phase whose window holds its stamp (from the phase's
    start to the moment nfsdist had printed the interval with its last operations: interval_in),
    and to "gap" between phases (mounts, module loads)."""
    for interval in intervals:
        interval["phase"] = next((name for name, p in phases.items() if interval_in(interval["ts"], p)), "gap")


def run() -> Dict[str, Any]:
    os.makedirs(SIGNALS, exist_ok=True)
    for stale in os.listdir(SIGNALS):
        os.unlink(os.path.join(SIGNALS, stale))
    server = pg.nfs_server()
    device = pg.route_device(server)
    plan = [("plain", "nfs3", False), ("loss", "nfs3", False), ("pause", "nfs3", True),
            ("restart", "nfs3", True), ("v4late", "nfs42", False)]
    pg.mount_v42(server)
    for name, mount, _ in plan:
        prepare(name, pg.MOUNTS[mount])
    out: Dict[str, Any] = {"server": server, "device": device, "threshold_ms": THRESHOLD_MS,
                           "stall_interval_s": STALL_INTERVAL_S, "loss_percent": LOSS_PERCENT,
                           "workload_pid": os.getpid(), "per_round": PER_ROUND, "v4_module_ops": V4_MODULE_OPS,
                           "kernel": pg.kernel_facts()}
    phases: Dict[str, Any] = {}
    with pg.nfsv4_unloaded() as unload:
        out.update(nfsv4_loaded_at_start=os.path.exists("/sys/module/nfsv4"), unload=unload)
        slower_log, dist_log, top_log = "/tmp/faults-nfsslower.out", "/tmp/faults-nfsdist.out", "/tmp/faults-nfstop.out"
        default_log, exporter_log = "/tmp/faults-nfsslower-default.out", "/tmp/faults-nfs-exporter.out"
        slower = pg.tool(["nfsslower", "--json", "-v", "--ops", "all", "--stall-interval", str(STALL_INTERVAL_S),
                          str(THRESHOLD_MS)], slower_log)
        default = pg.tool(["nfsslower", "--json", "-v", "--stall-interval", str(STALL_INTERVAL_S),
                           str(THRESHOLD_MS)], default_log)
        dist = pg.tool(["nfsdist", "--json", "-v", "--ops", "all", "1"], dist_log)
        top = pg.tool(["nfstop", "--json", "-v", "-i", "1"], top_log)
        exporter = pg.tool(["nfs-exporter", "-v", "--port", str(EXPORTER_PORT)], exporter_log)
        tail, default_tail, scraper = Tail(slower_log), Tail(default_log), Scraper(EXPORTER_PORT)
        tail.start()
        default_tail.start()
        try:
            out["ready_s"] = [pg.wait_ready(slower, slower_log), pg.wait_ready(dist, dist_log),
                              pg.wait_ready(top, top_log), pg.wait_ready(default, default_log)]
            pg.wait_said([exporter_log], "nfs-exporter: probe attached: ", "its start")
            scraper.start()
            for name, mount, host_action in plan:
                if name == "loss":
                    netem_loss(device, LOSS_PERCENT)
                if name == "v4late":
                    subprocess.run(["modprobe", "nfsv4"], check=True)
                    pg.mount_v42(server)
                    # the workload starts once every tool has noticed the module
                    pg.wait_said([slower_log, dist_log, top_log], "module nfsv4 loaded after the start",
                                 "modprobe nfsv4")
                try:
                    phases[name] = phase(name, pg.MOUNTS[mount], host_action)
                finally:
                    if name == "loss":
                        subprocess.run(["tc", "qdisc", "del", "dev", device, "root"], check=False)
                # the next phase starts (pg.GAP_S later) once both interval tools printed this one's end
                phases[name]["flushed"] = pg.wait_flushed([dist_log, top_log], phases[name]["end"],
                                                          f"the {name} phase")
            time.sleep(pg.GAP_S)
        finally:
            out["nfsslower"] = pg.stop(slower, slower_log)
            out["nfsdist"] = pg.stop(dist, dist_log)
            out["nfstop"] = pg.stop(top, top_log)
            out["nfsslower_default"] = pg.stop(default, default_log)
            scraper.stopping.set()
            if scraper.is_alive():
                scraper.join(60)
            out["nfs_exporter"] = pg.stop(exporter, exporter_log)
            for thread in (tail, default_tail):
                thread.stopping.set()
                thread.join(10)
    out["phases"] = phases
    out["slower_lines"] = [{"mono": mono, "record": json.loads(line)} for mono, line in tail.lines
                           if line.startswith("{")]
    out["default_slower_lines"] = [{"mono": mono, "record": json.loads(line)} for mono, line in default_tail.lines
                                   if line.startswith("{")]
    out["nfs_exporter"].update(scrapes=scraper.scrapes, scrape_errors=scraper.errors, port=EXPORTER_PORT)
    intervals = pg.json_lines(out["nfsdist"]["lines"], "ops")
    label(intervals, phases)
    out["nfsdist"]["intervals"] = intervals
    out["seen"] = pg.phase_totals(intervals)
    return out


def main(argv: List[str]) -> int:
    if argv[1:] != ["run"]:
        print(f"usage: {argv[0]} run", file=sys.stderr)
        return 2
    try:
        result = {"check": "faults", "ok": True, "data": run()}
    except Exception as exc:  # report the failure as data: the host shows it
        result = {"check": "faults", "ok": False, "error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

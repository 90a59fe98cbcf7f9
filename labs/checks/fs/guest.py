"""Guest side of the fs tools' lab checks: fsslower, fsdist and fstop -t FS against a known
workload, on local filesystems over device-mapper's delay target (dm-delay) and on SMB
over loopback with netem.

Runs inside a lab guest (root, bcc, xfsprogs, btrfs-progs, dmsetup, samba, cifs-utils)
from the read-only project share. Per local filesystem: a loop file under a dm `delay`
device, mkfs, mounted at /mnt/probekit-FS; SMB: the lab's Samba share mounted with
cache=strict and cache=loose (labs/checks/fs/smb_share.sh), delayed by netem on lo. Each tool is started once (one at a time, so that two compilers never
share the guest's memory) and stays attached while every filesystem's phases run:
`plain` (the workload, no delay) and `delay` (the same after `dmsetup reload` adds
DELAY_MS to every I/O). One worker process runs every phase's workload (fsdist watches
its pid alone: the root filesystem is ext4 too); phases are told apart by time: fsslower's
events by their own timestamps, the interval tools' records by stamp, each phase ending
once the tool has printed the interval read after its workload (the probes guest's wait_flushed)
and the next starting GAP_S later; the lab file systems are touched by nothing else.
With --exporter, `nfs-exporter -t` over the same filesystems is started first, before any
of them is mounted (so a filesystem whose module loads with its first mount, cifs, xfs,
btrfs on a fresh guest, is attached when it loads), and scraped right before and right
after each phase's workload, beside the tools.
Prints one JSON document; tests/lab/test_fs_lab.py judges it.

  python3 labs/checks/fs/guest.py [--exporter] [FS:TOOL ...]     (default: RUNS)
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

# run as a script (python3 PATH in the guest): its project tree is not on sys.path by itself
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
from discover.spec import serves_fstype  # noqa: E402
from labs.checks.probes.guest import (EVIDENCE_WAIT_S, json_lines, kernel_attachments, picks, said, stop,  # noqa: E402
                                      tool, wait_flushed, wait_ready, writes_and_two_fsyncs)
from labs.checks.shared import attach_kinds, guest_path  # noqa: E402
from probes.mounts import MountTable, kernel_dev, mount_dev  # noqa: E402

#: which tool proves which filesystem, as issue 13 names them (fsslower at 0 ms: every
#: operation is a line, so its counts can be exact), and the signal that ends it
RUNS: Tuple[Tuple[str, str], ...] = (("xfs", "fsslower"), ("ext4", "fsdist"), ("btrfs", "fstop"),
                                     ("cifs", "fsslower"))
STOP_SIGNAL = {"fsslower": signal.SIGTERM, "fsdist": signal.SIGINT, "fstop": signal.SIGHUP}
#: the SMB client enters through other functions per cache mode: both are mounted and worked
CIFS_MODES = ("strict", "loose")
SMB_SHARE = guest_path("smb_share")
#: added to every read and write of the device in the `delay` phase: under TCG an undelayed
#: fsync of a loop device took up to 65 ms and a cold 64 KiB read 190 ms, so 600 ms (log2
#: bucket 524-1048 ms) stands well apart
DELAY_MS = 600
IMAGE_MIB = 512   # mkfs.xfs wants 300 MiB at least
N_READS, READ_SIZE = 4, 65536
M_WRITES, WRITE_SIZE = 8, 65536
K_STATS = 3
GAP_S = 3.0       # quiet seconds between a phase's end (its intervals printed) and the next one
#: the tools that print a record per interval (their phases wait for the one after the workload)
INTERVAL_TOOLS = ("fsdist", "fstop")
#: the exporter's last bucket below DELAY_MS: an operation that waited the delay is above it
SLOW_SLOT = int(DELAY_MS * 1e6).bit_length() - 1
EXPORTER_LOG = "/tmp/nfs-exporter-fs.out"


def sh(*argv: str) -> str:
    return subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=True,
                          universal_newlines=True).stdout.strip()


class DelayedFs:
    """A filesystem on a loop file under a dm `delay` device; set_delay() reloads its table."""

    def __init__(self, fs: str) -> None:
        self.fs = fs
        self.image, self.name, self.mount = f"/var/tmp/probekit-{fs}.img", f"probekit-{fs}", f"/mnt/probekit-{fs}"
        self.loop = ""
        self.sectors = IMAGE_MIB * 2048

    def __enter__(self) -> "DelayedFs":
        try:
            with open(self.image, "wb") as handle:
                handle.truncate(IMAGE_MIB << 20)
            self.loop = sh("losetup", "-f", "--show", self.image)
            sh("dmsetup", "create", self.name, "--table", self._table(0))
            sh(f"mkfs.{self.fs}", *(["-q"] if self.fs != "btrfs" else ["-q", "-f"]), f"/dev/mapper/{self.name}")
            os.makedirs(self.mount, exist_ok=True)
            sh("mount", f"/dev/mapper/{self.name}", self.mount)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _table(self, delay_ms: int) -> str:
        return f"0 {self.sectors} delay {self.loop} 0 {delay_ms}"

    def set_delay(self, delay_ms: int) -> str:
        """Every I/O of the device waits delay_ms from now on; returns the table as dm has it."""
        sh("dmsetup", "suspend", self.name)
        try:
            sh("dmsetup", "reload", self.name, "--table", self._table(delay_ms))
        finally:
            sh("dmsetup", "resume", self.name)
        return sh("dmsetup", "table", self.name)

    @property
    def mounts(self) -> Dict[str, str]:
        return {"": self.mount}

    @contextlib.contextmanager
    def delayed(self) -> Iterator[str]:
        """DELAY_MS on every I/O of the device while the block runs; yields the dm table."""
        table = self.set_delay(DELAY_MS)
        try:
            yield table
        finally:
            self.set_delay(0)

    def __exit__(self, *_exc: Any) -> None:
        for argv in (["umount", self.mount], ["dmsetup", "remove", self.name], ["losetup", "-d", self.loop]):
            if argv[-1]:
                subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with contextlib.suppress(OSError):
            os.unlink(self.image)
        with contextlib.suppress(OSError):
            os.rmdir(self.mount)


class SmbFs:
    """The lab's SMB share mounted once per cache mode (labs/checks/fs/smb_share.sh); the delay is
    netem on lo, half of DELAY_MS each way, so that every request and its reply add DELAY_MS."""

    def __init__(self, fs: str) -> None:
        self.fs = fs
        self.mounts = {f"{mode} ": f"/mnt/probekit-cifs-{mode}" for mode in CIFS_MODES}

    def __enter__(self) -> "SmbFs":
        try:
            for mode, mount in zip(CIFS_MODES, self.mounts.values()):
                sh("sh", SMB_SHARE, "mount", mount, mode)
        except BaseException:
            self.__exit__()
            raise
        return self

    @contextlib.contextmanager
    def delayed(self) -> Iterator[str]:
        sh("tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", f"{DELAY_MS // 2}ms")
        try:
            yield sh("tc", "qdisc", "show", "dev", "lo")
        finally:
            subprocess.run(["tc", "qdisc", "del", "dev", "lo", "root"], stderr=subprocess.DEVNULL)

    def __exit__(self, *_exc: Any) -> None:
        for mount in self.mounts.values():
            subprocess.run(["sh", SMB_SHARE, "umount", mount], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def devs(fs: str, mount: str) -> Dict[str, int]:
    """The mount's dev as stat(2) gives it, as mountinfo (the superblock) gives it, and as
    --mount-point resolves it: the probe compares the superblock's."""
    table = MountTable(serves=lambda fstype: serves_fstype({"filesystem": fs}, fstype))  # no fstypes key in these specs
    st = os.stat(mount)
    with open("/proc/self/mountinfo") as lines:  # the last line of the mount point is the one on top
        major, minor = [line.split()[2] for line in lines if line.split()[4] == mount][-1].split(":")
    return {"stat": kernel_dev(os.major(st.st_dev), os.minor(st.st_dev)),
            "mountinfo": kernel_dev(int(major), int(minor)), "mount_point": mount_dev(mount, table, fs)}


def prepare(mount: str) -> str:
    src = os.path.join(mount, "read.bin")
    with open(src, "wb") as handle:
        handle.write(os.urandom(N_READS * READ_SIZE))
    return src


def workload(mount: str, tag: str, src: str) -> Dict[str, int]:
    """The known operations (run in a child): 3 opens, 4 x 64 KiB reads of a file not in the
    page cache, 8 x 64 KiB writes with 2 fsyncs, 3 stats."""
    issued = {"open": 0, "read": 0, "write": 0, "fsync": 0, "getattr": 0, "read_bytes": 0, "write_bytes": 0}
    fd = os.open(src, os.O_RDONLY)
    issued["open"] += 1
    for i in range(N_READS):
        issued["read_bytes"] += len(os.pread(fd, READ_SIZE, i * READ_SIZE))
        issued["read"] += 1
    os.close(fd)
    os.close(os.open(src, os.O_RDONLY))
    issued["open"] += 1
    fd = os.open(os.path.join(mount, f"write-{tag}.bin"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    issued["open"] += 1
    writes_and_two_fsyncs(fd, b"w" * WRITE_SIZE, M_WRITES, issued)
    os.close(fd)
    for _ in range(K_STATS):
        os.stat(src)
        issued["getattr"] += 1
    return issued


class Worker:
    """A child process that runs the workload when asked (over a pipe), started before the
    tools so that fsdist can watch its pid alone (-p): the root filesystem is ext4 too, and
    --mount-point needs the file's superblock, which a 5.10 kprobe without module BTF does
    not read."""

    def __init__(self) -> None:
        self.from_parent, self.to_child = os.pipe()
        self.from_child, self.to_parent = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(self.to_child)
            os.close(self.from_child)
            try:
                with os.fdopen(self.from_parent) as orders, os.fdopen(self.to_parent, "w") as answers:
                    for line in orders:
                        mount, tag, src = json.loads(line)
                        answers.write(json.dumps(workload(mount, tag, src)) + "\n")
                        answers.flush()
            finally:
                os._exit(0)
        os.close(self.from_parent)
        os.close(self.to_parent)
        self.orders, self.answers = os.fdopen(self.to_child, "w"), os.fdopen(self.from_child)

    def run(self, mount: str, tag: str, src: str) -> Dict[str, int]:
        self.orders.write(json.dumps([mount, tag, src]) + "\n")
        self.orders.flush()
        return json.loads(self.answers.readline())

    def close(self) -> None:
        self.orders.close()
        self.answers.close()
        os.waitpid(self.pid, 0)


def drop_pages() -> None:
    """Drop the page cache only: the reads must miss it; dentries and inodes stay, as for a
    user who reads a file again."""
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as handle:
        handle.write("1\n")


def phase(worker: Worker, mount: str, tag: str, src: str, tool_name: str, log: str,
          scrape: Optional[Callable[[], Dict[str, Any]]] = None) -> Dict[str, Any]:
    """One workload run by the worker, pages dropped first, with its wall and monotonic span; an
    interval tool's phase also waits until the tool printed the interval read after it (`flushed`);
    with the exporter, its lab series right before and right after the workload (`exporter`)."""
    drop_pages()
    before = scrape() if scrape else None
    started, mono = time.time(), time.monotonic()
    issued = worker.run(mount, tag.replace(" ", "-"), src)
    out: Dict[str, Any] = {"pid": worker.pid, "issued": issued, "start": started, "end": time.time(),
                           "mono_start": mono, "mono_end": time.monotonic(), "mount": mount}
    if scrape:
        out["exporter"] = {"before": before, "after": scrape()}
    if tool_name in INTERVAL_TOOLS:
        out["flushed"] = wait_flushed([log], out["end"], f"the {tag} phase")
    return out


@contextlib.contextmanager
def filesystems(names: List[str]) -> Iterator[Dict[str, Any]]:
    with contextlib.ExitStack() as stack:
        yield {fs: stack.enter_context(SmbFs(fs) if fs == "cifs" else DelayedFs(fs)) for fs in names}


def tool_args(fs: str, name: str, worker: int) -> List[str]:
    """Each tool as a user would run it on this filesystem (JSON for the judging)."""
    base = [name, "-t", fs, "-v", "--json"]
    if name == "fsslower":
        return base + ["0"]
    if name == "fsdist":  # the guest's root is ext4 too: the worker's operations only
        return base + ["-p", str(worker), "1"]
    return base + ["-i", "1"]


def exporter_series(filesystems: List[str]) -> Dict[str, Any]:
    """One scrape of the exporter, what the checks read of it: per filesystem whether its probe
    is attached and since when, and per `op mountpoint` of the lab mounts its ops, bytes,
    histogram count and the count above SLOW_SLOT's bucket (`slow`)."""
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client.utils import floatToGoString

    from probes.exporter import DEFAULT_PORT, le_seconds
    text = urllib.request.urlopen(f"http://127.0.0.1:{DEFAULT_PORT}/metrics", timeout=EVIDENCE_WAIT_S).read().decode()
    slow_le = floatToGoString(le_seconds(SLOW_SLOT))
    out: Dict[str, Any] = {fs: {"attached": 0.0, "attach_time": None, "ops": {}, "bytes": {}, "count": {}, "below": {}}
                           for fs in filesystems}
    fields = {"ops_total": "ops", "bytes_total": "bytes", "op_latency_seconds_count": "count"}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            fs = next((fs for fs in filesystems if sample.name.startswith(f"probekit_{fs}_")), None)
            if fs is None:
                continue
            what = sample.name[len(f"probekit_{fs}_"):]
            if what == "probe_attached":
                out[fs]["attached"] = sample.value
            elif what == "probe_attach_time_seconds":
                out[fs]["attach_time"] = sample.value
            elif sample.labels.get("mountpoint", "").startswith("/mnt/probekit-") and "op" in sample.labels:
                key = f"{sample.labels['op']} {sample.labels['mountpoint']}"
                if what in fields:
                    out[fs][fields[what]][key] = sample.value
                elif what == "op_latency_seconds_bucket" and sample.labels["le"] == slow_le:
                    out[fs]["below"][key] = sample.value
    for fs in filesystems:
        below = out[fs].pop("below")
        out[fs]["slow"] = {key: count - below.get(key, 0) for key, count in out[fs]["count"].items()}
    return out


def exporter_said_each(filesystems: List[str]) -> str:
    """Wait until the exporter said, for each filesystem, that its probe is attached or that it
    waits for a module; its stderr so far."""
    deadline = time.monotonic() + EVIDENCE_WAIT_S
    while True:
        text = said(EXPORTER_LOG)
        if all(f"nfs-exporter: {fs}: probe attached: " in text or
               any(line.startswith(f"nfs-exporter: {fs}: ") and "waiting for" in line for line in text.splitlines())
               for fs in filesystems):
            return text
        if time.monotonic() > deadline:
            raise RuntimeError(f"nfs-exporter said nothing of some of {filesystems}: {text[-1500:]}")
        time.sleep(0.5)


def exporter_attached(proc: subprocess.Popen, filesystems: List[str]) -> Dict[str, Any]:
    """Scrapes until every filesystem's probe is attached (those waiting for a module at the
    start attach once their mount loaded it); the scrape that showed it."""
    deadline = time.monotonic() + EVIDENCE_WAIT_S
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"nfs-exporter exited {proc.returncode}: {said(EXPORTER_LOG)[-1500:]}")
        try:
            series = exporter_series(filesystems)
            if all(series[fs]["attached"] == 1 for fs in filesystems):
                return series
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"nfs-exporter did not attach every probe: {said(EXPORTER_LOG)[-1500:]}")
        time.sleep(1.0)


def run(plan: List[Tuple[str, str]], with_exporter: bool = False) -> Dict[str, Any]:
    out: Dict[str, Any] = {"release": os.uname().release, "runs": {}}
    names = [fs for fs, _ in plan]
    out["attached_before"] = kernel_attachments()
    exporter = None
    try:
        if with_exporter:  # before any lab mount: a filesystem whose module its mount loads is attached then
            args = ["nfs-exporter", "-t", ",".join(names), "-v"]
            exporter = tool(args, EXPORTER_LOG)
            out["exporter"] = {"args": args, "start_said": exporter_said_each(names)}
            out["exporter"]["start"] = exporter_series(names)
        with filesystems(names) as mounted:
            _run_tools(plan, mounted, out, exporter)
            out["attached_after"] = kernel_attachments()
    finally:
        if exporter is not None and exporter.poll() is None:
            exporter.kill()
    out["mounts_after"] = sh("sh", "-c", "grep -c probekit- /proc/mounts || true")
    out["dm_after"] = sh("sh", "-c", "dmsetup ls | grep -c probekit- || true")
    return out


def _run_tools(plan: List[Tuple[str, str]], mounted: Dict[str, Any], out: Dict[str, Any],
               exporter: Optional[subprocess.Popen]) -> None:
    """The tools started on the mounted filesystems, every phase run, every tool (and the
    exporter) stopped by its signal: what each reported goes into `out`."""
    names = [fs for fs, _ in plan]
    sources = {(fs, label): prepare(mount) for fs, m in mounted.items() for label, mount in m.mounts.items()}
    out["devs"] = {fs: [devs(fs, mount) for mount in m.mounts.values()] for fs, m in mounted.items()}
    with open("/proc/self/mountinfo") as lines:
        out["mountinfo"] = [line.rstrip("\n") for line in lines if "/mnt/probekit-" in line]
    procs = {}
    worker = Worker()
    scrape = (lambda: exporter_series(names)) if exporter is not None else None
    try:
        for fs, name in plan:
            log = f"/tmp/{name}-{fs}.out"
            args = tool_args(fs, name, worker.pid)
            procs[fs] = (name, log, tool(args, log))
            out["runs"][fs] = {"tool": name, "args": args, "delay_ms": DELAY_MS,
                               "ready_s": wait_ready(procs[fs][2], log, timeout=600.0)}
        if exporter is not None:
            out["exporter"]["attached"] = exporter_attached(exporter, names)
        out["attached_during"] = kernel_attachments()
        for fs, _ in plan:  # phases `plain` and `delay`; per cache mode on SMB (`strict plain`, ...)
            phases = {}
            name, log, _ = procs[fs]
            for label, mount in mounted[fs].mounts.items():
                phases[f"{label}plain"] = phase(worker, mount, f"{label}plain", sources[(fs, label)], name, log,
                                                scrape)
                time.sleep(GAP_S)
                with mounted[fs].delayed() as how:
                    out["runs"][fs]["injected"] = how
                    phases[f"{label}delay"] = phase(worker, mount, f"{label}delay", sources[(fs, label)], name,
                                                    log, scrape)
                time.sleep(GAP_S)
            out["runs"][fs]["phases"] = phases
    finally:  # every tool stopped first, whatever failed: nothing may stay attached
        stopped = {}
        for fs, (name, log, proc) in procs.items():
            try:
                stopped[fs] = stop(proc, log, STOP_SIGNAL[name])
            except BaseException:
                proc.kill()
                raise
        if exporter is not None:
            out["exporter"].update(stop(exporter, EXPORTER_LOG, signal.SIGTERM))
        worker.close()
    for fs, result in stopped.items():
        name = procs[fs][0]
        result["records"] = json_lines(result["lines"], {"fsslower": "lat_us", "fsdist": "ops",
                                                         "fstop": "processes"}[name])
        result["picks"] = picks(result["stderr"])
        result["attach_kinds"] = attach_kinds(result["stderr"])
        out["runs"][fs].update(result)


def sbin_on_path() -> None:
    """mkfs, losetup and dmsetup live in sbin, which a user's PATH may lack."""
    os.environ["PATH"] = "/usr/local/sbin:/usr/sbin:/sbin:" + os.environ.get("PATH", "")


def main(argv: List[str]) -> int:
    sbin_on_path()
    with_exporter = "--exporter" in argv[1:]
    plan = [tuple(arg.split(":", 1)) for arg in argv[1:] if arg != "--exporter"] or list(RUNS)
    try:
        result = {"ok": True, "data": run(plan, with_exporter)}  # type: ignore[arg-type]
    except Exception as exc:  # reported as data: the host test shows it
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

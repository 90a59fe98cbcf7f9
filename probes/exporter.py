"""nfs-exporter: NFS operation latency, counts and bytes for Prometheus, from the probe's BPF maps.

Why a custom collector over map snapshots: the kernel side already keeps cumulative
per-operation log2 histograms (what nfsdist reads); a scrape reads them and turns them
into Prometheus' cumulative buckets, so the cost per NFS operation is the same as
nfsdist's and nothing is kept per event in user space. probes.exposition writes the text
format and serves it; this module only says what the metrics are.

Buckets: the exporter's histogram counts nanoseconds, and bcc's log2 slot k (>= 1) then
holds the integer values [2^(k-1), 2^k - 1] ns (slot 1 also 0, bcc's bpf_log2l(0) == 1).
A Prometheus bucket `le` counts values <= le, so slot k's bucket is le = (2^k - 1) ns:
every value of slot k is <= it and every value of slot k+1 (>= 2^k) is above it. Copying
2^k as the bound (ebpf_exporter's issues 488 and 515) puts 2^k itself one bucket late.
"""
from __future__ import annotations

import argparse
import ipaddress
import signal
import sys
import threading
import time
from contextlib import ExitStack
from functools import lru_cache, partial
from pathlib import Path

from discover.arguments import Parser, file_path, float_at_least, int_range
from discover.errors import Terminated, UserError, run_cli
from discover.version import probekit_version
from probes.cgroups import CgroupLabels, cgroup2_root
from probes.commands import (Target, add_request, find_target, is_operation, known_types, proc_label, request_totals,
                             server_ops, serves_requests)
from probes.exposition import Family, MetricsServer, counter, gauge, go_float, histogram, process_families
from probes.model import Tool
from probes.inflight import Stall, rpc_server, stalls
from probes.mounts import GONE_GRACE_S, Mount, MountTable
from probes.backend_choice import BACKENDS, choose, dotted
from probes.runtime import BTF_DIR, TICK_S, NothingToTrace, Session, module_live, modules_present
from discover.spec import parse_ops, serves_fstype

TYPE_CHECKING = False  # typing's constant without typing (discover/records.py)
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Tuple
    from probes.runtime import ServerKey
else:
    from discover.records import NamedTuple

#: the default port: outside 9100-9999, the range the Prometheus project's default port
#: allocation list hands out, so it meets no allocated exporter on the same host
DEFAULT_PORT = 19910
DEFAULT_ADDRESS = "127.0.0.1"
#: slots exported as buckets: le = 2^k - 1 ns for k in this range, 1.023 us .. 68.7 s
#: (slots below the first are counted in the first bucket, above the last in +Inf only)
BUCKET_SLOTS = range(10, 37)
BPF_STATS = Path("/proc/sys/kernel/bpf_stats_enabled")
#: where a loaded module appears (a filesystem waiting for its module looks here every TICK_S)
MODULES = Path("/sys/module")
#: labels of every per-operation series: the op, then the mount as node_exporter's
#: mountstats collector names it (export, protocol, mountaddr), its mount point and NFS version
MOUNT_LABELS = ["export", "protocol", "mountaddr", "mountpoint", "nfs_version"]
#: labels of the per-mount in-flight series: enough to name a stuck server and what it holds up
IN_FLIGHT_LABELS = ["server", "export", "mountpoint"]
#: the missed counters' help; their `cause` is one of probes.runtime.MISS_CAUSES
MISSED_HELP = ("{what} not counted, at most, by cause: recursion (the kernel skipped a run of their probe: "
               "its BPF guard was held on that CPU), kprobe or kretprobe (the kernel's missed count of their "
               "kprobe; a kretprobe's instances ran out), start_not_stored (the probe could not store their start).")
#: --cgroup-limit's default: distinct `cgroup` values before the rest share CgroupLabels.OVERFLOW
CGROUP_LIMIT = 64
#: --client-limit's default: distinct `client` values of the server families before the rest
#: share CgroupLabels.OVERFLOW
CLIENT_LIMIT = 64
#: slots of the server probe's microsecond histogram exported as buckets (--nfsd): le =
#: 2^k ms/1000 - 1 ns, 1.999 us .. 67.1 s
SERVER_BUCKET_SLOTS = range(1, 27)
#: labels of the server families: the client (bounded), the export, the procedure
SERVER_LABELS = ["client", "export", "proc"]


def le_seconds(slot: int) -> float:
    """Upper bound of log2 slot `slot` of a nanosecond histogram, in seconds (inclusive)."""
    return ((1 << slot) - 1) / 1e9


def server_le_seconds(slot: int) -> float:
    """Upper bound of log2 slot `slot` of the server probe's microsecond histogram, in seconds
    (inclusive): slot k holds whole microseconds up to 2^k - 1, so service times below 2^k us."""
    return ((1 << slot) * 1000 - 1) / 1e9


@lru_cache(maxsize=None)
def bucket_bounds(edges: range, le: Callable[[int], float]) -> Tuple[Tuple[int, str], ...]:
    """(slot, its `le` as the text format writes it) per edge: the same every scrape, written once."""
    return tuple((slot, go_float(le(slot))) for slot in edges)


def cumulative_buckets(slots: Dict[int, int], edges: range = BUCKET_SLOTS,
                       le: Callable[[int], float] = le_seconds) -> List[Tuple[str, int]]:
    """Prometheus (le, cumulative count) pairs, +Inf last, from sparse log2 slot counts."""
    running = sum(count for slot, count in slots.items() if slot < edges[0])
    out = []
    for slot, bound in bucket_bounds(edges, le):
        running += slots.get(slot, 0)
        out.append((bound, running))
    out.append(("+Inf", sum(slots.values())))
    return out


def point_label(entry: str, exit_: str) -> str:
    return entry if entry == exit_ else f"{entry} -> {exit_}"


def bpf_stats_enabled() -> bool:
    try:
        return BPF_STATS.read_text().strip() == "1"
    except OSError:
        return False


class MountLabels(NamedTuple):
    """A filesystem's mount labels: their names and values on the per-operation series, and on
    the per-mount in-flight series."""

    names: Tuple[str, ...]
    values: Callable[[Mount], Tuple[str, ...]]
    in_flight: Tuple[str, ...]
    in_flight_values: Callable[[Mount], Tuple[str, ...]]


#: NFS: node_exporter mountstats' names (a join meets them); in flight, the server first (an
#: RPC counts on every mount of its server)
NFS_LABELS = MountLabels(tuple(MOUNT_LABELS), lambda m: (m.export, m.protocol, m.mountaddr, m.mountpoint,
                                                         m.nfs_version),
                         tuple(IN_FLIGHT_LABELS), lambda m: (m.mountaddr, m.export, m.mountpoint))
#: a local filesystem: node_exporter filesystem collector's `device` and `mountpoint`
LOCAL_LABELS = MountLabels(("device", "mountpoint"), lambda m: (m.export, m.mountpoint),
                           ("device", "mountpoint"), lambda m: (m.export, m.mountpoint))
#: SMB: `device` (//server/share as mounted, the filesystem collector's), `server` (the address
#: connected to, mountinfo's addr=: what a stuck-server alert names), `mountpoint`
SMB_LABELS = MountLabels(("device", "server", "mountpoint"), lambda m: (m.export, m.mountaddr, m.mountpoint),
                         ("device", "server", "mountpoint"), lambda m: (m.export, m.mountaddr, m.mountpoint))


def mount_labels(fs: str) -> MountLabels:
    return {"nfs": NFS_LABELS, "cifs": SMB_LABELS}.get(fs, LOCAL_LABELS)


class FsCollector:
    """One filesystem's families (probekit_<fs>_*): every scrape reads one snapshot of its probe's maps.

    `lock` is held while the maps are read, so that the main thread never detaches the
    probe in the middle of a scrape (it takes the lock and sets `session` to None first).
    Without a session (waiting for the filesystem's modules, compiling again) a scrape gets
    its probe_attached 0 only."""

    def __init__(self, session: Optional[Session], lock: threading.Lock, mounts: Optional[MountTable] = None,
                 cgroups: Optional[CgroupLabels] = None, fs: str = "nfs", title: str = "NFS") -> None:
        self.session = session
        #: unix time the current probe was attached: its counters started from zero then
        self.attached_at = time.time()
        self.lock = lock
        #: the families' prefix (probekit_<fs>_) and how messages name the filesystem
        self.fs, self.title = fs, title
        self.labels = mount_labels(fs)
        self.mounts = mounts or MountTable()
        #: the `cgroup` label's names and gone cgroups, when the probe keys by cgroup
        self.cgroups = cgroups

    def name(self, family: str) -> str:
        return f"probekit_{self.fs}_{family}"

    def snapshot(self, stats_on: bool) -> Optional[Dict[str, Any]]:
        with self.lock:
            session = self.session
            if session is None or not session.attached:
                return None
            self.mounts.refresh()
            for dev in self.mounts.take_expired():
                session.forget_dev(dev)
            admitted: List[int] = []
            if self.cgroups is not None:
                admitted = session.admitted_cgroups()
                for cgroup in self.cgroups.expired(admitted):
                    session.forget_cgroup(cgroup)
                    admitted.remove(cgroup)
            in_flight = session.in_flight()
            now = time.monotonic_ns()  # the probe's clock (bpf_ktime_get_ns), read with the entries
            return {"session": session, "dist": session.dist(clear=False), "in_flight": in_flight,
                    "stuck": stalls(in_flight, now, 0, describe=False),
                    "anomalies": session.anomalies(), "inflight_lost": session.counter("inflight_lost"),
                    "missed": session.missed_per_cause(), "admitted": len(admitted),
                    "programs": session.program_stats() if stats_on else {}}

    def families(self, snap: Optional[Dict[str, Any]]) -> Iterator[Family]:
        """This filesystem's families from one snapshot (None: no probe attached)."""
        title = self.title
        yield gauge(self.name("probe_attached"), "1 while the probe is attached; 0 while the "
                    f"exporter waits for {title} modules or compiles the probe again.",
                    value=int(snap is not None))
        if snap is None:
            return
        session = snap["session"]
        yield gauge(self.name("probe_attach_time_seconds"), "Unix time the probe was attached: "
                    f"its counters started from zero then (again after {title} modules loaded).",
                    value=self.attached_at)
        ops = session.probe.ops  # the RPC layer too, tracked in flight beneath what --ops asked
        labels = ["op"] + list(self.labels.names) + (["cgroup"] if self.cgroups else [])
        rows = sorted(self.per_mount(snap["dist"]).items())
        yield histogram(self.name("op_latency_seconds"), f"Latency of completed {title} "
                       "operations (log2 buckets: le = 2^k - 1 ns).", labels,
                       [(key, (cumulative_buckets(entry["slots"]), entry["lat_ns"] / 1e9)) for key, entry in rows])
        yield counter(self.name("ops"), f"Completed {title} operations.", labels,
                      [(key, entry["count"]) for key, entry in rows])
        yield counter(self.name("bytes"), f"Bytes read or written by completed {title} "
                      "operations.", labels, [(key, entry["bytes"]) for key, entry in rows])
        flying = gauge(self.name("ops_in_flight"), f"{title} operations started and not ended "
                       "(each thread's outermost" + (", and RPCs)." if self.fs == "nfs" else ")."),
                       labels=["op"])
        per_op = {op: 0 for op in ops}
        for op in (f.op for f in snap["in_flight"]):
            per_op[op] = per_op.get(op, 0) + 1
        for op, value in per_op.items():
            flying.add([op], value)
        yield flying
        mount_flying = gauge(self.name("mount_ops_in_flight"), f"{title} operations in flight on "
                             "the mount (each thread's outermost on one of its files)" +
                             (", and RPCs to its server no traced operation waits for (counted on "
                              "each mount of that server)." if self.fs == "nfs" else "."),
                             labels=list(self.labels.in_flight))
        oldest = gauge(self.name("mount_oldest_in_flight_seconds"), "How long the oldest of "
                       f"{self.name('mount_ops_in_flight')} has been in flight (0: none).",
                       labels=list(self.labels.in_flight))
        for key, (value, age) in sorted(self.in_flight_per_mount(snap["stuck"]).items()):
            mount_flying.add(list(key), value)
            oldest.add(list(key), age)
        yield from (mount_flying, oldest)
        if self.cgroups is not None:
            yield gauge(self.name("cgroups_labelled"), "cgroups with series of their own; at "
                        "the limit, operations of any other cgroup are labelled "
                        f'cgroup="{CgroupLabels.OVERFLOW}".', value=snap["admitted"])
            yield gauge(self.name("cgroups_labelled_limit"), "--cgroup-limit: cgroups that can "
                        "have series of their own.", value=session.tool.cgroup_limit)
        yield counter(self.name("anomalies"), "Latencies dropped as impossible (end before start, "
                      "or above an hour).", value=snap["anomalies"])
        yield counter(self.name("inflight_lost"), "Operations not tracked in flight: another "
                      "thread held their slot.", value=snap["inflight_lost"])
        missed = counter(self.name("missed"), MISSED_HELP.format(what="Operations"),
                         labels=["op", "cause"])
        for (op, cause), value in snap["missed"].items():
            missed.add([op, cause], value)
        yield missed

    def in_flight_per_mount(self, stuck: List[Stall], server_of: Callable[[int], Optional[str]] = rpc_server
                            ) -> Dict[Tuple[str, ...], Tuple[int, float]]:
        """in-flight labels -> (in flight, oldest age in s), every mount known (0 when idle).
        An operation counts on its file's mount; an RPC (NFS only: a kworker's, or a process's
        in an operation not traced) on each mount of the server it went to, which sunrpc's
        debugfs names; an RPC whose server has no mount here, or is not known (no debugfs),
        on the server alone (export and mountpoint empty). A thread's RPC inside a traced
        operation is that operation (inflight.stalls folds it)."""
        empty = ("",) * len(self.labels.in_flight)
        out: Dict[Tuple[str, ...], Tuple[int, float]] = {
            self.labels.in_flight_values(m): (0, 0.0) for m in self.mounts.known.values() if m is not None}
        servers: Dict[int, Optional[str]] = {}
        for stall in stuck:
            if stall.op != "rpc":
                mount = self.mounts.known.get(stall.dev)
                keys = [self.labels.in_flight_values(mount) if mount else empty]
            else:  # NFS_LABELS.in_flight: the server first
                if stall.client_id is not None and stall.client_id not in servers:
                    servers[stall.client_id] = server_of(stall.client_id)
                server = servers.get(stall.client_id) if stall.client_id is not None else None
                keys = [key for key in out if server and key[0] == server] or [(server or "",) + empty[1:]]
            for key in keys:
                count, age = out.get(key, (0, 0.0))
                out[key] = (count + 1, max(age, stall.age_ns / 1e9))
        return out

    def per_mount(self, dist: Dict[str, Dict[str, Any]]) -> Dict[Tuple[str, ...], Dict[str, Any]]:
        """(op, mount labels...[, cgroup]) -> slots, count, bytes, lat_ns. Devs that are no
        mount of the filesystem (an RPC has none; a mount gone since) share the series with
        empty mount labels. Without the cgroup label, every asked op of every known mount has
        its series from the first scrape, at zero: a counter that first appears with its first
        burst already in it loses that burst to rate() and increase()."""
        def zero() -> Dict[str, Any]:
            return {"slots": {}, "count": 0, "bytes": 0, "lat_ns": 0}

        def labels(mount: Optional[Mount]) -> Tuple[str, ...]:
            return self.labels.values(mount) if mount else ("",) * len(self.labels.names)

        out: Dict[Tuple[str, ...], Dict[str, Any]] = {}
        for op, entry in dist.items():
            series = (entry["series"].items() if self.cgroups is not None
                      else (((dev, 0), per_dev) for dev, per_dev in entry.get("mounts", {0: entry}).items()))
            for (dev, cgroup), per_dev in series:
                key = (op,) + labels(self.mounts.known.get(dev))
                if self.cgroups is not None:
                    key += (self.cgroups.label(cgroup),)
                into = out.setdefault(key, zero())
                for slot, value in per_dev["slots"].items():
                    into["slots"][slot] = into["slots"].get(slot, 0) + value
                for field in ("count", "bytes", "lat_ns"):
                    into[field] += per_dev[field]
        if self.cgroups is None:
            for op in dist:
                for mount in self.mounts.known.values():
                    if mount is not None:
                        out.setdefault((op,) + labels(mount), zero())
        return out


class Collector:
    """The collector of the whole scrape: every filesystem's families (one
    FsCollector each), then what is the same for all of them once: build and loader info,
    probekit_probe_info (with an `fs` label), BPF program statistics."""

    def __init__(self, parts: Sequence[FsCollector], release: str, bcc_version: str, backend: str = "bcc",
                 loader_version: str = "") -> None:
        self.parts = list(parts)
        self.release = release
        #: build info: bcc's version where bcc runs (else empty), the loader (bcc or core) and its version
        self.bcc_version = bcc_version
        #: the loader chosen at the start, until a probe is attached
        self.early = (backend, loader_version)
        #: per filesystem, the loader its probe runs on
        self.loaders: Dict[str, Tuple[str, str]] = {}

    def loaded(self, fs: str, backend: str, version: str) -> None:
        """The loader a filesystem's attached probe runs on (auto may fall back to bcc for a
        module's BTF, so two filesystems may differ: one loader_info row each)."""
        self.loaders[fs] = (backend, version)
        if backend == "bcc":
            self.bcc_version = version

    def collect(self) -> Iterator[Family]:
        stats_on = bpf_stats_enabled()
        snaps = [(part, part.snapshot(stats_on)) for part in self.parts]
        for part, snap in snaps:
            yield from part.families(snap)
        build = gauge("probekit_build_info", "probekit, bcc and kernel versions (value 1).",
                      labels=["version", "bcc_version", "kernel"])
        build.add([probekit_version(), self.bcc_version, self.release], 1)
        yield build
        loader = gauge("probekit_bpf_loader_info", "The BPF loader the probe runs on (backend bcc, "
                       "or core: libbpf with the prebuilt CO-RE object) and its version (value 1).",
                       labels=["backend", "version"])
        for row in sorted(set(self.loaders.values())) or [self.early]:
            loader.add(list(row), 1)
        yield loader
        attached = [(part, snap) for part, snap in snaps if snap is not None]
        if not attached:
            return
        info = gauge("probekit_probe_info", "The attach point each traced operation uses (value 1).",
                     labels=["fs", "op", "kind", "point"])
        for part, snap in attached:
            for point in snap["session"].probe.points:
                info.add([part.fs, point.op, point.kind, point_label(point.entry, point.exit)], 1)
        yield info
        yield gauge("probekit_bpf_stats_enabled", "1 when kernel.bpf_stats_enabled is on (BPF "
                    "program run time and count are then exported).", value=int(stats_on))
        programs = [(part.fs, name, stats) for part, snap in attached for name, stats in snap["programs"].items()]
        if programs:
            run_time = counter("probekit_bpf_program_run_seconds", "Time spent in each BPF program.",
                               labels=["fs", "program"])
            runs = counter("probekit_bpf_program_runs", "Runs of each BPF program.",
                           labels=["fs", "program"])
            for fs, name, (ns, cnt) in sorted(programs):
                run_time.add([fs, name], ns / 1e9)
                runs.add([fs, name], cnt)
            yield from (run_time, runs)


class FirstSeen:
    """A bounded label: the first `limit` distinct values seen keep their own, every later one
    is CgroupLabels.OVERFLOW, for good (so the overflow series only grows: a value that once
    counted there never leaves it for a series of its own)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.admitted: Dict[str, None] = {}

    def label(self, value: str) -> str:
        if value not in self.admitted and len(self.admitted) < self.limit:
            self.admitted[value] = None
        return value if value in self.admitted else CgroupLabels.OVERFLOW


class NfsdCollector:
    """The server families (--nfsd): an NFS server's requests per client, export and procedure,
    from nfsdtop's probe (its cumulative maps). `lock` as NfsCollector's: the main thread sets
    `session` to None under it before the probe is detached."""

    def __init__(self, lock: threading.Lock, client_limit: int) -> None:
        self.session: Optional[Session] = None
        self.attached_at = time.time()
        self.lock = lock
        self.clients = FirstSeen(client_limit)

    def snapshot(self) -> Optional[Dict[str, Any]]:
        with self.lock:
            session = self.session
            if session is None or not session.attached:
                return None
            requests = session.requests(since_last=False)
            progress = session.requests_in_progress()
            now = time.monotonic_ns()
            return {"requests": requests, "in_progress": [(key, max(now - ts, 0) / 1e9) for key, ts in progress],
                    "missed": session.missed_per_cause(), "points": session.probe.points,
                    "limit": self.clients.limit}

    def series(self, requests: Dict[ServerKey, Dict[str, Any]], in_progress: List[Tuple[ServerKey, float]]
               ) -> Tuple[Dict[Tuple[str, str, str], Dict[str, Any]], Dict[Tuple[str, str], Tuple[int, float]]]:
        """(client, export, procedure) -> count, lat_ns, read_bytes, write_bytes, slots, clients
        past the limit summed into `other`; and (client, export) -> (in progress, oldest age in
        s), 0 for every (client, export) that has requests. Clients are admitted in address
        order within a scrape, so two exporters seeing the same clients label them alike."""
        def client(key: ServerKey) -> str:
            return self.clients.label(key[0])

        for key in sorted({key[0] for key in requests} | {key[0] for key, _age in in_progress}):
            self.clients.label(key)
        out: Dict[Tuple[str, str, str], Dict[str, Any]] = {}
        for key, entry in requests.items():
            add_request(out.setdefault((client(key), key[4], proc_label(*key[1:4])), request_totals()), entry)
        busy: Dict[Tuple[str, str], Tuple[int, float]] = {(c, e): (0, 0.0) for c, e, _p in out}
        for key, age in in_progress:
            count, oldest = busy.get((client(key), key[4]), (0, 0.0))
            busy[(client(key), key[4])] = (count + 1, max(oldest, age))
        return out, busy

    def collect(self) -> Iterator[Family]:
        snap = self.snapshot()
        yield gauge("probekit_nfsd_probe_attached", "1 while the NFS server probe is attached; 0 "
                    "while it compiles.", value=int(snap is not None))
        if snap is None:
            return
        yield gauge("probekit_nfsd_probe_attach_time_seconds", "Unix time the NFS server probe was "
                    "attached: its counters started from zero then.", value=self.attached_at)
        series, busy = self.series(snap["requests"], snap["in_progress"])
        # nearly every sample of a scrape, growing with the clients (bench/README.md,
        # "bench_server_scale.py"): their rows are the samples, no object per sample
        requests: List[Tuple[Tuple[str, ...], Dict[str, Any]]] = []
        operations: List[Tuple[Tuple[str, ...], Dict[str, Any]]] = []
        for key, entry in sorted(series.items()):
            (operations if is_operation(key[2]) else requests).append((key, entry))

        def latency(rows: List[Tuple[Tuple[str, ...], Dict[str, Any]]]) -> List[Tuple[Tuple[str, ...], Any]]:
            return [(key, (cumulative_buckets(entry["slots"], SERVER_BUCKET_SLOTS, server_le_seconds),
                           entry["lat_ns"] / 1e9)) for key, entry in rows]

        yield histogram("probekit_nfsd_request_duration_seconds", "Service time of completed "
                       "NFS server requests, from the dispatch of the decoded call to the encoded reply (log2 "
                       "buckets: le = 2^k us - 1 ns).", SERVER_LABELS, latency(requests))
        yield counter("probekit_nfsd_requests", "Completed NFS server requests.", SERVER_LABELS,
                      [(key, entry["count"]) for key, entry in requests])
        yield counter("probekit_nfsd_read_bytes", "Bytes the reads of completed requests "
                      "moved.", SERVER_LABELS, [(key, entry["read_bytes"]) for key, entry in requests])
        yield counter("probekit_nfsd_write_bytes", "Bytes the writes of completed requests "
                      "moved.", SERVER_LABELS, [(key, entry["write_bytes"]) for key, entry in requests])
        yield histogram("probekit_nfsd_operation_duration_seconds", "Service time of NFSv4 "
                       "operations inside completed COMPOUNDs (proc=\"NFSv4 READ\"...), from the previous "
                       "operation's end to this one's encoded reply.", SERVER_LABELS, latency(operations))
        yield counter("probekit_nfsd_operations", "NFSv4 operations nfsd ran inside COMPOUNDs "
                      "(each COMPOUND also counts once in probekit_nfsd_requests_total).", SERVER_LABELS,
                      [(key, entry["count"]) for key, entry in operations])
        progress = gauge("probekit_nfsd_requests_in_progress", "Requests nfsd threads are serving now.",
                         labels=SERVER_LABELS[:2])
        oldest = gauge("probekit_nfsd_oldest_in_progress_seconds", "How long the oldest of "
                       "probekit_nfsd_requests_in_progress has been served (0: none).",
                       labels=SERVER_LABELS[:2])
        for key, (value, age) in sorted(busy.items()):
            progress.add(list(key), value)
            oldest.add(list(key), age)
        yield from (progress, oldest)
        yield gauge("probekit_nfsd_clients_labelled", "Clients with series of their own; at the limit, "
                    f'requests of any other client are labelled client="{CgroupLabels.OVERFLOW}".',
                    value=len(self.clients.admitted))
        yield gauge("probekit_nfsd_clients_labelled_limit", "--client-limit: clients that can have "
                    "series of their own.", value=snap["limit"])
        info = gauge("probekit_nfsd_probe_info", "The attach point each traced server operation uses "
                     "(value 1; the export is named at a context point).", labels=["op", "kind", "point"])
        for point in snap["points"]:
            info.add([point.op + (" context" if point.context else ""), point.kind,
                      point_label(point.entry, point.exit)], 1)
        yield info
        missed = counter("probekit_nfsd_missed", MISSED_HELP.format(what="Requests"),
                         labels=["op", "cause"])
        for (op, cause), value in snap["missed"].items():
            missed.add([op, cause], value)
        yield missed


def scrape(collectors: Sequence[Any]) -> Iterator[Family]:
    """Every family of a scrape: the process' own, then each collector's."""
    yield from process_families()
    for collector in collectors:
        yield from collector.collect()


def listen(address: str, port: int, families: Callable[[], Iterable[Family]]) -> MetricsServer:
    """Bind the metrics server (not yet serving): a taken port fails before anything is attached."""
    try:
        return MetricsServer(address, port, families)
    except OSError as exc:
        raise UserError(f"cannot listen on {address} port {port}: {exc.strerror or exc}") from None


def ip_address(value: str) -> str:
    """--address: an IP address, as the server binds it."""
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an IP address (e.g. 127.0.0.1, 0.0.0.0, ::1, ::)") from None
    return value


EXAMPLES = f"""

Examples:
  nfs-exporter                          # serve http://127.0.0.1:{DEFAULT_PORT}/metrics
  nfs-exporter --port 19911             # another port, still loopback only
  nfs-exporter --address 0.0.0.0        # every IPv4 interface (firewall it)
  nfs-exporter --address :: --port {DEFAULT_PORT} # every IPv6 (and, by the system's default, IPv4) interface
  nfs-exporter --ops all -v             # every operation and RPC; say the attach points
  nfs-exporter --cgroup-label           # series per cgroup too (systemd units, containers)
  nfs-exporter --nfsd                   # on an NFS server: its requests per client, export, procedure
  nfs-exporter -t nfs,xfs,ext4          # NFS, XFS and ext4: probekit_nfs_*, probekit_xfs_*, probekit_ext4_*
  nfs-exporter -t ext4,cifs             # cifs is attached when its module loads (the first SMB mount)
  curl -s 127.0.0.1:{DEFAULT_PORT}/metrics | grep probekit_nfs_ops_total

Prometheus scrape job:
  - job_name: nfs
    static_configs: [{{targets: ['127.0.0.1:{DEFAULT_PORT}']}}]

Metrics: probekit_nfs_op_latency_seconds (histogram per op), probekit_nfs_ops_total,
probekit_nfs_bytes_total, probekit_nfs_ops_in_flight, probekit_nfs_mount_ops_in_flight and
probekit_nfs_mount_oldest_in_flight_seconds{{server,export,mountpoint}}, probekit_probe_info{{fs,op,kind,point}},
probekit_nfs_anomalies_total, probekit_nfs_inflight_lost_total, probekit_nfs_missed_total{{op}},
probekit_build_info, probekit_bpf_loader_info{{backend,version}}, probekit_nfs_probe_attached,
probekit_nfs_probe_attach_time_seconds; with
--cgroup-label a `cgroup` label (the cgroup v2 path, or "{CgroupLabels.OVERFLOW}" for cgroups past
--cgroup-limit) and probekit_nfs_cgroups_labelled(_limit); and with sysctl
kernel.bpf_stats_enabled=1 probekit_bpf_program_run_seconds_total and _runs_total{{fs,program}}.
With --nfsd (knfsd running; the server probe is nfsdtop's, on --backend's loader): probekit_nfsd_requests_total,
probekit_nfsd_read_bytes_total, probekit_nfsd_write_bytes_total and the histogram
probekit_nfsd_request_duration_seconds{{client,export,proc}}, probekit_nfsd_requests_in_progress and
probekit_nfsd_oldest_in_progress_seconds{{client,export}}, probekit_nfsd_probe_attached,
probekit_nfsd_probe_attach_time_seconds, probekit_nfsd_probe_info, probekit_nfsd_missed_total{{op}},
probekit_nfsd_clients_labelled(_limit); clients past --client-limit share client="{CgroupLabels.OVERFLOW}".
Each other filesystem (-t) has the same families as probekit_FS_* (ops, bytes, latency,
in flight per mount, probe_attached, missed...), labelled by its own mounts: device and
mountpoint (a local filesystem), device, server and mountpoint (cifs); probekit_probe_info has
an `fs` label. Started before a filesystem is mounted, it serves and waits for that
filesystem's modules, attaching its probe when they load (the other probes go on); a module
that loads later (nfsv4 on a v3-only client) is traced beside the running probe on core (the
counters go on); on bcc it makes it attach a new probe (counters restart from zero).
SIGTERM detaches everything and exits 143 (systemd: SuccessExitStatus=143).
"""


def exported_types() -> List[str]:
    """The filesystems -t takes: every spec's but the NFS server's (--nfsd)."""
    return [name for name in known_types() if name != "nfsd"]


def fs_targets(types_text: Optional[str], spec_path: Optional[str]) -> List[Target]:
    """-t FS[,FS...] (default nfs, or --spec's filesystem) -> one Target each, in the order
    given: one-line UserError for an unknown or repeated name, nfsd (--nfsd's), or a --spec
    for a filesystem -t does not name. All read before the port is taken."""
    given = find_target(None, spec_path) if spec_path else None
    default = given.spec["filesystem"] if given else "nfs"
    names = [name.strip() for name in types_text.split(",")] if types_text is not None else [default]
    for i, name in enumerate(names):
        if not name:
            raise UserError(f"-t {types_text!r}: an empty filesystem name (FS[,FS...]: {', '.join(exported_types())})")
        if name in names[:i]:
            raise UserError(f"-t {types_text}: {name} is given twice")
        if name == "nfsd":
            raise UserError("-t nfsd: an NFS server's requests are --nfsd's families (per client, export and "
                            "procedure); -t names the filesystems whose operations this host runs")
    if given and given.spec["filesystem"] not in names:
        raise UserError(f"--spec {spec_path}: a spec for {given.spec['filesystem']}, which -t {types_text} does not "
                        "name")
    return [given if given and given.spec["filesystem"] == name else find_target(name, None) for name in names]


def ops_option(text: str) -> str:
    """--ops, checked as the command line is read: the exporter starts nothing on a bad one."""
    try:
        parse_ops(text)
    except UserError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("--ops: ", "", 1)) from None
    return text


def exporter_parser() -> Parser:
    parser = Parser("nfs-exporter", "[OPTIONS]", nfs_exporter.__doc__, EXAMPLES)
    parser.add_argument("--address", default=DEFAULT_ADDRESS, type=ip_address,
                        help=f"Address to listen on; 0.0.0.0 or :: for every interface. [default: {DEFAULT_ADDRESS}]")
    parser.add_argument("--port", type=int_range(1, 65535), default=DEFAULT_PORT,
                        help=f"TCP port to listen on. [default: {DEFAULT_PORT}]")
    parser.add_argument("-t", "--type", dest="types_text", metavar="FS[,FS...]",
                        help="Filesystems to export, as fsdist's -t (" + ", ".join(exported_types())
                             + "), a family set per filesystem (probekit_FS_*). Default: nfs.")
    parser.add_argument("--ops", dest="ops_text", metavar="TEXT", type=ops_option,
                        help="Operations to trace, as nfsdist's --ops (names, letters or all); default: nfsdist's, "
                             "those each filesystem's spec has.")
    parser.add_argument("-v", "--verbose", action="store_true", help="Say which attach point each operation uses.")
    parser.add_argument("--spec", dest="spec_path", metavar="FILE", type=file_path,
                        help="Probe spec for its filesystem instead of probes/specs/FS.toml (-t defaults to its "
                             "filesystem).")
    parser.add_argument("--gone-mount-grace", dest="grace", metavar="FLOAT", type=float_at_least(0), default=GONE_GRACE_S,
                        help="Seconds an unmounted mount (or a removed cgroup) keeps its series before its counts "
                             f"are dropped. [default: {GONE_GRACE_S}]")
    parser.add_argument("--cgroup-label", action="store_true",
                        help="Label every series with the cgroup v2 path of the task that started the operation.")
    parser.add_argument("--cgroup-limit", metavar="INTEGER", type=int_range(1, 4096), default=CGROUP_LIMIT,
                        help="With --cgroup-label: cgroups that get series of their own (per filesystem); "
                             f'operations of any other share cgroup="{CgroupLabels.OVERFLOW}". [default: {CGROUP_LIMIT}]')
    parser.add_argument("--backend", choices=BACKENDS, default="auto",
                        help="BPF loader, as the tools' --backend: auto takes core (libbpf, the prebuilt CO-RE "
                             "object, no compiler) where libbpf 1.0+, the kernel's BTF and the object allow, else "
                             "bcc. [default: auto]")
    parser.add_argument("--nfsd", action="store_true",
                        help="On an NFS server (knfsd running): the probekit_nfsd_* families too, its requests per "
                             "client, export and procedure (nfsdtop's probe).")
    parser.add_argument("--client-limit", metavar="INTEGER", type=int_range(1, 4096), default=CLIENT_LIMIT,
                        help="With --nfsd: clients that get series of their own; requests of any other share "
                             f'client="{CgroupLabels.OVERFLOW}". [default: {CLIENT_LIMIT}]')
    return parser


def nfs_exporter(argv: Optional[Sequence[str]] = None) -> None:
    """Export filesystem operation latency histograms, counts, bytes and operations in flight
    for Prometheus (NFS by default; -t for others), from in-kernel histograms (nfsdist's and
    fsdist's), until SIGTERM or Ctrl-C."""
    a = exporter_parser().parse(argv)
    address, port, types_text, ops_text, verbose = a.address, a.port, a.types_text, a.ops_text, a.verbose
    spec_path, grace, cgroup_label, cgroup_limit = a.spec_path, a.grace, a.cgroup_label, a.cgroup_limit
    backend, nfsd, client_limit = a.backend, a.nfsd, a.client_limit
    if cgroup_label and cgroup2_root() is None:
        raise UserError("--cgroup-label needs the cgroup v2 hierarchy, and none is mounted")
    targets = fs_targets(types_text, spec_path)  # read once, before the port is taken
    server_spec = None
    if nfsd:
        if not module_live("nfsd"):
            raise UserError("--nfsd: knfsd is not running here (module nfsd not loaded): start the NFS server first")
        server_spec = find_target("nfsd", None).spec
        assert serves_requests(server_spec), "probes/specs/nfsd.toml times no request with its client"
    collectors: List[Any] = []  # filled below, before the server serves
    server = listen(address, port, partial(scrape, collectors))
    release = Path("/proc/sys/kernel/osrelease").read_text().strip()
    # no loader is one line now, not after a wait for modules (whose BTF the session checks)
    early = [choose(backend, target.spec, release, (), BTF_DIR) for target in targets]
    first = early[0]
    version = dotted(first.lib.version) if first.lib else ""
    if any(choice.name == "bcc" for choice in early):  # bcc's module (and tracefs') only where bcc loads
        from probes.bcc_backend import bcc_version, import_bpf

        import_bpf()
        version = bcc_version() if first.name == "bcc" else version
    tool = Tool(dist=True, inflight=True, dist_unit_ns=1, per_mount=True, lat_sum=True,
                cgroup_limit=cgroup_limit if cgroup_label else 0)
    lock = threading.Lock()
    parts = [Filesystem(target, target.ops(ops_text),
                        FsCollector(None, lock, MountTable(grace=grace, serves=partial(serves_fstype, target.spec)),
                                    CgroupLabels(grace) if cgroup_label else None, target.spec["filesystem"],
                                    target.title))
             for target in targets]
    collector = Collector([fs.collector for fs in parts], release, version if first.name == "bcc" else "",
                          first.name, version)
    nfsd_collector = NfsdCollector(lock, client_limit)
    collectors += [collector, nfsd_collector] if nfsd else [collector]
    stop = StopSignals()
    serving = False
    try:
        threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
        serving = True
        where = f"[{address}]" if ":" in address else address
        print(f"nfs-exporter: serving http://{where}:{port}/metrics", file=sys.stderr, flush=True)
        with stop, ExitStack() as held:
            if server_spec:
                served = attach_server(held, server_spec, nfsd_collector, verbose, backend)
                stop.install()  # the server probe's handlers, saved by it, go back when it detaches
                stop.signal = stop.signal or served.stop_signal  # one that came before install()

            def open_session(fs: Filesystem) -> Session:
                session = Session(fs.prog, tool, fs.ops, fs.target.spec, verbose, backend=backend)
                session.late_action = "attaching again with it (the counters restart from zero)"
                return session

            serve_filesystems(parts, collector, open_session, stop)
    finally:
        if serving:
            server.shutdown()
        server.server_close()
    if stop.signal is not None:
        raise Terminated(stop.signal)


class Filesystem(NamedTuple):
    """One filesystem the exporter serves: what it traces, and its families."""

    target: Target
    ops: List[str]
    collector: FsCollector

    @property
    def prog(self) -> str:
        """How its lines on stderr start (NFS's as before other filesystems were served)."""
        fs = self.collector.fs
        return "nfs-exporter" if fs == "nfs" else f"nfs-exporter: {fs}"


class StopSignals:
    """SIGTERM, SIGHUP and SIGINT set `signal` for the whole run, whichever probes are attached.

    Each Session installs handlers of its own when it attaches and puts back the ones it found
    when it detaches; with several probes coming and going in any order, that chain would put
    back a detached probe's handler, or the default one while others are attached. So after
    each attach install() puts this one back: every Session then saves, and restores, this."""

    def __init__(self) -> None:
        self.signal: Optional[int] = None
        self._old: Dict[int, Any] = {}

    def _stop(self, signum: int, _frame: Any) -> None:
        self.signal = signum

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            previous = signal.signal(sig, self._stop)
            self._old.setdefault(sig, previous)

    def __enter__(self) -> "StopSignals":
        self.install()
        return self

    def __exit__(self, *_exc: Any) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


def attach_server(held: ExitStack, spec: Dict[str, Any], collector: NfsdCollector, verbose: bool,
                  backend: str) -> Session:
    """--nfsd: nfsdtop's probe, attached for the exporter's whole run (`held` detaches it; the
    collector lets go of it first)."""
    session = held.enter_context(Session("nfs-exporter", Tool(server=True), server_ops(spec), spec, verbose,
                                         backend=backend))

    def release() -> None:
        with collector.lock:
            collector.session = None

    held.callback(release)
    with collector.lock:
        collector.session, collector.attached_at = session, time.time()
    session.warn(f"NFS server probe attached: {', '.join(session.ops)}")
    return session


def serve_filesystems(parts: Sequence[Filesystem], collector: Collector, open_session: Callable[[Filesystem], Session],
                      stop: StopSignals, modules: Path = MODULES) -> None:
    """Each filesystem's probe life, side by side until a stop signal: attached when its
    modules are there (a filesystem whose module is not loaded yet, cifs before its first
    mount, is attached when it loads, the others' counters untouched), attached again when a
    module loads later that its loader cannot add beside the running programs (bcc)."""
    live: Dict[str, Session] = {}
    waiting: Dict[str, List[str]] = {}
    try:
        while stop.signal is None:
            for fs in parts:
                name = fs.collector.fs
                session = live.get(name)
                if session is None:
                    if name in waiting and not modules_present(waiting[name], modules):
                        continue
                    started = _attach(fs, collector, open_session, waiting)
                    if started is not None:
                        live[name] = started
                        stop.install()
                elif not session.wait(0):  # its own handler took a signal before install() came back
                    stop.signal = session.stop_signal
                elif session.late_modules:
                    _detach(fs, live.pop(name))
                if stop.signal is not None:
                    break
            deadline = time.monotonic() + TICK_S
            while stop.signal is None and time.monotonic() < deadline:
                time.sleep(0.2)
    finally:
        for fs in reversed(parts):
            if fs.collector.fs in live:
                _detach(fs, live.pop(fs.collector.fs))


def _attach(fs: Filesystem, collector: Collector, open_session: Callable[[Filesystem], Session],
            waiting: Dict[str, List[str]]) -> Optional[Session]:
    """The filesystem's probe attached and handed to its collector; None while none of its
    operations can be traced for want of a module (said once per set of modules)."""
    name = fs.collector.fs
    try:
        session = open_session(fs)
    except NothingToTrace as exc:
        if not exc.modules:
            raise
        if waiting.get(name) != exc.modules:
            print(f"{fs.prog}: {exc}: waiting for {' or '.join(exc.modules)} to load", file=sys.stderr, flush=True)
        waiting[name] = exc.modules
        return None
    waiting.pop(name, None)
    session.__enter__()
    with fs.collector.lock:
        fs.collector.session, fs.collector.attached_at = session, time.time()
        collector.loaded(name, session.backend.name, session.backend.version)
    session.warn(f"probe attached: {', '.join(session.ops)}")
    return session


def _detach(fs: Filesystem, session: Session) -> None:
    with fs.collector.lock:  # a scrape still reading the maps ends first; detaching comes after
        fs.collector.session = None
    session.__exit__(None, None, None)


def main() -> None:
    run_cli("nfs-exporter", nfs_exporter)


if __name__ == "__main__":
    main()

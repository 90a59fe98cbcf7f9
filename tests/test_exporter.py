"""nfs-exporter: bucket seams on real latencies, the text a scrape gets, and bad options.

The latencies are the ones Debian's nfsslower-bpfcc printed in the 6.1 lab guest
(tests/fixtures/6.1.0-50-amd64/bcc-tools), plus every bucket edge itself: the kernel puts
a value in bcc's log2 slot (bpf_log2l), the exporter turns slots into buckets, and each
bucket must then count exactly the values <= its `le` (Prometheus' definition).
"""
from __future__ import annotations

import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Tuple

import pytest

from discover.version import probekit_version
from probes import exporter
from probes.exposition import encode
from probes.exporter import BUCKET_SLOTS, Collector, FsCollector, cumulative_buckets, le_seconds, listen
from probes.mounts import MountTable
from probes.runtime import MISS_CAUSES

REPO = Path(__file__).resolve().parents[1]
BCC_NFSSLOWER = REPO / "tests/fixtures/6.1.0-50-amd64/bcc-tools/nfsslower-bpfcc.txt"


def scrape_of(session: Any, mounts: Any = None, cgroups: Any = None) -> Collector:
    """The exporter's collector over one NFS probe (the 6.1 guest's kernel and bcc)."""
    return Collector([FsCollector(session, threading.Lock(), mounts, cgroups)], "6.1.0-50-amd64", "0.26.0")


def bcc_log2l(value: int) -> int:
    """bcc's bpf_log2l as its helpers define it: floor(log2(v)) + 1, and 1 for 0 (bcc issue 1649's table)."""
    return max(value.bit_length(), 1)


def real_latencies_ns() -> List[int]:
    """LAT(ms) column of the captured nfsslower-bpfcc run, in ns."""
    out = []
    for line in BCC_NFSSLOWER.read_text().splitlines()[2:]:
        fields = line.split()
        if len(fields) >= 7:
            out.append(round(float(fields[6]) * 1e6))
    return out


def edge_values() -> List[int]:
    """Each bucket's bound and its neighbours: 2^k - 2, 2^k - 1 (in the bucket), 2^k (the next)."""
    return [0, 1, 2, 3] + [v for k in BUCKET_SLOTS for v in ((1 << k) - 2, (1 << k) - 1, 1 << k)]


def slots_of(values: List[int]) -> Dict[int, int]:
    slots: Dict[int, int] = {}
    for value in values:
        slots[bcc_log2l(value)] = slots.get(bcc_log2l(value), 0) + 1
    return slots


@pytest.mark.parametrize("values", [real_latencies_ns(), edge_values(), real_latencies_ns() + edge_values() +
                                    [(1 << 40) + 5]], ids=["bcc-6.1", "edges", "both"])
def test_each_bucket_counts_the_values_up_to_its_le(values: List[int]) -> None:
    assert len(values) > 100 or values == edge_values()
    buckets = cumulative_buckets(slots_of(values))
    assert buckets[-1] == ("+Inf", len(values))
    for le, count in buckets[:-1]:
        le_ns = round(float(le) * 1e9)
        assert count == sum(1 for v in values if v <= le_ns), le
    assert [c for _, c in buckets] == sorted(c for _, c in buckets)  # cumulative


def test_a_bound_is_in_its_bucket_and_one_more_ns_is_not() -> None:
    for k in BUCKET_SLOTS:
        bound = (1 << k) - 1
        assert round(le_seconds(k) * 1e9) == bound
        at = dict(cumulative_buckets(slots_of([bound])))
        above = dict(cumulative_buckets(slots_of([bound + 1])))
        le = [le for le, _ in cumulative_buckets({})][k - BUCKET_SLOTS[0]]
        assert at[le] == 1 and above[le] == 0, le


class _Recorded:
    """What Session's readers return, from the recorded latencies (the collector under test is real)."""

    attached = True  # the collector reads nothing while Session.attached is False

    def __init__(self, per_op: Dict[str, List[int]], points: List[Any]) -> None:
        self.per_op = per_op
        self.probe = SimpleNamespace(ops=list(per_op), points=points)

    def dist(self, clear: bool) -> Dict[str, Dict[str, Any]]:
        assert not clear, "a scrape must not move nfsdist's baseline"
        return {op: {"slots": slots_of(v), "count": len(v), "bytes": 4096 * len(v), "lat_ns": sum(v)}
                for op, v in self.per_op.items()}

    def in_flight(self) -> List[Any]:
        return []

    def anomalies(self) -> int:
        return 0

    def counter(self, _name: str) -> int:
        return 0

    def missed_per_cause(self) -> Dict[Tuple[str, str], int]:
        return {(op, cause): 0 for op in self.per_op for cause in MISS_CAUSES}

    def program_stats(self) -> Dict[str, Tuple[int, int]]:
        return {}


def _scrape_text(mounts: Optional[MountTable] = None) -> Tuple[str, Dict[str, List[int]]]:
    """bcc's nfsslower example's latencies served by today's collector (`mounts`: the NFS
    mounts it labels, else the host's)."""

    from probes.model import Point
    rows: Dict[str, List[int]] = {"read": [], "write": [], "getattr": []}
    for line in BCC_NFSSLOWER.read_text().splitlines()[2:]:
        fields = line.split()
        if len(fields) >= 7 and fields[3] in "RWG":
            rows[{"R": "read", "W": "write", "G": "getattr"}[fields[3]]].append(round(float(fields[6]) * 1e6))
    points = [Point(0, "read", "kprobe", "task", "nfs_file_read", "nfs_file_read", (), {}),
              Point(1, "getattr", "tracepoint", "task", "nfs:nfs_getattr_enter", "nfs:nfs_getattr_exit", (), {})]
    collector = scrape_of(_Recorded(rows, points), mounts)
    server = listen("127.0.0.1", 0, collector.collect)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        server.shutdown()
        server.server_close()
    return text, rows


def test_scrape_serves_the_histograms_counts_and_health() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    text, rows = _scrape_text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    hist = families["probekit_nfs_op_latency_seconds"]
    assert hist.type == "histogram"
    for op, values in rows.items():
        samples = {s.name: s for s in hist.samples if s.labels["op"] == op and s.name.endswith(("_count", "_sum"))}
        assert samples["probekit_nfs_op_latency_seconds_count"].value == len(values)
        assert samples["probekit_nfs_op_latency_seconds_sum"].value == pytest.approx(sum(values) / 1e9)
    ops_total = {s.labels["op"]: s.value for s in families["probekit_nfs_ops"].samples}
    assert ops_total == {op: len(v) for op, v in rows.items()}
    assert "probekit_nfs_ops_total{" in text and "probekit_nfs_bytes_total{" in text
    info = {(s.labels["op"], s.labels["kind"], s.labels["point"]) for s in families["probekit_probe_info"].samples}
    assert info == {("read", "kprobe", "nfs_file_read"),
                    ("getattr", "tracepoint", "nfs:nfs_getattr_enter -> nfs:nfs_getattr_exit")}
    assert "pid=" not in text
    assert f'probekit_build_info{{bcc_version="0.26.0",kernel="6.1.0-50-amd64",version="{probekit_version()}"}} 1.0' in text


@pytest.mark.parametrize("args,hint", [(["--port", "0"], "--port"), (["--port", "x"], "--port"),
                                       (["--address", "localhost:1"], "--address"), (["--ops", "reed"], "--ops"),
                                       (["--gone-mount-grace", "-1"], "--gone-mount-grace"),
                                       (["--gone-mount-grace", "soon"], "--gone-mount-grace"),
                                       (["--cgroup-limit", "0"], "--cgroup-limit"),
                                       (["--cgroup-limit", "many"], "--cgroup-limit"),
                                       (["extra"], "unrecognized arguments: extra")])
def test_bad_options_are_one_line_exit_2(args: List[str], hint: str) -> None:
    res = subprocess.run([sys.executable, "-m", "probes.exporter", *args], capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    assert res.returncode == 2 and len(res.stderr.splitlines()) == 1, res.stderr
    assert res.stderr.startswith("nfs-exporter: error: ") and hint in res.stderr and "Traceback" not in res.stderr


def test_a_taken_port_fails_before_anything_is_attached() -> None:
    taken = listen("127.0.0.1", 0, list)
    try:
        port = str(taken.server_address[1])
        res = subprocess.run([sys.executable, "-m", "probes.exporter", "--port", port], capture_output=True,
                             text=True, cwd=REPO, timeout=60)
    finally:
        taken.server_close()
    assert res.returncode == 1 and res.stderr == f"nfs-exporter: error: cannot listen on 127.0.0.1 port {port}: " \
                                                 f"Address already in use\n"


def test_help_has_examples_and_the_default_port() -> None:
    res = subprocess.run([sys.executable, "-m", "probes.exporter", "--help"], capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    assert res.returncode == 0
    assert f"127.0.0.1:{exporter.DEFAULT_PORT}/metrics" in res.stdout and "--address 0.0.0.0" in res.stdout


def test_series_per_mount_carry_node_exporters_labels() -> None:
    """Two superblocks of the 6.1 guest's real mount tables: one series each, labelled as
    node_exporter's mountstats collector labels them; an RPC (dev 0) gets empty mount labels."""

    from probes.mounts import MountTable, kernel_dev
    fixtures = REPO / "tests/fixtures/6.1.0-50-amd64/exporter"
    values = real_latencies_ns()
    v3, v42 = values[:40], values[40:100]

    def entry(vals: List[int]) -> Dict[str, Any]:
        return {"slots": slots_of(vals), "count": len(vals), "bytes": 0, "lat_ns": sum(vals)}

    class PerMount(_Recorded):
        def dist(self, clear: bool) -> Dict[str, Dict[str, Any]]:
            mounts = {kernel_dev(0, 44): entry(v3), kernel_dev(0, 47): entry(v42), 0: entry([])}
            return {"read": dict(entry(v3 + v42), mounts=mounts)}

    collector = scrape_of(PerMount({"read": []}, []), MountTable(fixtures / "mountinfo", fixtures / "mountstats"))
    text = encode(collector.collect()).decode()
    assert ('probekit_nfs_ops_total{export="127.0.0.1:/srv/nfs",mountaddr="127.0.0.1",mountpoint="/mnt/nfs3",'
            'nfs_version="3",op="read",protocol="tcp"} 40.0') in text
    assert ('probekit_nfs_ops_total{export="127.0.0.1:/srv/nfs",mountaddr="127.0.0.1",mountpoint="/mnt/nfs42",'
            'nfs_version="4.2",op="read",protocol="tcp"} 60.0') in text
    assert 'probekit_nfs_ops_total{export="",mountaddr="",mountpoint="",nfs_version="",op="read",protocol=""} 0.0' \
        in text


def test_every_asked_op_of_every_mount_is_at_zero_before_its_first_operation() -> None:
    """Prometheus' rate() and increase() see a burst only on a series scraped before it: the 6.1
    guest's two mounts have every asked op from the first scrape, at zero, then the burst."""

    from probes.mounts import MountTable, kernel_dev
    fixtures = REPO / "tests/fixtures/6.1.0-50-amd64/exporter"
    v3 = real_latencies_ns()[:40]
    none: Dict[str, Any] = {"slots": {}, "count": 0, "bytes": 0, "lat_ns": 0, "mounts": {}}

    class FirstBurst(_Recorded):
        burst = False

        def dist(self, clear: bool) -> Dict[str, Dict[str, Any]]:
            if not self.burst:
                return {"read": none, "write": none}
            read = {"slots": slots_of(v3), "count": len(v3), "bytes": 0, "lat_ns": sum(v3)}
            return {"read": dict(read, mounts={kernel_dev(0, 44): read}), "write": none}

    session = FirstBurst({"read": [], "write": []}, [])
    collector = scrape_of(session, MountTable(fixtures / "mountinfo", fixtures / "mountstats"))

    def series(text: str) -> Dict[Tuple[str, str], float]:
        return {(line.split('mountpoint="')[1].split('"')[0], line.split('op="')[1].split('"')[0]):
                float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith("probekit_nfs_ops_total{") and 'mountpoint="/' in line}

    before = series(encode(collector.collect()).decode())
    assert before == {(point, op): 0.0 for point in ("/mnt/nfs3", "/mnt/nfs42") for op in ("read", "write")}
    session.burst = True
    after = series(encode(collector.collect()).decode())
    assert after == {**before, ("/mnt/nfs3", "read"): 40.0}


def test_a_gone_mount_leaves_after_the_grace_and_its_counts_go_with_it(tmp_path: Path) -> None:
    """umount of /mnt/nfs42 (the real tables without its lines): its series stays, labelled,
    for the grace period; then the probe's maps drop its dev (Session.forget_dev) and neither
    it nor the unlabelled series carries its 60 reads."""

    from probes.mounts import MountTable, kernel_dev
    from test_mounts import Clock, unmounted
    fixtures = REPO / "tests/fixtures/6.1.0-50-amd64/exporter"
    values = real_latencies_ns()

    class PerMount(_Recorded):
        def __init__(self) -> None:
            super().__init__({"read": []}, [])
            self.mounts = {kernel_dev(0, 44): values[:40], kernel_dev(0, 47): values[40:100], 0: []}

        def dist(self, clear: bool) -> Dict[str, Dict[str, Any]]:
            per = {dev: {"slots": slots_of(v), "count": len(v), "bytes": 0, "lat_ns": sum(v)}
                   for dev, v in self.mounts.items()}
            every = [x for v in self.mounts.values() for x in v]
            return {"read": {"slots": slots_of(every), "count": len(every), "bytes": 0, "lat_ns": sum(every),
                             "mounts": per}}

        def forget_dev(self, dev: int) -> None:
            del self.mounts[dev]

    clock = Clock()
    mounts = MountTable(fixtures / "mountinfo", fixtures / "mountstats", grace=300, clock=clock)
    session = PerMount()
    collector = scrape_of(session, mounts)
    v42 = ('probekit_nfs_ops_total{export="127.0.0.1:/srv/nfs",mountaddr="127.0.0.1",mountpoint="/mnt/nfs42",'
           'nfs_version="4.2",op="read",protocol="tcp"} 60.0')
    unlabelled = 'probekit_nfs_ops_total{export="",mountaddr="",mountpoint="",nfs_version="",op="read",protocol=""}'
    assert v42 in encode(collector.collect()).decode()
    mounts.paths = unmounted(tmp_path, "/mnt/nfs42").paths
    clock.now += 60
    text = encode(collector.collect()).decode()
    assert v42 in text and f"{unlabelled} 0.0" in text
    clock.now += 300
    text = encode(collector.collect()).decode()
    assert 'mountpoint="/mnt/nfs42"' not in text and f"{unlabelled} 0.0" in text
    assert kernel_dev(0, 47) not in session.mounts and 'mountpoint="/mnt/nfs3"' in text


def test_forget_dev_and_forget_cgroup_delete_their_keys_of_both_maps() -> None:
    import types
    from collections import namedtuple

    from probes.bcc_backend import BccMap
    from probes.runtime import RealtimeReads, Session
    dist_key, total_key = namedtuple("dist_key", "op slot dev cgroup"), namedtuple("total_key", "op dev cgroup")

    class Ids(dict):
        Key = staticmethod(lambda value: value)

    dist = {dist_key(0, 10, 44, 7): 3, dist_key(0, 10, 47, 7): 5, dist_key(1, 12, 47, 8): 1, dist_key(1, 9, 0, 0): 2}
    totals = {total_key(0, 44, 7): 1, total_key(0, 47, 7): 2, total_key(1, 47, 8): 3}
    tables = {"dist": dist, "op_totals": totals, "cgroup_ids": Ids({7: 1, 8: 1})}
    fake = SimpleNamespace(backend=SimpleNamespace(map=lambda name: BccMap(tables[name])),
                           _dist_base={(0, 47, 7, 10): 5, (0, 44, 7, 10): 1, (1, 47, 8, 12): 1},
                           _totals_base={(0, 47, 7): (1, 1), (0, 44, 7): (2, 2), (1, 47, 8): (3, 3)},
                           reading=RealtimeReads())
    fake._forget = types.MethodType(Session._forget, fake)
    Session.forget_dev(fake, 47)
    assert sorted((k.op, k.dev) for k in dist) == [(0, 44), (1, 0)]
    assert [(k.op, k.dev) for k in totals] == [(0, 44)]
    assert fake._dist_base == {(0, 44, 7, 10): 1} and fake._totals_base == {(0, 44, 7): (2, 2)}
    Session.forget_cgroup(fake, 7)
    assert list(dist) == [dist_key(1, 9, 0, 0)] and not totals and fake._dist_base == {} and fake._totals_base == {}
    assert dict(tables["cgroup_ids"]) == {8: 1}
    Session.forget_cgroup(fake, 7)  # twice: nothing left to delete, no error


def test_cgroup_label_names_real_cgroups_overflow_and_drops_a_removed_one(cgroup: Path) -> None:
    """--cgroup-label on this host's cgroup2 tree: admitted ids are labelled with their path,
    id 0 (cgroups past the limit) with the overflow value; a removed cgroup keeps its series
    for the grace, then its counts are dropped and its place among the admitted freed."""

    from probes.cgroups import CgroupLabels
    from probes.mounts import MountTable, kernel_dev
    from test_mounts import Clock
    fixtures = REPO / "tests/fixtures/6.1.0-50-amd64/exporter"
    values = real_latencies_ns()
    (cgroup / "a.scope").mkdir()
    (cgroup / "b.scope").mkdir()
    a, b = (cgroup / "a.scope").stat().st_ino, (cgroup / "b.scope").stat().st_ino

    class PerCgroup(_Recorded):
        def __init__(self) -> None:
            super().__init__({"read": []}, [])
            self.tool = SimpleNamespace(cgroup_limit=2)
            self.series = {(kernel_dev(0, 44), a): values[:40], (kernel_dev(0, 47), b): values[40:100],
                           (kernel_dev(0, 44), 0): values[100:105]}

        def dist(self, clear: bool) -> Dict[str, Dict[str, Any]]:
            every = [x for v in self.series.values() for x in v]
            return {"read": {"slots": slots_of(every), "count": len(every), "bytes": 0, "lat_ns": sum(every),
                             "series": {k: {"slots": slots_of(v), "count": len(v), "bytes": 0, "lat_ns": sum(v)}
                                        for k, v in self.series.items()}}}

        def admitted_cgroups(self) -> List[int]:
            return sorted({cg for _, cg in self.series if cg})

        def forget_cgroup(self, cg: int) -> None:
            self.series = {k: v for k, v in self.series.items() if k[1] != cg}

    clock = Clock()
    session = PerCgroup()
    collector = scrape_of(session, MountTable(fixtures / "mountinfo", fixtures / "mountstats"),
                          CgroupLabels(grace=300, clock=clock))
    v3 = 'export="127.0.0.1:/srv/nfs",mountaddr="127.0.0.1",mountpoint="/mnt/nfs3",nfs_version="3"'
    v42 = 'export="127.0.0.1:/srv/nfs",mountaddr="127.0.0.1",mountpoint="/mnt/nfs42",nfs_version="4.2"'
    text = encode(collector.collect()).decode()
    assert f'probekit_nfs_ops_total{{cgroup="/{cgroup.name}/a.scope",{v3},op="read",protocol="tcp"}} 40.0' in text
    assert f'probekit_nfs_ops_total{{cgroup="/{cgroup.name}/b.scope",{v42},op="read",protocol="tcp"}} 60.0' in text
    assert f'probekit_nfs_ops_total{{cgroup="other",{v3},op="read",protocol="tcp"}} 5.0' in text
    assert "probekit_nfs_cgroups_labelled 2.0" in text and "probekit_nfs_cgroups_labelled_limit 2.0" in text
    (cgroup / "b.scope").rmdir()
    clock.now += 60
    assert f'cgroup="/{cgroup.name}/b.scope"' in encode(collector.collect()).decode()  # within the grace
    clock.now += 300
    text = encode(collector.collect()).decode()
    assert f'cgroup="/{cgroup.name}/b.scope"' not in text and "probekit_nfs_cgroups_labelled 1.0" in text
    assert f'probekit_nfs_ops_total{{cgroup="/{cgroup.name}/a.scope",{v3},op="read",protocol="tcp"}} 40.0' in text


def test_without_a_probe_a_scrape_has_the_health_metrics_only() -> None:
    """While the exporter waits for NFS modules (or compiles again after one loaded), a scrape
    says the probe is not attached and serves no operation series."""

    collector = scrape_of(None)
    text = encode(collector.collect()).decode()
    assert "probekit_nfs_probe_attached 0.0" in text and 'probekit_build_info{bcc_version="0.26.0"' in text and 'probekit_bpf_loader_info{backend="bcc",version=""}' in text
    assert "probekit_nfs_ops_total" not in text and "probekit_nfs_probe_attach_time_seconds" not in text
    attached, _ = _scrape_text()
    assert "probekit_nfs_probe_attached 1.0" in attached and "probekit_nfs_probe_attach_time_seconds " in attached


class _Attachable(_Recorded):
    """A probe as serve_filesystems drives it: entered once, ticked, left once (the collector
    reading it is real, as are the loop, its signal handling and the module directory)."""

    def __init__(self, log: List[str], fs: str) -> None:
        super().__init__({"read": [1000]}, [])
        self.log, self.fs = log, fs
        self.backend = SimpleNamespace(name="core", version="1.5.0")
        self.ops, self.late_modules, self.stop_signal = ["read"], [], None

    def __enter__(self) -> "_Attachable":
        self.log.append(f"attach {self.fs}")
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.log.append(f"detach {self.fs}")

    def wait(self, _seconds: float) -> bool:
        return True

    def warn(self, _message: str) -> None:
        pass


def test_a_filesystem_whose_module_loads_later_is_attached_beside_the_others(tmp_path: Path) -> None:
    """nfs-exporter -t ext4,cifs started before the first SMB mount: ext4 is attached at once,
    cifs waits for its module (said in one line) and is attached when /sys/module/cifs appears,
    ext4's probe untouched (attached once, its attach time kept); SIGTERM then detaches both,
    and the signal handlers are the ones before the run."""
    import os
    import signal
    from contextlib import redirect_stderr
    from io import StringIO

    from probes.commands import find_target
    from probes.exporter import Filesystem, StopSignals, serve_filesystems
    from probes.runtime import NothingToTrace

    log: List[str] = []
    parts = [Filesystem(find_target(fs, None), ["read"], FsCollector(None, threading.Lock(), fs=fs)) for fs in ("ext4", "cifs")]
    collector = Collector([fs.collector for fs in parts], "6.12.57+deb13-amd64", "")
    ext4_attached: List[float] = []

    def open_session(fs: Filesystem) -> Any:
        name = fs.collector.fs
        if name == "cifs" and not (tmp_path / "cifs").exists():
            log.append("cifs not loaded")
            raise NothingToTrace("none of read can be traced (SMB/CIFS modules loaded? see --verbose)", ["cifs"])
        if name == "cifs":
            ext4_attached.append(parts[0].collector.attached_at)
            threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
        return _Attachable(log, name)

    before = signal.getsignal(signal.SIGTERM)
    threading.Timer(1.5, lambda: (tmp_path / "cifs").mkdir()).start()
    stderr = StringIO()
    with redirect_stderr(stderr), StopSignals() as stop:
        serve_filesystems(parts, collector, open_session, stop, modules=tmp_path)
    assert stop.signal == signal.SIGTERM and signal.getsignal(signal.SIGTERM) is before
    assert log[0] == "attach ext4" and log.count("cifs not loaded") == 1, log
    assert log[1:] == ["cifs not loaded", "attach cifs", "detach cifs", "detach ext4"]
    assert stderr.getvalue() == ("nfs-exporter: cifs: none of read can be traced (SMB/CIFS modules loaded? see "
                                 "--verbose): waiting for cifs to load\n")
    assert ext4_attached == [parts[0].collector.attached_at]
    assert parts[0].collector.session is None and parts[1].collector.session is None


def test_modules_present_sees_a_module_directory(tmp_path: Path) -> None:
    from probes.runtime import modules_present
    assert not modules_present(["nfs", "nfsv4"], tmp_path)
    (tmp_path / "nfsv4").mkdir()
    assert modules_present(["nfs", "nfsv4"], tmp_path)


def test_in_flight_per_mount_names_the_server_and_its_mounts() -> None:
    """On the 6.1.0-50 guest's mounts (NFSv3 and NFSv4.2 of one server, 127.0.0.1): a read stuck
    on /mnt/nfs3 counts there; a kworker's RPC to that server on both its mounts (the server holds
    both up); an RPC to a server with no mount here, or of unknown server, on the server alone.
    Every mount has its series, 0 when idle."""
    from probes.inflight import Stall
    from probes.mounts import MountTable, kernel_dev

    fixtures = Path(__file__).resolve().parent / "fixtures/6.1.0-50-amd64/exporter"
    mounts = MountTable(fixtures / "mountinfo", fixtures / "mountstats")
    mounts.refresh()
    collector = FsCollector(None, threading.Lock(), mounts)
    export = "127.0.0.1:/srv/nfs"
    idle = collector.in_flight_per_mount([])
    assert idle == {("127.0.0.1", export, "/mnt/nfs3"): (0, 0.0), ("127.0.0.1", export, "/mnt/nfs42"): (0, 0.0)}
    s = 10**9
    stuck = [Stall(501, 501, "python3", "read", 0, 30 * s, "?", "READ", None, kernel_dev(0, 44), 5),
             Stall(90, 2, "kworker/u2:1", "rpc", 0, 12 * s, "WRITE", "WRITE", None, client_id=5),
             Stall(91, 2, "kworker/u2:1", "rpc", 0, 3 * s, "NULL", "NULL", None, client_id=9),
             Stall(92, 2, "kworker/u2:1", "rpc", 0, 1 * s, "NULL", "NULL", None, client_id=11)]
    servers = {5: "127.0.0.1", 9: "10.0.0.9", 11: None}
    assert collector.in_flight_per_mount(stuck, servers.get) == {
        ("127.0.0.1", export, "/mnt/nfs3"): (2, 30.0), ("127.0.0.1", export, "/mnt/nfs42"): (1, 12.0),
        ("10.0.0.9", "", ""): (1, 3.0), ("", "", ""): (1, 1.0)}


def lab_mount_lines(tmp_path: Path) -> List[str]:
    """The 6.12 fs lab run's mount table (tests/fixtures/6.12.117+deb13-amd64/fs-lab: ext4 root,
    XFS on dm, two SMB mounts), written to tmp_path/mountinfo beside an empty mountstats."""
    import gzip
    import json

    run = REPO / "tests/fixtures/6.12.117+deb13-amd64/fs-lab/guest-run-exporter.json.gz"
    with gzip.open(run, "rt") as handle:
        lines: List[str] = json.load(handle)["data"]["mountinfo"]
    (tmp_path / "mountinfo").write_text("\n".join(lines) + "\n")
    (tmp_path / "mountstats").write_text("")
    return lines


def test_a_local_filesystem_has_its_families_labelled_by_device_and_mountpoint(tmp_path: Path) -> None:
    """-t nfs,ext4 on the 6.12 fs lab run's mount table (its ext4 root) beside the 6.1 guest's NFS
    mounts: probekit_ext4_* per ext4 mount with node_exporter filesystem collector's `device`
    and `mountpoint`, at zero before their first operation; what one filesystem shares with
    the others is one family with an `fs` label (probe_info, BPF program statistics whose
    program names repeat across the two probes), never two families of one name."""
    from prometheus_client.parser import text_string_to_metric_families

    from probes.model import Point
    from discover.spec import serves_fstype
    from probes.commands import find_target

    lines = lab_mount_lines(tmp_path)
    ext4 = {}
    for line in lines:
        left, _, right = line.partition(" - ")
        if right.split()[0] == "ext4":
            ext4[left.split()[4]] = right.split()[1]
    assert ext4, "the lab guest's root is ext4"
    fixtures = REPO / "tests/fixtures/6.1.0-50-amd64/exporter"
    values = real_latencies_ns()[:10]

    class WithPrograms(_Recorded):
        def program_stats(self) -> Dict[str, Tuple[int, int]]:
            return {"read_entry": (1500, 3), "read_exit": (2500, 3)}

    nfs = WithPrograms({"read": values}, [Point(0, "read", "kprobe", "task", "nfs_file_read", "nfs_file_read", (), {})])
    local = WithPrograms({"read": [], "write": []},
                         [Point(0, "read", "fentry", "task", "ext4_file_read_iter", "ext4_file_read_iter", (), {})])
    spec = find_target("ext4", None).spec
    lock = threading.Lock()
    parts = [FsCollector(nfs, lock, MountTable(fixtures / "mountinfo", fixtures / "mountstats")),
             FsCollector(local, lock, MountTable(tmp_path / "mountinfo", tmp_path / "mountstats",
                                                 serves=lambda fstype: serves_fstype(spec, fstype)), fs="ext4",
                         title="ext4")]
    collector = Collector(parts, "6.12.57+deb13-amd64", "")
    from unittest import mock
    with mock.patch("probes.exporter.bpf_stats_enabled", return_value=True):
        text = encode(collector.collect()).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    ops = {(s.labels["op"], s.labels["device"], s.labels["mountpoint"]): s.value
           for s in families["probekit_ext4_ops"].samples}
    assert {(op, device, point) for op in ("read", "write") for point, device in ext4.items()} <= set(ops)
    assert all(set(s.labels) == {"op", "device", "mountpoint"} for s in families["probekit_ext4_ops"].samples)
    assert {(s.labels["device"], s.labels["mountpoint"]) for s in families["probekit_ext4_mount_ops_in_flight"].samples} \
        == {(device, point) for point, device in ext4.items()}
    assert "probekit_ext4_probe_attached 1.0" in text and "probekit_nfs_probe_attached 1.0" in text
    assert sum(s.value for s in families["probekit_nfs_ops"].samples) == len(values)
    info = {(s.labels["fs"], s.labels["op"], s.labels["kind"]) for s in families["probekit_probe_info"].samples}
    assert info == {("nfs", "read", "kprobe"), ("ext4", "read", "fentry")}
    runs = {(s.labels["fs"], s.labels["program"]): s.value for s in families["probekit_bpf_program_runs"].samples}
    assert runs == {(fs, name): 3 for fs in ("nfs", "ext4") for name in ("read_entry", "read_exit")}
    names = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(names) == len(set(names))


def test_types_are_the_fs_tools_names_in_the_order_given() -> None:
    """-t as fsdist's, comma-separated; nfs without it; --spec stands in for its filesystem's
    spec and is the default -t."""
    from probes.exporter import fs_targets
    from probes.runtime import SPECS_DIR

    assert [t.spec["filesystem"] for t in fs_targets(None, None)] == ["nfs"]
    assert [t.spec["filesystem"] for t in fs_targets("xfs, nfs,cifs", None)] == ["xfs", "nfs", "cifs"]
    xfs = str(SPECS_DIR / "xfs.toml")
    assert [(t.spec["filesystem"], str(t.spec_path)) for t in fs_targets(None, xfs)] == [("xfs", xfs)]
    given = fs_targets("ext4,xfs", xfs)
    assert [str(t.spec_path) for t in given] == [str(SPECS_DIR / "ext4.toml"), xfs]


def test_xfs_and_smb_series_carry_their_mounts_labels(tmp_path: Path) -> None:
    """The 6.12 fs lab run's mount lines (tests/fixtures/6.12.117+deb13-amd64/fs-lab): XFS
    series by `device` and `mountpoint`; SMB's two mounts of one share (cache=strict, loose)
    by `device` (the share), `server` (mountinfo's addr=) and `mountpoint`, one series each."""

    from discover.spec import serves_fstype
    from probes.commands import find_target
    from probes.mounts import kernel_dev
    lab_mount_lines(tmp_path)
    values = real_latencies_ns()

    class PerDev(_Recorded):
        def __init__(self, devs: List[int]) -> None:
            super().__init__({"read": []}, [])
            self.devs = devs

        def dist(self, clear: bool) -> Dict[str, Dict[str, Any]]:
            per = {dev: {"slots": slots_of(values[:i + 3]), "count": i + 3, "bytes": 0, "lat_ns": sum(values[:i + 3])}
                   for i, dev in enumerate(self.devs)}
            return {"read": {"slots": {}, "count": 0, "bytes": 0, "lat_ns": 0, "mounts": per}}

    def fs_part(fs: str, devs: List[int]) -> FsCollector:
        spec = find_target(fs, None).spec
        mounts = MountTable(tmp_path / "mountinfo", tmp_path / "mountstats",
                            serves=lambda fstype: serves_fstype(spec, fstype))
        return FsCollector(PerDev(devs), threading.Lock(), mounts, fs=fs, title=fs)

    collector = Collector([fs_part("xfs", [kernel_dev(253, 0)]),
                           fs_part("cifs", [kernel_dev(0, 52), kernel_dev(0, 53)])], "6.12.117+deb13-amd64", "")
    text = encode(collector.collect()).decode()
    assert 'probekit_xfs_ops_total{device="/dev/mapper/probekit-xfs",mountpoint="/mnt/probekit-xfs",op="read"} 3.0' \
        in text
    share = 'device="//127.0.0.1/probekit"'
    assert f'probekit_cifs_ops_total{{{share},mountpoint="/mnt/probekit-cifs-strict",op="read",server="127.0.0.1"}} 3.0' \
        in text
    assert f'probekit_cifs_ops_total{{{share},mountpoint="/mnt/probekit-cifs-loose",op="read",server="127.0.0.1"}} 4.0' \
        in text
    assert f'probekit_cifs_mount_ops_in_flight{{{share},mountpoint="/mnt/probekit-cifs-loose",server="127.0.0.1"}} 0.0' \
        in text
    assert "probekit_xfs_ops_total{" in text and "probekit_ext4_" not in text and 'mountpoint="/mnt/probekit-ext4"' not in text


def test_a_served_scrape_is_prometheus_clients_text_byte_for_byte(tmp_path: Path) -> None:
    """On the 6.1 guest's mount tables, with /mnt/nfs3 renamed to a mount point holding a
    space, a quote, a backslash and a newline (escaped as the kernel escapes them), a GET
    gets, gzipped or not, what prometheus_client's own text encoder writes for the same
    families."""
    import gzip

    from prometheus_client import generate_latest
    from test_exposition import as_client_registry

    from probes.mounts import MountTable, kernel_dev
    fixtures = REPO / "tests/fixtures/6.1.0-50-amd64/exporter"
    odd = "/mnt/a\\040b\"c\\134d\\012e"
    for name in ("mountinfo", "mountstats"):
        (tmp_path / name).write_text((fixtures / name).read_text().replace("/mnt/nfs3 ", odd + " "))
    values = real_latencies_ns()

    class PerMount(_Recorded):
        def dist(self, clear: bool) -> Dict[str, Dict[str, Any]]:
            mounts = {kernel_dev(0, 44): values[:40], kernel_dev(0, 47): values[40:], 0: values[:3]}
            per = {dev: {"slots": slots_of(v), "count": len(v), "bytes": 512 * len(v), "lat_ns": sum(v)}
                   for dev, v in mounts.items()}
            return {op: {"slots": {}, "count": 0, "bytes": 0, "lat_ns": 0, "mounts": per} for op in self.per_op}

    collector = scrape_of(PerMount({"read": [], "write": []}, []),
                          MountTable(tmp_path / "mountinfo", tmp_path / "mountstats"))
    server = listen("127.0.0.1", 0, collector.collect)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        plain = urllib.request.urlopen(url, timeout=10)
        served = plain.read()
        zipped = urllib.request.urlopen(urllib.request.Request(url, headers={"Accept-Encoding": "gzip"}), timeout=10)
        assert zipped.headers["Content-Encoding"] == "gzip"
        served_gzip = gzip.decompress(zipped.read())
    finally:
        server.shutdown()
        server.server_close()
    assert plain.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    expected = generate_latest(as_client_registry(list(collector.collect())))
    assert 'mountpoint="/mnt/a b\\"c\\\\d\\ne"' in expected.decode()
    assert expected.count(b"probekit_nfs_op_latency_seconds_bucket{") == 2 * 3 * (len(BUCKET_SLOTS) + 1)
    assert served == served_gzip == expected

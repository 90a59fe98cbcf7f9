"""The NFS server side's cost as its clients grow: 1, 10, 100 and 200 NFSv3 clients of one lab
guest's knfsd, each with an address of its own, beside node_exporter's nfsd collector.

One 6.12 guest, core, is the server and every client: client K is a network namespace with a
veth on a bridge in the guest (10.200.0.1 the server's side, 10.200.x.y the client's; nothing
leaves the guest) and its own NFSv3 mount of the guest's export through that address, made
in the namespace (`nsenter --net`) inside one private mount namespace held by a `sleep` (so the
server's tools see the server's mounts only, as on a real server: the clients' are elsewhere);
the export is opened to 10.200.0.0/16 for the run (`exportfs -o`, undone after). `nolock`: the
NLM side (statd per namespace) is not what is measured. Clients are set up BATCH at a time: one
`ip -batch` for their namespaces and veths, one shell for their addresses and mounts; then udev's
work for the new mounts is waited for (`udevadm settle`: nfsrahead per mount). Per size,
a round of I/O from every client (a forked process in that mount namespace writes 4 KiB with
fsync, stats and lists it on each mount) before each measurement, so that every client has rows:
- nfs-exporter --nfsd (core) from the share, fresh per size, with its default --client-limit
  (64) and with --client-limit 4096 (every client its own series): one warm scrape, then the
  median of SCRAPES whole /metrics GETs, the samples served (all, and the probekit_nfsd_ ones),
  the clients it labelled, VmRSS and VmHWM after them; then a Prometheus of the guest scraping
  it with the shipped rules (packaging/prometheus/probekit-rules.yml), its scrape interval and
  timeout SCRAPE_MARGIN times the slowest measured scrape (MIN_SCRAPE_S at least), the rules
  every EVAL_S: once it has two successful scrapes, the median over RULE_EVALS evaluations of
  the sum over the rule groups of prometheus_rule_group_last_duration_seconds, and what it
  scraped (rules_over_series: whether the rules ran over the exporter's series);
- nfsdtop (core): its Session and its interval's code (commands.nfsdtop_frame) in a process of
  their own, one round of I/O per interval, FRAMES tables and FRAMES --json lines timed (wall
  time of producing the interval's output from the maps), the rows each had, VmRSS and VmHWM;
- node_exporter (`--collector.nfsd`, /proc/net/rpc/nfsd: no per-client figures) scraped
  SCRAPES times, the anchor.
- the exporter's scrape in a process of its own (exporter_phases: the collectors nfs-exporter
  --nfsd builds, per limit): SCRAPES scrapes encoded as the server does, the map reads alone,
  the probes' map entries, the function calls of one scrape, to say whether the time follows
  the series or the entries.
`--profile` adds, at the largest size, cProfile's top functions of one nfsdtop --json interval
and of one such scrape per limit.
A size that fails, or --until (HH:MM UTC: the guest's budget, from when the lab is up) running
out, ends the run: the sizes done are kept, `stopped` says why.

  flock /tmp/probekit-lab.lock .venv/bin/python bench/bench_server_scale.py [--lab NAME] [--json PATH] [--until HH:MM]
  python3 bench/bench_server_scale.py --in-guest [--profile] [--sizes 1,2] [--budget S]   # inside a guest, as root
"""
from __future__ import annotations

import io
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from typing import Any, Dict, List, Optional, Tuple

from bench_exporter import scrape_times, start, status_kib, stop
from lab_run import PROJECT, help_asked, run_in_lab

sys.path.insert(0, PROJECT)
from labs.checks.nfsdtop.guest import exporter_ready, nfs_clients  # noqa: E402

CLIENTS = (1, 10, 100, 200)
SCRAPES = FRAMES = RULE_EVALS = 5
#: the exporter's runs per size: its default client limit, and one above every client
LIMITS = {"limit64": [], "limit4096": ["--client-limit", "4096"]}
EXPORTER_PORT, NODE_PORT, PROM_PORT = 19914, 9103, 9093
BRIDGE, SERVER, SUBNET = "srvscale0", "10.200.0.1", "10.200.0.0/16"
EXPORT, BASE = "/srv/nfs", "/mnt/srvscale"
EXPORT_OPTS = "rw,sync,no_root_squash,no_subtree_check,insecure"
PROM_DIR = "/tmp/bench-srvscale-prometheus"
RULES = os.path.join(PROJECT, "packaging", "prometheus", "probekit-rules.yml")
MOUNT_OPTS = "vers=3,nosharecache,nolock"
#: clients set up per `ip -batch` and shell (Clients.add_batch)
BATCH = 50
#: Prometheus' scrape interval (and timeout) per exporter: SCRAPE_MARGIN times the slowest of
#: its measured scrapes, whole seconds, at least MIN_SCRAPE_S; the rules evaluated every EVAL_S
#: (the series stay in the head between scrapes)
MIN_SCRAPE_S, SCRAPE_MARGIN, EVAL_S = 15, 3, 5
#: the guest's seconds between polls of Prometheus
POLL_S = 2


def prom_config(scrape_s: int) -> str:
    """prometheus.yml: the exporter scraped every `scrape_s` (its timeout as long), the shipped rules."""
    return (f"global: {{scrape_interval: {scrape_s}s, scrape_timeout: {scrape_s}s, evaluation_interval: {EVAL_S}s}}\n"
            f"rule_files: ['{RULES}']\n"
            "scrape_configs:\n"
            "  - job_name: probekit\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{EXPORTER_PORT}']}}]\n")


def run(*argv: str) -> None:
    subprocess.run(argv, check=True)


def address(k: int) -> str:
    return f"10.200.{1 + k // 200}.{1 + k % 200}"


def client_io(mntns: str, points: List[str]) -> None:
    """One round from every client: a child in the clients' mount namespace writes 4 KiB
    with fsync, stats and lists its directory on each mount."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setns(os.open(mntns, os.O_RDONLY), os.CLONE_NEWNS)
            for k, point in enumerate(points):
                work = os.path.join(point, "work", f"srvscale-{k}")
                os.makedirs(work, exist_ok=True)
                fd = os.open(os.path.join(work, "small.bin"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.write(fd, b"s" * 4096)
                os.fsync(fd)
                os.close(fd)
                os.stat(os.path.join(work, "small.bin"))
                os.listdir(work)
            code = 0
        finally:
            os._exit(code)
    _pid, status = os.waitpid(pid, 0)
    if status != 0:
        raise RuntimeError(f"the clients' I/O round failed (wait status {status})")


class Clients:
    """The namespaces, their addresses and mounts; everything made is undone by close(), from
    what exists (the clients' mounts under BASE, the namespaces named), so a batch stopped
    half-way is undone too."""

    def __init__(self) -> None:
        self.points: List[str] = []
        self.holder: Optional[subprocess.Popen] = None
        self.mntns = ""
        self.namespaces: List[str] = []  # every namespace a batch was to make, made or not
        self.made: List[List[str]] = []  # what close() runs, last made first

    def open(self) -> None:
        """The clients' mount namespace, the bridge with the server's address, the export to them."""
        self.holder = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "infinity"])
        self.mntns = f"/proc/{self.holder.pid}/ns/mnt"
        while os.readlink(self.mntns) == os.readlink("/proc/self/ns/mnt"):
            time.sleep(0.05)
        run("ip", "link", "add", BRIDGE, "type", "bridge")
        self.made.append(["ip", "link", "del", BRIDGE])
        run("ip", "addr", "add", f"{SERVER}/16", "dev", BRIDGE)
        run("ip", "link", "set", BRIDGE, "up")
        run("exportfs", "-o", EXPORT_OPTS, f"{SUBNET}:{EXPORT}")
        self.made.append(["exportfs", "-u", f"{SUBNET}:{EXPORT}"])

    def grow(self, count: int) -> float:
        """Clients up to `count`, BATCH at a time by add_batch(); then udev's work for their
        mounts waited for (`udevadm settle`; its seconds returned): each NFS mount's bdi runs
        nfs-common's nfsrahead, and they kept the guest's one vCPU busy for three minutes after
        200 mounts were made, through the first measurements (bench/README.md); then an
        untimed round, so that the first exporter after it sees no MKDIR or CREATE the next
        does not."""
        while len(self.points) < count:
            self.add_batch(range(len(self.points), min(count, len(self.points) + BATCH)))
        began = time.monotonic()
        run("udevadm", "settle", "--timeout=900")
        settled = time.monotonic() - began
        client_io(self.mntns, self.points)  # new clients' directories and files: every later round alike
        return settled

    def add_batch(self, ks: range) -> None:
        """Client K: namespace srvscaleK, its veth's far end on the bridge with its address, its
        mount BASE/K. One `ip -batch` makes the namespaces and veths; one shell gives each
        namespace its address (`ip -n`) and makes each mount (`nsenter` into the clients' mount
        namespace and the client's network namespace opens both from here)."""
        names = [f"srvscale{k}" for k in ks]
        self.namespaces += names
        links = "".join(f"netns add {ns}\nlink add srvs{k} type veth peer name eth0 netns {ns}\n"
                        f"link set srvs{k} master {BRIDGE} up\n" for k, ns in zip(ks, names))
        subprocess.run(["ip", "-batch", "-"], input=links, universal_newlines=True, check=True)
        script = ["set -e"]
        for k, ns in zip(ks, names):
            point = f"{BASE}/{k}"
            os.makedirs(point, exist_ok=True)
            script += [f"printf 'addr add {address(k)}/16 dev eth0\\nlink set eth0 up\\n' | ip -n {ns} -batch -",
                       f"nsenter --mount={self.mntns} --net=/run/netns/{ns} mount -t nfs -o {MOUNT_OPTS} "
                       f"{SERVER}:{EXPORT} {point}"]
        subprocess.run(["sh", "-c", "\n".join(script)], check=True)
        self.points += [f"{BASE}/{k}" for k in ks]

    def io(self) -> None:
        client_io(self.mntns, self.points)

    def mounted(self) -> List[str]:
        """The clients' NFS mounts under BASE, from their mount namespace's own table."""
        if self.holder is None:
            return []
        with open(f"/proc/{self.holder.pid}/mounts") as handle:
            return [fields[1] for fields in (line.split() for line in handle)
                    if fields[1].startswith(BASE + "/") and fields[2].startswith("nfs")]

    def close(self) -> None:
        """Unmount every client mount (one shell in their namespace, forced and lazy where a plain
        umount fails), end the holder, delete the namespaces (one `ip -force -batch`), then
        the export and the bridge."""
        points = self.mounted()
        if points:
            subprocess.run(["nsenter", f"--mount={self.mntns}", "sh", "-c",
                            'for p; do umount "$p" || umount -f -l "$p"; done', "sh"] + points[::-1])
        if self.holder is not None:
            self.holder.kill()
            self.holder.wait()
        if self.namespaces:
            subprocess.run(["ip", "-force", "-batch", "-"], universal_newlines=True,
                           input="".join(f"netns del {ns}\n" for ns in reversed(self.namespaces)))
        for argv in reversed(self.made):
            subprocess.run(argv)


def fetch(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=300).read().decode()


def sample_values(text: str, name: str) -> Dict[str, float]:
    """Label set -> value of one family's samples in a scrape."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            labels, _, value = line.rpartition(" ")
            out[labels[len(name):]] = float(value)
    return out


def prom_query(expr: str) -> float:
    """The sum of an instant query's values in the guest's Prometheus (0 for an empty answer)."""
    url = f"http://127.0.0.1:{PROM_PORT}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    answer = json.loads(urllib.request.urlopen(url, timeout=60).read().decode())
    return sum(float(item["value"][1]) for item in answer["data"]["result"])


def scrape_interval(scrape_max_s: float) -> int:
    """Prometheus' scrape interval and timeout for an exporter whose slowest measured scrape
    took `scrape_max_s`."""
    return max(MIN_SCRAPE_S, math.ceil(SCRAPE_MARGIN * scrape_max_s))


def rule_evaluation(scrape_s: int) -> Dict[str, Any]:
    """A fresh Prometheus scraping the exporter every `scrape_s` with the shipped rules. Once it
    has two successful scrapes (`up` 1; rates need two), RULE_EVALS evaluations' time, all
    groups summed, read from its own prometheus_rule_group_last_duration_seconds after each;
    then what it scraped (successful and failed scrapes, the slowest, the samples), its series,
    and the samples the rules' last evaluation produced."""
    shutil.rmtree(PROM_DIR, ignore_errors=True)
    os.makedirs(PROM_DIR)
    with open(os.path.join(PROM_DIR, "prometheus.yml"), "w") as handle:
        handle.write(prom_config(scrape_s))
    prom = start(["prometheus", f"--config.file={PROM_DIR}/prometheus.yml", f"--storage.tsdb.path={PROM_DIR}/data",
                  f"--web.listen-address=127.0.0.1:{PROM_PORT}"], "Server is ready to receive web requests",
                 "/tmp/bench-srvscale-prometheus.log")
    began = time.monotonic()
    try:
        seen, totals, waited_s = -1, [], 0.0
        deadline = began + scrape_s * 4 + EVAL_S * (RULE_EVALS + 2) + 300
        while len(totals) < RULE_EVALS and time.monotonic() < deadline:
            time.sleep(POLL_S)
            if seen < 0:  # not yet two successful scrapes: no evaluation counted
                if prom_query('sum_over_time(up{job="probekit"}[1h])') >= 2:
                    waited_s = time.monotonic() - began
                    seen = int(min(sample_values(fetch(PROM_PORT), "prometheus_rule_group_iterations_total").values()))
                continue
            text = fetch(PROM_PORT)
            done = int(min(sample_values(text, "prometheus_rule_group_iterations_total").values()))
            if done > seen:
                totals.append(sum(sample_values(text, "prometheus_rule_group_last_duration_seconds").values()))
                seen = done
        scraped = {"ok": int(prom_query('sum_over_time(up{job="probekit"}[1h])')),
                   "all": int(prom_query('count_over_time(up{job="probekit"}[1h])')),
                   "max_s": prom_query('max_over_time(scrape_duration_seconds{job="probekit"}[1h])'),
                   "samples": int(prom_query('max_over_time(scrape_samples_scraped{job="probekit"}[1h])'))}
        text = fetch(PROM_PORT)
        head = sample_values(text, "prometheus_tsdb_head_series")
        failed = sum(sample_values(text, "prometheus_rule_evaluation_failures_total").values())
        rules = sum(sample_values(text, "prometheus_rule_group_rules").values())
        produced = sum(sample_values(text, "prometheus_rule_group_last_evaluation_samples").values())
    finally:
        stop(prom)
        shutil.rmtree(PROM_DIR, ignore_errors=True)
    if len(totals) < RULE_EVALS:
        raise RuntimeError(f"Prometheus evaluated the rules {len(totals)} times over two scrapes "
                           f"(every {scrape_s} s) in {time.monotonic() - began:.0f} s")
    return {"median_s": statistics.median(totals), "evals_s": totals, "rules": int(rules),
            "head_series": int(sum(head.values())), "failures": int(failed), "rule_samples": int(produced),
            "scrape_interval_s": scrape_s,
            "eval_interval_s": EVAL_S, "scrapes": scraped, "waited_s": round(waited_s, 1),
            "took_s": round(time.monotonic() - began, 1)}


def exporter_at(clients: Clients, extra: List[str]) -> Dict[str, Any]:
    """One exporter (--nfsd, core, from the share): a round of I/O, scrapes, memory, the rules."""
    log = "/tmp/bench-srvscale-exporter.log"
    argv = [sys.executable, "-m", "probes.exporter", "--nfsd", "--port", str(EXPORTER_PORT), "--backend", "core"]
    proc = subprocess.Popen(argv + extra, cwd=PROJECT, env=dict(os.environ, PYTHONPATH=PROJECT),
                            stdout=open(log, "w"), stderr=open(log + ".err", "w"))
    try:
        ready_s = exporter_ready(proc, log)
        clients.io()
        time.sleep(2)
        fetch(EXPORTER_PORT)  # warm
        res = scrape_times(EXPORTER_PORT, SCRAPES)
        res.update(rss_kib=status_kib(proc.pid, "VmRSS"), hwm_kib=status_kib(proc.pid, "VmHWM"),
                   ready_s=round(ready_s, 1))
        text = fetch(EXPORTER_PORT)
        res["nfsd_samples"] = sum(1 for line in text.splitlines() if line.startswith("probekit_nfsd_"))
        res["clients_labelled"] = int(sample_values(text, "probekit_nfsd_clients_labelled")[""])
        res["rules"] = rule_evaluation(scrape_interval(res["max_s"]))
        return res
    finally:
        stop(proc)


def nfsdtop_frames(mntns: str, points: List[str], profile: bool) -> Dict[str, Any]:
    """nfsdtop's Session (core) and interval in this process (a fresh one per size: its memory
    is nfsdtop's): per interval a round of I/O from every client, then its output produced from
    the maps, timed; text then --json."""
    from probes.commands import find_target, nfsdtop_frame, server_ops
    from probes.model import Tool
    from probes.runtime import Session

    target = find_target("nfsd", None)
    res: Dict[str, Any] = {}
    with Session("nfsdtop", Tool(server=True), server_ops(target.spec), target.spec, False, backend="core") as session:
        client_io(mntns, points)
        nfsdtop_frame(session, 1, 1.0, "client", True, 20)  # warm: what came before
        for form, as_json in (("text", False), ("json", True)):
            walls, rows = [], []
            for _ in range(FRAMES):
                began = time.monotonic()
                client_io(mntns, points)
                seconds = round(time.monotonic() - began, 3)
                started = time.perf_counter()
                frame = nfsdtop_frame(session, 1, seconds, "client", as_json, 20)
                walls.append(time.perf_counter() - started)
                rows.append(len(json.loads(frame)["rows"]) if as_json else len(frame.splitlines()) - 1)
            res[form] = {"median_s": statistics.median(walls), "min_s": min(walls), "max_s": max(walls), "rows": rows}
        res.update(rss_kib=status_kib(os.getpid(), "VmRSS"), hwm_kib=status_kib(os.getpid(), "VmHWM"))
        if profile:
            import cProfile
            import pstats
            client_io(mntns, points)
            prof = cProfile.Profile()
            prof.runcall(nfsdtop_frame, session, 1, 1.0, "client", True, 20)
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(25)
            res["profile"] = text.getvalue()
    return res


def exporter_phases(mntns: str, points: List[str], profile: bool) -> Dict[str, Any]:
    """The exporter's --nfsd scrape in this process, to name where its time goes: the
    collectors nfs_exporter builds (the NFS client's and the server's, core), per limit a
    fresh server collector; after a round of I/O, SCRAPES whole scrapes encoded as the server
    encodes them, each with the two map reads (snapshots) timed alone before it, and the
    probe's map entries; then one more scrape under cProfile, its function calls counted (the
    work done, which the host's load, that changes the guest's speed from minute to minute,
    does not change), with `profile` its top functions."""
    import cProfile
    import pstats
    from functools import partial as bind

    from discover.spec import serves_fstype
    from probes.commands import find_target, server_ops
    from probes.exporter import Collector, FsCollector, NfsdCollector, scrape
    from probes.exposition import encode
    from probes.model import Tool
    from probes.mounts import MountTable
    from probes.runtime import Session

    nfs, nfsd = find_target("nfs", None), find_target("nfsd", None)
    client_tool = Tool(dist=True, inflight=True, dist_unit_ns=1, per_mount=True, lat_sum=True)
    res: Dict[str, Any] = {}
    with Session("nfs-exporter", client_tool, nfs.ops(None), nfs.spec, False, backend="core") as client, \
            Session("nfs-exporter", Tool(server=True), server_ops(nfsd.spec), nfsd.spec, False, backend="core") as server:
        lock = threading.Lock()
        part = FsCollector(client, lock, MountTable(serves=bind(serves_fstype, nfs.spec)), None, "nfs", nfs.title)
        for name, extra in LIMITS.items():
            limit = int(extra[1]) if extra else 64
            collector, server_part = Collector([part], "", "", "core", ""), NfsdCollector(lock, limit)
            server_part.session = server
            client_io(mntns, points)
            time.sleep(2)
            encode(scrape([collector, server_part]))  # warm: the clients admitted, as the exporter's first scrape
            walls: Dict[str, List[float]] = {"scrape_s": [], "nfsd_snapshot_s": [], "nfs_snapshot_s": []}
            for _ in range(SCRAPES):
                for field, read in (("nfsd_snapshot_s", server_part.snapshot), ("nfs_snapshot_s",
                                                                                 lambda: part.snapshot(False))):
                    started = time.perf_counter()
                    read()
                    walls[field].append(time.perf_counter() - started)
                started = time.perf_counter()
                body = encode(scrape([collector, server_part]))
                walls["scrape_s"].append(time.perf_counter() - started)
            row: Dict[str, Any] = {field: statistics.median(values) for field, values in walls.items()}
            row.update(walls=walls, samples=sum(1 for line in body.decode().splitlines() if line[:1] not in ("#", "")),
                       entries={table: len(server.backend.map(table).items())
                                for table in ("server_stats", "server_hist")},
                       client_entries={table: len(client.backend.map(table).items()) for table in ("dist", "op_totals")})
            prof = cProfile.Profile()
            prof.runcall(lambda: encode(scrape([collector, server_part])))
            row["calls"] = pstats.Stats(prof).total_calls  # the work, as the host's load does not change it
            if profile:
                for order in ("tottime", "cumulative"):
                    text = io.StringIO()
                    pstats.Stats(prof, stream=text).sort_stats(order).print_stats(25)
                    row[f"profile_{order}"] = text.getvalue()
            res[name] = row
        res.update(rss_kib=status_kib(os.getpid(), "VmRSS"), hwm_kib=status_kib(os.getpid(), "VmHWM"))
    return res


class BudgetReached(Exception):
    """The run's time (--budget) ran out."""


def in_guest(profile: bool, sizes_wanted: Tuple[int, ...] = CLIENTS, budget_s: int = 0) -> Dict[str, Any]:
    """Every size in turn; a size that fails, or the budget (seconds, 0: none) running out,
    ends the run with the sizes done kept and `stopped` saying why."""
    sizes: List[Dict[str, Any]] = []
    res: Dict[str, Any] = {"kernel": os.uname().release, "scrapes": SCRAPES, "frames": FRAMES,
                           "rule_evals": RULE_EVALS, "limits": list(LIMITS), "batch": BATCH, "sizes": sizes}
    clients, node, count = Clients(), None, 0

    def out_of_time(*_: Any) -> None:
        raise BudgetReached(f"the run's budget of {budget_s} s ran out")

    signal.signal(signal.SIGALRM, out_of_time)
    signal.alarm(budget_s)
    try:
        clients.open()
        node = start(["prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{NODE_PORT}",
                      "--collector.disable-defaults", "--collector.nfsd"], "Listening", "/tmp/bench-srvscale-node.log")
        for count in sizes_wanted:
            began = time.monotonic()
            settle_s = clients.grow(count)
            row: Dict[str, Any] = {"clients": count, "grow_s": round(time.monotonic() - began, 1),
                                   "udev_settle_s": round(settle_s, 1)}
            for name, extra in LIMITS.items():
                row[name] = exporter_at(clients, extra)
            row["nfsdtop"] = here(clients, "--nfsdtop-here", profile and count == sizes_wanted[-1])
            row["exporter_phases"] = here(clients, "--exporter-here", profile and count == sizes_wanted[-1])
            row["node_exporter"] = scrape_times(NODE_PORT, SCRAPES)
            row["server_clients"] = len(nfs_clients())
            row["size_s"] = round(time.monotonic() - began, 1)
            sizes.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    except Exception as error:  # noqa: BLE001 - the sizes done are kept, the reason with them
        res["stopped"] = f"at {count} clients ({len(clients.points)} set up): {type(error).__name__}: {error}"
        print(res["stopped"], file=sys.stderr, flush=True)
    finally:
        signal.alarm(0)
        if node is not None:
            stop(node)
        clients.close()
    return res


def here(clients: Clients, what: str, profile: bool) -> Dict[str, Any]:
    """nfsdtop_frames() (--nfsdtop-here) or exporter_phases() (--exporter-here) in a process of
    its own, on the share's code: its memory is that measurement's alone."""
    cmd = [sys.executable, os.path.abspath(__file__), what, clients.mntns] + clients.points
    done = subprocess.run(cmd + (["--profile"] if profile else []), cwd=PROJECT, env=dict(os.environ, PYTHONPATH=PROJECT),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=3600)
    if done.returncode:
        raise RuntimeError(f"{what}: {done.stderr[-1000:]}")
    return json.loads(done.stdout)


def per_client_fit(res: Dict[str, Any], part: str, field: str, form: str = "") -> Tuple[float, float]:
    """Least-squares (intercept, slope per client) of one figure over the sizes."""
    xs = [row["clients"] for row in res["sizes"]]
    ys = [float((row[part][form] if form else row[part])[field]) for row in res["sizes"]]
    slope, intercept = statistics.linear_regression(xs, ys)
    return intercept, slope


def rules_over_series(run: Dict[str, Any]) -> bool:
    """Whether Prometheus held the exporter's series when it evaluated the rules: every scrape
    of it succeeded (two at least) and its head held as many series as the exporter serves. A
    scrape slower than its timeout leaves it only its own `up` and scrape_* series (at a fixed
    4 s timeout, the 2026-12-06 04:02 run met that from 10 clients on), and a failed one makes
    the series stale: the rules' time is then that of rules over nothing."""
    scrapes = run["rules"].get("scrapes", {"ok": 2, "all": 2})
    return run["rules"]["head_series"] >= run["samples"] and scrapes["all"] >= 2 and scrapes["ok"] == scrapes["all"]


def report(res: Dict[str, Any]) -> str:
    ms = lambda seconds: f"{seconds * 1000:.0f} ms"  # noqa: E731
    mib = lambda kib: f"{kib / 1024:.1f} MiB"  # noqa: E731
    lines = [f"bench_server_scale on {res['kernel']} (medians of {res['scrapes']} scrapes, {res['frames']} "
             f"intervals, {res['rule_evals']} rule evaluations)",
             "| clients | " + " | ".join(f"{n} scrape | {n} samples (nfsd) | {n} RSS (peak) | {n} rules (scraped every)"
                                         for n in res["limits"])
             + " | nfsdtop table | nfsdtop --json | nfsdtop RSS (peak) | node_exporter scrape (samples) |"]
    for row in res["sizes"]:
        cells = [f"{ms(row[n]['median_s'])} | {row[n]['samples']} ({row[n]['nfsd_samples']}) | "
                 f"{mib(row[n]['rss_kib'])} ({mib(row[n]['hwm_kib'])}) | "
                 + (ms(row[n]['rules']['median_s']) + (f" ({row[n]['rules']['scrape_interval_s']} s)"
                                                        if "scrape_interval_s" in row[n]["rules"] else "")
                    if rules_over_series(row[n]) else "not scraped")
                 for n in res["limits"]]
        top = row["nfsdtop"]
        lines.append(f"| {row['clients']} | " + " | ".join(cells) +
                     f" | {ms(top['text']['median_s'])} | {ms(top['json']['median_s'])} | {mib(top['rss_kib'])} "
                     f"({mib(top['hwm_kib'])}) | {ms(row['node_exporter']['median_s'])} "
                     f"({row['node_exporter']['samples']}) |")
    for name in res["limits"] if len(res["sizes"]) >= 2 else []:
        _b, time_slope = per_client_fit(res, name, "median_s")
        _b, series = per_client_fit(res, name, "nfsd_samples")
        lines.append(f"{name}: {time_slope * 1000:.2f} ms and {series:.1f} nfsd samples per client")
    for form in ("text", "json") if len(res["sizes"]) >= 2 else ():
        _b, slope = per_client_fit(res, "nfsdtop", "median_s", form)
        lines.append(f"nfsdtop {form}: {slope * 1e6:.0f} us per client")
    for row in res["sizes"]:
        for name, run in ((n, row["exporter_phases"][n]) for n in res["limits"] if "exporter_phases" in row):
            lines.append(f"{row['clients']} clients, {name} in-process: scrape {ms(run['scrape_s'])} (fastest "
                         f"{ms(min(run['walls']['scrape_s']))}), {run['samples']} samples, server maps read in "
                         f"{ms(run['nfsd_snapshot_s'])} ({run['entries']['server_stats']} + "
                         f"{run['entries']['server_hist']} entries), client maps in {ms(run['nfs_snapshot_s'])}, "
                         f"{run['calls']} calls")
    if "stopped" in res:
        lines.append(f"stopped {res['stopped']}")
    if res["sizes"] and "profile" in res["sizes"][-1]["nfsdtop"]:
        lines += ["--- profile, one nfsdtop --json interval", res["sizes"][-1]["nfsdtop"]["profile"]]
    for name in res["limits"] if res["sizes"] and "profile_tottime" in res["sizes"][-1].get("exporter_phases", {}).get(
            res["limits"][0], {}) else ():
        lines += [f"--- profile, one in-process scrape, {name}", res["sizes"][-1]["exporter_phases"][name]["profile_tottime"]]
    return "\n".join(lines)


def main(argv: List[str]) -> int:
    if help_asked(argv, __doc__):
        return 0
    for what, measure in (("--nfsdtop-here", nfsdtop_frames), ("--exporter-here", exporter_phases)):
        if what in argv:
            args = [a for a in argv[argv.index(what) + 1:] if a != "--profile"]
            print(json.dumps(measure(args[0], args[1:], "--profile" in argv)))
            return 0
    if "--in-guest" in argv:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: namespaces, mounts, export undone
        sizes = tuple(int(n) for n in argv[argv.index("--sizes") + 1].split(",")) if "--sizes" in argv else CLIENTS
        budget = int(argv[argv.index("--budget") + 1]) if "--budget" in argv else 0
        print(json.dumps(in_guest("--profile" in argv, sizes, budget)))
        return 0
    lab = argv[argv.index("--lab") + 1] if "--lab" in argv else None
    out = argv[argv.index("--json") + 1] if "--json" in argv else "/tmp/bench_server_scale.json"
    until = until_epoch(argv[argv.index("--until") + 1]) if "--until" in argv else 0.0
    began, load = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), os.getloadavg()
    guests = qemu_guests()
    kept: List[Dict[str, Any]] = []
    loads: List[float] = []
    sampling = threading.Event()

    def sample_load() -> None:
        while not sampling.wait(30):
            loads.append(os.getloadavg()[0])

    def save() -> Dict[str, Any]:
        """The guest's JSON with the host's figures, written to `out`."""
        host = {"began": began, "ended": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                "load_start": load, "load_end": os.getloadavg(), "load_1m_samples": loads,
                "load_mean_1m": round(statistics.mean(loads), 1) if loads else None,
                "cpus": os.cpu_count(), "qemu_guests_running": guests}
        with open(out, "w") as handle:
            json.dump(dict(kept[0], host=host), handle, indent=1)
        return host

    def keep(data: Dict[str, Any]) -> str:
        kept.append(data)
        save()  # before the report: nothing lost if it fails
        return report(data)

    def command() -> str:
        budget = f" --budget {max(60, int(until - time.time()))}" if until else ""
        return f"python3 bench/bench_server_scale.py --in-guest{budget}" + (" --profile" if "--profile" in argv else "")

    threading.Thread(target=sample_load, daemon=True).start()
    try:
        code = run_in_lab(lab, "bench-server-scale", command, 7200, keep, kernel="6.12")
    finally:
        sampling.set()
    if kept:
        host = save()
        print(f"bench_server_scale: {began} to {host['ended']}, host load {load[0]:.1f} at the start, "
              f"{host['load_end'][0]:.1f} at the end; JSON in {out}")
    return code


def until_epoch(hhmm: str) -> float:
    """The next HH:MM UTC (today's, or tomorrow's once past) as seconds since the epoch."""
    hour, minute = (int(part) for part in hhmm.split(":"))
    now = time.time()
    at = now - now % 86400 + hour * 3600 + minute * 60
    return at if at > now else at + 86400


def qemu_guests() -> int:
    """QEMU processes running on the host when the run began (other benches' or CI's guests)."""
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm") as handle:
                count += handle.read().startswith("qemu-system")
        except OSError:
            pass
    return count

if __name__ == "__main__":
    sys.exit(main(sys.argv))

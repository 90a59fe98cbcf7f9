"""The NFS server side's cost as its clients grow: 1, 10, 100 and 200 NFSv3 clients of one lab
guest's knfsd, each with an address of its own, beside node_exporter's nfsd collector.

One 6.12 guest, core, is the server and every client: client K is a network namespace with a
veth on a bridge in the guest (10.200.0.1 the server's side, 10.200.x.y the client's; nothing
leaves the guest) and its own NFSv3 mount of the guest's export through that address, made
in the namespace (`nsenter --net`) inside one private mount namespace held by a `sleep` (so the
server's tools see the server's mounts only, as on a real server: the clients' are elsewhere);
the export is opened to 10.200.0.0/16 for the run (`exportfs -o`, undone after). `nolock`: the
NLM side (statd per namespace) is not what is measured. Per size, a round of I/O from every
client (a forked process in that mount namespace writes 4 KiB with fsync, stats and lists it
on each mount) before each measurement, so that every client has rows:
- nfs-exporter --nfsd (core) from the share, fresh per size, with its default --client-limit
  (64) and with --client-limit 4096 (every client its own series): one warm scrape, then the
  median of SCRAPES whole /metrics GETs, the samples served (all, and the probekit_nfsd_ ones),
  the clients it labelled, VmRSS and VmHWM after them; then a Prometheus of the guest scraping
  it with the shipped rules (packaging/prometheus/probekit-rules.yml): the median over RULE_EVALS
  evaluations of the sum over the rule groups of prometheus_rule_group_last_duration_seconds;
- nfsdtop (core): its Session and its interval's code (commands.nfsdtop_frame) in a process of
  their own, one round of I/O per interval, FRAMES tables and FRAMES --json lines timed (wall
  time of producing the interval's output from the maps), the rows each had, VmRSS and VmHWM;
- node_exporter (`--collector.nfsd`, /proc/net/rpc/nfsd: no per-client figures) scraped
  SCRAPES times, the anchor.
`--profile` adds, at the largest size, cProfile's top functions of one nfsdtop --json interval.
A Prometheus scrape slower than EVAL_S fails: its rule figure is then not over the series
(rules_over_series says which are); the run kept (bench/README.md) met that from 10 clients on.

  flock /tmp/probekit-lab.lock .venv/bin/python bench/bench_server_scale.py [--lab NAME] [--json PATH]
  python3 bench/bench_server_scale.py --in-guest [--profile] [--sizes 1,2]   # inside a guest, as root
"""
from __future__ import annotations

import io
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from typing import Any, Dict, List, Optional, Tuple

from bench_exporter import scrape_times, start, status_kib, stop
from lab_run import PROJECT, run_in_lab

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
EVAL_S = 4
PROM_CONFIG = f"""global: {{scrape_interval: {EVAL_S}s, scrape_timeout: {EVAL_S}s, evaluation_interval: {EVAL_S}s}}
rule_files: ['{RULES}']
scrape_configs:
  - job_name: probekit
    static_configs: [{{targets: ['127.0.0.1:{EXPORTER_PORT}']}}]
"""


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
    """The namespaces, their addresses and mounts; everything made is undone by close()."""

    def __init__(self) -> None:
        self.points: List[str] = []
        self.holder: Optional[subprocess.Popen] = None
        self.mntns = ""
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

    def grow(self, count: int) -> None:
        """Client K: namespace srvscaleK, its veth's far end on the bridge, its mount BASE/K; then
        an untimed round, so that the first exporter after it sees no MKDIR or CREATE the next does
        not (the kept run, from before this round, did: bench/README.md)."""
        while len(self.points) < count:
            k, ns = len(self.points), f"srvscale{len(self.points)}"
            run("ip", "netns", "add", ns)
            self.made.append(["ip", "netns", "del", ns])
            run("ip", "link", "add", f"srvs{k}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            run("ip", "link", "set", f"srvs{k}", "master", BRIDGE, "up")
            run("ip", "-n", ns, "addr", "add", f"{address(k)}/16", "dev", "eth0")
            run("ip", "-n", ns, "link", "set", "eth0", "up")
            point = f"{BASE}/{k}"
            os.makedirs(point, exist_ok=True)
            run("nsenter", f"--mount={self.mntns}", f"--net=/run/netns/{ns}", "mount", "-t", "nfs", "-o",
                "vers=3,nosharecache,nolock", f"{SERVER}:{EXPORT}", point)
            self.points.append(point)
        client_io(self.mntns, self.points)  # new clients' directories and files: every later round alike

    def io(self) -> None:
        client_io(self.mntns, self.points)

    def close(self) -> None:
        for point in reversed(self.points):
            if subprocess.run(["nsenter", f"--mount={self.mntns}", "umount", point]).returncode:
                subprocess.run(["nsenter", f"--mount={self.mntns}", "umount", "-f", "-l", point])
        if self.holder is not None:
            self.holder.kill()
            self.holder.wait()
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


def rule_evaluation() -> Dict[str, Any]:
    """A fresh Prometheus scraping the exporter with the shipped rules: after two evaluations
    (rates need two scrapes), RULE_EVALS evaluations' time, all groups summed, read from its
    own prometheus_rule_group_last_duration_seconds at each."""
    shutil.rmtree(PROM_DIR, ignore_errors=True)
    os.makedirs(PROM_DIR)
    with open(os.path.join(PROM_DIR, "prometheus.yml"), "w") as handle:
        handle.write(PROM_CONFIG)
    prom = start(["prometheus", f"--config.file={PROM_DIR}/prometheus.yml", f"--storage.tsdb.path={PROM_DIR}/data",
                  f"--web.listen-address=127.0.0.1:{PROM_PORT}"], "Server is ready to receive web requests",
                 "/tmp/bench-srvscale-prometheus.log")
    try:
        seen, totals = 0, []
        deadline = time.monotonic() + EVAL_S * (RULE_EVALS + 10) + 120
        while len(totals) < RULE_EVALS and time.monotonic() < deadline:
            text = fetch(PROM_PORT)
            done = int(min(sample_values(text, "prometheus_rule_group_iterations_total").values(), default=0))
            if done > seen and done >= 3:
                totals.append(sum(sample_values(text, "prometheus_rule_group_last_duration_seconds").values()))
            seen = max(seen, done)
            time.sleep(EVAL_S / 4)
        text = fetch(PROM_PORT)
        head = sample_values(text, "prometheus_tsdb_head_series")
        failed = sum(sample_values(text, "prometheus_rule_evaluation_failures_total").values())
        rules = sum(sample_values(text, "prometheus_rule_group_rules").values())
    finally:
        stop(prom)
        shutil.rmtree(PROM_DIR, ignore_errors=True)
    if len(totals) < RULE_EVALS:
        raise RuntimeError(f"Prometheus evaluated the rules {seen} times only")
    return {"median_s": statistics.median(totals), "evals_s": totals, "rules": int(rules),
            "head_series": int(sum(head.values())), "failures": int(failed)}


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
        res["rules"] = rule_evaluation()
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


def in_guest(profile: bool, sizes_wanted: Tuple[int, ...] = CLIENTS) -> Dict[str, Any]:
    sizes: List[Dict[str, Any]] = []
    res: Dict[str, Any] = {"kernel": os.uname().release, "scrapes": SCRAPES, "frames": FRAMES,
                           "rule_evals": RULE_EVALS, "limits": list(LIMITS), "sizes": sizes}
    clients, node = Clients(), None
    try:
        clients.open()
        node = start(["prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{NODE_PORT}",
                      "--collector.disable-defaults", "--collector.nfsd"], "Listening", "/tmp/bench-srvscale-node.log")
        for count in sizes_wanted:
            began = time.monotonic()
            clients.grow(count)
            row: Dict[str, Any] = {"clients": count, "grow_s": round(time.monotonic() - began, 1)}
            for name, extra in LIMITS.items():
                row[name] = exporter_at(clients, extra)
            row["nfsdtop"] = nfsdtop_here(clients, profile and count == sizes_wanted[-1])
            row["node_exporter"] = scrape_times(NODE_PORT, SCRAPES)
            row["server_clients"] = len(nfs_clients())
            sizes.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    finally:
        if node is not None:
            stop(node)
        clients.close()
    return res


def nfsdtop_here(clients: Clients, profile: bool) -> Dict[str, Any]:
    """nfsdtop_frames() in a process of its own, on the share's code."""
    cmd = [sys.executable, os.path.abspath(__file__), "--nfsdtop-here", clients.mntns] + clients.points
    done = subprocess.run(cmd + (["--profile"] if profile else []), cwd=PROJECT, env=dict(os.environ, PYTHONPATH=PROJECT),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=3600)
    if done.returncode:
        raise RuntimeError(f"nfsdtop's intervals: {done.stderr[-1000:]}")
    return json.loads(done.stdout)


def per_client_fit(res: Dict[str, Any], part: str, field: str, form: str = "") -> Tuple[float, float]:
    """Least-squares (intercept, slope per client) of one figure over the sizes."""
    xs = [row["clients"] for row in res["sizes"]]
    ys = [float((row[part][form] if form else row[part])[field]) for row in res["sizes"]]
    slope, intercept = statistics.linear_regression(xs, ys)
    return intercept, slope


def rules_over_series(run: Dict[str, Any]) -> bool:
    """Whether Prometheus held the exporter's series when it evaluated the rules: a scrape
    slower than its timeout (EVAL_S) leaves it only its own `up` and scrape_* series, and the
    rules' time is then that of rules over nothing."""
    return run["rules"]["head_series"] >= run["samples"]


def report(res: Dict[str, Any]) -> str:
    ms = lambda seconds: f"{seconds * 1000:.0f} ms"  # noqa: E731
    mib = lambda kib: f"{kib / 1024:.1f} MiB"  # noqa: E731
    lines = [f"bench_server_scale on {res['kernel']} (medians of {res['scrapes']} scrapes, {res['frames']} "
             f"intervals, {res['rule_evals']} rule evaluations)",
             "| clients | " + " | ".join(f"{n} scrape | {n} samples (nfsd) | {n} RSS (peak) | {n} rules"
                                         for n in res["limits"])
             + " | nfsdtop table | nfsdtop --json | nfsdtop RSS (peak) | node_exporter scrape (samples) |"]
    for row in res["sizes"]:
        cells = [f"{ms(row[n]['median_s'])} | {row[n]['samples']} ({row[n]['nfsd_samples']}) | "
                 f"{mib(row[n]['rss_kib'])} ({mib(row[n]['hwm_kib'])}) | "
                 + (ms(row[n]['rules']['median_s']) if rules_over_series(row[n]) else "not scraped")
                 for n in res["limits"]]
        top = row["nfsdtop"]
        lines.append(f"| {row['clients']} | " + " | ".join(cells) +
                     f" | {ms(top['text']['median_s'])} | {ms(top['json']['median_s'])} | {mib(top['rss_kib'])} "
                     f"({mib(top['hwm_kib'])}) | {ms(row['node_exporter']['median_s'])} "
                     f"({row['node_exporter']['samples']}) |")
    for name in res["limits"]:
        _b, time_slope = per_client_fit(res, name, "median_s")
        _b, series = per_client_fit(res, name, "nfsd_samples")
        lines.append(f"{name}: {time_slope * 1000:.2f} ms and {series:.1f} nfsd samples per client")
    for form in ("text", "json"):
        _b, slope = per_client_fit(res, "nfsdtop", "median_s", form)
        lines.append(f"nfsdtop {form}: {slope * 1e6:.0f} us per client")
    if "profile" in res["sizes"][-1]["nfsdtop"]:
        lines += ["--- profile, one nfsdtop --json interval", res["sizes"][-1]["nfsdtop"]["profile"]]
    return "\n".join(lines)


def main(argv: List[str]) -> int:
    if "--nfsdtop-here" in argv:
        args = [a for a in argv[argv.index("--nfsdtop-here") + 1:] if a != "--profile"]
        print(json.dumps(nfsdtop_frames(args[0], args[1:], "--profile" in argv)))
        return 0
    if "--in-guest" in argv:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: namespaces, mounts, export undone
        sizes = tuple(int(n) for n in argv[argv.index("--sizes") + 1].split(",")) if "--sizes" in argv else CLIENTS
        print(json.dumps(in_guest("--profile" in argv, sizes)))
        return 0
    lab = argv[argv.index("--lab") + 1] if "--lab" in argv else None
    out = argv[argv.index("--json") + 1] if "--json" in argv else "/tmp/bench_server_scale.json"
    began, load = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), os.getloadavg()
    kept: List[Dict[str, Any]] = []

    def keep(data: Dict[str, Any]) -> str:
        kept.append(data)
        return report(data)

    code = run_in_lab(lab, "bench-server-scale", "python3 bench/bench_server_scale.py --in-guest" +
                      (" --profile" if "--profile" in argv else ""), 7200, keep, kernel="6.12")
    if kept:
        host = {"began": began, "ended": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                "load_start": load, "load_end": os.getloadavg(), "cpus": os.cpu_count()}
        with open(out, "w") as handle:
            json.dump(dict(kept[0], host=host), handle, indent=1)
        print(f"bench_server_scale: {began} to {host['ended']}, host load {load[0]:.1f} at the start, "
              f"{host['load_end'][0]:.1f} at the end; JSON in {out}")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))

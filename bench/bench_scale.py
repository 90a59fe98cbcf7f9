"""nfs-exporter's cost as the mounts grow: 1, 10, 50 and 100 NFSv3 mounts in one lab guest,
beside node_exporter's scrape of the same mounts.

Per size, in one guest (6.12, core): MOUNTS[i] extra NFSv3 mounts of the guest's own export
(`nosharecache`: a superblock each, bench_exporter's), a fresh nfs-exporter per size and per
tree, bench_exporter's workload once on every mount (write, fsync, open, read, stat), then
one warm scrape and SCRAPES timed ones: the median wall time of a whole /metrics GET, the
samples served, VmRSS after them and VmHWM; node_exporter (mountstats and nfs collectors,
what a fleet scrapes beside it) scraped as many times over the same mounts.

Trees: `--tree NAME=PATH` (repeatable) runs the exporter of another checkout in the share
(e.g. a copy of main as `.before`: `--tree before=.before --tree after=.` for both in one
boot); default the share's own, as "after".
`--profile` adds, at the largest size, cProfile's top functions of one scrape of each tree,
in-process on the tree's own code (a Session as the exporter opens it, the WSGI app it serves).

  flock /tmp/probekit-lab.lock .venv/bin/python bench/bench_scale.py [--lab NAME] [--tree before=.before]
  python3 bench/bench_scale.py --in-guest [--tree ...] [--profile]   # inside a guest, as root
"""
from __future__ import annotations

import io
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from typing import Any, Dict, List, Optional, Tuple

from bench_exporter import BASE, bench_dir, drop_caches, scrape_times, start, status_kib, stop, workload
from lab_run import help_asked, run_in_lab

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MOUNTS = (1, 10, 50, 100)
SCRAPES = 5
EXPORTER_PORT, NODE_PORT = 19913, 9102


def grow(mounted: List[str], count: int) -> None:
    """Mount /mnt/nfs3's export under BASE until `count` extra mounts are there."""
    server = next(line.split()[0] for line in open("/proc/mounts") if line.split()[1] == "/mnt/nfs3")
    while len(mounted) < count:
        point = f"{BASE}/{len(mounted)}"
        os.makedirs(point, exist_ok=True)
        subprocess.run(["mount", "-t", "nfs", "-o", "vers=3,nosharecache", server, point], check=True)
        mounted.append(point)
        os.makedirs(bench_dir(point), exist_ok=True)


def exporter_at(tree: str, points: List[str]) -> Dict[str, Any]:
    """One exporter of `tree` over the mounts there: workload, scrapes, memory."""
    env = dict(os.environ, PYTHONPATH=tree)
    argv = [sys.executable, "-m", "probes.exporter", "--port", str(EXPORTER_PORT), "--backend", "core"]
    out = open("/tmp/bench-scale-exporter.log", "w")
    proc = subprocess.Popen(argv, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600
        while "probe attached" not in open("/tmp/bench-scale-exporter.log").read():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"exporter of {tree}: {open('/tmp/bench-scale-exporter.log').read()[-500:]}")
            time.sleep(0.5)
        drop_caches()
        for point in points:
            workload(bench_dir(point))
        time.sleep(2)
        urllib.request.urlopen(f"http://127.0.0.1:{EXPORTER_PORT}/metrics", timeout=120).read()  # warm
        res = scrape_times(EXPORTER_PORT, SCRAPES)
        res.update(rss_kib=status_kib(proc.pid, "VmRSS"), hwm_kib=status_kib(proc.pid, "VmHWM"))
        return res
    finally:
        stop(proc)


def profile_scrape(points: List[str], top: int = 25) -> str:
    """cProfile of one scrape, in this process, on the code PYTHONPATH names: the exporter's
    Session and collectors, encoded by probes.exposition (a tree without it: through the WSGI
    app it served, prometheus_client's where the tree had no app of its own)."""
    import cProfile
    import pstats
    import threading
    from functools import partial

    from discover.spec import serves_fstype
    from probes import exporter
    from probes.commands import find_target
    from probes.model import Tool
    from probes.mounts import MountTable
    from probes.runtime import Session

    target = find_target("nfs", None)
    tool = Tool(dist=True, inflight=True, dist_unit_ns=1, per_mount=True, lat_sum=True, cgroup_limit=0)
    with Session("bench-scale", tool, target.ops(None), target.spec, False, backend="core") as session:
        for point in points:
            workload(bench_dir(point))
        collector = exporter.FsCollector(session, threading.Lock(),
                                         MountTable(serves=partial(serves_fstype, target.spec)))
        whole = exporter.Collector([collector], os.uname().release, "", "core", "")
        try:
            from probes.exposition import encode

            def scrape() -> int:
                return len(encode(whole.collect()))
        except ImportError:
            from prometheus_client import CollectorRegistry
            from prometheus_client.exposition import make_wsgi_app

            registry = CollectorRegistry()
            registry.register(whole)
            app = getattr(exporter, "metrics_app", make_wsgi_app)(registry)
            environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": ""}

            def scrape() -> int:
                return sum(len(part) for part in app(environ, lambda *_: None))

        scrape()
        prof = cProfile.Profile()
        started = time.perf_counter()
        prof.runcall(scrape)
        wall = time.perf_counter() - started
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(top)
    return f"one scrape under cProfile: {wall * 1000:.0f} ms\n" + text.getvalue()


def in_guest(trees: Dict[str, str], profile: bool) -> Dict[str, Any]:
    mounted: List[str] = []
    node = None
    sizes: List[Dict[str, Any]] = []
    res: Dict[str, Any] = {"kernel": os.uname().release, "scrapes": SCRAPES, "trees": list(trees), "sizes": sizes}
    try:
        node = start(["prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{NODE_PORT}",
                      "--collector.disable-defaults", "--collector.mountstats", "--collector.nfs"], "Listening",
                     "/tmp/bench-scale-node.log")
        for count in MOUNTS:
            grow(mounted, count)
            row: Dict[str, Any] = {"mounts": count}
            for name, tree in trees.items():
                try:
                    row[name] = exporter_at(tree, mounted)
                except (OSError, RuntimeError) as exc:  # the other trees' figures still count
                    row[name] = {"error": str(exc)[-500:]}
            row["node_exporter"] = scrape_times(NODE_PORT, SCRAPES)
            sizes.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
        if profile:
            res["profiles"] = {}
            for name, tree in trees.items():
                cmd = [sys.executable, os.path.abspath(__file__), "--profile-here"] + mounted
                done = subprocess.run(cmd, cwd=tree, env=dict(os.environ, PYTHONPATH=tree), capture_output=True,
                                      text=True, timeout=1800)
                res["profiles"][name] = done.stdout if done.returncode == 0 else done.stderr[-2000:]
    finally:
        if node is not None:
            stop(node)
        for point in reversed(mounted):
            subprocess.run(["umount", point], check=False)
    return res


def per_mount_fit(res: Dict[str, Any], tree: str, field: str) -> Tuple[float, float]:
    """Least-squares (intercept, slope per mount) of one tree's figure over the sizes."""
    xs = [row["mounts"] for row in res["sizes"]]
    ys = [float(row[tree][field]) for row in res["sizes"]]
    slope, intercept = statistics.linear_regression(xs, ys)
    return intercept, slope


def report(res: Dict[str, Any]) -> str:
    lines = [f"bench_scale on {res['kernel']} (median of {res['scrapes']} scrapes each)",
             "| mounts | " + " | ".join(f"{t} scrape | {t} samples | {t} RSS" for t in res["trees"])
             + " | node_exporter scrape | its samples |"]
    for row in res["sizes"]:
        cells = [f"{row[t]['median_s'] * 1000:.0f} ms | {row[t]['samples']} | {row[t]['rss_kib'] / 1024:.1f} MiB"
                 for t in res["trees"]]
        lines.append(f"| {row['mounts']} | " + " | ".join(cells) +
                     f" | {row['node_exporter']['median_s'] * 1000:.0f} ms | {row['node_exporter']['samples']} |")
    for tree in res["trees"]:
        _b, ms = per_mount_fit(res, tree, "median_s")
        _b, series = per_mount_fit(res, tree, "samples")
        lines.append(f"{tree}: {ms * 1000:.2f} ms, {series:.0f} samples per mount; {ms / series * 1e6:.1f} us per "
                     "sample")
    for name, text in res.get("profiles", {}).items():
        lines += [f"--- profile, {name}", text]
    return "\n".join(lines)


def parse_trees(argv: List[str]) -> Dict[str, str]:
    """`--tree NAME=PATH` (relative to the project) in the order given; none: this tree as "after"."""
    trees = {}
    for i, arg in enumerate(argv[:-1]):
        if arg == "--tree":
            name, _, path = argv[i + 1].partition("=")
            trees[name] = os.path.normpath(os.path.join(PROJECT, path))
    return trees or {"after": PROJECT}


def main(argv: List[str]) -> int:
    if help_asked(argv, __doc__):
        return 0
    if "--profile-here" in argv:
        print(profile_scrape(argv[argv.index("--profile-here") + 1:]))
        return 0
    if "--in-guest" in argv:
        print(json.dumps(in_guest(parse_trees(argv), "--profile" in argv)))
        return 0
    extra = " ".join(a for i, a in enumerate(argv[1:], 1) if a == "--profile" or a == "--tree" or
                     (i > 1 and argv[i - 1] == "--tree"))
    lab = argv[argv.index("--lab") + 1] if "--lab" in argv else None
    return run_in_lab(lab, "bench-scale", f"python3 bench/bench_scale.py --in-guest {extra}", 5400, report,
                      kernel="6.12")


if __name__ == "__main__":
    sys.exit(main(sys.argv))

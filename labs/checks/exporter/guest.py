"""Guest side of the exporter lab check: nfs-exporter, Prometheus and node_exporter around the known workload.

Runs inside a lab guest (root, bcc, python3-prometheus-client, Debian's prometheus and
prometheus-node-exporter installed but not running, /mnt/nfs3 and /mnt/nfs42) from the
read-only project share. It starts nfs-exporter, node_exporter (mountstats collector) and
a Prometheus scraping both, all on 127.0.0.1, runs the workload on each mount and prints
one JSON document: per mount phase what the workload issued and how much each op's series
moved between two direct scrapes, what PromQL through Prometheus' HTTP API answers (per
op and mount counts; the join with node_exporter's mountstats series; a median), `promtool
check metrics` on both scraped texts (and the texts), the exporter's exit after SIGTERM,
and the tracing programs / kprobe_events before, during and after it. Each mount's workload
runs in a systemd scope unit of its own, so that with --cgroup-label (passed on to the
exporter) each unit's series can be told apart; without it no series has a cgroup label.
With --late-nfsv4 the exporter starts on a v3-only client (nfsv4 unloaded, /mnt/nfs42
unmounted) and, once nfsv4 is loaded and v4.2 mounted, before the workload, must trace it
beside its running programs, its counters going on (core), or attach again (bcc).

  python3 labs/checks/exporter/guest.py [--cgroup-label] [--late-nfsv4]
"""
from __future__ import annotations

import datetime
import json
import os
import re
import signal
import subprocess
import sys
import shutil
import time
import urllib.parse
import urllib.request
from typing import Any, Callable, Dict, List, Optional, Tuple

# run as a script (python3 PATH in the guest): its project tree is not on sys.path by itself
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
from labs.checks.probes.guest import (EVIDENCE_WAIT_S, GAP_S, IDENTITY_UNITS, MOUNTS, in_scope,  # noqa: E402
                                      installed, json_lines, kernel_attachments, netem, netem_delay, nfs_server,
                                      prepare, route_device, mount_v42, slice_path, stop, tool, user_env,
                                      wait_flushed, wait_ready, workload)
from labs.checks.shared import guest_path, interval_in  # noqa: E402

PORT, NODE_PORT, PROM_PORT = 19910, 9100, 9090
SCRAPE_S = 2
#: netem's round trip for the quantile phase: Prometheus scrapes the exporter over lo too, and
#: a scrape (handshake, request, reply) must still end inside SCRAPE_S with the delay on; at
#: 1000 ms (the probe checks' DELAYS) no scrape succeeded for 600 s in CI (6.1 and 7.2)
QUANTILE_RTT_MS = 400
#: the exporter's --gone-mount-grace here (default 300 s): the check waits it out
GRACE_S = 10
PROM_DIR = "/tmp/probekit-prometheus"
#: the rules the Debian package ships, loaded by the check's Prometheus as an operator would
RULES = "/usr/share/probekit/prometheus/probekit-rules.yml"
PROM_CONFIG = f"""global: {{scrape_interval: {SCRAPE_S}s, evaluation_interval: {SCRAPE_S}s}}
rule_files: ['{RULES}']
scrape_configs:
  - job_name: probekit
    static_configs: [{{targets: ['127.0.0.1:{PORT}']}}]
  - job_name: node
    static_configs: [{{targets: ['127.0.0.1:{NODE_PORT}']}}]
"""
#: the workload's exact counts (open/read/write/getattr/fsync), as the probe lab checks count them
EXACT = ("read", "write", "open", "getattr", "fsync")
QUERIES = {
    "counts": 'sum by (op, mountpoint) (probekit_nfs_ops_total{mountpoint!=""})',
    "join": 'probekit_nfs_ops_total{op="read"} and on (export, mountaddr, protocol) '
            'node_mountstats_nfs_operations_requests_total',
    "node_mounts": 'count by (export, mountaddr, protocol) (node_mountstats_nfs_operations_requests_total)',
}


#: the op whose quantiles PromQL and nfsdist must agree on: the workload's four reads after a
#: cache drop (readahead serves two of them: only the upper half waits for the server)
QUANTILE_OP = "read"
QUANTILES = (0.5, 0.9)
#: histogram_quantile over exactly one phase: the bucket counts at its end minus those at its start
PHASE_QUANTILE = ('histogram_quantile({q}, sum by (le) ({series} @ {end}) - sum by (le) ({series} @ {start}))')
QUANTILE_SERIES = f'probekit_nfs_op_latency_seconds_bucket{{op="{QUANTILE_OP}",mountpoint="{MOUNTS["nfs3"]}"}}'


def fetch(url: str, what: str) -> str:
    """An HTTP answer from one of the check's servers, however slow a loaded guest makes it
    (a direct scrape took over 30 s at load 10 on the 2-core host): EVIDENCE_WAIT_S at most."""
    try:
        return urllib.request.urlopen(url, timeout=EVIDENCE_WAIT_S).read().decode()
    except OSError as exc:
        raise RuntimeError(f"{what} never answered {url} (waited {EVIDENCE_WAIT_S:.0f} s): {exc}") from exc


def scrape(port: int) -> str:
    return fetch(f"http://127.0.0.1:{port}/metrics", "the exporter" if port == PORT else "node_exporter")


def promql(query: str, at: Optional[float] = None) -> List[Dict[str, Any]]:
    """An instant query, evaluated now or at `at` (epoch seconds)."""
    params = {"query": query}
    if at is not None:
        params["time"] = f"{at:.3f}"
    url = f"http://127.0.0.1:{PROM_PORT}/api/v1/query?" + urllib.parse.urlencode(params)
    answer = json.loads(fetch(url, "Prometheus"))
    if answer.get("status") != "success":
        raise RuntimeError(f"PromQL {query!r}: {answer}")
    return answer["data"]["result"]


def wait_http(url: str, what: str, proc: subprocess.Popen, timeout: float = EVIDENCE_WAIT_S) -> None:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=5).read()
            return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{what} never answered at {url} (waited {timeout:.0f} s)")


def service(argv: List[str], log: str) -> subprocess.Popen:
    """A server of this check, in its own process group (ended by end())."""
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=open(log, "w"), start_new_session=True)


def end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def check_metrics(text: str) -> Dict[str, Any]:
    res = subprocess.run(["promtool", "check", "metrics"], input=text, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, universal_newlines=True)
    return {"rc": res.returncode, "output": res.stdout}


def node_and_prometheus(servers: List[subprocess.Popen]) -> None:
    """node_exporter (mountstats on) and a Prometheus scraping it and nfs-exporter, on loopback
    (added to `servers` as they start, so that the caller ends whatever started)."""
    shutil.rmtree(PROM_DIR, ignore_errors=True)
    os.makedirs(PROM_DIR)
    with open(os.path.join(PROM_DIR, "prometheus.yml"), "w") as handle:
        handle.write(PROM_CONFIG)
    node = service(["prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{NODE_PORT}",
                    "--collector.disable-defaults", "--collector.mountstats"], "/tmp/node-exporter.err")
    servers.append(node)
    prom = service(["prometheus", f"--config.file={PROM_DIR}/prometheus.yml", f"--storage.tsdb.path={PROM_DIR}/data",
                    f"--web.listen-address=127.0.0.1:{PROM_PORT}"], "/tmp/prometheus.err")
    servers.append(prom)
    wait_http(f"http://127.0.0.1:{NODE_PORT}/metrics", "prometheus-node-exporter", node)
    wait_http(f"http://127.0.0.1:{PROM_PORT}/-/ready", "prometheus", prom)


def samples(text: str, name: str, by: Tuple[str, ...] = ("op", "mountpoint")) -> Dict[str, float]:
    """"op mountpoint" (the values of `by`, space-separated) -> sum of one family's series."""
    out: Dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line.rsplit(" ", 1)
            fields = dict(part.split("=", 1) for part in labels[len(name) + 1:-1].split('",'))
            key = " ".join(fields.get(label, "").strip(chr(34)) for label in by)
            out[key] = out.get(key, 0.0) + float(value)
    return out


def op_samples(text: str, name: str) -> Dict[str, float]:
    """op -> value of a family labelled by op first, summed over its other labels
    (probekit_nfs_missed_total: per op and cause)."""
    out: Dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + '{op="'):
            labels, value = line.rsplit(" ", 1)
            op = labels[len(name) + 5:].split('"', 1)[0]
            out[op] = out.get(op, 0.0) + float(value)
    return out


ATTACHED = "nfs-exporter: probe attached: "


def start(port: int, log: str, extra: List[str], ready: str = ATTACHED) -> subprocess.Popen:
    """The exporter, once it said `ready` (its probe is attached: compiling takes minutes under
    TCG; with --nfsd on a server without NFS mounts, its server probe is what gets attached)."""
    err = open(log, "w")
    proc = subprocess.Popen([installed("nfs-exporter"), "--port", str(port), "-v",
                             "--gone-mount-grace", str(GRACE_S)] + extra,
                            cwd="/", env=user_env(), stdout=subprocess.DEVNULL, stderr=err)
    wait_logged(proc, log, ready, 1)
    return proc


def wait_logged(proc: subprocess.Popen, log: str, text: str, times: int) -> float:
    """Seconds until the exporter has said `text` `times` times (ATTACHED: its probe is attached)."""
    started = time.monotonic()
    while time.monotonic() - started < EVIDENCE_WAIT_S:
        if proc.poll() is not None:
            raise RuntimeError(f"nfs-exporter exited {proc.returncode}: {open(log).read()}")
        if open(log).read().count(text) >= times:
            return round(time.monotonic() - started, 1)
        time.sleep(0.5)
    raise RuntimeError(f"nfs-exporter: never said {text!r} {times} times (waited {EVIDENCE_WAIT_S:.0f} s): "
                       f"{open(log).read()[-1000:]}")


#: what the exporter says once a module loaded after its start is traced beside its programs
NOW_TRACED = "nfs-exporter: module nfsv4 loaded after the start: now traced: "
#: stats of the NFSv3 mount's root before nfsv4 loads: counts the scrape after must still hold
LATE_STATS = 5


def late_nfsv4(proc: subprocess.Popen, log: str) -> Dict[str, Any]:
    """nfsv4 loaded and NFSv4.2 mounted under the running exporter, after it counted NFSv3
    operations: the scrapes before and after, the loader, and how long it took to say it
    traces nfsv4 (core: beside its programs) or to attach again (bcc)."""
    for _ in range(LATE_STATS):
        os.stat(MOUNTS["nfs3"])
    before = scrape(PORT)
    backend = next(line.split('backend="', 1)[1].split('"', 1)[0] for line in before.splitlines()
                   if line.startswith("probekit_bpf_loader_info{"))
    subprocess.run(["modprobe", "nfsv4"], check=True)
    mount_v42(nfs_server())
    seconds = wait_logged(proc, log, NOW_TRACED, 1) if backend == "core" else wait_logged(proc, log, ATTACHED, 2)
    return {"backend": backend, "seconds": seconds, "stats": LATE_STATS, "before": before, "after": scrape(PORT)}


def scrapes(job: str, window: str = "20m") -> List[Tuple[float, bool]]:
    """(timestamp, succeeded) of each scrape of a job Prometheus holds from the last `window`:
    its `up` samples, stamped with the scrape's start like every sample of that scrape."""
    return [(float(stamp), value == "1") for row in promql(f'up{{job="{job}"}}[{window}]')
            for stamp, value in row["values"]]


def scraped_after(moment: float, what: str, jobs: Tuple[str, ...] = ("probekit",)) -> float:
    """The first evaluation time at which each job's last scrape succeeded and started after
    `moment`, once Prometheus holds it: PromQL there sees every operation that ended by `moment`,
    and no series made stale by a failed scrape (a loaded 1-vCPU guest can miss the scrape
    timeout, and `@` a stale time gave []). Waits at most EVIDENCE_WAIT_S; its expiry raises,
    saying the scrape never came."""
    deadline = time.monotonic() + EVIDENCE_WAIT_S
    while True:
        held = {job: scrapes(job) for job in jobs}
        for at in sorted({stamp for job in jobs for stamp, ok in held[job] if ok and stamp > moment}):
            last = {job: max((s for s in held[job] if s[0] <= at), default=(0.0, False)) for job in jobs}
            if all(ok and stamp > moment for stamp, ok in last.values()):
                return at
        if time.monotonic() > deadline:
            raise RuntimeError(f"Prometheus never held a successful scrape of {' and '.join(jobs)} after {what} "
                               f"(waited {EVIDENCE_WAIT_S:.0f} s; its last scrapes: "
                               f"{ {job: held[job][-3:] for job in jobs} })")
        time.sleep(SCRAPE_S / 2)


#: the shipped recording rules read back, each at its largest over the run: a mount's workload
#: may have ended more than the rules' 5 minutes before the check reads them
RECORDED = {"ops_rate": "instance_mountpoint_op:probekit_nfs_ops:rate5m",
            "p99": "instance_mountpoint_op:probekit_nfs_op_latency_seconds:p99_rate5m"}


def epoch(stamp: str) -> float:
    """An RFC 3339 time with nanoseconds (Prometheus' JSON) as epoch seconds; 0 for none."""
    match = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", stamp)
    if not match:
        return 0.0
    whole = datetime.datetime.strptime(match[1] + match[3].replace("Z", "+00:00"), "%Y-%m-%dT%H:%M:%S%z")
    return whole.timestamp() + float(match[2] or 0)


def shipped_rules() -> List[Tuple[str, str]]:
    """(record|alert, name) of each rule in the installed rules file, in its order."""
    with open(RULES) as handle:
        return re.findall(r"^\s*- (record|alert): (\S+)", handle.read(), re.M)


def rules_evaluated_after(moment: float) -> Dict[str, Any]:
    """The shipped rules once Prometheus evaluated every group after `moment` (EVIDENCE_WAIT_S at
    most): each rule's health and last error, the recorded series at their largest over the run,
    and the alerts active then."""
    deadline = time.monotonic() + EVIDENCE_WAIT_S
    while True:
        groups = json.loads(fetch(f"http://127.0.0.1:{PROM_PORT}/api/v1/rules", "Prometheus"))["data"]["groups"]
        last = [epoch(group.get("lastEvaluation", "")) for group in groups]
        if groups and min(last) > moment:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"Prometheus never evaluated the rules of {RULES} after the workloads "
                               f"(waited {EVIDENCE_WAIT_S:.0f} s; groups: {[g.get('name') for g in groups]})")
        time.sleep(SCRAPE_S / 2)
    at = max(last)
    alerts = json.loads(fetch(f"http://127.0.0.1:{PROM_PORT}/api/v1/alerts", "Prometheus"))["data"]["alerts"]
    return {"at": at, "shipped": shipped_rules(),
            "rules": [{"group": group["name"], "name": rule["name"], "type": rule["type"],
                       "health": rule.get("health", ""), "error": rule.get("lastError", "")}
                      for group in groups for rule in group["rules"]],
            "recorded": {key: promql(f"max_over_time({name}[30m])", at=at) for key, name in RECORDED.items()},
            "alerts": [{"name": alert["labels"].get("alertname"), "state": alert.get("state"),
                        "labels": alert["labels"]} for alert in alerts]}


def unit_workload(name: str, mount: str, tag: str, units: List[subprocess.Popen]) -> Tuple[Dict[str, int], str]:
    """The workload in a scope unit of its own slice (IDENTITY_UNITS' a or b), which stays until
    the end (appended to `units`): its series must not leave after the gone-cgroup grace.
    What it issued, and its cgroup's path."""
    slice_name = IDENTITY_UNITS[name][0]
    unit = f"probekit-exporter-{tag}-{time.monotonic_ns()}"
    child = in_scope(slice_name, unit, [sys.executable, guest_path("probes"), "workload-on", mount, tag,
                                        f"/tmp/{unit}.leave"], stdout=subprocess.PIPE)
    units.append(child)
    line = child.stdout.readline() if child.stdout else ""
    if not line:
        raise RuntimeError(f"workload in {unit} printed nothing (exit {child.wait()})")
    return json.loads(line), f"{slice_path(slice_name)}/{unit}.scope"


def scraped_phase(work: Callable[..., Tuple[Dict[str, int], Optional[str]]],
                  *args: Any) -> Tuple[Dict[str, Any], float]:
    """work(*args) (the workload: what it issued, and its cgroup or None) between two direct
    scrapes, each after a quiet gap: its phase ("issued", "cgroup", "moved": per series how much
    each "op mountpoint" moved, and per "op mountpoint cgroup" in "by_cgroup"; "missed": what
    probekit_nfs_missed_total moved by), and when the workload ended."""
    time.sleep(GAP_S)
    first = scrape(PORT)
    issued, cgroup = work(*args)
    ended = time.time()
    time.sleep(GAP_S)
    text = scrape(PORT)
    moved = {series: grown(samples(first, series), samples(text, series))
             for series in ("probekit_nfs_ops_total", "probekit_nfs_op_latency_seconds_count",
                            "probekit_nfs_bytes_total")}
    by = ("op", "mountpoint", "cgroup")
    moved["by_cgroup"] = grown(samples(first, "probekit_nfs_ops_total", by), samples(text, "probekit_nfs_ops_total", by))
    missed = grown(op_samples(first, "probekit_nfs_missed_total"), op_samples(text, "probekit_nfs_missed_total"))
    return {"issued": issued, "moved": moved, "cgroup": cgroup, "missed": missed}, ended


def grown(before: Dict[str, float], after: Dict[str, float]) -> Dict[str, float]:
    """How much each series of the later scrape moved since the earlier (those that moved)."""
    return {key: value - before.get(key, 0) for key, value in after.items() if value != before.get(key, 0)}


def timed_workload(mount: str, tag: str, dist_log: str) -> Dict[str, Any]:
    """The workload after a quiet gap, bracketed by evidence: `at_start`, a successful scrape
    Prometheus holds from after the gap began and before the workload, and `end`, the first one
    after the workload ended (the times of PromQL's `@`); `flushed`, when nfsdist had printed
    the interval holding its last operations (wall times, for its interval stamps)."""
    time.sleep(GAP_S)
    at_start = scraped_after(time.time() - GAP_S, f"the quiet gap before the {tag} phase")
    start = time.time()
    issued = workload(mount, tag)
    end_ops = time.time()
    return {"issued": issued, "at_start": at_start, "start": start, "end_ops": end_ops,
            "end": scraped_after(end_ops, f"the {tag} phase's workload"),
            "flushed": wait_flushed([dist_log], end_ops, f"the {tag} phase's workload")}


def phase_quantiles(phase: Dict[str, Any]) -> Dict[str, List[Dict[str, Any]]]:
    return {str(q): promql(PHASE_QUANTILE.format(q=q, series=QUANTILE_SERIES, start=f"{phase['at_start']:.3f}",
                                                 end=f"{phase['end']:.3f}"), at=phase["end"]) for q in QUANTILES}


def nfsdist_phase_hist(intervals: List[Dict[str, Any]], phase: Dict[str, Any]) -> Dict[str, int]:
    """nfsdist's QUANTILE_OP histogram (interval-start usecs -> count) over one phase's intervals."""
    window = {"start": phase["start"], "flushed": phase["flushed"]}
    hist: Dict[str, int] = {}
    for interval in intervals:
        if interval_in(interval["ts"], window):
            for bucket in interval["ops"][QUANTILE_OP]["hist"]:
                if bucket["count"]:
                    key = f"{bucket['interval-start']}-{bucket['interval-end']}"
                    hist[key] = hist.get(key, 0) + bucket["count"]
    return hist


def gone_mount(mount: str) -> Dict[str, Any]:
    """umount a mount the exporter has series of: which mount points the scrapes label right
    after, and after the grace (the first scrape past it that no longer labels the mount, or,
    when none did within EVIDENCE_WAIT_S, the last one); then mount it again (the boot's later
    checks use it)."""
    source = next(line.split()[0] for line in open("/proc/mounts") if line.split()[1] == mount)

    def seen() -> Dict[str, Any]:
        ops = samples(scrape(PORT), "probekit_nfs_ops_total")
        return {"mountpoints": sorted({key.split(" ", 1)[1] for key in ops}),
                "unlabelled": sum(v for key, v in ops.items() if key.split(" ", 1)[1] == "")}
    out: Dict[str, Any] = {"before": seen()}
    subprocess.run(["umount", mount], check=True)
    gone = time.monotonic()
    try:
        out["just_after"] = seen()
        time.sleep(GRACE_S)
        # the grace has passed: scrape until one no longer labels the mount (EVIDENCE_WAIT_S at most)
        while True:
            out["after_grace"] = seen()
            if mount not in out["after_grace"]["mountpoints"] or time.monotonic() - gone > GRACE_S + EVIDENCE_WAIT_S:
                break
            time.sleep(SCRAPE_S / 2)
        out["left_after_s"] = round(time.monotonic() - gone, 1)
    finally:
        subprocess.run(["mount", "-t", "nfs", "-o", "vers=4.2", source, mount], check=True)
    return out


def main(argv: List[str]) -> Dict[str, Any]:
    extra = [arg for arg in argv if arg == "--cgroup-label"]
    late = "--late-nfsv4" in argv
    for tag, mount in MOUNTS.items():
        prepare(mount, tag)
    before = kernel_attachments()
    log = "/tmp/exporter.err"
    started = time.monotonic()
    servers: List[subprocess.Popen] = []
    out: Dict[str, Any] = {"phases": {}, "kernel": os.uname().release, "cgroup_label": bool(extra),
                           "late_nfsv4": late}
    units: List[subprocess.Popen] = []
    proc = None
    dist = None
    dist_log = "/tmp/exporter-nfsdist.out"
    try:
        if late:  # before any probe holds nfsv4's functions
            subprocess.run(["umount", MOUNTS["nfs42"]], check=True)
            subprocess.run(["modprobe", "-r", "nfsv4"], check=False)
            out["nfsv4_at_start"] = os.path.exists("/sys/module/nfsv4")
        node_and_prometheus(servers)
        # nfsdist beside the exporter (its own probe, the same operations): both compile at once
        dist = tool(["nfsdist", "--json", "1"], dist_log)
        proc = start(PORT, log, extra)
        if late:
            out["late"] = late_nfsv4(proc, log)
        wait_ready(dist, dist_log)
        out["ready_s"] = round(time.monotonic() - started, 1)
        during = kernel_attachments()
        for (tag, mount), unit in zip(MOUNTS.items(), IDENTITY_UNITS):
            out["phases"][tag], workloads_end = scraped_phase(unit_workload, unit, mount, tag, units)
        # PromQL once Prometheus holds a successful scrape of both targets after the last workload
        out["promql_at"] = scraped_after(workloads_end, "the mounts' workloads", ("probekit", "node"))
        out["promql"] = {name: promql(query, at=out["promql_at"]) for name, query in QUERIES.items()}
        # two scrapes more: a series first scraped at promql_at has the second sample rate() needs
        out["rules"] = rules_evaluated_after(out["promql_at"] + 2 * SCRAPE_S)
        # quantiles of one phase, plain and with netem delay, from Prometheus and from nfsdist
        device = route_device(nfs_server())
        quantile: Dict[str, Any] = {"op": QUANTILE_OP, "rtt_delay_ms": QUANTILE_RTT_MS, "device": device,
                                    "phases": {"plain": timed_workload(MOUNTS["nfs3"], "nfs3", dist_log)}}
        with netem(device, netem_delay(device, QUANTILE_RTT_MS)):
            quantile["phases"]["delay"] = timed_workload(MOUNTS["nfs3"], "nfs3", dist_log)
        for phase in quantile["phases"].values():
            phase["promql"] = phase_quantiles(phase)
        out["quantile"] = quantile
        out["texts"] = {"probekit": scrape(PORT), "node": scrape(NODE_PORT)}
        # how many of Prometheus' scrapes of each target failed (a loaded guest misses the timeout)
        out["scrapes"] = {job: {"all": len(held), "failed": sum(not ok for _, ok in held)}
                          for job in ("probekit", "node") for held in [scrapes(job, "30m")]}
        out["gone"] = gone_mount(MOUNTS["nfs42"])
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(EVIDENCE_WAIT_S)
        if dist is not None:
            out["nfsdist"] = stop(dist, dist_log, signal.SIGINT)
        for server in servers:
            end(server)
        for child in units:
            child.terminate()
            child.wait()
        if late:  # the boot's later checks need v4.2 mounted, whatever happened here
            subprocess.run(["modprobe", "nfsv4"], check=False)
            mount_v42(nfs_server())
    intervals = json_lines(out["nfsdist"]["lines"], "ops")
    for phase in out["quantile"]["phases"].values():
        phase["nfsdist_hist"] = nfsdist_phase_hist(intervals, phase)
    out.update(rc=proc.returncode, stderr=open(log).read().splitlines(),
               attached={"before": before, "during": during, "after": kernel_attachments()})
    out["promtool"] = {name: check_metrics(text) for name, text in out["texts"].items()}
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))

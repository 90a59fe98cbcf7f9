"""promtool unit tests of packaging/prometheus/probekit-rules.yml, made from real lab scrapes, so
that the rules are tried on what nfs-exporter really serves and the expectations follow from
what happened in the run (the server stopped, a probe compiled again), not from numbers typed
to fit. Four runs:

- the 7.3 fault run (tests/fixtures/7.3.4+deb13-amd64/faults/): the exporter scraped about
  every second while the NFS server's QEMU was stopped for 30 s, then while it compiled a new
  probe after nfsv4 loaded; its per-mount in-flight series, on a 1 s grid (each grid point
  takes the last scrape at or before it);
- the 6.1 exporter run (tests/fixtures/6.1.0-50-amd64/exporter/): its last scrape, with both
  mounts' histograms and counters, placed 5 minutes after zero, where every counter of the
  probe started (its attach); rates are then the scrape's counts over 300 s and the p99 is the
  run's own;
- the 6.12 nfsdtop run (tests/fixtures/6.12.117+deb13-amd64/nfsdtop/): `nfs-exporter --nfsd`'s
  scrapes right before and right after the workload of its two clients, that window's increase
  repeated as a server that keeps the load: each client's share of the requests and bytes, and
  no noisy-client alert (127.0.0.1 sends most, but the load never changed);
- the 7.3 fleet run (tests/fixtures/7.3.4+deb13-amd64/fleet/): its server's exporter scraped as
  client-b's quiet reads began, as client-a's load began and as it ended: the noisy-client alert
  for client-a once its load has gone on, as the others' p99 rose, and not for the load alone.

    python3 tests/prometheus_rule_tests.py OUTDIR   # then: promtool test rules OUTDIR/*.yml
"""
from __future__ import annotations

import bisect
import gzip
import json
import math
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import yaml
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "packaging/prometheus/probekit-rules.yml"
FAULT_RUN = REPO / "tests/fixtures/7.3.4+deb13-amd64/faults/faults.json.gz"
EXPORTER_RUN = REPO / "tests/fixtures/6.1.0-50-amd64/exporter/exporter-run.json.gz"
IN_FLIGHT = {"in_flight": "probekit_nfs_mount_ops_in_flight", "oldest_s": "probekit_nfs_mount_oldest_in_flight_seconds"}
MOUNT_KEY = ("server", "export", "mountpoint")
#: the recording rules' grouping of the per-operation series
PER_MOUNT_OP = ("instance", "mountaddr", "export", "mountpoint", "op")
#: the per-operation families the rules read, as the scrape names their samples
SCRAPED = ("probekit_nfs_op_latency_seconds_bucket", "probekit_nfs_ops_total", "probekit_nfs_bytes_total",
           "probekit_nfs_missed_total", "probekit_nfs_probe_attached")
RATE_WINDOW_S = 300
NFSD_RUN = REPO / "tests/fixtures/6.12.117+deb13-amd64/nfsdtop/guest-run.json.gz"
#: the server families the server rules read
NFSD_SCRAPED = ("probekit_nfsd_requests_total", "probekit_nfsd_read_bytes_total", "probekit_nfsd_write_bytes_total")
NFSD_DURATION = "probekit_nfsd_request_duration_seconds_bucket"
FLEET_RUN = REPO / "tests/fixtures/7.3.4+deb13-amd64/fleet/guest-run-4.json.gz"
#: the fleet test's step, and how many steps hold the quiet window's rates (past the 5-minute window)
FLEET_STEP_S, QUIET_STEPS = 30, 12


def rules() -> Dict[str, Dict[str, Any]]:
    """Each rule of the shipped file by its alert or record name."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule.get("alert", rule.get("record")): rule for group in groups for rule in group["rules"]}


def instance(stderr: str) -> str:
    """host:port the exporter served on, as Prometheus' `instance` would name it."""
    return re.search(r"serving http://([^/]+)/metrics", stderr).group(1)


def series(name: str, labels: Dict[str, str]) -> str:
    return name + "{" + ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items())) + "}"


def values(points: List[Optional[float]]) -> str:
    """promtool's notation: a value per step; a series gone from a scrape is `stale` once (the
    marker Prometheus writes), then absent."""
    out: List[str] = []
    for i, point in enumerate(points):
        out.append(repr(point) if point is not None else "stale" if i and points[i - 1] is not None else "_")
    return " ".join(out)


def alert(name: str, labels: Dict[str, str]) -> Dict[str, Any]:
    """An expected firing alert: the rule's labels added, its annotations rendered for `labels`."""
    rule = rules()[name]
    render = {key: re.sub(r"{{ \$labels\.(\w+) }}", lambda m: labels[m.group(1)], text)
              for key, text in rule["annotations"].items()}
    return {"exp_labels": {**labels, **rule["labels"]}, "exp_annotations": render}


def threshold(name: str) -> float:
    """The number an alert's expression compares against."""
    return float(re.search(r"> (\d+(?:\.\d+)?)$", rules()[name]["expr"].strip()).group(1))


def fault_run_test() -> Dict[str, Any]:
    """The server stopped for 30 s: the stuck alert fires late in the stop, naming the server,
    export and mount, and not before the threshold, under packet loss, after the server answered
    again, or through the nfs-server restart (6 s); the probe's recompile after nfsv4 loaded (the
    mounts' series leave the scrapes: the exporter serves them only while attached) leaves the
    detached alert pending, shorter than its `for`."""
    data = json.load(gzip.open(FAULT_RUN))["data"]
    scrapes = data["nfs_exporter"]["scrapes"]
    where = instance(data["nfs_exporter"]["stderr"])
    start = scrapes[0]["mono"]
    monos = [s["mono"] for s in scrapes]
    grid = [scrapes[bisect.bisect_right(monos, start + t) - 1] for t in range(int(monos[-1] - start) + 1)]
    keys = sorted({tuple(s[k] for k in MOUNT_KEY) for scrape in scrapes for s in scrape["series"]})
    inputs = [{"series": series("probekit_nfs_probe_attached", {"instance": where}),
               "values": values([float(bool(scrape["series"])) for scrape in grid])}]
    for key in keys:
        at = [next((s for s in scrape["series"] if tuple(s[k] for k in MOUNT_KEY) == key), None) for scrape in grid]
        for field, name in IN_FLIGHT.items():
            inputs.append({"series": series(name, {"instance": where, **dict(zip(MOUNT_KEY, key))}),
                           "values": values([s[field] if s else None for s in at])})

    def step(mono: float) -> int:
        return int(mono - start)

    phases, stuck_after = data["phases"], threshold("NFSOperationsStuck")
    host = phases["pause"]["host"]
    resumed = host["seen_mono"]  # the workload saw the host's note after SIGCONT: the server answered by then
    stopped = resumed - host["paused_s"]  # the stop began at or before this
    mount = phases["pause"]["mount"]
    paused = next(key for key in keys if key[2] == mount)
    labels = {"instance": where, **dict(zip(MOUNT_KEY, paused))}
    late = step(resumed - 3)
    detached = next(i for i, scrape in enumerate(grid) if not scrape["series"])
    tests = [{"eval_time": f"{step(mono)}s", "alertname": "NFSOperationsStuck", "exp_alerts": []}
             for mono in (phases["loss"]["mono_end"], stopped + stuck_after - 5, resumed + 5,
                          phases["restart"]["mono_end"])]
    tests.append({"eval_time": f"{late}s", "alertname": "NFSOperationsStuck",
                  "exp_alerts": [alert("NFSOperationsStuck", labels)]})
    tests.append({"eval_time": f"{len(grid) - 1}s", "alertname": "NFSProbeDetached", "exp_alerts": []})
    pending = {"alertname": "NFSProbeDetached", "alertstate": "pending", "instance": where,
               **rules()["NFSProbeDetached"]["labels"]}
    oldest = next(s for s in grid[late]["series"] if s["mountpoint"] == mount)["oldest_s"]
    exprs = [{"expr": "server:probekit_nfs_mount_oldest_in_flight_seconds:max", "eval_time": f"{late}s",
              "exp_samples": [{"labels": series("server:probekit_nfs_mount_oldest_in_flight_seconds:max",
                                                {"server": paused[0]}), "value": oldest}]},
             {"expr": 'ALERTS{alertname="NFSProbeDetached"}', "eval_time": f"{detached - 1}s", "exp_samples": []}]
    exprs += [{"expr": 'ALERTS{alertname="NFSProbeDetached"}', "eval_time": f"{at}s",
               "exp_samples": [{"labels": series("ALERTS", pending), "value": 1}]} for at in (detached, len(grid) - 1)]
    return {"interval": "1s", "input_series": inputs, "alert_rule_test": tests, "promql_expr_test": exprs}


def bucket_quantile(q: float, buckets: List[Tuple[float, float]]) -> float:
    """Prometheus' histogram_quantile on cumulative (le, count) buckets (promql/quantile.go,
    bucketQuantile), the same float operations in the same order: what the rule must record."""
    buckets = sorted(buckets)
    rank = q * buckets[-1][1]
    b = next((i for i, (_, count) in enumerate(buckets[:-1]) if count >= rank), len(buckets) - 1)
    if b == len(buckets) - 1:
        return buckets[-2][0]
    start, end, count = 0.0, buckets[b][0], buckets[b][1]
    if b > 0:
        start = buckets[b - 1][0]
        count -= buckets[b - 1][1]
        rank -= buckets[b - 1][1]
    return start + (end - start) * (rank / count)


def rate(increase: float) -> float:
    """rate() over RATE_WINDOW_S of a counter that rose by `increase` from zero, its samples at
    both ends of the window (nothing to extrapolate), as promql/functions.go computes it: the
    increase times (extrapolated / sampled interval, 1 here) / the window's seconds."""
    return increase * (1.0 / RATE_WINDOW_S)


def exporter_run_test() -> Dict[str, Any]:
    """The run's last scrape, 5 minutes after zero: per mount and operation, the recorded rates
    are the scrape's counts and bytes over 300 s and the p99 is its histogram's; nothing was
    missed and the probe was attached, so neither alert fires."""
    run = json.load(gzip.open(EXPORTER_RUN))
    where = instance("\n".join(run["stderr"]))
    samples = [s for family in text_string_to_metric_families(run["texts"]["probekit"])
               for s in family.samples if s.name in SCRAPED]
    steps = RATE_WINDOW_S // 60
    inputs = []
    for s in samples:
        start = s.value if s.name == "probekit_nfs_probe_attached" else 0.0
        inputs.append({"series": series(s.name, {"instance": where, **s.labels}),
                       "values": values([start] * steps + [s.value])})
    buckets: Dict[Tuple[str, ...], List[Tuple[float, float]]] = {}
    exprs = []
    for s in samples:
        key = tuple({"instance": where, **s.labels}.get(k, "") for k in PER_MOUNT_OP)
        if s.name == "probekit_nfs_op_latency_seconds_bucket":
            buckets.setdefault(key, []).append((float(s.labels["le"]), rate(s.value)))
        elif s.name in ("probekit_nfs_ops_total", "probekit_nfs_bytes_total"):
            name = f"instance_mountpoint_op:{s.name[:-len('_total')]}:rate5m"
            selector = series(name, dict(zip(PER_MOUNT_OP, key)))
            exprs.append({"expr": selector, "eval_time": f"{steps}m",
                          "exp_samples": [{"labels": selector, "value": rate(s.value)}]})
    p99 = "instance_mountpoint_op:probekit_nfs_op_latency_seconds:p99_rate5m"
    for key, hist in sorted(buckets.items()):
        selector = series(p99, dict(zip(PER_MOUNT_OP, key)))
        exprs.append({"expr": selector, "eval_time": f"{steps}m",
                      "exp_samples": [{"labels": selector, "value": bucket_quantile(0.99, hist)}]})
    tests = [{"eval_time": f"{steps}m", "alertname": name, "exp_alerts": []}
             for name in ("NFSOperationsMissed", "NFSProbeDetached")]
    return {"interval": "1m", "input_series": inputs, "alert_rule_test": tests, "promql_expr_test": exprs}


def to_nearest(value: float, unit: float) -> float:
    """PromQL's round(value, unit) (promql/functions.go funcRound): the same float operations."""
    inverse = 1 / unit
    return math.floor(value * inverse + 0.5) / inverse


def samples_of(text: str, names: Tuple[str, ...]) -> Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]:
    """The samples of a scraped text whose names are `names`, by name and sorted labels."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples if s.name in names}


def nfsd_run_test() -> Dict[str, Any]:
    """The server under the run's load for good: `nfs-exporter --nfsd`'s scrapes before and after
    the workload (two clients: 127.0.0.1 and the quiet neighbour) are two samples a window apart,
    and every later sample adds what that window added, one window per step (the step: the
    window's length rounded to a divisor of 5 minutes, so that rate() extrapolates nothing).
    After 5 minutes the recorded shares are each client's part of the window's increase; the
    noisy-client alert does not fire, though 127.0.0.1 sends most requests: the load never changed,
    so no other client's service time rose (fleet_run_test has the load that begins)."""
    run = json.load(gzip.open(NFSD_RUN))["data"]
    exporter = run["exporter"]
    where = instance(exporter["stderr"])
    scraped = {moment: samples_of(exporter["scrapes"][moment], NFSD_SCRAPED) for moment in ("before", "after")}
    step = min((d for d in range(1, RATE_WINDOW_S + 1) if RATE_WINDOW_S % d == 0),
               key=lambda d: abs(d - exporter["window_s"]))
    rule = rules()["NFSNoisyClient"]
    hold_s = int(rule["for"].rstrip("m")) * 60
    steps = (RATE_WINDOW_S + hold_s) // step + 2
    inputs, grew = [], {}
    for (name, labels), value in sorted(scraped["after"].items()):
        first = scraped["before"].get((name, labels), 0.0)
        inputs.append({"series": series(name, {"instance": where, **dict(labels)}),
                       "values": " ".join(repr(first + k * (value - first)) for k in range(steps + 1))})
        what = "requests" if name == "probekit_nfsd_requests_total" else "bytes"
        client = dict(labels)["client"]
        grew.setdefault(what, {}).setdefault(client, 0.0)
        grew[what][client] += value - first
    at = RATE_WINDOW_S // step  # the first step whose window holds a whole 5 minutes of samples
    exprs = []
    for what, per_client in sorted(grew.items()):
        name = f"instance_client:probekit_nfsd_{what}:share_rate5m"
        exprs.append({"expr": f"round({name}, 0.001)", "eval_time": f"{at * step}s", "exp_samples": [
            {"labels": series("", {"instance": where, "client": client}),
             "value": to_nearest(value / sum(per_client.values()), 0.001)}
            for client, value in sorted(per_client.items())]})
    # one load from the start: however large a client's share, no other client's p99 rose
    tests = [{"eval_time": f"{at * step + hold_s + step}s", "alertname": "NFSNoisyClient", "exp_alerts": []}]
    return {"interval": f"{step}s", "input_series": inputs, "alert_rule_test": tests, "promql_expr_test": exprs}


def nfsd_increase(server: Dict[str, Any], start: str, end: str) -> Tuple[Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float], float]:
    """What each server series the rules read rose by between two of the fleet server's scrapes,
    and the seconds between them."""
    scraped = {moment: samples_of(server["scrapes"][moment], NFSD_SCRAPED + (NFSD_DURATION,)) for moment in (start, end)}
    return ({key: value - scraped[start].get(key, 0.0) for key, value in scraped[end].items()},
            server["scraped_at"][end] - server["scraped_at"][start])


def client_p99(increase: Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]) -> Dict[str, float]:
    """Each client's p99 service time over a window, as the recording rule computes it (every
    procedure and export summed per bucket); a client with no request has none."""
    per: Dict[str, Dict[float, float]] = {}
    for (name, labels), value in increase.items():
        found = dict(labels)
        if name == NFSD_DURATION:
            le = per.setdefault(found["client"], {})
            le[float(found["le"])] = le.get(float(found["le"]), 0.0) + value
    return {client: bucket_quantile(0.99, list(buckets.items())) for client, buckets in per.items()
            if max(buckets.values()) > 0}


def fleet_run_test() -> List[Dict[str, Any]]:
    """The fleet's server (tests/fixtures/.../fleet): its exporter scraped as the quiet phase began
    (client-b's reads alone), as client-a's load began and as it ended. The quiet window's rates
    held QUIET_STEPS steps, then the loaded window's held past 5 minutes and the alert's `for`.
    NFSNoisyClient is silent in the quiet part and fires afterwards for each client the rule's
    bounds name (share, clients, requests/s, and another client's p99 above the rule's factor
    times the lowest of its quiet and loaded p99s); the same loaded window held from the start
    (no client's p99 rose) fires nothing."""
    server = json.load(gzip.open(FLEET_RUN))["data"]["server"]["data"]
    where = instance("\n".join(server["exporter"]["stderr"]))
    quiet, quiet_s = nfsd_increase(server, "before", "heavy")
    loaded, loaded_s = nfsd_increase(server, "heavy", "drain")
    rule = rules()["NFSNoisyClient"]
    hold_s = int(rule["for"].rstrip("m")) * 60
    loaded_steps = (RATE_WINDOW_S + hold_s) // FLEET_STEP_S + 2

    def inputs(quiet_steps: int) -> List[Dict[str, Any]]:
        out = []
        for key in sorted(loaded):
            name, labels = key
            rising, value = [], 0.0
            for k in range(QUIET_STEPS + loaded_steps + 1):  # the same length, held from the start or not
                rising.append(value)
                value += quiet.get(key, 0.0) * FLEET_STEP_S / quiet_s if k < quiet_steps else \
                    loaded[key] * FLEET_STEP_S / loaded_s
            out.append({"series": series(name, {"instance": where, **dict(labels)}), "values": " ".join(map(repr, rising))})
        return out

    requests: Dict[str, float] = {}
    for (name, labels), value in loaded.items():
        if name == "probekit_nfsd_requests_total":
            requests[dict(labels)["client"]] = requests.get(dict(labels)["client"], 0.0) + value
    total = sum(requests.values())
    share, clients, load = (float(x) for x in re.findall(r"(?<=[)}]) > (\d+(?:\.\d+)?)", rule["expr"]))
    factor = float(re.search(r"> (\d+(?:\.\d+)?) \* min_over_time", rule["expr"]).group(1))
    before, during = client_p99(quiet), client_p99(loaded)
    busy = {client for client, n in requests.items() if n / total > share}
    rose = {client for client in set(before) & set(during) - busy if during[client] > factor * min(before[client], during[client])}
    noisy = sorted(busy - {"other"}) if rose and len([n for n in requests.values() if n]) > clients \
        and total / loaded_s > load else []
    fired_at = f"{QUIET_STEPS * FLEET_STEP_S + RATE_WINDOW_S + hold_s + FLEET_STEP_S}s"
    p99 = "instance_client:probekit_nfsd_request_duration_seconds:p99_rate5m"
    settled = f"{QUIET_STEPS * FLEET_STEP_S + RATE_WINDOW_S + FLEET_STEP_S}s"
    return [{"interval": f"{FLEET_STEP_S}s", "input_series": inputs(QUIET_STEPS),
             "alert_rule_test": [{"eval_time": f"{QUIET_STEPS * FLEET_STEP_S}s", "alertname": "NFSNoisyClient", "exp_alerts": []},
                                 {"eval_time": fired_at, "alertname": "NFSNoisyClient",
                                  "exp_alerts": [alert("NFSNoisyClient", {"instance": where, "client": c}) for c in noisy]}],
             "promql_expr_test": [{"expr": f"round({p99}, 0.00001)", "eval_time": settled, "exp_samples": [
                 {"labels": series("", {"instance": where, "client": client}), "value": to_nearest(value, 0.00001)}
                 for client, value in sorted(during.items())]}]},
            {"interval": f"{FLEET_STEP_S}s", "input_series": inputs(0),
             "alert_rule_test": [{"eval_time": fired_at, "alertname": "NFSNoisyClient", "exp_alerts": []}]}]


def write(out: Path) -> List[Path]:
    """One promtool test file per run in `out` (JSON, which YAML reads), naming the shipped rules."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, tests in (("fault-run", [fault_run_test()]), ("exporter-run", [exporter_run_test()]),
                        ("nfsd-run", [nfsd_run_test()]), ("fleet-run", fleet_run_test())):
        path = out / f"{name}.yml"
        path.write_text(json.dumps({"rule_files": [str(RULES)], "evaluation_interval": tests[0]["interval"],
                                    "tests": tests}, indent=1) + "\n")
        written.append(path)
    return written


if __name__ == "__main__":
    print("\n".join(str(p) for p in write(Path(sys.argv[1]))))

"""The exporter lab check's verdicts: nfs-exporter, Debian's Prometheus and node_exporter
around the known workload (labs/checks/exporter/guest.py, run in a guest).

Each verify_* raises AssertionError saying what is wrong; tests/lab/test_exporter_lab.py
runs them on its kernels, `labs test --lab-results FILE` on any lab it boots (its artefact
directory then holds metrics/probekit.prom and metrics/node.prom, the two scraped texts).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

from prometheus_client.parser import text_string_to_metric_families

from labs.checks.probes.verdicts import WORKLOAD_EXACT as EXACT, counted_once
from probes.exporter import BUCKET_SLOTS

MOUNT_POINTS = {"nfs3": "/mnt/nfs3", "nfs42": "/mnt/nfs42"}


def keep_results(out: Dict[str, Any], artifacts: Path) -> None:
    """The scraped texts as metrics/probekit.prom and metrics/node.prom, the rest as JSON."""
    metrics = artifacts / "metrics"
    metrics.mkdir(parents=True, exist_ok=True)
    (metrics / "probekit.prom").write_text(out["texts"]["probekit"])
    (metrics / "node.prom").write_text(out["texts"]["node"])
    (artifacts / f"exporter-{out['kernel']}.json").write_text(json.dumps(out, indent=1) + "\n")


def verify_series_move_by_the_workload_on_its_mount_only(results: Dict[str, Any], mount: str) -> None:
    """Between two direct scrapes around one mount's workload, each exact op's counter and
    histogram count move by what was issued (but for what probekit_nfs_missed_total says was
    missed), on that mount's series and no other."""
    phase = results["phases"][mount]
    issued, moved, missed = phase["issued"], phase["moved"], phase.get("missed", {})
    for series in ("probekit_nfs_ops_total", "probekit_nfs_op_latency_seconds_count"):
        for op in EXACT:
            counted_once(f"{series} {op} {MOUNT_POINTS[mount]}", int(moved[series].get(f"{op} {MOUNT_POINTS[mount]}", 0)),
                         issued[op], int(missed.get(op, 0)))
        assert all(key.split(" ", 1)[1] == MOUNT_POINTS[mount] for key in moved[series]), moved[series]
    for op in ("read", "write"):
        if not missed.get(op):
            assert moved["probekit_nfs_bytes_total"][f"{op} {MOUNT_POINTS[mount]}"] == issued[f"{op}_bytes"]


def verify_promql_counts_equal_the_workload_on_both_mounts(results: Dict[str, Any]) -> None:
    """Totals since the start, per op and mount, are the phases' workloads: and, with
    --late-nfsv4, the stats of /mnt/nfs3's root done before nfsv4 loaded and whatever was
    counted while it loaded and /mnt/nfs42 was mounted (on sid one getattr of the new mount,
    from the lab agent), between late_nfsv4's two scrapes."""
    got = {(r["metric"]["op"], r["metric"]["mountpoint"]): int(float(r["value"][1]))
           for r in results["promql"]["counts"]}
    late = results.get("late") or {}
    got[("getattr", MOUNT_POINTS["nfs3"])] = got.get(("getattr", MOUNT_POINTS["nfs3"]), 0) - late.get("stats", 0)
    if late:
        before = counters(late["before"])
        for (name, labels), value in counters(late["after"]).items():
            key = (dict(labels).get("op", ""), dict(labels).get("mountpoint", ""))
            if name == "probekit_nfs_ops_total" and key in got:
                got[key] -= int(value - before.get((name, labels), 0.0))
    for mount, point in MOUNT_POINTS.items():
        for op in EXACT:
            counted_once(f"PromQL {op} {point}", got.get((op, point), 0), results["phases"][mount]["issued"][op],
                         int(results["phases"][mount].get("missed", {}).get(op, 0)))


def verify_join_with_node_exporter_mountstats(results: Dict[str, Any]) -> None:
    """`on (export, mountaddr, protocol)` meets node_exporter's series for both mounts.

    node_exporter's `mountaddr` is the server address (mountinfo's addr=), so the lab's v3
    and v4.2 mounts of one export have one identity there: node_exporter 1.5.0 and 1.9.0
    export one series set for both and drop the other mount as a duplicate device (its
    issue 993). Our series stay per mount, and both meet that one identity."""
    node_mounts = results["promql"]["node_mounts"]
    joined = {r["metric"]["mountpoint"] for r in results["promql"]["join"]}
    assert node_mounts, "node_exporter exported no NFS mount"
    assert joined == set(MOUNT_POINTS.values()), (joined, node_mounts)


def quantile_bucket(hist: Dict[str, int], q: float) -> Tuple[int, int]:
    """(first, last) usecs of the nfsdist bucket holding quantile q, ranked as histogram_quantile
    ranks (the first bucket whose running count reaches q times the total), from {"start-end": count}."""
    buckets = sorted((tuple(int(x) for x in key.split("-")), count) for key, count in hist.items())
    total, running = sum(count for _, count in buckets), 0
    assert total, "nfsdist counted none of the phase's operations"
    for (first, last), count in buckets:
        running += count
        if running >= q * total:
            return first, last
    raise AssertionError(hist)  # unreachable: running ends at total


def exporter_edges_around(low_us: float, high_us: float) -> Tuple[float, float]:
    """The exporter's bucket bounds (le = 2^k - 1 ns, in usecs) at or below low_us and at or
    above high_us: histogram_quantile may return any point of its bucket, edges included."""
    edges = [((1 << slot) - 1) / 1000 for slot in BUCKET_SLOTS]
    return (max((e for e in edges if e <= low_us), default=0.0),
            min((e for e in edges if e >= high_us), default=float("inf")))


def verify_quantiles_agree_with_nfsdist_and_move_with_delay(results: Dict[str, Any]) -> None:
    """histogram_quantile over exactly one phase (bucket counts at its end minus at its start,
    PromQL's `@`) lies in nfsdist's bucket of the same rank for the same phase, widened one
    log2 step each way and then out to the exporter's own bucket edges. The two tools time
    one read with their own probes, each inside the other's (CI once saw a read at < 2048 us
    in nfsdist and > 2097 us in the exporter, whose bucket then ends at 4194 us); and the
    exporter's buckets are powers of two in nanoseconds, nfsdist's in microseconds, so they
    do not align. With netem delay on the link the 0.9 quantile (the reads that wait for the
    server) is above the plain one and at least half the added round trip (interpolation in a
    log2 bucket can go down to its lower edge)."""
    quantile = results["quantile"]
    found: Dict[Tuple[str, str], float] = {}
    for name, phase in quantile["phases"].items():
        for q, rows in phase["promql"].items():
            assert len(rows) == 1, f"{name} q{q}: PromQL gave {rows}"
            value_us = float(rows[0]["value"][1]) * 1e6
            first, last = quantile_bucket(phase["nfsdist_hist"], float(q))
            low, high = exporter_edges_around(first / 2, (last + 1) * 2)
            assert low <= value_us <= high, \
                f"{name} q{q}: PromQL {value_us:.0f} us, nfsdist's bucket of that rank {first}-{last} us"
            found[(name, q)] = value_us
    plain, delay = found[("plain", "0.9")], found[("delay", "0.9")]
    assert delay > plain and delay >= quantile["rtt_delay_ms"] * 1000 / 2, (found, quantile["rtt_delay_ms"])


def verify_cgroup_label_only_when_asked_and_each_unit_on_its_own_series(results: Dict[str, Any]) -> None:
    """Without --cgroup-label no series has a cgroup label. With it, each mount's workload ran
    in a scope unit of its own (NFSv3 in one, NFSv4.2 in the other): the series labelled with
    that unit's cgroup path moved by exactly what it issued, on its mount only."""
    text = results["texts"]["probekit"]
    if not results["cgroup_label"]:
        assert "cgroup=" not in text and "probekit_nfs_cgroups_labelled" not in text
        return
    assert "probekit_nfs_cgroups_labelled_limit 64.0" in text
    for mount, phase in results["phases"].items():
        by_cgroup, cgroup = phase["moved"]["by_cgroup"], phase["cgroup"]
        for op in EXACT:
            counted_once(f"{op} {MOUNT_POINTS[mount]} cgroup={cgroup}",
                         int(by_cgroup.get(f"{op} {MOUNT_POINTS[mount]} {cgroup}", 0)), phase["issued"][op],
                         int(phase.get("missed", {}).get(op, 0)))
        elsewhere = [key for key in by_cgroup if key.endswith(f" {cgroup}") and key.split(" ")[1] != MOUNT_POINTS[mount]]
        assert not elsewhere, f"{cgroup}'s operations on another mount: {elsewhere}"


#: what the exporter says once a module loaded after its start is traced beside its programs
NOW_TRACED = "nfs-exporter: module nfsv4 loaded after the start: now traced: "


def counters(text: str) -> Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]:
    """Every counter sample of a scraped text (histogram buckets, sums and counts too), by name and labels."""
    out: Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        if family.type in ("counter", "histogram"):
            for sample in family.samples:
                if not sample.name.endswith("_created"):
                    out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def verify_attached_once_or_again_when_nfsv4_loaded(results: Dict[str, Any]) -> None:
    """The exporter attaches its probe once. Started on a v3-only client (--late-nfsv4: nfsv4
    unloaded), once nfsv4 loads: on core it says in one line that nfs4_file_open is traced now,
    attaches nothing again, and no counter goes back (the scrape before and after, its NFSv3
    stats counted); on bcc it says so and attaches again. The NFSv4.2 phase's exact counts
    (its opens are nfsv4's nfs4_file_open) are checked by the phase checks."""
    stderr = results["stderr"]
    attached = [line for line in stderr if line.startswith("nfs-exporter: probe attached: ")]
    if not results["late_nfsv4"]:
        assert len(attached) == 1, stderr
        return
    assert results["nfsv4_at_start"] is False, "nfsv4 could not be unloaded before the exporter started"
    late = results.get("late")
    if late is None or late["backend"] != "core":  # bcc, or a run recorded before core traced it in place
        assert any("module nfsv4 loaded after the start" in line and "attaching again" in line for line in stderr), stderr
        assert len(attached) == 2, stderr
        return
    said = [line for line in stderr if line.startswith(NOW_TRACED)]
    assert len(said) == 1 and "open (O): " in said[0] and "nfs4_file_open" in said[0], stderr
    assert len(attached) == 1 and not any("attaching again" in line for line in stderr), stderr
    before, after = counters(late["before"]), counters(late["after"])
    stats = sum(value for (name, labels), value in before.items() if name == "probekit_nfs_ops_total"
                and dict(labels).get("op") == "getattr" and dict(labels).get("mountpoint") == "/mnt/nfs3")
    assert stats >= late["stats"], f"the NFSv3 stats before nfsv4 loaded: {stats} getattr counted"
    went_back = {key: (value, after.get(key)) for key, value in before.items() if after.get(key, 0) < value}
    assert not went_back, f"counters went back once nfsv4 loaded: {went_back}"
    attach_time = [line for text in (late["before"], late["after"]) for line in text.splitlines()
                   if line.startswith("probekit_nfs_probe_attach_time_seconds ")]
    assert len(attach_time) == 2 and attach_time[0] == attach_time[1], attach_time


def verify_promtool_accepts_both_scrapes(results: Dict[str, Any]) -> None:
    assert results["promtool"]["probekit"]["rc"] == 0, results["promtool"]["probekit"]["output"]
    assert results["promtool"]["node"]["rc"] == 0, results["promtool"]["node"]["output"]


def verify_sigterm_detaches_everything(results: Dict[str, Any]) -> None:
    assert results["rc"] == 143 and results["stderr"][-1] == "nfs-exporter: terminated by SIGTERM; stopped and cleaned up"
    attached = results["attached"]
    assert set(attached["during"]["bpf_progs"]) > set(attached["before"]["bpf_progs"])
    assert attached["after"] == attached["before"]


def verify_no_pid_label_and_probe_info_names_every_op(results: Dict[str, Any]) -> None:
    text = results["texts"]["probekit"]
    assert "pid=" not in text
    info_ops = {line.split('op="', 1)[1].split('"', 1)[0] for line in text.splitlines()
                if line.startswith("probekit_probe_info{")}
    assert set(EXACT) | {"commit"} <= info_ops


def verify_an_unmounted_mount_keeps_its_series_for_the_grace_then_leaves(results: Dict[str, Any]) -> None:
    """umount /mnt/nfs42 under the running exporter (--gone-mount-grace 10): still labelled
    right after, gone after the grace, and its counts did not move to the unlabelled series."""
    gone = results["gone"]
    assert {"/mnt/nfs3", "/mnt/nfs42"} <= set(gone["before"]["mountpoints"]), gone
    assert "/mnt/nfs42" in gone["just_after"]["mountpoints"], gone
    assert "/mnt/nfs42" not in gone["after_grace"]["mountpoints"], gone
    assert "/mnt/nfs3" in gone["after_grace"]["mountpoints"], gone
    assert gone["after_grace"]["unlabelled"] == gone["before"]["unlabelled"], gone


#: (name, verify, arguments) in the order `labs test` reports them
def verify_the_shipped_rules_evaluate_on_the_lab_scrapes(results: Dict[str, Any]) -> None:
    """Debian's Prometheus loads the package's rules file as installed: every rule it names is
    evaluated without error; the recorded per-mount rate has moved for each operation the
    workloads issued on each mount and the recorded p99 of reads is a positive latency on both;
    no alert is active but NFSOperationsMissed where the exporter said it missed operations.
    With --cgroup-label a unit's series appears with its first operations in it, which rate()
    has no earlier sample to count from: there the recorded series of both mounts must exist."""
    rules = results["rules"]
    kinds = {"record": "recording", "alert": "alerting"}
    assert sorted((rule["type"], rule["name"]) for rule in rules["rules"]) == \
        sorted((kinds[kind], name) for kind, name in rules["shipped"]), rules["rules"]
    failing = [rule for rule in rules["rules"] if rule["health"] != "ok" or rule["error"]]
    assert not failing, f"rules Prometheus could not evaluate: {failing}"
    recorded = {key: {(row["metric"].get("op"), row["metric"].get("mountpoint")): float(row["value"][1])
                      for row in rows} for key, rows in rules["recorded"].items()}
    for mount, point in MOUNT_POINTS.items():
        issued = results["phases"][mount]["issued"]
        if results["cgroup_label"]:
            assert any(where == point for _op, where in recorded["ops_rate"]), f"{point}: no recorded series"
            continue
        still = [op for op in EXACT if issued[op] and not recorded["ops_rate"].get((op, point), 0) > 0]
        assert not still, f"{point}: the recorded ops rate never moved for {still} ({recorded['ops_rate']})"
        p99 = recorded["p99"].get(("read", point), float("nan"))
        assert 0 < p99 < float("inf"), f"{point}: recorded read p99 {p99}"
    missed = any(phase.get("missed") for phase in results["phases"].values())
    active = sorted({alert["name"] for alert in rules["alerts"]})
    assert active == (["NFSOperationsMissed"] if missed else []), rules["alerts"]


EXPORTER_CHECKS: List[Tuple[str, Callable[..., None], Tuple[str, ...]]] = [
    ("exporter: series move by the workload, NFSv3", verify_series_move_by_the_workload_on_its_mount_only, ("nfs3",)),
    ("exporter: series move by the workload, NFSv4.2", verify_series_move_by_the_workload_on_its_mount_only, ("nfs42",)),
    ("exporter: PromQL counts = workload", verify_promql_counts_equal_the_workload_on_both_mounts, ()),
    ("exporter: join with node_exporter mountstats", verify_join_with_node_exporter_mountstats, ()),
    ("exporter: nfsv4 loaded later: traced in place (core) or attached again (bcc)",
     verify_attached_once_or_again_when_nfsv4_loaded, ()),
    ("exporter: cgroup label per unit, or none", verify_cgroup_label_only_when_asked_and_each_unit_on_its_own_series,
     ()),
    ("exporter: quantiles = nfsdist's, moved by delay", verify_quantiles_agree_with_nfsdist_and_move_with_delay, ()),
    ("exporter: promtool accepts both scrapes", verify_promtool_accepts_both_scrapes, ()),
    ("exporter: SIGTERM detaches everything", verify_sigterm_detaches_everything, ()),
    ("exporter: no pid label, probe_info per op", verify_no_pid_label_and_probe_info_names_every_op, ()),
    ("exporter: a gone mount leaves after the grace", verify_an_unmounted_mount_keeps_its_series_for_the_grace_then_leaves, ()),
    ("exporter: the shipped rules evaluate", verify_the_shipped_rules_evaluate_on_the_lab_scrapes, ()),
]

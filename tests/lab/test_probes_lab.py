"""Lab tests of nfsslower / nfsdist / nfstop on real NFS traffic (QEMU guest, Debian 6.1).

One guest boot for the whole module (bcc compiles each tool at start, 30-50 s under TCG):
the guest side (tests/lab/probes_guest.py) runs the tools around a workload with known
counts and reports both as JSON; the asserts here compare them.

Operations the kernel issues by itself, and tested as such:
- commit (C): the workload's 1 MiB writes exceed wsize (256 KiB), so the flush at each
  fsync is sent UNSTABLE and the client sends COMMIT: at least one commit per such
  fsync, started by writeback (kworker) or by the fsync itself. The O_SYNC 4 KiB write is
  sent FILE_SYNC and needs no commit.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List

import pytest

from labs.base import Lab
from labs.qemu import QemuLab

pytestmark = pytest.mark.lab

GUEST_SCRIPT = "tests/lab/probes_guest.py"


@pytest.fixture(scope="module")
def lab() -> Lab:
    assert os.geteuid() == 0, "lab tests build images and boot QEMU: run them as root"
    the_lab = QemuLab(kernel="6.1", topology="single", name="probes-check-6.1", ssh=False,
                      progress=lambda message: print(message, flush=True))
    the_lab.down()
    the_lab.up()
    yield the_lab
    the_lab.down()


@pytest.fixture(scope="module")
def results(lab: Lab) -> Dict[str, Dict[str, Any]]:
    """Run every guest check once (order matters: v3only unloads nfsv4 last)."""
    share = getattr(lab, "guest_project_dir", "/opt/probekit")
    out: Dict[str, Dict[str, Any]] = {}
    for check in ("counts", "latency", "top", "v3only"):
        res = lab.run(f"cd {share} && python3 {GUEST_SCRIPT} {check}", timeout=900)
        assert res.exit_code == 0, f"{check}: exit {res.exit_code}: {res.stderr[-2000:]}"
        out[check] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def data(results: Dict[str, Dict[str, Any]], check: str) -> Dict[str, Any]:
    found = results[check]
    assert found["ok"], f"{check}: {found.get('error')}"
    return found["data"]


@pytest.mark.parametrize("mount", ["nfs3", "nfs42"])
def test_nfsdist_counts_match_the_workload(results: Dict[str, Dict[str, Any]], mount: str) -> None:
    run = data(results, "counts")[mount]
    issued, seen = run["issued"], run["seen"]["ops"]
    for op in ("read", "write", "open", "getattr", "fsync"):
        assert seen[op]["count"] == issued[op], f"{mount} {op}: saw {seen[op]['count']}, issued {issued[op]}"
    assert seen["read"]["bytes"] == issued["read_bytes"]
    assert seen["write"]["bytes"] == issued["write_bytes"]
    # kernel-issued COMMITs: at least one per fsync of unstable data (the O_SYNC 4 KiB write
    # goes FILE_SYNC and needs none)
    assert issued["unstable_fsync"] <= seen["commit"]["count"] <= issued["write"]
    assert run["seen"]["anomalies"] == 0


def _events(run: Dict[str, Any]) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in run["lines"] if line.startswith("{") and '"lat_us"' in line]


def _phase_hist(intervals: List[Dict[str, Any]], phase: str, op: str) -> Dict[int, int]:
    """interval-start (usecs) -> count for one op, summed over one phase's intervals."""
    hist: Dict[int, int] = {}
    for interval in intervals:
        if interval["phase"] == phase:
            for bucket in interval["ops"][op]["hist"]:
                hist[bucket["interval-start"]] = hist.get(bucket["interval-start"], 0) + bucket["count"]
    return {start: count for start, count in hist.items() if count}


def _mean_bucket(hist: Dict[int, int]) -> float:
    return sum(start * count for start, count in hist.items()) / max(sum(hist.values()), 1)


def test_nfsslower_reports_injected_latency(results: Dict[str, Dict[str, Any]]) -> None:
    lat = data(results, "latency")
    delay_us, threshold_us = lat["delay_ms"] * 1000, lat["threshold_ms"] * 1000
    run = lat["nfsslower"]
    assert run["rc"] == 0, run["stderr"]
    events = run["events"]
    # nfsslower prints nothing below its threshold, and nothing impossible
    assert events and all(threshold_us <= e["lat_us"] < 3600 * 10**6 for e in events)
    delayed = [e for e in events if e["phase"] == "delay"]
    plain = [e for e in events if e["phase"] == "nodelay"]
    # with 50 ms on every loopback packet an uncached read waits for a READ RPC (>= 2 x 50 ms):
    # at least the first read of the phase is reported, at or above the injected delay
    delayed_reads = [e for e in delayed if e["op"] == "read"]
    assert delayed_reads and all(e["lat_us"] >= delay_us for e in delayed_reads)
    assert all(e["file"] == "read.bin" and e["bytes"] == 65536 for e in delayed_reads)
    # both fsyncs of the delayed phase are reported; commits come from kworkers
    assert sum(1 for e in delayed if e["op"] == "fsync") == lat["phases"]["delay"]["issued"]["fsync"]
    # without the delay the same reads stay below the threshold, and fewer ops cross it
    # (TCG alone makes a 4 MiB fsync slow, so fsync is compared in nfsdist, not here)
    assert not [e for e in plain if e["op"] == "read"]
    assert len(delayed) > len(plain)


def test_nfsdist_histogram_moves_with_delay(results: Dict[str, Dict[str, Any]]) -> None:
    lat = data(results, "latency")
    run = lat["nfsdist"]
    assert run["rc"] == 0, run["stderr"]
    intervals = run["intervals"]
    delay_us = lat["delay_ms"] * 1000
    for phase in ("nodelay", "delay"):
        for op in ("read", "write", "open", "getattr", "fsync"):
            seen = sum(_phase_hist(intervals, phase, op).values())
            assert seen == lat["phases"][phase]["issued"][op], f"{phase} {op}: {seen}"
    reads_plain, reads_delay = _phase_hist(intervals, "nodelay", "read"), _phase_hist(intervals, "delay", "read")
    # the slowest read moves up into a bucket starting at or above the delay (one READ RPC
    # waits 2 x 50 ms); without the delay TCG's slowest read stays in a lower bucket
    assert max(reads_delay) >= delay_us and max(reads_delay) > max(reads_plain)
    for op in ("read", "fsync"):
        plain, delayed = _phase_hist(intervals, "nodelay", op), _phase_hist(intervals, "delay", op)
        assert _mean_bucket(delayed) > _mean_bucket(plain), f"{op}: {plain} -> {delayed}"


def test_nfstop_shows_the_workload_process(results: Dict[str, Dict[str, Any]]) -> None:
    top = data(results, "top")
    rows = [json.loads(line) for line in top["result"]["lines"] if line.startswith("{")]
    mine = [p for row in rows for p in row["processes"] if p["pid"] == top["child_pid"]]
    assert mine, f"pid {top['child_pid']} never appeared in nfstop"
    reads = sum(p["ops"].get("read", {}).get("count", 0) for p in mine)
    writes = sum(p["ops"].get("write", {}).get("count", 0) for p in mine)
    assert reads == 4 and writes == 9
    assert {p["comm"] for p in mine} == {"python3"}  # named even though it exited before the refresh
    written = sum(p["write_mb_s"] * row["interval_s"] for row in rows for p in row["processes"]
                  if p["pid"] == top["child_pid"])
    assert written > 0
    # a log2 bucket bounds each latency from above: p99 (bucket bound) is never below 0,
    # and for a single-op interval it is at least that op's latency (= its average)
    for p in mine:
        for op in p["ops"].values():
            if op["count"] == 1:
                assert op["p99_ms"] >= op["avg_ms"] - 0.001


def test_every_command_runs_without_nfsv4(results: Dict[str, Dict[str, Any]]) -> None:
    v3 = data(results, "v3only")
    assert not v3["nfsv4_loaded"], f"nfsv4 could not be unloaded: {v3['unload']}"
    for name, run in v3["results"].items():
        assert run["rc"] == 0, f"{name}: {run['stderr']}"
        assert "nfs4_file_open" in run["stderr"] and "not loaded" in run["stderr"]  # -v says it was skipped
    slower = _events(v3["results"]["nfsslower"])
    assert sum(1 for e in slower if e["op"] == "open") == v3["issued"]["open"]
    dist = [json.loads(line) for line in v3["results"]["nfsdist"]["lines"] if '"ops"' in line][-1]
    for op in ("read", "write", "open", "getattr", "fsync"):
        assert dist["ops"][op]["count"] == v3["issued"][op]
    top_rows = [json.loads(line) for line in v3["results"]["nfstop"]["lines"] if line.startswith("{")]
    assert any(row["processes"] for row in top_rows)

"""The shipped Prometheus rules (packaging/prometheus/probekit-rules.yml) load in Debian's
promtool and pass its unit tests on real lab scrapes (tests/prometheus_rule_tests.py makes
them from the fixtures); a rule that misses what those runs show fails them."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import List

import pytest

from needs import missing
from prometheus_rule_tests import RULES, write


def promtool(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("promtool") is None:
        missing("promtool is not installed: Debian's prometheus package (scripts/apt-packages.txt lists it)")
    return subprocess.run(["promtool", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=300)


def test_rules_file_passes_promtool_check() -> None:
    res = promtool("check", "rules", str(RULES))
    assert res.returncode == 0 and "SUCCESS: 11 rules found" in res.stdout, res.stdout


def test_rules_pass_their_unit_tests_on_real_scrapes(tmp_path: Path) -> None:
    res = promtool("test", "rules", *map(str, write(tmp_path)))
    assert res.returncode == 0, res.stdout


@pytest.mark.parametrize("old, new", [
    ("probekit_nfs_mount_oldest_in_flight_seconds > 20", "probekit_nfs_mount_oldest_in_flight_seconds > 40"),
    ("for: 10m", "for: 10s"),
    ("sum by (instance, mountaddr, export, mountpoint, op, le)", "sum by (instance, mountaddr, export, op, le)"),
    ("sum by (instance, mountaddr, export, mountpoint, op) (rate(probekit_nfs_ops_total[5m]))",
     "sum by (instance, mountaddr, export, mountpoint, op) (increase(probekit_nfs_ops_total[5m]))"),
    ("histogram_quantile(0.99,", "histogram_quantile(0.9,"),
    ('share_rate5m{client!="other"} > 0.5', 'share_rate5m{client!="other"} > 0.95'),
    ("sum by (instance, client) (rate(probekit_nfsd_requests_total[5m]))",
     "sum by (instance, client) (increase(probekit_nfsd_requests_total[5m]))"),
    ("> 1.5 * min_over_time", "> 1000 * min_over_time"),
    ("> 1.5 * min_over_time", "> 0 * min_over_time"),
], ids=["stuck-threshold-above-the-pause", "detached-for-shorter-than-a-recompile", "p99-over-both-mounts",
        "ops-not-per-second", "p90-recorded-as-p99", "noisy-share-above-the-runs", "share-of-increases-not-rates",
        "noisy-rise-above-the-fleet-run", "noisy-without-a-rise"])
def test_a_rule_changed_against_what_the_runs_show_fails(tmp_path: Path, old: str, new: str) -> None:
    """The stuck alert must fire in a 30 s stop and the detached one must not in a 32 s recompile;
    the recorded values must be per second and the 99th percentile of each mount; the fleet's
    noisy client must be caught by the shipped share and by the rise of the other client's p99
    its load caused, and a client sending most of an unchanged load (the 6.12 nfsdtop run's
    127.0.0.1) must not."""
    text = RULES.read_text()
    assert old in text
    changed = tmp_path / "changed-rules.yml"
    changed.write_text(text.replace(old, new))
    tests: List[str] = []
    for path in write(tmp_path / "tests"):
        doc = json.loads(path.read_text())
        doc["rule_files"] = [str(changed)]
        path.write_text(json.dumps(doc))
        tests.append(str(path))
    res = promtool("test", "rules", *tests)
    assert res.returncode != 0, res.stdout

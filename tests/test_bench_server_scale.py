"""bench/bench_server_scale.py's run kept as a fixture (6.12 lab guest, core, 1/10/100/200 NFSv3
clients of the guest's knfsd, each from a network namespace of its own; the run was stopped
while growing to 200, see bench/README.md): every size reached measured, the server saw every
client, nfsdtop gave each a row, the exporter's server series grow by the same count per
client, and the cost per client at 100 is not above that at 10 as a quadratic one would be."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import bench_server_scale  # noqa: E402

RUN = Path(__file__).parent / "fixtures" / "6.12.117+deb13-amd64" / "bench" / "bench_server_scale.json"


def recorded() -> Dict[str, Any]:
    return json.loads(RUN.read_text())


def figures(part: str, field: str, form: str = "") -> List[float]:
    return [float((row[part][form] if form else row[part])[field]) for row in recorded()["sizes"]]


def clients() -> List[int]:
    return [row["clients"] for row in recorded()["sizes"]]


def test_the_sizes_reached_were_measured_and_the_server_saw_every_client() -> None:
    res = recorded()
    assert clients() == list(bench_server_scale.CLIENTS[:3]) and "200" in res["stopped"]
    assert res["kernel"].startswith("6.12") and res["limits"] == list(bench_server_scale.LIMITS)
    for row in res["sizes"]:
        assert row["server_clients"] >= row["clients"], row["clients"]  # and 127.0.0.1, the guest's own mounts
        for part in res["limits"] + ["node_exporter"]:
            assert row[part]["samples"] > 0 and row[part]["min_s"] <= row[part]["median_s"] <= row[part]["max_s"]
        for name in res["limits"]:
            rules = row[name]["rules"]
            assert len(rules["evals_s"]) == res["rule_evals"] and rules["rules"] > 0 and rules["failures"] == 0


def test_the_rules_timed_over_the_series_only_where_prometheus_scraped_them() -> None:
    """From 10 clients on a scrape took longer than Prometheus' 4 s timeout in this loaded
    guest: those figures are rules over nothing, and the report says so."""
    res = recorded()
    over = [(row["clients"], name) for row in res["sizes"] for name in res["limits"]
            if bench_server_scale.rules_over_series(row[name])]
    assert over == [(1, "limit64"), (1, "limit4096"), (10, "limit64")]
    assert bench_server_scale.report(res).count("not scraped") == 3


def test_nfsdtop_had_a_row_for_every_client_in_every_interval() -> None:
    for row in recorded()["sizes"]:
        count = row["clients"]
        assert all(count <= rows <= count + 1 for rows in row["nfsdtop"]["json"]["rows"]), count  # + 127.0.0.1
        assert all(min(count, 20) <= rows <= min(count + 1, 20) for rows in row["nfsdtop"]["text"]["rows"]), count


def test_without_a_bound_the_server_series_grow_by_the_same_count_per_client() -> None:
    samples = figures("limit4096", "nfsd_samples")
    counts = clients()
    steps = [(b - a) / (m - n) for a, b, n, m in zip(samples, samples[1:], counts, counts[1:])]
    assert max(steps) - min(steps) <= 1, steps
    assert [int(n) for n in figures("limit4096", "clients_labelled")] == [count + 1 for count in counts]


def test_the_default_limit_labels_64_clients() -> None:
    assert [int(n) for n in figures("limit64", "clients_labelled")] == [2, 11, 64]


def test_node_exporter_serves_as_many_samples_at_every_size() -> None:
    assert len(set(figures("node_exporter", "samples"))) == 1


@pytest.mark.parametrize("part,per,form", [("limit64", "nfsd_samples", ""), ("limit4096", "nfsd_samples", ""),
                                           ("nfsdtop", "clients", "text"), ("nfsdtop", "clients", "json")])
def test_the_cost_per_client_at_100_is_not_a_quadratic_one(part: str, per: str, form: str) -> None:
    """Time per added sample (exporter) or per client (nfsdtop) at 100 clients below twice that
    at 10: a cost quadratic in the clients would be ten times it."""
    res = recorded()
    ten, hundred = res["sizes"][1], res["sizes"][2]

    def unit(row: Dict[str, Any]) -> float:
        timed = row[part][form] if form else row[part]
        return timed["median_s"] / float(row[part][per] if per != "clients" else row["clients"])

    assert unit(hundred) < 2 * unit(ten), (unit(ten), unit(hundred))

"""bench/bench_scale.py's run kept as a fixture (6.12 lab guest, core, 1/10/50/100 NFSv3 mounts,
the tree before the scale work and after it in one boot): every size measured on every tree,
the series grow by the same count per mount, and no step costs more per added series than
the one before it (no quadratic step), for the exporter's scrape time and memory."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import bench_scale  # noqa: E402

RUN = Path(__file__).parent / "fixtures" / "6.12.117+deb13-amd64" / "bench" / "bench_scale.json"


def recorded() -> Dict[str, Any]:
    return json.loads(RUN.read_text())


def figures(tree: str, field: str) -> List[float]:
    return [float(row[tree][field]) for row in recorded()["sizes"]]


def test_every_size_was_measured_on_every_tree_and_node_exporter() -> None:
    res = recorded()
    assert [row["mounts"] for row in res["sizes"]] == list(bench_scale.MOUNTS)
    assert res["scrapes"] == bench_scale.SCRAPES and res["kernel"].startswith("6.12")
    for row in res["sizes"]:
        for tree in res["trees"] + ["node_exporter"]:
            assert "error" not in row[tree] and row[tree]["samples"] > 0, (row["mounts"], tree)
            assert row[tree]["min_s"] <= row[tree]["median_s"] <= row[tree]["max_s"]


@pytest.mark.parametrize("tree", ["before", "after"])
def test_the_series_grow_by_the_same_count_per_mount(tree: str) -> None:
    mounts = [row["mounts"] for row in recorded()["sizes"]]
    samples = figures(tree, "samples")
    steps = [(b - a) / (m - n) for a, b, n, m in zip(samples, samples[1:], mounts, mounts[1:])]
    assert max(steps) - min(steps) <= 1, steps  # the mounts' series, nothing else growing


@pytest.mark.parametrize("tree", ["before", "after"])
def test_no_step_costs_more_per_added_series_than_the_one_before(tree: str) -> None:
    """Scrape time per added sample from 50 to 100 mounts at most 1.5x that from 10 to 50
    (a quadratic cost would double it), and memory per added sample no steeper either."""
    samples = figures(tree, "samples")
    for field, slack_kib in (("median_s", 0), ("rss_kib", 512)):
        values = figures(tree, field)
        middle = (values[2] - values[1]) / (samples[2] - samples[1])
        last = (values[3] - values[2]) / (samples[3] - samples[2])
        assert last <= 1.5 * middle + slack_kib / (samples[3] - samples[2]), (field, middle, last)


def test_the_same_series_are_served_before_and_after() -> None:
    assert figures("before", "samples") == figures("after", "samples")


def test_after_scrapes_faster_than_before_at_every_size_and_fit() -> None:
    res = recorded()
    for row in res["sizes"]:
        assert row["after"]["median_s"] < row["before"]["median_s"], row["mounts"]
    _b, before = bench_scale.per_mount_fit(res, "before", "median_s")
    _a, after = bench_scale.per_mount_fit(res, "after", "median_s")
    assert 0 < after < before

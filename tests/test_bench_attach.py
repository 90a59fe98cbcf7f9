"""bench/bench_attach.py's per-program figures, on the JSON of its `--set core-tree` run in a
6.12 lab guest (2026-12-06): the loaders' totals are the sums of their programs' runs."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import bench_attach  # noqa: E402

RUN = Path(__file__).parent / "fixtures" / "6.12.117+deb13-amd64" / "bench" / "bench_attach_core_tree.json"


def test_a_loaders_time_per_run_is_that_of_its_programs_together() -> None:
    res = json.loads(RUN.read_text())
    for tool, programs in res["programs"].items():
        runs = sum(seen["run_cnt"] for seen in programs.values())
        ns = sum(seen["run_time_ns"] for seen in programs.values())
        assert res["bpf_ns_per_run"][tool] == pytest.approx(ns / runs)


def test_the_report_gives_each_program_its_time_and_size() -> None:
    res = json.loads(RUN.read_text())
    text = bench_attach.report(res)
    for tool, programs in res["programs"].items():
        for name, seen in programs.items():
            assert (f"{name}: {seen['run_time_ns'] / seen['run_cnt']:.0f} ns per run over {seen['run_cnt']} runs, "
                    f"{seen['bytes_xlated']} bytes xlated") in text


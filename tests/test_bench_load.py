"""bench/bench_load.py's run kept as a fixture (7.3 lab guest, 1 vCPU, PREEMPT_LAZY: 4 writers x
200 rounds of create/write/stat/unlink on NFSv3 under `nfsslower --ops all --json 0`, core and
bcc, main's tree before and this one after, in one boot): nothing is printed that the writers did
not issue; where the tool printed fewer, it said so (the ring buffer's dropped events: its reader
fell behind), and no probe run was skipped; after, reading the events at real-time priority,
every one of the 4 x 800 operations is printed on both loaders and nothing is lost."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import bench_load  # noqa: E402

RUN = Path(__file__).parent / "fixtures" / "7.3.4+deb13-amd64" / "bench" / "bench_load.json"


def recorded() -> Dict[str, Any]:
    return json.loads(RUN.read_text())


def rows(tree: str) -> List[Dict[str, Any]]:
    return [row for row in recorded()["runs"] if row["tree"] == tree]


def test_both_trees_ran_the_load_on_both_loaders_on_one_preemptible_cpu() -> None:
    res = recorded()
    assert res["kernel"].startswith("7.3") and res["cpus"] == 1 and "CONFIG_PREEMPT_LAZY=y" in res["preempt"]
    assert (res["writers"], res["rounds"]) == (bench_load.WRITERS, bench_load.ROUNDS) == (4, 200)
    for tree in ("before", "after"):
        assert sorted(row["loader"] for row in rows(tree)) == sorted(bench_load.LOADERS)
        for row in rows(tree):
            assert row["rc"] == 0 and row["attach"] == "fentry", row["stderr"]
            assert row["issued"] == {op: 800 for op in bench_load.OPS}


@pytest.mark.parametrize("tree", ["before", "after"])
def test_nothing_is_printed_twice_and_what_is_not_printed_is_said(tree: str) -> None:
    """Fewer lines than operations only with a "events lost" warning at least as large; no
    run of a probe skipped by the kernel (no recursion, kprobe or start store count): on 7.3
    task storage has no busy counter to refuse a start."""
    assert recorded()["task_storage_busy_counter"] is False
    for row in rows(tree):
        short = sum(row["issued"][op] - row["counted"][op] for op in bench_load.OPS)
        assert all(row["counted"][op] <= row["issued"][op] for op in bench_load.OPS), row["counted"]
        assert row["missed"] == {}, row["missed"]
        assert bench_load.events_lost(row) >= short, (row["loader"], short)


def test_before_core_fell_behind_and_dropped_events() -> None:
    core = next(row for row in rows("before") if row["loader"] == "core")
    assert bench_load.events_lost(core) > 0 and core["counted"]["write"] < 800


def test_after_every_operation_is_printed_on_both_loaders() -> None:
    for row in rows("after"):
        assert row["counted"] == row["issued"] and bench_load.events_lost(row) == 0, row["loader"]


def test_a_warning_is_read_per_op_and_cause() -> None:
    line = ("nfsslower: warning: not counted: 3 write (kernel: 2 runs skipped at nfs_file_write; probe: 1 starts "
            "not stored), 1 open (kernel: 1 kretprobe misses at nfs_file_open) (docs/probes.md, 'Missed operations')")
    assert bench_load.parse_missed(line) == {"write": {"recursion at nfs_file_write": 2, "start_not_stored": 1},
                                             "open": {"kretprobe at nfs_file_open": 1}}
    assert bench_load.events_lost({"stderr": ["nfsslower: warning: 204 events lost (buffer full: the reader fell "
                                              "behind)", "nfsslower: warning: 3 events lost (buffer full: ...)"]}) == 207

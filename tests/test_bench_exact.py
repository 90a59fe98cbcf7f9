"""bench/bench_exact.py's runs kept as fixtures (issue 34: the fs check's exact counts, repeated in
one boot of each kernel on the shared, loaded host): every run asked for ran and was judged, the
numbers kept agree with the verdicts, and no operation went uncounted without the tool saying so."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import bench_exact  # noqa: E402

FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("*/bench/bench_exact.json"))


def recorded(path: Path) -> Dict[str, Any]:
    return json.loads(path.read_text())


def judged(res: Dict[str, Any]) -> Iterator[Tuple[int, str, Dict[str, Any]]]:
    for entry in res["runs"]:
        for fs, verdict in entry.get("fs", {}).items():
            yield entry["run"], fs, verdict


def test_there_are_runs_to_read() -> None:
    assert FIXTURES, "no tests/fixtures/*/bench/bench_exact.json"


@pytest.fixture(params=FIXTURES, ids=lambda path: path.parent.parent.name)
def res(request: pytest.FixtureRequest) -> Dict[str, Any]:
    out = recorded(request.param)
    assert out["kernel"] == request.param.parent.parent.name
    return out


def test_every_run_asked_for_ran_and_was_judged(res: Dict[str, Any]) -> None:
    assert [entry["run"] for entry in res["runs"]] == list(range(1, res["runs_asked"] + 1))
    for entry in res["runs"]:
        assert "error" not in entry, entry
        assert sorted(entry["fs"]) == sorted(pair.split(":")[0] for pair in res["plan"])
        for fs, verdict in entry["fs"].items():
            assert verdict["ran"] == "" and verdict["verdict"] in bench_exact.VERDICTS, (entry["run"], fs, verdict)


def test_the_host_was_loaded_and_its_load_kept(res: Dict[str, Any]) -> None:
    load = res["host_load"]
    assert load["samples"] and load["min"] <= load["mean"] <= load["max"]
    assert load["max"] > 2, "the issue wants a loaded host (2 cores): this run's was not"


def test_the_numbers_kept_agree_with_each_verdict(res: Dict[str, Any]) -> None:
    """exact: every op counted as issued; otherwise the bench's judgement of the numbers kept
    gives the verdict kept."""
    for run, fs, verdict in judged(res):
        numbers: List[Dict[str, int]] = [n for ops in verdict["phases"].values() for n in ops.values()]
        if verdict["verdict"] == "exact":
            assert verdict["counts"] == "" and all(n["counted"] == n["issued"] for n in numbers), (run, fs)
            continue
        run_wide = verdict["missed_outside"] if verdict["tool"] == "fsslower" else {}
        assert bench_exact.judge_counts(verdict["phases"], run_wide) == verdict["verdict"], (run, fs)


def test_nothing_went_uncounted_without_a_report(res: Dict[str, Any]) -> None:
    """Issue 34's done-when: each phase's count is the workload's, or the tool reported the
    difference; with the exporter, its counts too."""
    for run, fs, verdict in judged(res):
        assert verdict["verdict"] != "unreported", (run, fs, verdict["counts"], verdict["phases"])
        assert verdict.get("exporter", "") == "", (run, fs, verdict["exporter"])


def test_said_missed_reads_the_warning_as_the_tools_word_it() -> None:
    from probes.runtime import describe_missed
    causes = {("write", "kretprobe", "xfs_file_write_iter"): 3, ("write", "start_not_stored", ""): 1,
              ("read", "recursion", "xfs_file_read_iter"): 2}
    line = f"fsslower: warning: not counted: {describe_missed(causes)} (docs/probes.md, 'Missed operations')"
    assert bench_exact.said_missed(f"{line}\nother\n{line}\n") == {"write": 8, "read": 4}


def test_judge_counts() -> None:
    def phase(counted: int, issued: int, missed: int) -> Dict[str, Dict[str, Dict[str, int]]]:
        return {"plain": {"read": {"counted": counted, "issued": issued, "missed": missed}}}

    assert bench_exact.judge_counts(phase(3, 4, 1), {}) == "reported"
    assert bench_exact.judge_counts(phase(3, 4, 0), {}) == "unreported"
    assert bench_exact.judge_counts(phase(5, 4, 0), {}) == "unreported"
    assert bench_exact.judge_counts(phase(4, 4, 0), {}) == "unreported"  # counts right, bytes not
    assert bench_exact.judge_counts(phase(3, 4, 0), {"read": 1}) == "reported"
    two = {"plain": phase(3, 4, 0)["plain"], "delay": phase(3, 4, 0)["plain"]}
    assert bench_exact.judge_counts(two, {"read": 1}) == "unreported"  # one miss covers one op once

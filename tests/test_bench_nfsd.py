"""bench/bench_nfsd.py's figures and checks, on the JSON its 6.12 lab run printed (2026-12-04
23:16 UTC, `bench_nfsd.py --lab h20 --pairs 6`): rounds alternate ABBA, every median is of its
rounds' median loops, each pair is two neighbouring rounds, the BPF time is the sum over the
probe's rounds, and a request the server or nfsdtop did not count is said."""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any, Dict

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import bench_nfsd  # noqa: E402

RUN = Path(__file__).parent / "fixtures" / "6.12.117+deb13-amd64" / "bench" / "bench_nfsd.json"


def recorded() -> Dict[str, Any]:
    return json.loads(RUN.read_text())


def test_rounds_alternate_abba() -> None:
    assert bench_nfsd.schedule(2) == ["off", "on", "on", "off"]
    for pairs in (2, 4, 6):
        states = bench_nfsd.schedule(pairs)
        firsts = states[0::2]
        assert states.count("off") == states.count("on") == pairs
        assert firsts.count("off") == firsts.count("on") == pairs // 2
    assert [r["state"] for r in recorded()["rounds"]] == bench_nfsd.schedule(recorded()["pairs"])


def test_every_recorded_round_was_served_and_counted() -> None:
    res = recorded()
    for record in res["rounds"]:
        assert bench_nfsd.problems(record) == [], record["state"]
    assert res["attachments"]["after"] == res["attachments"]["before"]


def test_medians_and_pairs_are_of_the_rounds_median_loops() -> None:
    res = recorded()
    got = bench_nfsd.summary(res)
    per_round = [statistics.median(r["seconds"]) / r["requests"] * 1e6 for r in res["rounds"]]
    assert [row["us_per_request"] for row in got["rounds"]] == per_round
    off = statistics.median(v for v, r in zip(per_round, res["rounds"]) if r["state"] == "off")
    on = statistics.median(v for v, r in zip(per_round, res["rounds"]) if r["state"] == "on")
    assert (got["off_us"], got["on_us"], got["ratio"], got["added_us"]) == (off, on, on / off, on - off)
    assert len(got["pairs"]) == res["pairs"]
    for number, pair in enumerate(got["pairs"]):
        first, second = per_round[2 * number], per_round[2 * number + 1]
        assert {pair["off"], pair["on"]} == {first, second}
        assert pair["ratio"] == pytest.approx(pair["on"] / pair["off"])
    assert got["pair_ratio_median"] == statistics.median(pair["ratio"] for pair in got["pairs"])


def test_bpf_time_is_summed_over_the_probes_rounds() -> None:
    res = recorded()
    bpf = bench_nfsd.summary(res)["bpf"]
    probed = [r for r in res["rounds"] if r["state"] == "on"]
    assert bpf["requests"] == sum(r["requests"] * len(r["seconds"]) for r in probed)
    assert bpf["runs"] == sum(entry["runs"] for entry in bpf["per_program"].values())
    assert bpf["ns"] == sum(ns for r in probed for _, ns in r["programs"].values())
    assert bpf["ns_per_run"] == bpf["ns"] / bpf["runs"]
    # a READ runs the request's fentry/fexit pair, the export's and the read's tracepoints
    assert {name: entry["runs"] / bpf["requests"] for name, entry in bpf["per_program"].items() if entry["runs"]} == \
        pytest.approx({"nfsd_dispatch": 2, "fh_verify": 2, "tracepoint__nfsd__nfsd_read_start": 1,
                       "tracepoint__nfsd__nfsd_read_done": 1}, abs=0.001)
    assert bpf["per_program"]["tracepoint__nfsd__nfsd_write_start"]["ns_per_run"] is None  # no write ran


def test_a_request_not_counted_is_said() -> None:
    res = recorded()
    served = res["rounds"][0]
    served["server_delta"]["NFSv3 READ"] -= 1
    assert any("the server counted" in said for said in bench_nfsd.problems(served))
    probed = res["rounds"][1]
    intervals = [i for i, line in enumerate(probed["tool"]["lines"]) if '"NFSv3 READ"' in line]
    del probed["tool"]["lines"][intervals[-1]]  # an interval nfsdtop printed, lost
    said = bench_nfsd.problems(probed)
    assert any(s.startswith("nfsdtop counted {") for s in said) and any("bytes read" in s for s in said), said
    probed["tool"]["rc"] = 1
    assert "nfsdtop exited 1" in bench_nfsd.problems(probed)
    assert "CHECK FAILED" in bench_nfsd.report(res)


def test_report_gives_every_round_and_the_medians() -> None:
    text = bench_nfsd.report(recorded())
    assert sum(line.startswith("  round ") for line in text.splitlines()) == 12
    assert "medians: off " in text and "nothing left attached" in text and "CHECK FAILED" not in text


@pytest.mark.parametrize("argv", [["--pairs", "0"], ["--loops"], ["--requests", "x"], ["--warmup", "-1"],
                                  ["--frob"]])
def test_bad_options_stop_before_anything_runs(argv: list, capsys: pytest.CaptureFixture) -> None:
    assert bench_nfsd.main(["bench_nfsd.py", *argv]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1

"""The lab guest scripts wait on evidence, not on time: a tool's printed interval that read its
counts after a phase (probes_guest.wait_flushed), a scrape Prometheus holds after a phase
(exporter_guest.scraped_after), and phase windows that end at that evidence (interval_in).

The interval lines are nfsdist's real output of the 6.1 exporter run (tests/fixtures/6.1.0-50-amd64/
exporter); the scrape lists stand for Prometheus' `up` samples (timestamp, succeeded).
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from labs.checks.exporter import guest as exporter_guest
from labs.checks.probes import guest as probes_guest
from labs.checks.probes.guest import wait_flushed
from labs.checks.shared import interval_in, wall

RUN = Path(__file__).parent / "fixtures" / "6.1.0-50-amd64" / "exporter" / "exporter-run.json.gz"


@pytest.fixture(scope="module")
def nfsdist_lines() -> List[str]:
    with gzip.open(RUN, "rt") as handle:
        lines: List[str] = json.load(handle)["nfsdist"]["lines"]
    return lines


def log_of(tmp_path: Path, lines: List[str]) -> str:
    path = tmp_path / "nfsdist.out"
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def test_flushed_once_the_interval_after_the_first_stamped_later_is_printed(
        tmp_path: Path, nfsdist_lines: List[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """An interval stamped after the moment was printed after it; the next one read after it.
    Until that next one is printed, the wait goes on and, at its bound, says what never came."""
    stamps = [wall(json.loads(line)["ts"]) for line in nfsdist_lines[1:]]
    moment = stamps[10] - 0.5  # intervals 10 (stamped later) and 11 (read after) are needed
    assert wait_flushed([log_of(tmp_path, nfsdist_lines[:13])], moment, "the phase") > 0
    monkeypatch.setattr(probes_guest, "EVIDENCE_WAIT_S", 0.3)
    with pytest.raises(RuntimeError, match="never printed an interval read after the phase"):
        wait_flushed([log_of(tmp_path, nfsdist_lines[:12])], moment, "the phase")


def test_a_phase_window_ends_at_its_evidence_or_else_at_the_old_allowance() -> None:
    phase: Dict[str, Any] = {"start": wall("2026-12-02 19:38:30"), "end": wall("2026-12-02 19:38:35")}
    assert interval_in("2026-12-02 19:38:29", phase)
    assert not interval_in("2026-12-02 19:38:28", phase)
    assert interval_in("2026-12-02 19:38:38", phase) and not interval_in("2026-12-02 19:38:39", phase)
    phase["flushed"] = wall("2026-12-02 19:38:50")  # a loaded guest printed the phase's end late
    assert interval_in("2026-12-02 19:38:50", phase) and not interval_in("2026-12-02 19:38:51", phase)


def prometheus_holds(monkeypatch: pytest.MonkeyPatch, held: Dict[str, List[Tuple[float, bool]]]) -> None:
    monkeypatch.setattr(exporter_guest, "scrapes", lambda job, window="20m": held[job])


def test_promql_time_is_a_scrape_after_the_moment_with_no_target_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    """At 13 the exporter's last scrape (12) failed (its series stale): 14 is the first time both
    targets' last scrapes succeeded after 10.5."""
    prometheus_holds(monkeypatch, {"probekit": [(10.0, True), (12.0, False), (14.0, True)],
                                   "node": [(11.0, True), (13.0, True)]})
    assert exporter_guest.scraped_after(10.5, "the workload", ("probekit", "node")) == 14.0
    assert exporter_guest.scraped_after(10.5, "the workload") == 14.0


def test_a_scrape_that_never_comes_is_reported_as_such(monkeypatch: pytest.MonkeyPatch) -> None:
    prometheus_holds(monkeypatch, {"probekit": [(10.0, True), (12.0, False)]})
    monkeypatch.setattr(exporter_guest, "EVIDENCE_WAIT_S", 0.0)
    monkeypatch.setattr(exporter_guest, "SCRAPE_S", 0.0)
    with pytest.raises(RuntimeError, match="never held a successful scrape of probekit after the delay phase"):
        exporter_guest.scraped_after(10.5, "the delay phase")

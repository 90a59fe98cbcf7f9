"""The probe lab checks' verdicts (labs/probe_checks.py) on a real 5.10 guest run (README beside it)."""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Dict

import pytest

from labs.probe_checks import verify_nfsslower_reports_injected_latency

RUN = Path(__file__).parent / "fixtures" / "5.10.0-32-amd64" / "probes" / "guest-run.json.gz"


@pytest.fixture
def run() -> Dict[str, Any]:
    with gzip.open(RUN, "rt") as handle:
        out: Dict[str, Any] = json.load(handle)
    return out


def delayed_reads(run: Dict[str, Any]) -> list:
    return [e for e in run["main"]["data"]["nfsslower"]["events"] if e["phase"] == "delay" and e["op"] == "read"]


def test_a_read_waiting_on_readahead_under_the_round_trip_passes(run: Dict[str, Any]) -> None:
    """The read that sent the READ waited the whole added round trip, the one behind it less."""
    rtt_us = run["main"]["data"]["rtt_delay_ms"] * 1000
    assert sorted(e["lat_us"] >= rtt_us for e in delayed_reads(run)) == [False, True]
    verify_nfsslower_reports_injected_latency(run)


def test_no_read_at_the_round_trip_fails(run: Dict[str, Any]) -> None:
    """A delay that no read waited for in full (a probe timing only part of it) is caught."""
    rtt_us = run["main"]["data"]["rtt_delay_ms"] * 1000
    for event in delayed_reads(run):
        event["lat_us"] = min(event["lat_us"], rtt_us - 1)
    with pytest.raises(AssertionError):
        verify_nfsslower_reports_injected_latency(run)

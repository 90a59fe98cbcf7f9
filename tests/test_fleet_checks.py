"""The fleet check's verdicts (labs/fleet_checks.py) on a real run of a Debian 7.3 QEMU fleet: the
server with nfsdtop by client, client-b reading lightly under nfsdist, client-a loading the server
part-way (README beside the fixture). Each negative case is the same run varied as a real mistake
or a real other outcome would vary it."""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Dict

import pytest

from labs import fleet_checks as fc

RUN = Path(__file__).parent / "fixtures" / "7.3.4+deb13-amd64" / "fleet" / "guest-run.json.gz"


@pytest.fixture
def data() -> Dict[str, Any]:
    with gzip.open(RUN, "rt") as handle:
        out: Dict[str, Any] = json.load(handle)
    assert out["check"] == "fleet" and out["ok"]
    return dict(out["data"])


@pytest.mark.parametrize("verify", fc.FLEET_CHECKS, ids=lambda f: f.__name__[len("verify_"):])
def test_the_lab_run_passes(data: Dict[str, Any], verify: Any) -> None:
    verify(data)


def test_the_run_is_three_guests_of_one_kernel(data: Dict[str, Any]) -> None:
    assert data["nodes"] == {"server": "server", "heavy": "client-a", "light": "client-b"}
    releases = {fc.role(data, name)["release"] for name in ("server", "light", "heavy")}
    assert releases == {"7.3.4+deb13-amd64"}
    assert (fc.role(data, "heavy")["address"], fc.role(data, "light")["address"]) == ("10.77.0.2", "10.77.0.3")


def swap_roles(data: Dict[str, Any]) -> None:
    """The two clients' roles swapped: client-b taken for the loader, client-a for the light reader."""
    light, heavy = data["light"]["data"], data["heavy"]["data"]
    light["address"], heavy["address"] = heavy["address"], light["address"]


def test_swapped_roles_fail_the_ranking_and_the_counts(data: Dict[str, Any]) -> None:
    swap_roles(data)
    with pytest.raises(AssertionError, match=r"before: NFSv3 requests of \{'10.77.0.3'\} \(client-b 10.77.0.2 only\)"):
        fc.verify_heavy_client_ranked_first(data)
    with pytest.raises(AssertionError, match="nfsdtop counted more than issued"):
        fc.verify_counts_per_client(data)


def swap_phases(seen: Any, one: str, other: str) -> None:
    for entry in seen:
        entry[0] = {one: other, other: one}.get(entry[0], entry[0])


def test_no_slowdown_fails_both_latency_verdicts(data: Dict[str, Any]) -> None:
    """The heavy phase's reads and nfsdist intervals taken for the before phase's and back: the
    reads under load are then the `before` ones, and the quiet ones the `heavy` ones."""
    light = data["light"]["data"]
    swap_phases(light["seen"], "before", "heavy")
    for read in light["reads"]:
        read[2] = {"before": "heavy", "heavy": "before"}.get(read[2], read[2])
    with pytest.raises(AssertionError, match="read µs per phase"):
        fc.verify_light_reads_slower_under_load(data)
    with pytest.raises(AssertionError, match=r"read bucket \(µs\) per phase"):
        fc.verify_nfsdist_sees_the_slowdown(data)


def test_nfsdtop_short_by_what_it_reported_missed(data: Dict[str, Any]) -> None:
    """The real run: nfsdtop counted fewer requests than issued, all within what it reported missed."""
    server = fc.role(data, "server")
    counted = fc.per_client(server)
    short = sum(n - counted[client["address"]].get(label, 0) for client in (fc.role(data, "light"), fc.role(data, "heavy"))
                for label, n in client["issued"].items())
    assert 0 < short <= fc.missed(server) == 110


def test_a_miss_nfsdtop_did_not_report_fails_the_counts(data: Dict[str, Any]) -> None:
    """The same counts with nfsdtop's "missed" gone: the shortfall is then unexplained."""
    lines = data["server"]["data"]["nfsdtop"]["lines"]
    for index, line in enumerate(lines):
        if line.startswith("{") and '"missed"' in line:
            record = json.loads(line)
            record["missed"] = {}
            lines[index] = json.dumps(record)
    with pytest.raises(AssertionError, match="109 NFSv3 requests not counted, nfsdtop reported 0 missed"):
        fc.verify_counts_per_client(data)


def test_a_request_counted_twice_fails_the_counts(data: Dict[str, Any]) -> None:
    """One of client-b's READs counted in two intervals: more than it issued."""
    light = fc.role(data, "light")
    lines = data["server"]["data"]["nfsdtop"]["lines"]
    for index, line in enumerate(lines):
        record = json.loads(line) if line.startswith("{") else {}
        reads = [r for r in record.get("requests", []) if r["client"] == light["address"] and r["proc"] == "READ"
                 and r["version"] == 3]
        if reads:
            reads[0]["count"] += 8
            lines[index] = json.dumps(record)
            break
    with pytest.raises(AssertionError, match=r"light \(10.77.0.3\): nfsdtop counted more than issued"):
        fc.verify_counts_per_client(data)


def test_a_read_nfsdist_missed_fails(data: Dict[str, Any]) -> None:
    """The workload's reads one more than nfsdist counted (a read it did not see)."""
    light = data["light"]["data"]
    light["reads"].append(list(light["reads"][-1]))
    with pytest.raises(AssertionError, match="nfsdist counted"):
        fc.verify_nfsdist_sees_the_slowdown(data)


def test_the_heavy_client_outside_its_phase_fails(data: Dict[str, Any]) -> None:
    """The server's view of `before` and `heavy` swapped: client-a's requests then fall in `before`."""
    swap_phases(data["server"]["data"]["seen"], "before", "heavy")
    with pytest.raises(AssertionError, match="before: NFSv3 requests of"):
        fc.verify_heavy_client_ranked_first(data)


def test_a_quiet_window_taken_for_heavy_fails_the_ranking(data: Dict[str, Any]) -> None:
    """The server's view of `heavy` and `after` swapped: its `heavy` intervals are then client-b's alone."""
    swap_phases(data["server"]["data"]["seen"], "heavy", "after")
    with pytest.raises(AssertionError, match=r"heavy: first rows \['10.77.0.3'"):
        fc.verify_heavy_client_ranked_first(data)

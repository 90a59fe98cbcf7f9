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


# -- the exporters, Prometheus and the pause -----------------------------------------------------

def alert_rows(data: Dict[str, Any]) -> Any:
    return data["light"]["data"]["prom"]["data"]["kept"]["alerts"]


def test_the_noisy_alert_for_client_b_fails(data: Dict[str, Any]) -> None:
    """client-a's NFSNoisyClient samples relabelled as client-b's: the alert then named the wrong client."""
    light = fc.role(data, "light")["address"]
    for row in alert_rows(data):
        if row["metric"]["alertname"] == "NFSNoisyClient":
            row["metric"]["client"] = light
    with pytest.raises(AssertionError, match="NFSNoisyClient never fired for client-a"):
        fc.verify_rules_load_and_noisy_alert_fires_for_client_a_only(data)


def test_a_pending_noisy_alert_for_client_b_fails(data: Dict[str, Any]) -> None:
    """One pending sample of NFSNoisyClient for client-b beside client-a's: the alert is not client-a's alone."""
    row = next(r for r in alert_rows(data) if r["metric"]["alertname"] == "NFSNoisyClient")
    alert_rows(data).append({"metric": dict(row["metric"], client=fc.role(data, "light")["address"],
                                            alertstate="pending"), "values": row["values"][:1]})
    with pytest.raises(AssertionError, match="NFSNoisyClient for others than client-a"):
        fc.verify_rules_load_and_noisy_alert_fires_for_client_a_only(data)


def test_the_stuck_alert_missing_a_client_fails(data: Dict[str, Any]) -> None:
    """The pause's NFSOperationsStuck samples of client-b's exporter gone: one client's mount is not named."""
    light = fc.target(fc.prom(data), fc.role(data, "light")["address"])
    rows = alert_rows(data)
    rows[:] = [r for r in rows if not (r["metric"]["alertname"] == "NFSOperationsStuck"
                                       and r["metric"]["instance"] == light)]
    with pytest.raises(AssertionError, match=r"NFSOperationsStuck fired for .*, not for \[\('10.77.0.3:19910'"):
        fc.verify_stuck_alert_names_the_server_and_both_mounts(data)


def test_a_stuck_alert_before_the_pause_fails(data: Dict[str, Any]) -> None:
    """Prometheus' view of `pause` moved before `after`: its stuck alerts then fired before the pause."""
    found = data["light"]["data"]["prom"]["data"]
    stop = next(t for name, t in found["seen"] if name == "stop")
    for entry in found["seen"]:
        if entry[0] == "pause":
            entry[1] = stop  # the pause seen only when it was over
    with pytest.raises(AssertionError, match="NFSOperationsStuck before the pause"):
        fc.verify_stuck_alert_names_the_server_and_both_mounts(data)


def test_swapped_roles_fail_the_recorded_share(data: Dict[str, Any]) -> None:
    swap_roles(data)
    with pytest.raises(AssertionError, match="end of heavy: shares"):
        fc.verify_recorded_share_names_client_a_top(data)
    with pytest.raises(AssertionError, match="nfs-exporter --nfsd counted more than issued"):
        fc.verify_server_exporter_counts_each_request_once(data)


def test_a_load_outside_its_unit_fails_nfstop(data: Dict[str, Any]) -> None:
    """The load said to have run in another unit: nfstop's first rows are then not its cgroup."""
    load = data["heavy"]["data"]["load"]
    load["cgroup"] = load["cgroup"].replace("probekit-fleet-heavy", "other-unit")
    data["heavy"]["data"]["unit"] = "other-unit"
    with pytest.raises(AssertionError, match="nfstop's first rows while the load ran"):
        fc.verify_nfstop_names_the_load_unit(data)


def test_a_write_counted_twice_fails_the_client_exporter(data: Dict[str, Any]) -> None:
    """One write fewer made by the load than client-a's exporter counted: counted twice."""
    writer = next(w for w in data["heavy"]["data"]["workers"] if w["writer"])
    writer["requests"] -= 1
    with pytest.raises(AssertionError, match="heavy's nfs-exporter, write on /mnt/nfs3: counted"):
        fc.verify_client_exporters_count_each_operation_once(data)


def test_a_pause_read_the_exporter_lost_fails(data: Dict[str, Any]) -> None:
    """One read more made in the pause than client-a's exporter counted, none reported missed: lost."""
    heavy = data["heavy"]["data"]
    heavy["pause_reads"].append(list(heavy["pause_reads"][-1]))
    with pytest.raises(AssertionError, match="heavy's nfs-exporter, read on /mnt/nfs3: counted"):
        fc.verify_client_exporters_count_each_operation_once(data)

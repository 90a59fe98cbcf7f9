"""The exporter lab check's verdicts (labs/checks/exporter/verdicts.py) on real runs: a Debian 6.1 guest
(default options), a 7.3 pair's client and a 7.2 guest (--cgroup-label, nfsv4 loaded after the
start; on bcc, and on core, which traces it beside the running programs).

The fixtures are what labs/checks/exporter/guest.py printed there (READMEs beside them); the
negative cases change one thing in a copy, the way a broken exporter or a lost operation
would, and the verdict must say what is wrong.
"""
from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path
from typing import Any, Dict

import pytest

from labs.checks.exporter.verdicts import (EXPORTER_CHECKS, exporter_edges_around, quantile_bucket,
                                           verify_attached_once_or_again_when_nfsv4_loaded,
                                           verify_cgroup_label_only_when_asked_and_each_unit_on_its_own_series, verify_promql_counts_equal_the_workload_on_both_mounts,
                                           verify_quantiles_agree_with_nfsdist_and_move_with_delay,
                                           verify_series_move_by_the_workload_on_its_mount_only,
                                           verify_the_shipped_rules_evaluate_on_the_lab_scrapes)

FIXTURES = Path(__file__).parent / "fixtures"
RUN = FIXTURES / "6.1.0-50-amd64" / "exporter" / "exporter-run.json.gz"
CGROUP_RUN = FIXTURES / "7.3.4+deb13-amd64" / "exporter" / "exporter-run.json.gz"
#: on core: nfsv4 traced beside the running programs, the counters going on
CORE_LATE_RUN = FIXTURES / "7.3.4+deb13-amd64" / "exporter" / "late-nfsv4-core-run.json.gz"
#: sid: one getattr of /mnt/nfs42 while it was mounted after nfsv4 loaded (the lab agent's, not the workload's)
SID_RUN = FIXTURES / "7.2.13+deb14-amd64" / "exporter" / "exporter-run.json.gz"


def load(path: Path) -> Dict[str, Any]:
    with gzip.open(path, "rt") as handle:
        out: Dict[str, Any] = json.load(handle)
    return out


@pytest.fixture(scope="module")
def real() -> Dict[str, Any]:
    return load(RUN)


@pytest.fixture
def run(real: Dict[str, Any]) -> Dict[str, Any]:
    return copy.deepcopy(real)


@pytest.fixture
def cgroup_run() -> Dict[str, Any]:
    return load(CGROUP_RUN)


@pytest.mark.parametrize("path", [RUN, CGROUP_RUN, CORE_LATE_RUN, SID_RUN],
                         ids=["6.1", "7.3-cgroup-label-late-nfsv4", "7.3-core-late-nfsv4", "7.2-core-late-nfsv4"])
@pytest.mark.parametrize("check", EXPORTER_CHECKS, ids=lambda c: c[0])
def test_every_check_passes_on_the_real_runs(path: Path, check: Any) -> None:
    _name, verify, args = check
    verify(load(path), *args)


def test_a_units_operation_counted_under_another_cgroup_fails(cgroup_run: Dict[str, Any]) -> None:
    """One of unit a's reads shows up under the root cgroup instead: the verdict names it."""
    phase = cgroup_run["phases"]["nfs3"]
    by_cgroup = phase["moved"]["by_cgroup"]
    by_cgroup[f"read /mnt/nfs3 {phase['cgroup']}"] -= 1
    by_cgroup["read /mnt/nfs3 /"] = 1
    with pytest.raises(AssertionError, match="read /mnt/nfs3 cgroup=/probekit.slice"):
        verify_cgroup_label_only_when_asked_and_each_unit_on_its_own_series(cgroup_run)


def test_a_cgroup_label_without_the_option_fails(run: Dict[str, Any], cgroup_run: Dict[str, Any]) -> None:
    """The default exporter must not label by cgroup: the 7.3 text under a run that says the
    option was off is caught."""
    run["texts"]["probekit"] = cgroup_run["texts"]["probekit"]
    with pytest.raises(AssertionError):
        verify_cgroup_label_only_when_asked_and_each_unit_on_its_own_series(run)


def test_quantile_ranks_as_histogram_quantile_does(run: Dict[str, Any]) -> None:
    """The delayed phase's four reads (400 ms of round trip): two served by readahead, two that
    waited for the server, 262-524 ms."""
    hist = run["quantile"]["phases"]["delay"]["nfsdist_hist"]
    assert sum(hist.values()) == run["quantile"]["phases"]["delay"]["issued"]["read"] == 4
    assert quantile_bucket(hist, 0.9) == (262144, 524287)
    assert quantile_bucket(hist, 0.5)[1] < 65536


def test_a_read_timed_across_an_edge_by_the_two_tools_passes() -> None:
    """CI's 6.1 run: nfsdist put the median read in 1024-2047 us, the exporter above 2^21 ns,
    and histogram_quantile answered its bucket's upper edge, 4194 us: inside the bound."""
    low, high = exporter_edges_around(1024 / 2, 2048 * 2)
    assert (low, high) == (((1 << 18) - 1) / 1000, ((1 << 22) - 1) / 1000)
    assert low <= 4194.303 <= high


def test_a_quantile_two_log2_steps_off_fails(run: Dict[str, Any]) -> None:
    """The check allows one log2 step (nanosecond and microsecond buckets do not align); an
    exporter whose values sit two steps off is caught."""
    rows = run["quantile"]["phases"]["plain"]["promql"]["0.5"]
    value = float(rows[0]["value"][1])
    rows[0]["value"][1] = str(value * 4)
    with pytest.raises(AssertionError, match="plain q0.5: PromQL"):
        verify_quantiles_agree_with_nfsdist_and_move_with_delay(run)


def test_a_delay_that_does_not_move_the_quantile_fails(run: Dict[str, Any]) -> None:
    phases = run["quantile"]["phases"]
    phases["delay"] = copy.deepcopy(phases["plain"])
    with pytest.raises(AssertionError, match="rtt|plain|delay"):
        verify_quantiles_agree_with_nfsdist_and_move_with_delay(run)


def test_an_op_lost_without_a_word_fails_and_a_reported_one_passes(run: Dict[str, Any]) -> None:
    moved = run["phases"]["nfs3"]["moved"]["probekit_nfs_ops_total"]
    moved["write /mnt/nfs3"] -= 1
    with pytest.raises(AssertionError, match="the tool reported 0 missed"):
        verify_series_move_by_the_workload_on_its_mount_only(run, "nfs3")
    run["phases"]["nfs3"]["missed"] = {"write": 1}
    run["phases"]["nfs3"]["moved"]["probekit_nfs_op_latency_seconds_count"]["write /mnt/nfs3"] -= 1
    verify_series_move_by_the_workload_on_its_mount_only(run, "nfs3")


def test_a_promql_count_above_the_workload_fails(run: Dict[str, Any]) -> None:
    row = next(r for r in run["promql"]["counts"] if r["metric"]["op"] == "read")
    row["value"][1] = str(int(float(row["value"][1])) + 1)
    with pytest.raises(AssertionError, match="PromQL read"):
        verify_promql_counts_equal_the_workload_on_both_mounts(run)


def test_no_second_attach_after_nfsv4_loaded_fails(cgroup_run: Dict[str, Any]) -> None:
    """An exporter that keeps its first probe when nfsv4 loads (the v4.2 opens would go
    uncounted) is caught by its stderr before any count is compared."""
    cgroup_run["stderr"] = [line for line in cgroup_run["stderr"] if "attaching again" not in line]
    with pytest.raises(AssertionError):
        verify_attached_once_or_again_when_nfsv4_loaded(cgroup_run)
    assert cgroup_run["late_nfsv4"] and cgroup_run["nfsv4_at_start"] is False


def test_a_rule_prometheus_could_not_evaluate_fails(run: Dict[str, Any]) -> None:
    rule = run["rules"]["rules"][0]
    rule["health"], rule["error"] = "err", "found duplicate series for the match group"
    with pytest.raises(AssertionError, match="could not evaluate"):
        verify_the_shipped_rules_evaluate_on_the_lab_scrapes(run)


def test_a_shipped_rule_prometheus_did_not_load_fails(run: Dict[str, Any]) -> None:
    run["rules"]["rules"] = [rule for rule in run["rules"]["rules"] if rule["name"] != "NFSOperationsStuck"]
    with pytest.raises(AssertionError):
        verify_the_shipped_rules_evaluate_on_the_lab_scrapes(run)


def test_a_mount_the_recorded_rate_left_out_fails(run: Dict[str, Any]) -> None:
    rows = run["rules"]["recorded"]["ops_rate"]
    run["rules"]["recorded"]["ops_rate"] = [row for row in rows if row["metric"].get("mountpoint") != "/mnt/nfs42"]
    with pytest.raises(AssertionError, match="/mnt/nfs42: the recorded ops rate never moved"):
        verify_the_shipped_rules_evaluate_on_the_lab_scrapes(run)


def test_a_stuck_alert_without_a_pause_fails(run: Dict[str, Any]) -> None:
    run["rules"]["alerts"].append({"name": "NFSOperationsStuck", "state": "firing", "labels": {}})
    with pytest.raises(AssertionError):
        verify_the_shipped_rules_evaluate_on_the_lab_scrapes(run)


@pytest.fixture
def core_late_run() -> Dict[str, Any]:
    return load(CORE_LATE_RUN)


def test_on_core_a_counter_lower_after_nfsv4_loaded_fails(core_late_run: Dict[str, Any]) -> None:
    """The scrape after nfsv4 loaded with the 5 NFSv3 getattrs gone, as a new probe's would be."""
    late = core_late_run["late"]
    assert late["backend"] == "core"
    late["after"] = "\n".join(line for line in late["after"].splitlines()
                              if not (line.startswith("probekit_nfs_ops_total{") and 'op="getattr"' in line)) + "\n"
    with pytest.raises(AssertionError, match="counters went back"):
        verify_attached_once_or_again_when_nfsv4_loaded(core_late_run)


def test_on_core_a_second_attach_fails(core_late_run: Dict[str, Any]) -> None:
    """An exporter on core that attached a new probe (counters restarting) instead of tracing
    nfsv4 beside the running one is caught by its stderr."""
    attached = next(line for line in core_late_run["stderr"] if line.startswith("nfs-exporter: probe attached: "))
    core_late_run["stderr"].append(attached)
    with pytest.raises(AssertionError):
        verify_attached_once_or_again_when_nfsv4_loaded(core_late_run)


def test_on_core_the_late_stats_are_no_workload_operation(core_late_run: Dict[str, Any]) -> None:
    """PromQL's totals since the start hold the 5 stats of /mnt/nfs3 done before nfsv4 loaded:
    the verdict takes them off, and one getattr more than that is still caught."""
    row = next(r for r in core_late_run["promql"]["counts"]
               if (r["metric"]["op"], r["metric"]["mountpoint"]) == ("getattr", "/mnt/nfs3"))
    assert int(row["value"][1]) == core_late_run["phases"]["nfs3"]["issued"]["getattr"] + core_late_run["late"]["stats"]
    verify_promql_counts_equal_the_workload_on_both_mounts(core_late_run)
    row["value"][1] = str(int(row["value"][1]) + 1)
    with pytest.raises(AssertionError, match="PromQL getattr /mnt/nfs3"):
        verify_promql_counts_equal_the_workload_on_both_mounts(core_late_run)


def test_what_the_late_mount_did_is_not_the_workload() -> None:
    """sid's run: the getattr of /mnt/nfs42 counted while it was mounted, between late_nfsv4's
    scrapes, is taken off its total; counted as the workload's it would be one too many."""
    sid = load(SID_RUN)
    verify_promql_counts_equal_the_workload_on_both_mounts(sid)
    sid["late"]["after"] = sid["late"]["before"]
    with pytest.raises(AssertionError, match="PromQL getattr /mnt/nfs42: counted 6, the workload issued 5"):
        verify_promql_counts_equal_the_workload_on_both_mounts(sid)

"""The probe lab checks' verdicts (labs/checks/probes/verdicts.py) on real guest runs: 5.10 (bcc) and 6.12
(core, with the bcc reference beside it; and a v3-only start with nfsv4 loaded under the
tools); READMEs beside them."""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Dict

import pytest

from labs.checks.probes.verdicts import (V3ONLY_CHECKS, verify_a_forced_kretprobe_miss_is_reported,
                                         verify_auto_picks_the_loader_and_bcc_counts_the_same,
                                         verify_fentry_where_the_loader_and_btf_allow, verify_late_nfsv4_is_traced_by_the_running_tools,
                                         verify_nfsslower_reports_injected_latency)
from labs.checks.shared import attach_kinds

RUN = Path(__file__).parent / "fixtures" / "5.10.0-32-amd64" / "probes" / "guest-run.json.gz"
RUN_CORE = Path(__file__).parent / "fixtures" / "6.12.117+deb13-amd64" / "probes" / "guest-run.json.gz"
#: the v3only run with nfsv4 loaded under the running tools, on core
LATE_RUN = Path(__file__).parent / "fixtures" / "6.12.117+deb13-amd64" / "probes" / "late-nfsv4-run.json.gz"
#: guest.py kmiss on 6.12 (probes kmiss.json of its lab run): 256 O_DIRECT reads, 16 at once
KMISS_RUN = Path(__file__).parent / "fixtures" / "6.12.117+deb13-amd64" / "probes" / "kmiss-run.json.gz"


def load(path: Path) -> Dict[str, Any]:
    with gzip.open(path, "rt") as handle:
        out: Dict[str, Any] = json.load(handle)
    return out


@pytest.fixture
def run() -> Dict[str, Any]:
    return load(RUN)


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


@pytest.fixture
def core_run() -> Dict[str, Any]:
    return load(RUN_CORE)


def test_core_and_the_bcc_reference_count_the_same(core_run: Dict[str, Any]) -> None:
    """6.12: both tools on core (auto: libbpf 1.5, module BTF), fentry on the NFS functions, and
    the nfsdist on bcc beside them counted every operation and byte of every phase as they did."""
    verify_auto_picks_the_loader_and_bcc_counts_the_same(core_run)
    verify_fentry_where_the_loader_and_btf_allow(core_run)
    main = core_run["main"]["data"]
    assert main["attach_kinds"]["nfsdist"]["backend"] == "core"
    assert all(main["seen"][phase] == main["seen_bcc"][phase] for phase in main["phases"])


def test_core_module_targets_must_go_by_btf_object(core_run: Dict[str, Any]) -> None:
    """-v's `fentry targets:` lines on core: given by BTF object and type id passes; named to
    libbpf (the fallback, which loads every module's BTF) fails the lab check."""
    given = ("nfsdist: fentry targets: 10 programs' in nfs, nfsv4 given by BTF object and type id "
             "(libbpf loads no module's BTF)")
    named = ("nfsdist: fentry targets: nfs:nfs_file_read named to libbpf, which loads every module's BTF for them "
             "(no loaded BTF object named nfs)")
    assert attach_kinds(given)["targets"] == [given.split("fentry targets: ")[1]]
    for name in ("nfsslower", "nfsdist"):
        core_run["main"]["data"]["attach_kinds"][name]["targets"] = attach_kinds(given)["targets"]
    verify_fentry_where_the_loader_and_btf_allow(core_run)
    core_run["main"]["data"]["attach_kinds"]["nfsdist"]["targets"] = attach_kinds(named)["targets"]
    with pytest.raises(AssertionError, match="named to libbpf"):
        verify_fentry_where_the_loader_and_btf_allow(core_run)


def test_a_count_or_bytes_the_reference_does_not_share_fail(core_run: Dict[str, Any]) -> None:
    main = core_run["main"]["data"]
    main["seen_bcc"]["nfs42"]["ops"]["write"]["bytes"] -= 4096
    with pytest.raises(AssertionError, match="nfs42"):
        verify_auto_picks_the_loader_and_bcc_counts_the_same(core_run)
    main["seen_bcc"]["nfs42"]["ops"]["write"]["bytes"] += 4096
    main["seen"]["meta3"]["ops"]["rename"]["count"] += 1
    with pytest.raises(AssertionError, match="meta3"):
        verify_auto_picks_the_loader_and_bcc_counts_the_same(core_run)


def test_a_difference_reported_missed_passes_and_no_more(core_run: Dict[str, Any]) -> None:
    """A read one loader did not count passes where that tool said it missed one, not two."""
    phase = core_run["main"]["data"]["seen_bcc"]["delay"]
    phase["ops"]["read"]["count"] -= 1
    phase["ops"]["read"]["bytes"] -= 65536
    phase["missed"]["read"] = 1
    verify_auto_picks_the_loader_and_bcc_counts_the_same(core_run)
    phase["ops"]["read"]["count"] -= 1
    with pytest.raises(AssertionError, match="delay"):
        verify_auto_picks_the_loader_and_bcc_counts_the_same(core_run)


def test_a_kernel_auto_puts_on_core_must_run_core(core_run: Dict[str, Any]) -> None:
    core_run["main"]["data"]["attach_kinds"]["nfsslower"]["backend"] = "bcc"
    with pytest.raises(AssertionError):
        verify_auto_picks_the_loader_and_bcc_counts_the_same(core_run)


@pytest.fixture
def late_run() -> Dict[str, Any]:
    return load(LATE_RUN)


def test_nfsv4_loaded_under_the_running_tools_is_traced_by_them(late_run: Dict[str, Any]) -> None:
    """6.12 on core: started without nfsv4, each tool said it traces nfs4_file_open once nfsv4
    loaded; nfsslower counted the NFSv4.2 workload in its window exactly, nfsdist's totals are
    both workloads', and after SIGTERM nothing of either instance was left attached."""
    v3 = late_run["v3only"]["data"]
    assert v3["late"]["backend"] == "core"
    for verify in V3ONLY_CHECKS:
        verify(late_run)


def test_a_tool_that_says_restart_on_core_fails(late_run: Dict[str, Any]) -> None:
    stderr = late_run["v3only"]["data"]["results"]["nfsdist"]["stderr"]
    late_run["v3only"]["data"]["results"]["nfsdist"]["stderr"] = "\n".join(
        line.replace("now traced", "not traced") for line in stderr.splitlines()) + \
        "\nnfsdist: warning: module nfsv4 loaded after the start: ...; restart nfsdist to trace it\n"
    with pytest.raises(AssertionError, match="nfsdist"):
        verify_late_nfsv4_is_traced_by_the_running_tools(late_run)


def test_a_late_open_not_counted_fails(late_run: Dict[str, Any]) -> None:
    """The cached-dentry open of the NFSv4.2 phase (nfs4_file_open's) left out, as a tool that
    did not attach nfsv4's points would: the verdict names open."""
    v3 = late_run["v3only"]["data"]
    phase, lines = v3["late"]["phase"], v3["results"]["nfsslower"]["lines"]
    opens = [i for i, line in enumerate(lines) if line.startswith("{") and '"lat_us"' in line
             and json.loads(line)["op"] == "open"
             and phase["mono_start"] <= json.loads(line)["end_us"] / 1e6 <= phase["mono_end"]]
    assert len(opens) == phase["issued"]["open"]
    del lines[opens[1]]
    with pytest.raises(AssertionError, match="open"):
        verify_late_nfsv4_is_traced_by_the_running_tools(late_run)


def test_a_program_of_the_second_instance_left_attached_fails(late_run: Dict[str, Any]) -> None:
    attached = late_run["v3only"]["data"]["attached"]
    second = sorted(set(attached["late"]["bpf_progs"]) - set(attached["during"]["bpf_progs"]))
    assert second
    attached["after"]["bpf_progs"] = sorted(attached["after"]["bpf_progs"] + second[:1])
    with pytest.raises(AssertionError):
        verify_late_nfsv4_is_traced_by_the_running_tools(late_run)


def test_a_forced_miss_passes_counted_or_reported_and_fails_unreported() -> None:
    """The 6.12 capture passes (bcc: 16 counted, 240 kretprobe misses; core: 165 and 91); the
    same run with one interval's misses left unreported, or with none said to be kretprobe
    misses, fails."""
    run = {"kmiss": load(KMISS_RUN)}
    verify_a_forced_kretprobe_miss_is_reported(run)
    intervals = run["kmiss"]["data"]["nfsdist"]["core"]["intervals"]
    missing = next(i for i in intervals if i["missed"].get("read"))
    saved = dict(missing)
    missing["missed"], missing["missed_by"] = {"read": 0}, []
    with pytest.raises(AssertionError, match="core: counted 165 \\+ reported missed"):
        verify_a_forced_kretprobe_miss_is_reported(run)
    missing.update(saved)
    for entry in (e for i in intervals for e in i.get("missed_by", [])):
        entry["cause"] = "recursion"
    with pytest.raises(AssertionError):
        verify_a_forced_kretprobe_miss_is_reported(run)

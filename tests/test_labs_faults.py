"""The fault checks' verdicts (labs/checks/faults/verdicts.py) on a real fault run of a Debian 7.3 QEMU pair.

The fixture is the guest's JSON document of one `run_faults` on the pair's client (see the
README beside it); the negative cases change one thing in a copy of it, the way a broken
tool or a lost event would, and the verdict must say what is wrong.
"""
from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path
from typing import Any, Dict

import pytest

from labs.checks.faults.verdicts import (FAULT_CHECKS, exact_counts, stall_records, verify_default_pause_stalls,
                                         verify_exporter_names_the_stuck_server, verify_loss, verify_nfstop_process,
                                         verify_pause_completes, verify_pause_stalls, verify_silent_guest, verify_v4late,
                                         v4_late_verdict)

RUN = Path(__file__).parent / "fixtures" / "7.3.4+deb13-amd64" / "faults" / "faults.json.gz"
#: the 7.3 pair's run before it (nfsslower --ops all alone): its first stall line came later
#: than threshold + interval, within how late its ticks ran
LATE_RUN = RUN.parent / "faults-a73ebee.json.gz"
#: a 6.12 pair's run from before the lab read QEMU's state (a stopped guest then timed out)
EARLIER_RUN = Path(__file__).parent / "fixtures" / "6.12.117+deb13-amd64" / "faults" / "faults.json.gz"
#: the probe lab's v3-only run on core with nfsv4 loaded under the tools (tests/test_probe_checks.py)
PROBES_LATE_RUN = Path(__file__).parent / "fixtures" / "6.12.117+deb13-amd64" / "probes" / "late-nfsv4-run.json.gz"


@pytest.fixture(scope="module")
def real() -> Dict[str, Any]:
    with gzip.open(RUN, "rt") as handle:
        return json.load(handle)


@pytest.fixture
def run(real: Dict[str, Any]) -> Dict[str, Any]:
    return copy.deepcopy(real)


@pytest.mark.parametrize("name", [name for name, _ in FAULT_CHECKS])
def test_every_check_passes_on_the_real_run(run: Dict[str, Any], name: str) -> None:
    verify = dict(FAULT_CHECKS)[name]
    assert verify(run)


def test_stall_lines_name_the_stuck_create_and_its_rpc(run: Dict[str, Any]) -> None:
    detail = verify_pause_stalls(run)
    stalls = stall_records(run["data"], "pause")
    assert {(s["op"], s["rpc"], s["server"]) for s in stalls} == {("create", "CREATE", "10.77.0.1")}
    assert len(detail.splitlines()) == len(stalls) and "file new-1.bin" in detail


def test_no_stall_line_fails(run: Dict[str, Any]) -> None:
    run["data"]["slower_lines"] = [line for line in run["data"]["slower_lines"] if line["record"].get("in_flight") is not True]
    with pytest.raises(AssertionError, match="no in-flight line"):
        verify_pause_stalls(run)


def test_a_late_first_stall_line_fails(run: Dict[str, Any]) -> None:
    """As if the tool printed a stuck operation only after 12 s (threshold 2 s, interval 5 s)."""
    run["data"]["slower_lines"] = [line for line in run["data"]["slower_lines"]
                                   if line["record"].get("in_flight_ms", 1e9) > 12000]
    with pytest.raises(AssertionError, match="first in-flight line only after"):
        verify_pause_stalls(run)


def test_a_first_stall_line_as_late_as_the_tools_ticks_passes() -> None:
    """Past threshold + interval (7276 ms > 7000) but within how late that run's ticks came
    (its re-prints were up to 340 ms over 5 s apart): a busy host, not a tool that missed a tick."""
    with gzip.open(LATE_RUN, "rt") as handle:
        run = json.load(handle)
    first = min(s["in_flight_ms"] for s in stall_records(run["data"], "pause"))
    run["data"]["slower_lines"] = [line for line in run["data"]["slower_lines"]
                                   if line["record"].get("in_flight_ms") != first]
    assert round(min(s["in_flight_ms"] for s in stall_records(run["data"], "pause"))) == 7276
    verify_pause_stalls(run)


def test_a_stuck_op_that_never_completes_fails(run: Dict[str, Any]) -> None:
    data = run["data"]
    stuck = stall_records(data, "pause")[0]
    data["slower_lines"] = [line for line in data["slower_lines"]
                            if line["record"].get("in_flight", True) or line["record"]["op"] != stuck["op"]
                            or line["record"]["pid"] != stuck["pid"]]
    with pytest.raises(AssertionError, match="never completed"):
        verify_pause_stalls(run)


def test_an_op_counted_twice_fails(run: Dict[str, Any]) -> None:
    run["data"]["seen"]["pause"]["ops"]["write"]["count"] += 1
    with pytest.raises(AssertionError, match=r"pause write \(nfsdist\): counted 7, the workload issued 6$"):
        verify_pause_completes(run)


def test_an_op_lost_silently_fails(run: Dict[str, Any]) -> None:
    run["data"]["seen"]["pause"]["ops"]["write"]["count"] -= 1
    with pytest.raises(AssertionError, match="counted 5, the workload issued 6, the tool reported 0 missed"):
        verify_pause_completes(run)


def test_an_op_the_tool_reported_missed_passes_and_is_named(run: Dict[str, Any]) -> None:
    """The kernel skipped a probe run (its BPF guard held on that CPU) and the tool said so."""
    run["data"]["seen"]["pause"]["ops"]["write"]["count"] -= 1
    run["data"]["seen"]["pause"]["missed"] = {"write": 2}
    assert "write 5 (1 reported missed)" in verify_pause_completes(run)


def test_loss_without_a_latency_shift_fails(run: Dict[str, Any]) -> None:
    """As if every operation of the loss phase had been as fast as can be (counts unchanged)."""
    for interval in run["data"]["nfsdist"]["intervals"]:
        if interval["phase"] == "loss":
            for entry in interval["ops"].values():
                for bucket in entry["hist"]:
                    bucket["interval-start"] = 0
    with pytest.raises(AssertionError, match="no latency moved"):
        verify_loss(run)


def test_a_stopped_guest_presumed_dead_fails(run: Dict[str, Any]) -> None:
    """Reported after the agent's patience ran out (as before the lab read QEMU's state): the
    verdict wants the stop itself seen, whatever the time."""
    with gzip.open(EARLIER_RUN, "rt") as handle:  # such a message, from a real run of that time
        earlier = json.load(handle)["data"]["host"]["pause"]["silent"]
    assert "guest agent silent" in earlier["message"]
    run["data"]["host"]["pause"]["silent"] = earlier
    with pytest.raises(AssertionError, match="was not seen as stopped"):
        verify_silent_guest(run)


def test_v4late_needs_an_attach_or_a_restart_note(run: Dict[str, Any]) -> None:
    assert "restart" in verify_v4late(run)
    for tool in ("nfsslower", "nfsdist"):
        run["data"][tool]["stderr"] = "\n".join(line for line in run["data"][tool]["stderr"].splitlines()
                                                if "loaded after the start" not in line)
    with pytest.raises(AssertionError, match="neither attached"):
        verify_v4late(run)


def test_skipped_ops_are_not_checked(run: Dict[str, Any]) -> None:
    assert "open" not in exact_counts(run["data"], "v4late", skip=("open",))


def _nfstop_rows(run: Dict[str, Any]) -> list:
    return [json.loads(line) for line in run["data"]["nfstop"]["lines"] if line.startswith("{")]


def test_nfstop_losing_a_write_fails(run: Dict[str, Any]) -> None:
    rows = _nfstop_rows(run)
    mine = next(p for row in rows for p in row["processes"]
                if p["pid"] == run["data"]["workload_pid"] and p["ops"].get("write", {}).get("count"))
    mine["ops"]["write"]["count"] -= 1
    run["data"]["nfstop"]["lines"] = [json.dumps(row) for row in rows]
    with pytest.raises(AssertionError, match="write: counted 47, the workload issued 48, the tool reported 0 missed"):
        verify_nfstop_process(run)
    rows[-1]["missed"] = {"write": 1}
    run["data"]["nfstop"]["lines"] = [json.dumps(row) for row in rows]
    assert "write 47 (1 reported missed)" in verify_nfstop_process(run)


def test_nfstop_not_showing_the_stuck_operation_fails(run: Dict[str, Any]) -> None:
    rows = _nfstop_rows(run)
    for row in rows:
        for p in row["processes"]:
            p["in_flight"], p["oldest_ms"] = 0, None
    run["data"]["nfstop"]["lines"] = [json.dumps(row) for row in rows]
    with pytest.raises(AssertionError, match="in flight for at most 0.0 ms"):
        verify_nfstop_process(run)


def test_a_command_that_failed_without_nfsv4_fails(run: Dict[str, Any]) -> None:
    run["data"]["nfstop"]["rc"] = 1
    with pytest.raises(AssertionError, match="nfstop exited 1"):
        verify_v4late(run)


def test_the_default_nfsslower_shows_the_stuck_create_as_its_rpc(run: Dict[str, Any]) -> None:
    """The create the --ops all run shows stuck is outside the default operations: the default
    run shows the RPC it waits in, with the workload's pid, the file and the server, every
    stall interval; it prints no completed line but of the default operations."""
    detail = verify_default_pause_stalls(run)
    stalls = stall_records(run["data"], "pause", "default_slower_lines")
    assert {(s["pid"], s["op"], s["type"], s["rpc"], s["file"], s["server"]) for s in stalls} == \
        {(run["data"]["workload_pid"], "rpc", "P", "CREATE", "new-1.bin", "10.77.0.1")}
    assert len(stalls) == 6 and "stuck (--ops all) [('create', 'CREATE')]" in detail


def test_the_exporter_names_the_server_and_mount_of_the_pause(run: Dict[str, Any]) -> None:
    detail = verify_exporter_names_the_stuck_server(run)
    assert detail.startswith("server 10.77.0.1 export 10.77.0.1:/srv/nfs mountpoint /mnt/nfs3: in flight in 27 of 27")


def _default_lines(run: Dict[str, Any]) -> list:
    return run["data"]["default_slower_lines"]


def test_a_default_nfsslower_blind_to_the_pause_fails(run: Dict[str, Any]) -> None:
    """As bcc's nfsslower, or ours before the RPC layer was tracked beneath the default ops."""
    lines = _default_lines(run)
    run["data"]["default_slower_lines"] = [line for line in lines if line["record"].get("in_flight") is not True]
    with pytest.raises(AssertionError, match="no in-flight line from nfsslower with its default operations"):
        verify_default_pause_stalls(run)
    pid = run["data"]["workload_pid"]
    run["data"]["default_slower_lines"] = lines
    for line in lines:  # as if only a kworker's RPC had been seen
        if line["record"].get("in_flight") is True:
            line["record"].update(pid=4242, tid=4242, comm="kworker/u4:1", file="CREATE")
    with pytest.raises(AssertionError, match=f"no in-flight line for the workload's pid {pid}"):
        verify_default_pause_stalls(run)


def test_a_default_nfsslower_printing_rpc_completions_fails(run: Dict[str, Any]) -> None:
    """The RPCs tracked beneath the default ops must not print as completed lines."""
    done = next(line for line in _default_lines(run) if line["record"].get("in_flight") is False)
    extra = copy.deepcopy(done)
    extra["record"].update(op="rpc", type="P", rpc="GETATTR", file="GETATTR")
    _default_lines(run).append(extra)
    with pytest.raises(AssertionError, match="completed lines of operations not asked for: {'rpc'}"):
        verify_default_pause_stalls(run)


def test_a_default_line_naming_another_operation_fails(run: Dict[str, Any]) -> None:
    pid = run["data"]["workload_pid"]
    for line in _default_lines(run):
        if line["record"].get("in_flight") is True and line["record"]["pid"] == pid:
            line["record"].update(op="rpc", rpc="READDIR")
    with pytest.raises(AssertionError, match="not the stuck"):
        verify_default_pause_stalls(run)


def _pause_series(run: Dict[str, Any]) -> list:
    data = run["data"]
    pause = data["phases"]["pause"]
    return [s for sc in data["nfs_exporter"]["scrapes"] if pause["mono_start"] <= sc["mono"] <= pause["mono_end"]
            for s in sc["series"] if s["mountpoint"] == pause["mount"]]


def test_an_exporter_blind_to_the_pause_fails(run: Dict[str, Any]) -> None:
    for series in _pause_series(run):
        series.update(in_flight=0.0, oldest_s=0.0)
    with pytest.raises(AssertionError, match="nothing in flight in .* scrapes while the server was stopped"):
        verify_exporter_names_the_stuck_server(run)


def test_an_exporter_naming_another_server_fails(run: Dict[str, Any]) -> None:
    for series in _pause_series(run):
        series["server"] = "10.77.0.9"
    with pytest.raises(AssertionError, match="10.77.0.9"):
        verify_exporter_names_the_stuck_server(run)


def test_an_exporter_stuck_after_the_pause_fails(run: Dict[str, Any]) -> None:
    data = run["data"]
    for scrape in data["nfs_exporter"]["scrapes"]:
        if data["phases"]["pause"]["mono_end"] <= scrape["mono"] <= data["phases"]["restart"]["mono_start"]:
            for series in scrape["series"]:
                series["in_flight"] = 1.0
    with pytest.raises(AssertionError, match="still in flight in every scrape after the pause"):
        verify_exporter_names_the_stuck_server(run)


def test_an_exporter_seeing_only_a_short_stall_fails(run: Dict[str, Any]) -> None:
    for series in _pause_series(run):
        series["oldest_s"] = min(series["oldest_s"], 1.0)
    with pytest.raises(AssertionError, match="oldest in flight 1.0 s while stopped"):
        verify_exporter_names_the_stuck_server(run)


def test_nfstop_counting_rpcs_with_its_default_ops_fails(run: Dict[str, Any]) -> None:
    rows = _nfstop_rows(run)
    row = next(row for row in rows if row["processes"])
    row["processes"][0]["ops"]["rpc"] = {"count": 3, "bytes": 0, "avg_ms": 1.0, "p99_ms": 1.0}
    run["data"]["nfstop"]["lines"] = [json.dumps(row) for row in rows]
    with pytest.raises(AssertionError, match="nfstop with its default operations counted {'rpc'}"):
        verify_nfstop_process(run)


def test_a_tool_that_traces_nfsv4_in_place_is_attached() -> None:
    """What the tools said on core when nfsv4 loaded under them (the 6.12 probe lab's v3-only
    run): the fault verdict takes it as attached, so the NFSv4.2 phase's opens are checked."""
    with gzip.open(PROBES_LATE_RUN, "rt") as handle:
        results = json.load(handle)["v3only"]["data"]["results"]
    assert {name: v4_late_verdict(run["stderr"]) for name, run in results.items()} == \
        {name: "attached" for name in results}

"""The fs lab checks' verdicts (labs/checks/fs/verdicts.py) on a real 6.12 guest run (README beside it):
every verdict passes on it as recorded, and fails when one operation is lost or one
latency is moved across the injected delay; nfs-exporter's too (the run scraped it around
every phase), and they fail when a scrape lost an operation, a probe was attached again,
or a delayed fsync sat below the delay."""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Dict

import pytest

from labs.checks.fs import verdicts as fc

RUN = Path(__file__).parent / "fixtures" / "6.12.117+deb13-amd64" / "fs-lab" / "guest-run.json.gz"
#: a later run of the same check with nfs-exporter -t scraped around every phase
EXPORTER_RUN = RUN.with_name("guest-run-exporter.json.gz")
#: a CI run of it where the loaded host stalled 4 of the plain phase's 8 xfs writes past 600 ms
STALLED_RUN = RUN.with_name("guest-run-stalled-writes.json.gz")
FILESYSTEMS = ("xfs", "ext4", "btrfs", "cifs")


def _run(path: Path) -> Dict[str, Any]:
    with gzip.open(path, "rt") as handle:
        out: Dict[str, Any] = json.load(handle)
    assert out["ok"]
    return out["data"]


@pytest.fixture(params=[RUN, EXPORTER_RUN, STALLED_RUN], ids=["tools", "with-exporter", "stalled-writes"])
def data(request: Any) -> Dict[str, Any]:
    return _run(request.param)


@pytest.fixture(params=[EXPORTER_RUN, STALLED_RUN], ids=["with-exporter", "stalled-writes"])
def exporter_run(request: Any) -> Dict[str, Any]:
    return _run(request.param)


@pytest.mark.parametrize("fs", FILESYSTEMS)
def test_the_recorded_run_passes(data: Dict[str, Any], fs: str) -> None:
    for verify in fc.RUN_CHECKS:
        verify(data["runs"][fs], fs)
    fc.verify_mount_point_finds_the_superblock(data, fs)
    release = data["release"]
    assert all(entry["ok"] for entry in fc.lab_results(data, fs)[release].values())


def test_the_recorded_run_left_nothing(data: Dict[str, Any]) -> None:
    fc.verify_nothing_left(data, "all")
    # btrfs's stat reports the subvolume's dev: --mount-point still found the superblock's
    btrfs = data["devs"]["btrfs"][0]
    assert btrfs["stat"] != btrfs["mountinfo"] == btrfs["mount_point"]


def _worker_events(run: Dict[str, Any], phase: str, op: str) -> list:
    span = run["phases"][phase]
    return [r for r in run["records"] if r["op"] == op and span["mono_start"] <= r["end_us"] / 1e6 <= span["mono_end"]]


def test_a_lost_operation_fails_the_count(data: Dict[str, Any]) -> None:
    run = data["runs"]["xfs"]
    run["records"].remove(_worker_events(run, "plain", "getattr")[0])
    with pytest.raises(AssertionError, match="getattr counted 2, issued 3"):
        fc.verify_counts_exact(run, "xfs")


def test_every_fsync_slow_without_delay_fails(data: Dict[str, Any]) -> None:
    """The delay is what makes every fsync slow: a phase without it where they all are cannot
    show it."""
    run = data["runs"]["cifs"]
    for event in _worker_events(run, "loose plain", "fsync"):
        event["lat_us"] = run["delay_ms"] * 1000
    with pytest.raises(AssertionError, match="loose plain: fsslower at 600 ms: at or above the delay without it"):
        fc.verify_delay_visible(run, "cifs")


def test_one_stalled_operation_without_delay_is_compared_not_refused(data: Dict[str, Any]) -> None:
    """A loaded host may stall one operation past the delay's mark (CI saw an xfs write take
    600 ms without it): the phase with the delay still shows more."""
    run = data["runs"]["cifs"]
    _worker_events(run, "loose plain", "open")[0]["lat_us"] = run["delay_ms"] * 1000
    fc.verify_delay_visible(run, "cifs")


def test_stalled_writes_without_delay_are_not_the_delay() -> None:
    """The CI run whose undelayed xfs writes stalled: four writes past 600 ms, as many slow
    operations as the delayed phase had; only the reads and fsyncs wait on the device, and
    there the plain phase had none: with its four reads at the delay it has as many as the
    delayed phase, and fails."""
    run = _run(STALLED_RUN)["runs"]["xfs"]
    assert [r["lat_us"] >= 600_000 for r in _worker_events(run, "plain", "write")].count(True) == 4
    fc.verify_delay_visible(run, "xfs")
    for event in _worker_events(run, "plain", "read"):
        event["lat_us"] = run["delay_ms"] * 1000
    with pytest.raises(AssertionError, match="xfs plain: fsslower at 600 ms: at or above the delay without it"):
        fc.verify_delay_visible(run, "xfs")


def test_a_delayed_fsync_in_a_lower_bucket_fails(data: Dict[str, Any]) -> None:
    """fsdist: both delayed fsyncs relabelled as ending below the delay (a probe that timed
    only part of the fsync would put them there)."""
    run = data["runs"]["ext4"]
    delay_us = run["delay_ms"] * 1000
    for record in run["records"]:
        for bucket in record["ops"]["fsync"]["hist"]:
            if bucket["interval-end"] >= delay_us:
                bucket["interval-start"], bucket["interval-end"] = delay_us // 2, delay_us - 1
    with pytest.raises(AssertionError, match="0 of 2 fsyncs at or above"):
        fc.verify_delay_visible(run, "ext4")


@pytest.mark.parametrize("fs", FILESYSTEMS)
def test_the_recorded_exporter_passes(exporter_run: Dict[str, Any], fs: str) -> None:
    for verify in fc.EXPORTER_CHECKS:
        verify(exporter_run, fs)
    fc.verify_exporter_stopped(exporter_run)


def test_the_recorded_exporter_waited_for_the_modules_the_mounts_loaded(exporter_run: Dict[str, Any]) -> None:
    """The guest had ext4 (its root) and btrfs loaded at boot, xfs and cifs not: the exporter
    attached the first two at once and each of the others when its mount loaded it."""
    start = exporter_run["exporter"]["start"]
    assert {fs: start[fs]["attached"] for fs in FILESYSTEMS} == {"xfs": 0, "ext4": 1, "btrfs": 1, "cifs": 0}


def test_a_scrape_that_lost_an_operation_fails(exporter_run: Dict[str, Any]) -> None:
    after = exporter_run["runs"]["cifs"]["phases"]["loose plain"]["exporter"]["after"]["cifs"]
    after["ops"]["getattr /mnt/probekit-cifs-loose"] -= 1
    with pytest.raises(AssertionError, match="loose plain: getattr exporter 2.0, issued 3"):
        fc.verify_exporter_counts_exact(exporter_run, "cifs")


def test_another_mounts_series_moving_in_a_phase_fails(exporter_run: Dict[str, Any]) -> None:
    after = exporter_run["runs"]["cifs"]["phases"]["strict plain"]["exporter"]["after"]["cifs"]
    after["ops"]["read /mnt/probekit-cifs-loose"] += 4
    with pytest.raises(AssertionError, match="other mounts' series moved"):
        fc.verify_exporter_counts_exact(exporter_run, "cifs")


def test_a_probe_attached_again_fails(exporter_run: Dict[str, Any]) -> None:
    """ext4 was attached at the start: a later scrape with another attach time is a restart."""
    exporter_run["runs"]["cifs"]["phases"]["loose delay"]["exporter"]["after"]["ext4"]["attach_time"] += 30
    with pytest.raises(AssertionError, match="ext4: attached again"):
        fc.verify_exporter_probes_independent(exporter_run, "ext4")


def test_a_delayed_fsync_below_the_delay_in_the_exporter_fails(exporter_run: Dict[str, Any]) -> None:
    phase = exporter_run["runs"]["xfs"]["phases"]["delay"]["exporter"]["after"]["xfs"]
    phase["slow"]["fsync /mnt/probekit-xfs"] -= 1
    with pytest.raises(AssertionError, match="xfs delay"):
        fc.verify_exporter_delay_visible(exporter_run, "xfs")


PROFILE = Path(__file__).parent / "fixtures" / "6.12.117+deb13-amd64" / "localfs" / "profile.json.gz"
REPO = Path(__file__).resolve().parent.parent


def _compat(*args: str) -> Any:
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-c", "from probes.cli import main; main()", "compat", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


def test_the_recorded_runs_lab_results_verify_the_compat_report(data: Dict[str, Any], tmp_path: Path) -> None:
    """`probes compat --lab-results` with this run's file (what CI's kernel artefacts hold) marks
    every XFS operation lab-verified on the profile of the same kernel; a kernel given by two
    files is one error line."""
    results = tmp_path / "lab-results-xfs.json"
    results.write_text(json.dumps(fc.lab_results(data, "xfs")))
    res = _compat("probes/specs/xfs.toml", "--kernel", str(PROFILE), "--lab-results", str(results),
                  "--format", "json")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert list(report["lab"].values()) == [{op: "verified" for op in ("read", "write", "open", "getattr", "fsync")}]
    twice = _compat("probes/specs/xfs.toml", "--kernel", str(PROFILE), "--lab-results", str(results),
                    "--lab-results", str(results))
    assert twice.returncode == 1 and twice.stderr.count("\n") == 1 and "also in" in twice.stderr

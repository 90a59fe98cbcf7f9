"""Lab tests: the tools on the client of a QEMU pair while the server fails (labs/checks/faults/).

On the pair kernels of tests/lab/conftest.py (7.3 in CI), in the same boot as their
probe checks: two nfsslower (--ops all, and bcc's default operations; threshold 2 s, stall
interval 5 s), one nfsdist, one nfstop (default operations) and one nfs-exporter (scraped
every second) watch a mixed workload (creates, lookups, opens, reads, writes, fsyncs, stats) through five
phases: plain, 20% netem loss on the link, the server's QEMU stopped for 30 s, nfs-server
restarted, and nfsv4 loaded after the tools started; while the server is stopped, a
command sent to it must fail within a minute, naming the kernel and the console log (the
"guest stops answering" path of every lab run). Each fault is its own test; the
stall lines seen are printed (pytest -s) and kept in the kernel's artefact directory.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Dict

import pytest
from conftest import guest_run, on_kernels, once_run, say

from labs.checks.faults.run import run_faults
from labs.checks.faults.verdicts import (verify_default_pause_stalls, verify_exporter_names_the_stuck_server,
                                         verify_loss, verify_nfstop_process, verify_pause_completes,
                                         verify_pause_stalls, verify_restart, verify_silent_guest, verify_v4late)

pytestmark = [pytest.mark.lab, on_kernels("faults")]


@guest_run("faults", fixture="faults")
def _run(kernel_lab: Any) -> Dict[str, Any]:
    result = run_faults(kernel_lab.lab, progress=say)
    kernel_lab.artifacts.mkdir(parents=True, exist_ok=True)
    (kernel_lab.artifacts / "faults.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


@pytest.fixture
def faults(kernel_lab: Any) -> Dict[str, Any]:
    return once_run(kernel_lab, "faults")


def _verdict(kernel_lab: Any, faults: Dict[str, Any], verify: Callable[[Dict[str, Any]], str]) -> None:
    detail = verify(faults)
    say(f"[faults] {kernel_lab.kernel} {verify.__name__}: {detail}")
    (kernel_lab.artifacts / f"{verify.__name__}.txt").write_text(detail + "\n")


def test_server_pause_shows_stall_lines(kernel_lab: Any, faults: Dict[str, Any]) -> None:
    _verdict(kernel_lab, faults, verify_pause_stalls)


def test_server_pause_seen_by_nfsslower_with_its_default_operations(kernel_lab: Any,
                                                                   faults: Dict[str, Any]) -> None:
    _verdict(kernel_lab, faults, verify_default_pause_stalls)


def test_server_pause_named_by_the_exporters_per_mount_series(kernel_lab: Any, faults: Dict[str, Any]) -> None:
    _verdict(kernel_lab, faults, verify_exporter_names_the_stuck_server)


def test_server_pause_every_operation_completes_once(kernel_lab: Any, faults: Dict[str, Any]) -> None:
    _verdict(kernel_lab, faults, verify_pause_completes)


def test_packet_loss_keeps_counts_and_moves_latency(kernel_lab: Any, faults: Dict[str, Any]) -> None:
    _verdict(kernel_lab, faults, verify_loss)


def test_server_restart_operations_complete(kernel_lab: Any, faults: Dict[str, Any]) -> None:
    _verdict(kernel_lab, faults, verify_restart)


def test_nfsv4_loaded_after_the_tools_started(kernel_lab: Any, faults: Dict[str, Any]) -> None:
    """Also the pair's v3-only client: every command started without nfsv4 and exited 0."""
    _verdict(kernel_lab, faults, verify_v4late)


def test_nfstop_shows_the_workload_process_and_its_stuck_operation(kernel_lab: Any,
                                                                    faults: Dict[str, Any]) -> None:
    _verdict(kernel_lab, faults, verify_nfstop_process)


def test_a_stopped_guest_is_reported_within_a_minute(kernel_lab: Any, faults: Dict[str, Any]) -> None:
    _verdict(kernel_lab, faults, verify_silent_guest)

"""Lab check of nfs-exporter with the real thing: Debian's Prometheus scrapes it and node_exporter.

In the shared per-kernel guest (tests/lab/conftest.py; on a pair, its client), the guest
side (labs/guest/exporter_guest.py) starts nfs-exporter, prometheus-node-exporter with
the mountstats collector and a Prometheus scraping both, all on 127.0.0.1, runs the known
workload on /mnt/nfs3 and then /mnt/nfs42, and reports what PromQL answers. Kernels 6.1
(bookworm: Prometheus 2.42, node_exporter 1.5.0) and 7.3 (trixie-backports) only: the
other kernels' images carry the same exporter code, and one boot's exporter check costs a
bcc compile and a Prometheus start under TCG. The scraped texts are kept as
metrics/probekit.prom and metrics/node.prom in the kernel's artefact directory.
"""
from __future__ import annotations

import json
from typing import Any, Dict

import pytest

from labs.base import Lab

EXPORTER_KERNELS = ("6.1", "7.3")
pytestmark = [pytest.mark.lab,
              pytest.mark.parametrize("kernel_lab", EXPORTER_KERNELS, indirect=True, ids=lambda k: f"k{k}")]

GUEST_SCRIPT = "labs/guest/exporter_guest.py"
MOUNT_POINTS = {"nfs3": "/mnt/nfs3", "nfs42": "/mnt/nfs42"}
#: operations the workload issues an exact number of (commit is the kernel's choice)
EXACT = ("read", "write", "open", "getattr", "fsync")


def run_guest_check(kernel_lab: Any) -> Dict[str, Any]:
    lab: Lab = kernel_lab.lab
    share = getattr(lab, "guest_project_dir", "/opt/probekit")
    with kernel_lab.timed("exporter"):
        res = lab.run(f"cd {share} && python3 {GUEST_SCRIPT}", timeout=1200)
    assert res.exit_code == 0, f"exit {res.exit_code}: {res.stderr[-2000:]}"
    out: Dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    print(f"[exporter lab] {kernel_lab.kernel}: {kernel_lab.times['exporter']:.0f} s", flush=True)
    metrics = kernel_lab.artifacts / "metrics"
    metrics.mkdir(parents=True, exist_ok=True)
    (metrics / "probekit.prom").write_text(out["texts"]["probekit"])
    (metrics / "node.prom").write_text(out["texts"]["node"])
    (kernel_lab.artifacts / f"exporter-{out['kernel']}.json").write_text(json.dumps(out, indent=1) + "\n")
    return out


@pytest.fixture
def results(kernel_lab: Any) -> Dict[str, Any]:
    return kernel_lab.once("exporter", lambda: run_guest_check(kernel_lab))


@pytest.mark.parametrize("mount", sorted(MOUNT_POINTS))
def test_series_move_by_the_workload_on_its_mount_only(results: Dict[str, Any], mount: str) -> None:
    """Between two direct scrapes around one mount's workload, each exact op's counter and
    histogram count move by what was issued, on that mount's series and no other."""
    phase = results["phases"][mount]
    issued, moved = phase["issued"], phase["moved"]
    for series in ("probekit_nfs_ops_total", "probekit_nfs_op_latency_seconds_count"):
        for op in EXACT:
            assert moved[series].get(f"{op} {MOUNT_POINTS[mount]}") == issued[op], (series, op, moved[series])
        assert all(key.split(" ", 1)[1] == MOUNT_POINTS[mount] for key in moved[series]), moved[series]
    assert moved["probekit_nfs_bytes_total"][f"read {MOUNT_POINTS[mount]}"] == issued["read_bytes"]
    assert moved["probekit_nfs_bytes_total"][f"write {MOUNT_POINTS[mount]}"] == issued["write_bytes"]


def test_promql_counts_equal_the_workload_on_both_mounts(results: Dict[str, Any]) -> None:
    got = {(r["metric"]["op"], r["metric"]["mountpoint"]): int(float(r["value"][1]))
           for r in results["promql"]["counts"]}
    for mount, point in MOUNT_POINTS.items():
        for op in EXACT:
            assert got.get((op, point)) == results["phases"][mount]["issued"][op], (op, point, got)


def test_join_with_node_exporter_mountstats(results: Dict[str, Any]) -> None:
    """`on (export, mountaddr, protocol)` meets node_exporter's series for both mounts.

    node_exporter's `mountaddr` is the server address (mountinfo's addr=), so the lab's v3
    and v4.2 mounts of one export have one identity there: node_exporter 1.5.0 and 1.9.0
    export one series set for both and drop the other mount as a duplicate device (its
    issue 993). Our series stay per mount, and both meet that one identity."""
    node_mounts = results["promql"]["node_mounts"]
    joined = {r["metric"]["mountpoint"] for r in results["promql"]["join"]}
    assert node_mounts, "node_exporter exported no NFS mount"
    assert joined == set(MOUNT_POINTS.values()), (joined, node_mounts)


def test_median_read_latency_is_inside_the_histogram(results: Dict[str, Any]) -> None:
    medians = {r["metric"]["mountpoint"]: float(r["value"][1]) for r in results["promql"]["median_read"]}
    assert set(medians) == set(MOUNT_POINTS.values())
    assert all(1e-6 < value < 10 for value in medians.values()), medians


def test_promtool_accepts_both_scrapes(results: Dict[str, Any]) -> None:
    assert results["promtool"]["probekit"]["rc"] == 0, results["promtool"]["probekit"]["output"]
    assert results["promtool"]["node"]["rc"] == 0, results["promtool"]["node"]["output"]


def test_sigterm_detaches_everything(results: Dict[str, Any]) -> None:
    assert results["rc"] == 143 and results["stderr"][-1] == "nfs-exporter: terminated by SIGTERM; stopped and cleaned up"
    attached = results["attached"]
    assert set(attached["during"]["bpf_progs"]) > set(attached["before"]["bpf_progs"])
    assert attached["after"] == attached["before"]


def test_no_pid_label_and_probe_info_names_every_op(results: Dict[str, Any]) -> None:
    text = results["texts"]["probekit"]
    assert "pid=" not in text
    info_ops = {line.split('op="', 1)[1].split('"', 1)[0] for line in text.splitlines()
                if line.startswith("probekit_probe_info{")}
    assert set(EXACT) | {"commit"} <= info_ops


def test_an_unmounted_mount_keeps_its_series_for_the_grace_then_leaves(results: Dict[str, Any]) -> None:
    """umount /mnt/nfs42 under the running exporter (--gone-mount-grace 10): still labelled
    right after, gone after the grace, and its counts did not move to the unlabelled series."""
    gone = results["gone"]
    assert {"/mnt/nfs3", "/mnt/nfs42"} <= set(gone["before"]["mountpoints"]), gone
    assert "/mnt/nfs42" in gone["just_after"]["mountpoints"], gone
    assert "/mnt/nfs42" not in gone["after_grace"]["mountpoints"], gone
    assert "/mnt/nfs3" in gone["after_grace"]["mountpoints"], gone
    assert gone["after_grace"]["unlabelled"] == gone["before"]["unlabelled"], gone

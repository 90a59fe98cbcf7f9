"""Lab test of a shared NFS server and two clients: client-a's load slows client-b (labs/checks/fleet/).

On the fleet kernels of tests/lab/conftest.py (FULL_MATRIX's "fleet"), whose job boots three guests:
the server and client-a and client-b, each client on its own socket link. One guest run drives
labs/checks/fleet/guest.py in all three at once (nfsdtop by client and nfs-exporter --nfsd on the
server, a light timed reader under nfsdist and nfs-exporter on client-b beside a Prometheus with
the shipped rules, parallel writers and readers in a unit of their own on client-a part-way
under nfstop by cgroup, then the server stopped); the verdicts compare its phases. The run's JSON is kept as fleet.json among the artefacts
(tests/fixtures/.../fleet comes from one).
"""
from __future__ import annotations

import json
from typing import Any, Dict

import pytest
from conftest import guest_run, on_kernels, once_run, say

from labs.checks.fleet import run as fleet, verdicts as fc

pytestmark = pytest.mark.lab


@guest_run("fleet", fixture="fleet_data")
def run_fleet(kernel_lab: Any) -> Dict[str, Any]:
    with kernel_lab.timed("fleet"):
        out = fleet.run_fleet(kernel_lab.lab, kernel_lab.artifacts, progress=say)
    kernel_lab.artifacts.mkdir(parents=True, exist_ok=True)
    (kernel_lab.artifacts / "fleet.json").write_text(json.dumps(out, indent=1) + "\n")
    say(f"[fleet lab] {kernel_lab.kernel}: {kernel_lab.times['fleet']:.0f} s")
    return out


@pytest.fixture
def fleet_data(kernel_lab: Any) -> Dict[str, Any]:
    out = once_run(kernel_lab, "fleet")
    assert out["ok"], out.get("error") or {role: doc.get("error") for role, doc in out["data"].items()
                                           if isinstance(doc, dict) and doc.get("ok") is False}
    return out["data"]


@guest_run("fleet_nodes", fixture="fleet_nodes")
def run_fleet_nodes(kernel_lab: Any) -> Dict[str, Any]:
    """What each guest of the booted fleet runs and mounts, and the QEMU state of each."""
    lab = kernel_lab.lab
    nodes = {name: {"release": lab.kernel_info(name)["release"],
                    "mounts": lab.run("grep ' /mnt/nfs' /proc/mounts", node=name, timeout=120).stdout.splitlines(),
                    "addresses": lab.run("ip -4 -o addr show scope global", node=name, timeout=120).stdout.split()}
             for name in lab.status()}
    return {"status": lab.status(), "clients": lab.client_names(), "nodes": nodes}


@pytest.fixture
def fleet_nodes(kernel_lab: Any) -> Dict[str, Any]:
    out: Dict[str, Any] = once_run(kernel_lab, "fleet_nodes")
    return out


@on_kernels("fleet")
def test_fleet_boots_three_guests_and_both_clients_mount(kernel_lab: Any, fleet_nodes: Dict[str, Any]) -> None:
    """The server and both clients run the kernel, each on its own address of the lab link, and
    each client mounts the server's export from 10.77.0.1 (NFSv3 and NFSv4.2)."""
    assert fleet_nodes["status"] == {"server": "running", "client-a": "running", "client-b": "running"}
    assert fleet_nodes["clients"] == ["client-a", "client-b"]
    for name, node in fleet_nodes["nodes"].items():
        assert node["release"] == kernel_lab.release, (name, node["release"])
    addresses = {name: [a for a in node["addresses"] if a.startswith("10.77.") and "/" in a] for name, node in fleet_nodes["nodes"].items()}
    assert addresses == {"server": ["10.77.0.1/24"], "client-a": ["10.77.0.2/24"], "client-b": ["10.77.0.3/24"]}
    for name in fleet_nodes["clients"]:
        mounts = [line.split() for line in fleet_nodes["nodes"][name]["mounts"]]
        assert sorted((m[0], m[1]) for m in mounts) == [("10.77.0.1:/srv/nfs", "/mnt/nfs3"),
                                                        ("10.77.0.1:/srv/nfs", "/mnt/nfs42")], (name, mounts)


@on_kernels("fleet")
@pytest.mark.parametrize("verify", fc.FLEET_CHECKS, ids=lambda f: f.__name__[len("verify_"):])
def test_fleet(fleet_data: Dict[str, Any], verify: Any) -> None:
    verify(fleet_data)

"""The Vagrant path, as a smoke of its own: vagrant-libvirt (driven through python-vagrant)
boots the NFS server and client pair from the box built out of our Debian 6.1 image, NFSv3
and v4.2 cross the socket link, one capture and one exact probe count pass on the client,
the live libvirt configuration obeys the network rule, and `down` leaves nothing behind.

The probe, fault and discovery checks themselves run on the QEMU kernels (tests/lab/conftest.py):
here they would repeat on the same 6.1 kernel. The smoke is one lane job (conftest's
@lane_job), run beside the kernels' jobs; the tests judge what it brought back.
"""
from __future__ import annotations

import json
import secrets
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest
from conftest import Job, lane_job, say, wait_for_job

from labs.checks.probes import verdicts as pc
from labs.checks.shared import GUEST_SCRIPTS
from labs.install import install_tools
from labs.vm.base import CLIENT, SERVER
from labs.vm.netrule import check_domain_xml, check_net_list, parse_net_list

pytestmark = pytest.mark.lab

LAB_NAME = "pytest-pair"
SHARE = "/opt/probekit"


def virsh(*args: str) -> str:
    return subprocess.run(["virsh", "-c", "qemu:///system", *args], check=True,
                          capture_output=True, text=True).stdout


def host_links() -> List[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], check=True, capture_output=True, text=True).stdout
    return sorted(line.split(":")[1].strip().split("@")[0] for line in out.splitlines())


def qemu_processes(prefix: str) -> List[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "qemu-system" in line and prefix in line]


@lane_job("vagrant", module=__name__)
class VagrantSmoke(Job):
    """Up, the smoke's facts gathered in order, down and what is left: `facts` for the tests."""

    name = "vagrant"

    def __init__(self, artifacts_root: Path) -> None:
        super().__init__()
        from labs.vm.vagrant import VagrantLab
        self.root = artifacts_root / "vagrant"
        self.lab = VagrantLab(kernel="6.1", topology="pair", name=LAB_NAME)
        self.facts: Dict[str, Any] = {}
        self.times: Dict[str, float] = {}

    def image_kernel(self) -> str:
        return "6.1"

    def run(self) -> None:
        from labs.vm.libvirt_daemons import ensure_daemons
        from conftest import _record_times
        self.started_at = time.monotonic()
        try:
            ensure_daemons()
            self.facts["nets_before"] = [row["name"] for row in parse_net_list(virsh("net-list", "--all"))]
            self.facts["links_before"] = host_links()
            self.lab.down()  # a lab a crashed earlier run left behind
            if self.stopping.is_set():
                return
            self.lab.up()
            if self.stopping.is_set():
                return
            self.times["up"] = round(time.monotonic() - self.started_at, 1)
            self._gather()
        except Exception as exc:  # every test fails with this one line
            self.failure = f"vagrant pair: {type(exc).__name__}: {exc}"
        finally:
            down_started = time.monotonic()
            try:
                self._down_and_leftovers()
            except Exception as exc:
                self.facts["leftovers_error"] = f"{type(exc).__name__}: {exc}"
            self.times["down"] = round(time.monotonic() - down_started, 1)
            self.times["total"] = round(time.monotonic() - self.started_at, 1)
            say(f"[lab] vagrant pair: {self.times}")
            _record_times(self.root.parent, "vagrant", self.times)
            self.done.set()

    def _gather(self) -> None:
        from labs.vm.vagrant import domain_prefix, lab_domains
        lab, facts = self.lab, self.facts
        facts["image_release"] = lab.state["kernel_release"]
        facts["nodes"] = {node: {"release": lab.kernel_info(node)["release"], "hostname": r.stdout.strip(),
                                 "stderr": r.stderr} for node in (SERVER, CLIENT)
                          for r in [lab.run("hostname", node=node)]}
        facts["mounts"] = lab.run("grep ' nfs' /proc/mounts", node=CLIENT).stdout
        facts["route"] = lab.run("ip -o route get 10.77.0.1", node=CLIENT).stdout
        token = secrets.token_hex(16)
        name = f"work/rw-smoke-{token[:8]}"
        wrote = lab.run(f"dd if=/dev/urandom of=/mnt/nfs42/{name} bs=64k count=16 status=none && sync && "
                        f"echo {token} >> /mnt/nfs42/{name} && sha256sum /mnt/nfs42/{name}", node=CLIENT)
        on_server = lab.run(f"sha256sum /srv/nfs/{name} && tail -c 33 /srv/nfs/{name}", node=SERVER)
        facts["round_trip"] = {"token": token, "client": wrote.stdout.split()[:1], "client_rc": wrote.exit_code,
                               "server": on_server.stdout.split()}
        lab.run(f"rm -f /mnt/nfs42/{name}", node=CLIENT)
        with tempfile.TemporaryDirectory() as tmp:
            src, back = Path(tmp) / "payload.bin", Path(tmp) / "back.bin"
            src.write_bytes(secrets.token_bytes(300_000))
            lab.put(src, "/root/probekit-payload.bin", node=SERVER)
            lab.get("/root/probekit-payload.bin", back, node=SERVER)
            facts["put_get_equal"] = back.read_bytes() == src.read_bytes()
        started = time.monotonic()
        lab.run(f"sh {SHARE}/{GUEST_SCRIPTS['workload']} prepare /mnt/nfs3", node=CLIENT, timeout=300)
        capture = lab.run(f"cd {SHARE} && python3 -m discover callgraph nfs_file_read --workload "
                          f"'sh {SHARE}/{GUEST_SCRIPTS['workload']} read /mnt/nfs3' --format json "
                          "-o /tmp/smoke-graph.json && cat /sys/kernel/tracing/current_tracer", node=CLIENT, timeout=900)
        graph = lab.run("cat /tmp/smoke-graph.json", node=CLIENT).stdout if capture.exit_code == 0 else "{}"
        facts["capture"] = {"rc": capture.exit_code, "stderr": capture.stderr[-1500:],
                            "tracer_after": capture.stdout.strip().splitlines()[-1:], "graph": json.loads(graph or "{}")}
        self.times["capture"] = round(time.monotonic() - started, 1)
        started = time.monotonic()
        install_tools(lab, self.root)
        res = lab.run(f"cd {SHARE} && python3 {GUEST_SCRIPTS['smoke']}", node=CLIENT, timeout=1200)
        facts["probe"] = json.loads(res.stdout.strip().splitlines()[-1]) if res.stdout.strip() else \
            {"ok": False, "error": f"exit {res.exit_code}: {res.stderr[-1500:]}"}
        self.times["probe"] = round(time.monotonic() - started, 1)
        domains = lab_domains(domain_prefix(LAB_NAME))
        facts["domains"], facts["domain_prefix"] = sorted(domains), domain_prefix(LAB_NAME)
        facts["domain_xml_problems"] = {dom: check_domain_xml(virsh("dumpxml", dom)) for dom in domains}
        facts["net_problems"] = check_net_list(virsh("net-list", "--all"), facts["nets_before"])
        facts["links_during"] = host_links()

    def _down_and_leftovers(self) -> None:
        from labs.vm.libvirt_daemons import ensure_daemons, stop_daemons_started_by_us
        from labs.vm.vagrant import domain_prefix, state_dir
        self.lab.down()
        prefix = domain_prefix(LAB_NAME)
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        left = {"qemu": qemu_processes(prefix), "ssh_master": str(state_dir(LAB_NAME)) in ps,
                "state_dir": state_dir(LAB_NAME).exists(), "status": self.lab.status()}
        ensure_daemons()  # down may have stopped the daemons it started: ask libvirt itself
        try:
            left["domains"] = [d for d in virsh("list", "--all", "--name").split() if d.startswith(prefix)]
            left["volumes"] = [v for v in virsh("vol-list", "default").split() if v.startswith(prefix)]
            left["nets"] = check_net_list(virsh("net-list", "--all"), self.facts.get("nets_before", []))
        finally:
            stop_daemons_started_by_us()
        self.facts["left"] = left

    def take_down(self) -> None:
        self.lab.down()


@pytest.fixture(scope="module")
def smoke() -> Dict[str, Any]:
    job = wait_for_job("vagrant")
    assert isinstance(job, VagrantSmoke)
    return job.facts


def test_both_nodes_run_the_image_kernel(smoke: Dict[str, Any]) -> None:
    assert str(smoke["image_release"]).startswith("6.1.")
    assert {node: n["release"] for node, n in smoke["nodes"].items()} == \
        {SERVER: smoke["image_release"], CLIENT: smoke["image_release"]}
    assert {node: n["hostname"] for node, n in smoke["nodes"].items()} == {SERVER: "nfs-server", CLIENT: "nfs-client"}
    assert [n["stderr"] for n in smoke["nodes"].values()] == ["", ""]  # no sudo noise on every command


def test_nfs_v3_and_v42_mounted_from_the_server_over_the_link(smoke: Dict[str, Any]) -> None:
    by_dir = {fields[1]: fields for fields in (line.split() for line in smoke["mounts"].splitlines())}
    assert by_dir["/mnt/nfs3"][0] == "10.77.0.1:/srv/nfs" and "vers=3" in by_dir["/mnt/nfs3"][3]
    assert by_dir["/mnt/nfs42"][0] == "10.77.0.1:/srv/nfs" and "vers=4.2" in by_dir["/mnt/nfs42"][3]
    assert by_dir["/mnt/nfs42"][2] == "nfs4"
    # the link address sits on the socket NIC, not on the user-mode SSH NIC
    assert " dev eth0 " in smoke["route"] and "src 10.77.0.2" in smoke["route"]


def test_write_on_client_reads_back_on_server(smoke: Dict[str, Any]) -> None:
    trip = smoke["round_trip"]
    assert trip["client_rc"] == 0 and trip["client"]
    assert trip["server"][0] == trip["client"][0] and trip["server"][-1] == trip["token"]
    assert smoke["put_get_equal"]


def test_one_capture_on_the_client(smoke: Dict[str, Any]) -> None:
    """discover callgraph nfs_file_read around reads of the NFSv3 mount: the function was traced
    and the tracer is back to nop."""
    capture = smoke["capture"]
    assert capture["rc"] == 0, capture["stderr"]
    calls = sum(node["calls"] for node in capture["graph"]["nodes"] if node["id"] == "nfs_file_read")
    assert calls > 0 and "nfs_file_read" in capture["graph"]["graph"]["roots"]
    assert capture["tracer_after"] == ["nop"]


def test_one_exact_probe_count_and_nothing_left_attached(smoke: Dict[str, Any]) -> None:
    """nfsdist, installed from the Debian package, counts the known workload's reads, writes, opens,
    stats and fsyncs once each (or says it missed them), bytes exact; after Ctrl-C the kernel holds
    the tracing programs it held before."""
    probe = pc.data({"smoke": smoke["probe"]}, "smoke")
    assert probe["rc"] == 0, probe["stderr"]
    issued, ops, missed = probe["issued"], probe["ops"], probe["missed"]
    for op in ("read", "write", "open", "getattr", "fsync"):
        pc.counted_once(f"vagrant {op}", ops[op]["count"], issued[op], missed.get(op, 0))
    for op in ("read", "write"):
        if not missed.get(op):
            assert ops[op]["bytes"] == issued[f"{op}_bytes"]
    attached = probe["attached"]
    assert set(attached["during"]["bpf_progs"]) > set(attached["before"]["bpf_progs"])
    assert attached["after"] == attached["before"]


def test_live_configuration_obeys_the_network_rule(smoke: Dict[str, Any]) -> None:
    prefix = smoke["domain_prefix"]
    assert smoke["domains"] == [f"{prefix}nfs-client", f"{prefix}nfs-server"]
    assert smoke["domain_xml_problems"] == {dom: [] for dom in smoke["domains"]}
    assert smoke["net_problems"] == []
    # the socket link and user-mode NICs live inside QEMU: no new host interface
    assert smoke["links_during"] == smoke["links_before"]


def test_down_leaves_nothing_behind(smoke: Dict[str, Any]) -> None:
    assert "leftovers_error" not in smoke, smoke.get("leftovers_error")
    left = smoke["left"]
    assert left["qemu"] == [] and not left["ssh_master"] and not left["state_dir"]
    assert left["status"] == {SERVER: "absent", CLIENT: "absent"}
    assert left["domains"] == [] and left["volumes"] == [] and left["nets"] == []

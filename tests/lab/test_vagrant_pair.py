"""The Vagrant lab, for real: vagrant-libvirt boots the NFS server and client pair from
the box built out of our Debian 6.1 image, NFSv3 and v4.2 cross the socket link, the
discovery and probe checks pass on its client, the live libvirt configuration obeys the
network rule, and `down` leaves nothing behind.

One pair for the whole module (a `vagrant up` under TCG takes minutes). The tests
run in file order; the last one takes the lab down and checks for leftovers.
"""
from __future__ import annotations

import secrets
import subprocess
import time
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from labs.base import CLIENT, SERVER
from labs.netrule import check_domain_xml, check_net_list, parse_net_list

pytestmark = pytest.mark.lab

LAB_NAME = "pytest-pair"


def virsh(*args: str) -> str:
    return subprocess.run(["virsh", "-c", "qemu:///system", *args], check=True,
                          capture_output=True, text=True).stdout


def host_links() -> List[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], check=True, capture_output=True, text=True).stdout
    return sorted(line.split(":")[1].strip().split("@")[0] for line in out.splitlines())


def qemu_processes(prefix: str) -> List[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "qemu-system" in line and prefix in line]


@pytest.fixture(scope="module")
def pair() -> Iterator[Dict[str, object]]:
    from labs.libvirt_daemons import ensure_daemons
    from labs.vagrant import VagrantLab
    ensure_daemons()
    context: Dict[str, object] = {
        "nets_before": [row["name"] for row in parse_net_list(virsh("net-list", "--all"))],
        "links_before": host_links(),
    }
    lab = VagrantLab(kernel="6.1", topology="pair", name=LAB_NAME)
    lab.down()  # a lab a crashed earlier run left behind
    started = time.monotonic()
    lab.up()
    context["up_seconds"] = time.monotonic() - started
    context["lab"] = lab
    print(f"vagrant pair timings: {lab.timings} total up {context['up_seconds']:.0f} s")
    try:
        yield context
    finally:
        lab.down()


def test_both_nodes_run_the_image_kernel(pair: Dict[str, object]) -> None:
    lab = pair["lab"]
    expected = lab.state["kernel_release"]
    assert str(expected).startswith("6.1.")
    for node in (SERVER, CLIENT):
        assert lab.kernel_info(node)["release"] == expected
    results = {node: lab.run("hostname", node=node) for node in (SERVER, CLIENT)}
    assert {node: r.stdout.strip() for node, r in results.items()} == {SERVER: "nfs-server", CLIENT: "nfs-client"}
    assert [r.stderr for r in results.values()] == ["", ""]  # no sudo noise on every command


def test_nfs_v3_and_v42_mounted_from_the_server_over_the_link(pair: Dict[str, object]) -> None:
    lab = pair["lab"]
    mounts = lab.run("grep ' nfs' /proc/mounts", node=CLIENT).stdout
    by_dir = {fields[1]: fields for fields in (line.split() for line in mounts.splitlines())}
    assert by_dir["/mnt/nfs3"][0] == "10.77.0.1:/srv/nfs" and "vers=3" in by_dir["/mnt/nfs3"][3]
    assert by_dir["/mnt/nfs42"][0] == "10.77.0.1:/srv/nfs" and "vers=4.2" in by_dir["/mnt/nfs42"][3]
    assert by_dir["/mnt/nfs42"][2] == "nfs4"
    # the link address sits on the socket NIC, not on the user-mode SSH NIC
    route = lab.run("ip -o route get 10.77.0.1", node=CLIENT).stdout
    assert " dev eth0 " in route and "src 10.77.0.2" in route


@pytest.mark.parametrize("mount", ["/mnt/nfs3", "/mnt/nfs42"])
def test_write_on_client_reads_back_on_server_and_over_nfs(pair: Dict[str, object], mount: str) -> None:
    lab = pair["lab"]
    token = secrets.token_hex(16)
    name = f"work/rw-{Path(mount).name}-{token[:8]}"
    ops_before = lab.run("awk '/^proc[34] /' /proc/net/rpc/nfsd", node=SERVER).stdout
    wrote = lab.run(f"dd if=/dev/urandom of={mount}/{name} bs=64k count=16 status=none && "
                    f"sync && echo {token} >> {mount}/{name} && sha256sum {mount}/{name}", node=CLIENT)
    assert wrote.exit_code == 0, wrote.stderr
    client_sum = wrote.stdout.split()[0]
    on_server = lab.run(f"sha256sum /srv/nfs/{name} && tail -c 33 /srv/nfs/{name}", node=SERVER)
    assert on_server.exit_code == 0, on_server.stderr
    assert on_server.stdout.split()[0] == client_sum
    assert on_server.stdout.split()[-1] == token
    # and back: the server changes the file, the client reads the change through NFS
    lab.run(f"echo from-server-{token} >> /srv/nfs/{name}", node=SERVER)
    read = lab.run(f"echo 3 > /proc/sys/vm/drop_caches; tail -n 1 {mount}/{name}", node=CLIENT)
    assert read.stdout.strip() == f"from-server-{token}"
    ops_after = lab.run("awk '/^proc[34] /' /proc/net/rpc/nfsd", node=SERVER).stdout
    assert ops_after != ops_before  # the server's nfsd counted the traffic
    lab.run(f"rm -f {mount}/{name}", node=CLIENT)


def test_put_and_get_round_trip(pair: Dict[str, object], tmp_path: Path) -> None:
    lab = pair["lab"]
    src = tmp_path / "payload.bin"
    src.write_bytes(secrets.token_bytes(300_000))
    lab.put(src, "/root/probekit-payload.bin", node=SERVER)
    assert lab.run("stat -c %U:%s /root/probekit-payload.bin", node=SERVER).stdout.strip() == "root:300000"
    back = tmp_path / "back.bin"
    lab.get("/root/probekit-payload.bin", back, node=SERVER)
    assert back.read_bytes() == src.read_bytes()


def test_project_tree_runs_in_the_guest(pair: Dict[str, object]) -> None:
    lab = pair["lab"]
    res = lab.run("cd /opt/probekit && python3 -m discover --help", node=CLIENT)
    assert res.exit_code == 0, res.stderr
    assert "Usage" in res.stdout
    assert lab.run("test -f /opt/probekit/Vagrantfile", node=SERVER).exit_code == 0


def test_backend_neutral_integration_checks_pass(pair: Dict[str, object], tmp_path: Path) -> None:
    """labs/integration.py on this lab: workload, discover callgraph, tracefs restore, the probe
    checks on the client (netem on its link to the server; `main` and `v3only`, as no fault run
    follows: libvirt owns these QEMU processes), artefacts."""
    from labs.integration import run_integration
    from labs.probe_checks import PROBE_CHECKS
    started = time.monotonic()
    report = run_integration(pair["lab"], tmp_path, keep_up=True, probes=True)
    print(f"vagrant pair integration: {time.monotonic() - started:.0f} s\n{report.text()}")
    assert report.passed, report.text()
    assert report.kernel_release == pair["lab"].state["kernel_release"]
    assert list(tmp_path.glob("*/callgraph/nfs_file_read.json"))
    ran = {check.name for check in report.checks}
    assert {name for name, _, _ in PROBE_CHECKS} <= ran, sorted(ran)
    assert "probe runs: main and v3only on the client" in ran
    assert not any(name.startswith("fault") for name in ran)
    assert all(run["ok"] for ops in report.lab_results.values() for run in ops.values())


def test_live_configuration_obeys_the_network_rule(pair: Dict[str, object]) -> None:
    from labs.vagrant import domain_prefix, lab_domains
    domains = lab_domains(domain_prefix(LAB_NAME))
    assert sorted(domains) == [f"{domain_prefix(LAB_NAME)}nfs-client", f"{domain_prefix(LAB_NAME)}nfs-server"]
    for dom in domains:
        xml = virsh("dumpxml", dom)
        assert "<interface type=" in xml
        assert check_domain_xml(xml) == [], dom
    assert check_net_list(virsh("net-list", "--all"), pair["nets_before"]) == []
    # the socket link and user-mode NICs live inside QEMU: no new host interface
    assert host_links() == pair["links_before"]


def test_zz_down_leaves_nothing_behind(pair: Dict[str, object]) -> None:
    from labs.libvirt_daemons import ensure_daemons, stop_daemons_started_by_us
    from labs.vagrant import domain_prefix, state_dir
    lab = pair["lab"]
    lab.down()
    prefix = domain_prefix(LAB_NAME)
    assert qemu_processes(prefix) == []
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(state_dir(LAB_NAME)) not in ps  # no shared SSH connection left running
    assert not state_dir(LAB_NAME).exists()
    assert lab.status() == {SERVER: "absent", CLIENT: "absent"}
    ensure_daemons()  # down may have stopped the daemons it started: ask libvirt itself
    try:
        assert [d for d in virsh("list", "--all", "--name").split() if d.startswith(prefix)] == []
        volumes = virsh("vol-list", "default").split()
        assert [v for v in volumes if v.startswith(prefix)] == []
        assert check_net_list(virsh("net-list", "--all"), pair["nets_before"]) == []
    finally:
        stop_daemons_started_by_us()

"""The Vagrant backend's machines, as labs/vm/vagrant.py plans them and the Vagrantfile takes them.

`plan_machines` is what the Vagrantfile's local mode applies (PROBEKIT_MACHINES): each
machine's link NIC, ports, kernel command line and extra QEMU arguments. The tests check that
the nodes of each topology are linked on 127.0.0.1 as the QEMU backend links them, that the
network rule holds for every extra argument, and (with the real vagrant) that the Vagrantfile
defines those machines and vagrant-libvirt accepts their settings. The libvirt domains they
become are checked by tests/test_netrule.py (captured from a real `vagrant up`) and by the lab
smoke, tests/lab/test_vagrant_pair.py.
"""
from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from needs import missing

from discover.errors import UserError
from labs.vm.netrule import check_qemu_argv, split_qemu_opts
from labs.vm.vagrant import REPO, Machine, VagrantLab, plan_machines

NODES = {"single": ["server"], "pair": ["server", "client"], "fleet": ["server", "client-a", "client-b"]}


def planned(topology: str) -> List[Machine]:
    """The machines of a topology on ports 40001, 40002, ... (in the order they are picked)."""
    ports = itertools.count(40001)
    return plan_machines(topology, port=lambda: next(ports))


def netdevs(machine: Machine) -> Dict[str, Tuple[str, Dict[str, List[str]]]]:
    """A machine's extra -netdev options by id."""
    args = machine.qemuargs
    found = [split_qemu_opts(args[i + 1]) for i, a in enumerate(args) if a == "-netdev"]
    return {opts["id"][0]: (kind, opts) for kind, opts in found}


@pytest.mark.parametrize("topology", list(NODES))
def test_each_node_is_a_machine_with_its_link_address_and_mac(topology: str) -> None:
    machines = planned(topology)
    assert [m.node for m in machines] == NODES[topology]
    assert [m.name for m in machines] == [f"nfs-{node}" for node in NODES[topology]]
    for index, m in enumerate(machines, start=1):
        assert (m.link_ip, m.link_mac) == (f"10.77.0.{index}", f"52:54:00:77:00:{index:02x}")
        # the guest's probekit-lab-link unit finds the NIC by this MAC and gives it this address
        args = m.cmdline.split()
        assert [a for a in args if a.startswith("probekit.link=")] == [f"probekit.link={m.link_mac},{m.link_ip}/24"]
        assert f"systemd.hostname={m.name}" in args and "root=/dev/vda" in args
        assert m.tunnel == ("server" if m.node == "server" else "client")
    ports = [m.ssh_port for m in machines] + sorted({m.link_port for m in machines})
    assert len(set(ports)) == len(ports)


@pytest.mark.parametrize("topology", list(NODES))
def test_extra_qemu_arguments_obey_the_network_rule(topology: str) -> None:
    for index, m in enumerate(planned(topology), start=1):
        assert check_qemu_argv(m.qemuargs, complete=False) == [], m.name
        kind, opts = netdevs(m)["probekit-ssh"]
        assert (kind, opts["restrict"], opts["hostfwd"]) == ("user", ["on"], [f"tcp:127.0.0.1:{m.ssh_port}-:22"])
        nics = [m.qemuargs[i + 1] for i, a in enumerate(m.qemuargs) if a == "-device"]
        assert nics == [f"virtio-net-pci,netdev=probekit-ssh,addr=0x1e,mac=52:54:00:77:01:{index:02x}"]


def test_pair_client_connects_to_the_servers_own_socket() -> None:
    """Two nodes: the client's NIC connects to the port the server's NIC listens on, no hub (the CI smoke's
    pair, as before the fleet)."""
    server, client = planned("pair")
    assert client.link_port == server.link_port
    assert set(netdevs(server)) == set(netdevs(client)) == {"probekit-ssh"}


def test_fleet_server_joins_its_nic_and_each_clients_link_on_one_hub() -> None:
    """Each client connects to a port of its own where the server's QEMU listens; the hub there also
    connects to the server's libvirt NIC (listening on a third port), so the three share one subnet."""
    server, client_a, client_b = planned("fleet")
    hub = netdevs(server)
    assert hub["to-nic"] == ("socket", {"id": ["to-nic"], "connect": [f"127.0.0.1:{server.link_port}"]})
    for client in (client_a, client_b):
        assert hub[f"to-{client.node}"] == ("socket", {"id": [f"to-{client.node}"],
                                                        "listen": [f"127.0.0.1:{client.link_port}"]})
    for end in ("nic", "client-a", "client-b"):
        assert hub[f"hub-{end}"] == ("hubport", {"id": [f"hub-{end}"], "hubid": ["0"], "netdev": [f"to-{end}"]})
    assert len({server.link_port, client_a.link_port, client_b.link_port}) == 3
    assert set(netdevs(client_a)) == set(netdevs(client_b)) == {"probekit-ssh"}


def test_a_hub_end_off_loopback_is_caught() -> None:
    server = planned("fleet")[0]
    args = [a.replace("listen=127.0.0.1:", "listen=0.0.0.0:") for a in server.qemuargs]
    bad = check_qemu_argv(args, complete=False)
    assert len(bad) == 2 and all("0.0.0.0" in line for line in bad)


def test_ports_picked_twice_are_picked_again() -> None:
    """free_port may hand out a port it gave a moment ago: no two ends may share one."""
    ports = iter([40001, 40001, 40002, 40002, 40001, 40003, 40004, 40005, 40006])
    machines = plan_machines("fleet", port=lambda: next(ports))
    used = [machines[0].link_port] + [m.ssh_port for m in machines] + [m.link_port for m in machines[1:]]
    assert sorted(used) == [40001, 40002, 40003, 40004, 40005, 40006]


@pytest.mark.parametrize("topology, client, clients, status", [
    ("single", "server", ["server"], ["server", "client"]),
    ("pair", "client", ["client"], ["server", "client"]),
    ("fleet", "client-a", ["client-a", "client-b"], ["server", "client-a", "client-b"]),
])
def test_roles_and_node_names_reach_their_machines(topology: str, client: str, clients: List[str],
                                                  status: List[str]) -> None:
    lab = VagrantLab(topology=topology, name="roles-test", progress=lambda _line: None)
    assert lab.machines() == [m.name for m in planned(topology)]
    assert (lab.machine("server"), lab.machine("client")) == ("nfs-server", f"nfs-{client}")
    assert lab.client_names() == clients
    assert [lab.machine(node) for node in lab.nodes()] == lab.machines()
    assert list(lab.status()) == status  # nothing up: every node absent
    assert set(lab.status().values()) == {"absent"}
    with pytest.raises(UserError, match="no node 'client-c'"):
        lab.machine("client-c")


def test_unknown_topology_is_one_line() -> None:
    with pytest.raises(UserError, match="unknown topology 'ring'"):
        VagrantLab(topology="ring")


# -- the real Vagrantfile ---------------------------------------------------------------------

def vagrant(args: List[str], env: Dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess:
    if shutil.which("vagrant") is None:
        missing("needs vagrant and vagrant-libvirt (bash scripts/setup)")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PROBEKIT_", "VAGRANT_"))}
    base.update({"VAGRANT_DOTFILE_PATH": str(tmp_path / "dotfile"), "VAGRANT_CHECKPOINT_DISABLE": "1",
                 "VAGRANT_DEFAULT_PROVIDER": "libvirt", "HOME": os.environ.get("HOME", str(tmp_path))})
    base.update(env)
    return subprocess.run(["vagrant", *args, "--machine-readable"], cwd=REPO, env=base, capture_output=True,
                          text=True, timeout=120)


def machine_names(out: str) -> List[str]:
    return [line.split(",")[1] for line in out.splitlines() if line.split(",")[2:3] == ["metadata"]
            and line.split(",")[3:4] == ["provider"]]


@pytest.mark.parametrize("topology", list(NODES))
def test_vagrantfile_local_mode_defines_the_planned_machines(topology: str, tmp_path: Path) -> None:
    """`vagrant validate` on the local mode with this plan: the machines are the plan's, and
    vagrant-libvirt accepts each one's link NIC, kernel command line and qemuargs."""
    for name in ("key", "vmlinuz", "initrd.img"):
        (tmp_path / name).write_text("")
    machines = planned(topology)
    res = vagrant(["validate"], {
        "PROBEKIT_VAGRANT_LOCAL": "1", "PROBEKIT_BOX": "probekit-test", "PROBEKIT_KERNEL": str(tmp_path / "vmlinuz"),
        "PROBEKIT_INITRD": str(tmp_path / "initrd.img"), "PROBEKIT_SSH_KEY": str(tmp_path / "key"),
        "PROBEKIT_CONSOLE_DIR": str(tmp_path), "PROBEKIT_MACHINES": json.dumps([m._asdict() for m in machines]),
    }, tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Vagrantfile validated successfully" in res.stdout
    assert machine_names(res.stdout) == [m.name for m in machines]


@pytest.mark.parametrize("topology, names", [
    ("", ["nfs-server", "nfs-client"]),
    ("pair", ["nfs-server", "nfs-client"]),
    ("fleet", ["nfs-server", "nfs-client-a", "nfs-client-b"]),
])
def test_vagrantfile_public_mode_takes_its_topology_from_the_environment(topology: str, names: List[str],
                                                                         tmp_path: Path) -> None:
    """Plain `vagrant up` on a user's machine: the pair unless PROBEKIT_TOPOLOGY says fleet."""
    res = vagrant(["status"], {"PROBEKIT_TOPOLOGY": topology} if topology else {}, tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert [line.split(",")[1] for line in res.stdout.splitlines() if line.split(",")[2:3] == ["state"]] == names


def test_vagrantfile_public_mode_refuses_an_unknown_topology(tmp_path: Path) -> None:
    res = vagrant(["status"], {"PROBEKIT_TOPOLOGY": "ring"}, tmp_path)
    assert res.returncode != 0
    assert "PROBEKIT_TOPOLOGY=ring: choose pair or fleet" in res.stderr

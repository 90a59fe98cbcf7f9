"""The network-rule checker on the configurations the labs really generate.

The QEMU argv comes from QemuLab itself; the libvirt domain XML and network list
were captured from a real `vagrant up` of the repository's Vagrantfile (see
tests/fixtures/vagrant/README.md). Each violation case edits one of those real
configurations in the way a mistake would, and the checker must name it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from labs.vm.netrule import (check_domain_xml, check_hostfwd, check_net_list, check_qemu_argv,
                          parse_net_list, split_qemu_opts)

FIXTURES = Path(__file__).parent / "fixtures" / "vagrant"
DOMAINS = ("nfs-server", "nfs-client")


def qemu_argvs(tmp_path: Path, topology: str, accel: str) -> Dict[str, List[str]]:
    """QemuLab's exact argv per guest; only the image paths are placeholders."""
    from labs.vm.images import ImageInfo
    from labs.vm.qemu import QemuLab
    lab = QemuLab(kernel="6.1", topology=topology, name="netrule-test", project_dir=tmp_path)
    lab.image = ImageInfo(key="test", suite="bookworm", kernel_release="6.1.0-test-amd64",
                          directory=tmp_path, rootfs=tmp_path / "rootfs.qcow2",
                          vmlinuz=tmp_path / "vmlinuz", initrd=tmp_path / "initrd.img",
                          ssh_private_key=tmp_path / "key", ssh_public_key=tmp_path / "key.pub",
                          packages=[])
    return lab.argv_by_node(accel)


def domain_xml(name: str) -> str:
    return (FIXTURES / f"{name}.domain.xml").read_text()


def replace_once(argv: List[str], old: str, new: str) -> List[str]:
    hits = [i for i, arg in enumerate(argv) if old in arg]
    assert hits, f"{old!r} not in the generated argv"
    out = list(argv)
    out[hits[0]] = out[hits[0]].replace(old, new)
    return out


# -- QEMU argv ---------------------------------------------------------------------------

@pytest.mark.parametrize("topology", ["single", "pair", "fleet"])
@pytest.mark.parametrize("accel", ["tcg", "kvm"])
def test_qemulab_argv_obeys_the_rule(tmp_path: Path, topology: str, accel: str) -> None:
    argvs = qemu_argvs(tmp_path, topology, accel)
    assert argvs
    for name, argv in argvs.items():
        assert "-netdev" in argv, name  # the SSH forward at least: the check saw a netdev
        assert check_qemu_argv(argv) == [], name


def test_pair_argv_links_both_guests_on_loopback(tmp_path: Path) -> None:
    argvs = qemu_argvs(tmp_path, "pair", "tcg")
    links = [argv[i + 1] for argv in argvs.values() for i, a in enumerate(argv)
             if a == "-netdev" and argv[i + 1].startswith("socket,")]
    modes = sorted(key for link in links for key in split_qemu_opts(link)[1] if key in ("listen", "connect"))
    assert modes == ["connect", "listen"]


def netdevs(argv: List[str]) -> Dict[str, Tuple[str, Dict[str, List[str]]]]:
    """A guest's -netdev options by id."""
    found = [split_qemu_opts(argv[i + 1]) for i, a in enumerate(argv) if a == "-netdev"]
    return {opts["id"][0]: (kind, opts) for kind, opts in found}


def kernel_links(argv: List[str]) -> List[str]:
    """The probekit.link=MAC,ADDRESS/PREFIX values on a guest's kernel command line."""
    cmdline = argv[argv.index("-append") + 1].split()
    return [arg.split("=", 1)[1] for arg in cmdline if arg.startswith("probekit.link=")]


def test_fleet_argv_links_the_server_and_client_a_to_a_hub_in_client_b(tmp_path: Path) -> None:
    """The server and client-a each connect to a port of their own on 127.0.0.1 where client-b's
    QEMU listens; client-b's one NIC sits on a hub with both links (so a stopped server leaves
    the clients linked); one subnet, one address and MAC per guest."""
    argvs = qemu_argvs(tmp_path, "fleet", "tcg")
    assert list(argvs) == ["server", "client-a", "client-b"]
    hub = netdevs(argvs["client-b"])
    ports = {}
    for peer in ("server", "client-a"):
        kind, opts = netdevs(argvs[peer])["link"]
        assert kind == "socket" and opts["connect"][0].startswith("127.0.0.1:") and "listen" not in opts
        ports[peer] = opts["connect"][0]
        assert hub[f"to-{peer}"] == ("socket", {"id": [f"to-{peer}"], "listen": [ports[peer]]})
        assert hub[f"hub-{peer}"] == ("hubport", {"id": [f"hub-{peer}"], "hubid": ["0"], "netdev": [f"to-{peer}"]})
    assert len(set(ports.values())) == 2
    assert hub["link"] == ("hubport", {"id": ["link"], "hubid": ["0"]})
    links = {name: kernel_links(argv) for name, argv in argvs.items()}
    assert links == {"server": ["52:54:00:77:00:01,10.77.0.1/24"], "client-a": ["52:54:00:77:00:02,10.77.0.2/24"],
                     "client-b": ["52:54:00:77:00:03,10.77.0.3/24"]}
    for name, argv in argvs.items():  # the NIC on the link carries the MAC its kernel command line names
        nics = [argv[i + 1] for i, a in enumerate(argv) if a == "-device" and "netdev=link" in argv[i + 1]]
        assert nics == [f"virtio-net-pci,netdev=link,mac={links[name][0].split(',')[0]}"]


def test_pair_argv_keeps_one_socket_behind_the_servers_nic(tmp_path: Path) -> None:
    """With one client the server's NIC is the socket link itself, no hub."""
    argvs = qemu_argvs(tmp_path, "pair", "tcg")
    server, client = netdevs(argvs["server"]), netdevs(argvs["client"])
    assert server["link"][1]["listen"] == client["link"][1]["connect"]
    assert not any(kind == "hubport" for kind, _ in server.values())
    assert {name: kernel_links(argv) for name, argv in argvs.items()} == {
        "server": ["52:54:00:77:00:01,10.77.0.1/24"], "client": ["52:54:00:77:00:02,10.77.0.2/24"]}


@pytest.mark.parametrize("topology, server, client, clients", [
    ("single", "lab", "lab", ["lab"]),
    ("pair", "server", "client", ["client"]),
    ("fleet", "server", "client-a", ["client-a", "client-b"]),
])
def test_roles_name_the_topologys_guests(tmp_path: Path, topology: str, server: str, client: str,
                                         clients: List[str]) -> None:
    """SERVER is the first guest, CLIENT the topology's one-client guest; a node name reaches its guest."""
    from discover.errors import UserError
    from labs.vm.qemu import QemuLab
    lab = QemuLab(kernel="6.1", topology=topology, name="roles-test", ssh=False, project_dir=tmp_path)
    lab.nodes = lab.plan_nodes()
    assert (lab.node_name("server"), lab.node_name("client"), lab.client_names()) == (server, client, clients)
    assert [lab.node_name(name) for name in clients] == clients
    with pytest.raises(UserError, match="no node 'client-c'"):
        lab.node_name("client-c")


@pytest.mark.parametrize("topology, node, old, new, named", [
    ("single", "lab", "restrict=on", "restrict=off", "restrict=on"),
    ("single", "lab", "restrict=on,", "", "restrict=on"),
    ("single", "lab", "hostfwd=tcp:127.0.0.1:", "hostfwd=tcp::", "every address"),
    ("single", "lab", "hostfwd=tcp:127.0.0.1:", "hostfwd=tcp:10.0.0.5:", "10.0.0.5"),
    ("pair", "server", "listen=127.0.0.1:", "listen=0.0.0.0:", "listen=0.0.0.0"),
    ("pair", "server", "listen=127.0.0.1:", "listen=:", ""),
])
def test_one_edit_off_the_rule_is_caught(tmp_path: Path, topology: str, node: str, old: str, new: str,
                                         named: str) -> None:
    """An unrestricted user netdev, a hostfwd or a socket link off loopback: one violation, named."""
    argv = qemu_argvs(tmp_path, topology, "tcg")[node]
    bad = check_qemu_argv(replace_once(argv, old, new))
    assert len(bad) == 1 and named in bad[0]


def test_multicast_tap_and_bridge_are_caught(tmp_path: Path) -> None:
    argv = qemu_argvs(tmp_path, "single", "tcg")["lab"]
    assert len(check_qemu_argv(argv + ["-netdev", "tap,id=t0,ifname=tap0,script=no"])) == 1
    assert len(check_qemu_argv(argv + ["-nic", "bridge,br=virbr0"])) == 1
    assert len(check_qemu_argv(argv + ["-netdev", "socket,id=m,mcast=230.0.0.1:1234"])) == 1
    assert len(check_qemu_argv(argv + ["-netdev", "user,id=u2,restrict=on,guestfwd=tcp:10.0.2.100:80-cmd:nc x 80"])) == 1


def test_qemu_default_nic_is_caught(tmp_path: Path) -> None:
    """Without any network option and without -nodefaults QEMU adds an open user NIC."""
    argv = qemu_argvs(tmp_path, "single", "tcg")["lab"]
    stripped: List[str] = []
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg in ("-netdev", "-nodefaults") or (arg == "-device" and "netdev=" in argv[i + 1]):
            skip = arg != "-nodefaults"
            continue
        stripped.append(arg)
    assert "-netdev" not in stripped
    bad = check_qemu_argv(stripped)
    assert len(bad) == 1 and "default" in bad[0]
    assert check_qemu_argv(stripped + ["-nic", "none"]) == []


def test_qemu_option_splitting() -> None:
    assert split_qemu_opts("user,id=u,hostfwd=a,hostfwd=b") == ("user", {"id": ["u"], "hostfwd": ["a", "b"]})
    assert split_qemu_opts("file,path=/a,,b,id=c") == ("file", {"path": ["/a,b"], "id": ["c"]})
    assert split_qemu_opts("type=user,restrict") == ("user", {"type": ["user"], "restrict": ["on"]})
    assert check_hostfwd("tcp:127.0.0.1:2222-:22") is None
    assert check_hostfwd("udp:127.0.0.1:53-10.0.2.15:53") is None
    assert check_hostfwd("::2222-:22") is not None


# -- libvirt domain XML from a real `vagrant up` ------------------------------------------

@pytest.mark.parametrize("name", DOMAINS)
def test_vagrant_domains_obey_the_rule(name: str) -> None:
    xml = domain_xml(name)
    assert "<interface type=" in xml and "hostfwd=tcp:127.0.0.1:" in xml
    assert check_domain_xml(xml) == []


def test_vagrant_pair_shares_one_socket_link() -> None:
    import xml.etree.ElementTree as ET
    ends = {}
    for name in DOMAINS:
        iface = ET.fromstring(domain_xml(name)).find("devices/interface")
        assert iface is not None
        source = iface.find("source")
        assert source is not None
        ends[iface.get("type")] = (source.get("address"), source.get("port"))
    assert set(ends) == {"server", "client"}
    assert ends["server"] == ends["client"] and ends["server"][0] == "127.0.0.1"


FLEET = ("nfs-server", "nfs-client-a", "nfs-client-b")


def fleet_xml(name: str) -> str:
    return (FIXTURES / "fleet" / f"{name}.domain.xml").read_text()


@pytest.mark.parametrize("name", FLEET)
def test_vagrant_fleet_domains_obey_the_rule(name: str) -> None:
    assert check_domain_xml(fleet_xml(name)) == []


def test_vagrant_fleet_links_meet_in_the_servers_hub() -> None:
    """The server's libvirt NIC listens on a port that the hub in its qemu:commandline connects to;
    the hub listens on each client's port, where that client's libvirt NIC connects; each NIC has
    the MAC its kernel command line gives an address."""
    import xml.etree.ElementTree as ET
    from labs.vm.netrule import QEMU_NS
    nics, links = {}, {}
    for name in FLEET:
        root = ET.fromstring(fleet_xml(name))
        [iface] = root.findall("devices/interface")
        source, mac = iface.find("source"), iface.find("mac")
        assert source is not None and mac is not None and source.get("address") == "127.0.0.1"
        nics[name] = (iface.get("type"), f"127.0.0.1:{source.get('port')}", mac.get("address"))
        links[name] = [a.split("=", 1)[1] for a in root.findtext("os/cmdline", "").split()
                       if a.startswith("probekit.link=")]
    hub = netdevs([arg.get("value", "") for arg in ET.fromstring(fleet_xml("nfs-server")).iter(f"{QEMU_NS}arg")])
    assert hub["to-nic"][1]["connect"] == [nics["nfs-server"][1]] and nics["nfs-server"][0] == "server"
    for client in ("client-a", "client-b"):
        assert nics[f"nfs-{client}"][0] == "client"
        assert hub[f"to-{client}"][1]["listen"] == [nics[f"nfs-{client}"][1]]
    assert {end: hub[f"hub-{end}"][1]["netdev"] for end in ("nic", "client-a", "client-b")} == \
        {"nic": ["to-nic"], "client-a": ["to-client-a"], "client-b": ["to-client-b"]}
    assert {name: [f"{nics[name][2]},10.77.0.{i}/24"] for i, name in enumerate(FLEET, start=1)} == links


def test_domain_socket_link_off_loopback_is_caught() -> None:
    xml = domain_xml("nfs-server").replace("address='127.0.0.1'", "address='0.0.0.0'", 1)
    bad = check_domain_xml(xml)
    assert len(bad) == 1 and "0.0.0.0" in bad[0]


def test_domain_management_network_is_caught() -> None:
    """What vagrant-libvirt adds by default (mgmt_attach): a NIC on its NAT network."""
    nat_nic = ("<interface type='network'><source network='vagrant-libvirt'/>"
               "<model type='virtio'/></interface>")
    xml = domain_xml("nfs-client").replace("<devices>", "<devices>" + nat_nic, 1)
    bad = check_domain_xml(xml)
    assert len(bad) == 1 and "vagrant-libvirt" in bad[0]
    bridge_nic = "<interface type='bridge'><source bridge='virbr0'/></interface>"
    assert len(check_domain_xml(domain_xml("nfs-client").replace("<devices>", "<devices>" + bridge_nic, 1))) == 1


def test_domain_qemu_commandline_is_checked() -> None:
    xml = domain_xml("nfs-server")
    assert len(check_domain_xml(xml.replace("restrict=on,", "", 1))) == 1
    assert len(check_domain_xml(xml.replace("hostfwd=tcp:127.0.0.1:", "hostfwd=tcp::", 1))) == 1


# -- libvirt networks ---------------------------------------------------------------------

def test_net_list_before_and_after_vagrant_up() -> None:
    before = (FIXTURES / "net-list.before.txt").read_text()
    names_before = [row["name"] for row in parse_net_list(before)]
    assert check_net_list(before, names_before) == []
    for after in ("net-list.after-up.txt", "fleet/net-list.after-up.txt"):
        assert check_net_list((FIXTURES / after).read_text(), names_before) == [], after


def test_active_or_new_network_is_caught() -> None:
    before = (FIXTURES / "net-list.before.txt").read_text()
    names_before = [row["name"] for row in parse_net_list(before)]
    assert names_before, "the captured list has libvirt's packaged 'default' network"
    active = before.replace("inactive", "active", 1)
    assert len(check_net_list(active, names_before)) == 1
    autostart = before.replace(" no ", " yes ", 1)
    assert any("autostart" in v for v in check_net_list(autostart, names_before))
    assert len(check_net_list(before, [])) == len(names_before)

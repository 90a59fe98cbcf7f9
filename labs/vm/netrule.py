"""The project's network rule, checked on generated VM configurations.

Nothing may send traffic to a non-loopback address of the host. So: QEMU user-mode
networking only with restrict=on and host forwards bound to 127.0.0.1; guests reach
each other only over QEMU socket links on 127.0.0.1; never a tap, a bridge, or a
libvirt NAT/bridged network. These checks read a QEMU argv, a libvirt domain XML
(`virsh dumpxml`) and `virsh net-list --all`; each returns the violations found,
one readable line each, so an empty list means the configuration obeys the rule.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

LOOPBACK = ("127.0.0.1", "localhost", "::1")
QEMU_NS = "{http://libvirt.org/schemas/domain/qemu/1.0}"
#: netdev back-ends that put guest frames on a host interface or an external network
FORBIDDEN_NETDEVS = ("tap", "bridge", "vde", "l2tpv3", "netmap", "vhost-vdpa", "af-xdp",
                     "vmnet-host", "vmnet-shared", "vmnet-bridged")
#: libvirt interface types that are loopback socket links when their addresses are
LOOPBACK_IFACE_TYPES = ("server", "client", "udp")


def split_qemu_opts(text: str) -> Tuple[str, Dict[str, List[str]]]:
    """'user,id=n0,hostfwd=a,hostfwd=b' -> ('user', {'id': ['n0'], 'hostfwd': ['a', 'b']}).

    QEMU escapes a literal comma as ',,'. The first item is the type when it has no '='.
    """
    items: List[str] = []
    current = ""
    i = 0
    while i < len(text):
        if text[i] == ",":
            if text[i + 1:i + 2] == ",":
                current += ","
                i += 2
                continue
            items.append(current)
            current = ""
        else:
            current += text[i]
        i += 1
    items.append(current)
    kind = ""
    opts: Dict[str, List[str]] = {}
    for index, item in enumerate(items):
        key, eq, value = item.partition("=")
        if not eq:
            if index == 0:
                kind = item
                continue
            value = "on"
        opts.setdefault(key, []).append(value)
    if not kind and "type" in opts:
        kind = opts["type"][0]
    return kind, opts


def _host_of(hostport: str) -> str:
    """'127.0.0.1:2222' -> '127.0.0.1'; ':2222' -> '' (every address); '[::1]:22' -> '::1'."""
    if hostport.startswith("["):
        return hostport[1:hostport.find("]")]
    return hostport.rpartition(":")[0] if ":" in hostport else hostport


def _is_loopback(host: str) -> bool:
    return host in LOOPBACK or host.startswith("127.")


def check_hostfwd(rule: str) -> Optional[str]:
    """hostfwd=[tcp|udp]:[hostaddr]:hostport-[guestaddr]:guestport must name 127.0.0.1."""
    host_part = rule.split("-", 1)[0]
    fields = host_part.split(":")
    if fields[0] in ("tcp", "udp"):
        fields = fields[1:]
    host = fields[0] if len(fields) >= 2 else ""
    if not _is_loopback(host):
        return f"hostfwd {rule!r} binds {host or 'every address'}, not 127.0.0.1"
    return None


def check_netdev(spec: str, where: str) -> List[str]:
    """One -netdev/-nic/-net value."""
    kind, opts = split_qemu_opts(spec)
    bad: List[str] = []
    if kind in FORBIDDEN_NETDEVS:
        bad.append(f"{where} {kind}: puts guest traffic on a host interface ({spec})")
    elif kind == "user":
        restrict = opts.get("restrict", ["off"])[-1]
        if restrict not in ("on", "yes", "true", "y"):
            bad.append(f"{where} user without restrict=on: the guest can reach the host and beyond ({spec})")
        for rule in opts.get("hostfwd", []):
            problem = check_hostfwd(rule)
            if problem:
                bad.append(f"{where} {problem}")
        for key in ("guestfwd", "smb"):
            if key in opts:
                bad.append(f"{where} user with {key}=: opens a path out of the guest ({spec})")
    elif kind == "socket":
        if "mcast" in opts:
            bad.append(f"{where} socket mcast= sends to a multicast group on the host network ({spec})")
        for key in ("listen", "connect", "udp", "localaddr"):
            for value in opts.get(key, []):
                if not _is_loopback(_host_of(value)):
                    bad.append(f"{where} socket {key}={value}: not on 127.0.0.1")
    elif kind in ("stream", "dgram"):
        for key in ("addr.host", "remote.host", "local.host"):
            for value in opts.get(key, []):
                if not _is_loopback(value):
                    bad.append(f"{where} {kind} {key}={value}: not on 127.0.0.1")
    return bad


def check_qemu_argv(argv: Sequence[str], complete: bool = True) -> List[str]:
    """Violations in a QEMU command line.

    complete=False for extra arguments only (libvirt's qemu:commandline), where the
    rest of the command line is libvirt's and QEMU's default NIC does not apply.
    """
    bad: List[str] = []
    saw_net = False
    nodefaults = "-nodefaults" in argv
    for index, arg in enumerate(argv):
        value = argv[index + 1] if index + 1 < len(argv) else ""
        if arg in ("-netdev", "-nic", "-net"):
            saw_net = True
            if arg == "-net" and split_qemu_opts(value)[0] == "nic":
                continue  # a guest NIC on a hub: its back-end is checked on its own
            if not (arg == "-nic" and split_qemu_opts(value)[0] == "none"):
                bad += check_netdev(value, arg)
        elif arg == "-chardev":
            kind, opts = split_qemu_opts(value)
            if kind in ("socket", "udp"):
                for key in ("host", "localaddr"):
                    for host in opts.get(key, []):
                        if not _is_loopback(host):
                            bad.append(f"-chardev {kind} {key}={host}: not on 127.0.0.1")
        elif arg == "-vnc" and not value.startswith(("unix:", "none")):
            host = _host_of(value.split(",")[0])
            if not _is_loopback(host):
                bad.append(f"-vnc {value}: listens on {host or 'every address'}, not 127.0.0.1")
    if complete and not saw_net and not nodefaults:
        bad.append("no -nic/-netdev and no -nodefaults: QEMU adds an unrestricted user-mode NIC")
    return bad


def check_domain_xml(xml_text: str) -> List[str]:
    """Violations in a libvirt domain (`virsh dumpxml`), qemu:commandline included."""
    root = ET.fromstring(xml_text)
    name = root.findtext("name", default="?")
    bad: List[str] = []
    devices = root.find("devices")
    for iface in (devices.findall("interface") if devices is not None else []):
        kind = iface.get("type", "")
        source = iface.find("source")
        if kind not in LOOPBACK_IFACE_TYPES:
            target = "" if source is None else " ".join(f"{k}={v}" for k, v in source.attrib.items())
            bad.append(f"{name}: <interface type='{kind}'> {target}".rstrip()
                       + " (only socket links on 127.0.0.1 are allowed)")
            continue
        addresses = [] if source is None else [source.get("address", "")]
        local = None if source is None else source.find("local")
        if local is not None:
            addresses.append(local.get("address", ""))
        for address in addresses:
            if not _is_loopback(address):
                bad.append(f"{name}: <interface type='{kind}'> address {address or '(any)'}, "
                           "not 127.0.0.1")
    for tag in ("serial", "console", "channel", "parallel"):
        for dev in (devices.findall(tag) if devices is not None else []):
            if dev.get("type") in ("tcp", "udp"):
                for source in dev.findall("source"):
                    host = source.get("host", "")
                    if not _is_loopback(host):
                        bad.append(f"{name}: <{tag} type='{dev.get('type')}'> host {host or '(any)'}")
    for graphics in (devices.findall("graphics") if devices is not None else []):
        listens = [graphics.get("listen")] + [l.get("address") for l in graphics.findall("listen")
                                              if l.get("type") == "address"]
        for address in filter(None, listens):
            if not _is_loopback(address):
                bad.append(f"{name}: <graphics type='{graphics.get('type')}'> listens on {address}")
    extra = [arg.get("value", "") for arg in root.iter(f"{QEMU_NS}arg")]
    bad += [f"{name}: qemu:commandline {problem}" for problem in check_qemu_argv(extra, complete=False)]
    return bad


def parse_net_list(text: str) -> List[Dict[str, str]]:
    """Rows of `virsh net-list --all`: name, state, autostart, persistent."""
    rows = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] != "Name" and not set(line.strip()) <= {"-"}:
            rows.append(dict(zip(("name", "state", "autostart", "persistent"), fields)))
    return rows


def check_net_list(text: str, present_before: Iterable[str] = ()) -> List[str]:
    """Violations in `virsh net-list --all`.

    Any active libvirt network is a host bridge (NAT or not); any network that was not
    there before the lab came up was created by the lab, active or not.
    """
    before = set(present_before)
    bad = []
    for row in parse_net_list(text):
        if row["state"] == "active":
            bad.append(f"libvirt network {row['name']} is active (a host bridge/NAT)")
        elif row["name"] not in before:
            bad.append(f"libvirt network {row['name']} was created by the lab")
        if row.get("autostart") == "yes":
            bad.append(f"libvirt network {row['name']} starts with libvirtd (autostart)")
    return bad

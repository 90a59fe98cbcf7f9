"""QemuLab: NFS labs on QEMU directly, from the cached Debian image, with no host networking.

Topologies (TOPOLOGIES):
  single  one guest is NFS server and client at once (mounts over 127.0.0.1); the fast
          path, and what kernel matrices use.
  pair    two guests linked by a QEMU socket netdev on 127.0.0.1 (10.77.0.1 server,
          10.77.0.2 client, static addresses from the kernel command line).
  fleet   a server and two clients (client-a 10.77.0.2, client-b 10.77.0.3): the server and
          client-a each on a socket link of their own to a hub in client-b's QEMU (not the
          server's: the fleet check stops the server, and the clients must still reach each
          other), one lab subnet, no host network.

Each guest boots the image's kernel directly, on a throw-away qcow2 overlay; the project
tree is shared read-only over 9p at /opt/probekit and a writable results share at
/results. Commands go through qemu-guest-agent on a virtio-serial socket. An optional
SSH forward (restricted user-mode NIC, 127.0.0.1 only) serves `labs shell`.
KVM is tried first and abandoned for TCG when it fails or stalls; the verdict is cached
per host kernel. The serial console is watched for panics, oopses and hangs.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple, Union

from discover.errors import UserError
from discover.schema import ANY, ListOf, MapOf, Nullable, OneOf, Record, validate
from labs.vm.agent import AgentError, AgentTimeout, connect, run_command
from labs.vm.base import CLIENT, SERVER, BrokenState, CommandResult, Lab
from labs.vm.console import ConsoleWatch, GuestFailure, failure
from labs.vm.images import ImageInfo, build_image, cache_root

PROJECT_DIR = Path(__file__).resolve().parents[2]
GUEST_PROVISION = "/usr/local/lib/probekit/provision"
LAB_SUBNET_PREFIX = "10.77.0."
#: a TCG boot is stuck after this long without a console line (a busy host only slows it)
BOOT_TIMEOUT_TCG = 480.0
#: a boot that prints for this many times BOOT_TIMEOUT_TCG is hung all the same
BOOT_HANG_FACTOR = 4
#: seconds between two asks of a booting guest's agent
READY_POLL_S = 3.0
KVM_STALL_SECONDS = 40.0
#: a kernel that reached userspace (or the KVM fast path is working)
REACHED_USERSPACE = re.compile(r"systemd\[1\]|Welcome to |Run /sbin/init|Freeing unused kernel")

Progress = Callable[[str], None]


class Topology(NamedTuple):
    """The guests of a lab. The first serves NFS; with more than one, every other guest mounts
    it over the lab link (one guest mounts its own exports)."""

    nodes: Tuple[str, ...]
    #: the guest CLIENT names: where the one-client checks run
    client: str
    #: the guest whose QEMU listens for every other's socket link (through a hub with more than
    #: one): it boots first, and must never be the one a check stops
    listener: str = ""

    @property
    def linked(self) -> bool:
        return len(self.nodes) > 1


TOPOLOGIES: Dict[str, Topology] = {
    "single": Topology(nodes=("lab",), client="lab"),
    "pair": Topology(nodes=("server", "client"), client="client", listener="server"),
    "fleet": Topology(nodes=("server", "client-a", "client-b"), client="client-a", listener="client-b"),
}


class Node(NamedTuple):
    """One guest of a lab: its name, addresses and ports."""

    name: str            # one of its Topology's nodes
    index: int           # 1-based, picks MACs, link address and ports
    link_address: str    # 10.77.0.N on the lab link ("" in one guest)
    link_port: int       # 127.0.0.1 port of its link, where the listener's QEMU listens (0: the listener, one guest)
    ssh_port: int        # 127.0.0.1 forward to the guest's port 22 (0: no SSH)


def lab_state_dir(name: str = "default") -> Path:
    """Where a running lab keeps its state, overlays, sockets and console logs."""
    return cache_root() / "labs" / name


#: what `_save` writes; `attach` checks it before use (a crash or a hand edit can leave anything)
STATE = Record({"kernel": str, "topology": OneOf(*TOPOLOGIES), "ssh": bool, "memory_mib": int,
                "vcpus": Nullable(int), "accel": Nullable(str), "project_dir": str,
                "image": Record({k: ANY for k in ImageInfo._fields}),
                "nodes": ListOf(Record({"name": str, "index": int, "link_address": str, "link_port": int,
                                        "ssh_port": int}, closed=True)),
                "pids": MapOf(int), "console_offsets": MapOf(int)})


def read_state(path: Path, name: str) -> Dict[str, Any]:
    """A lab's state.json, checked; a broken one is one line that says how to clear it."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise BrokenState(f"{path}: {exc.strerror or exc}", name) from None
    except (ValueError, RecursionError):
        raise BrokenState(f"{path}: lab state is not JSON", name) from None
    try:
        validate(data, STATE, str(path), "lab state")
    except UserError as exc:
        raise BrokenState(str(exc), name) from None
    return data


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (for SSH forwards and the socket link)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class QemuLab(Lab):
    """An NFS lab of one to three QEMU guests on one Debian kernel."""

    backend = "qemu"
    can_pause_nodes = True  # SIGSTOP/SIGCONT to a guest's own QEMU process (signal_node)

    def __init__(self, kernel: str = "6.1", topology: str = "single", name: str = "default",
                 ssh: bool = True, memory_mib: int = 1536, vcpus: Optional[int] = None,
                 accel: Optional[str] = None, project_dir: Path = PROJECT_DIR,
                 progress: Progress = print) -> None:
        if topology not in TOPOLOGIES:
            raise UserError(f"unknown topology {topology!r} ({', '.join(TOPOLOGIES)})")
        self.kernel = kernel
        self.topology = topology
        self.name = name
        self.ssh = ssh
        self.memory_mib = memory_mib
        self.vcpus = vcpus
        self.accel = accel
        self.project_dir = project_dir
        self.progress = progress
        self.state_dir = lab_state_dir(name)
        self.image: Optional[ImageInfo] = None
        self.nodes: List[Node] = []
        self.pids: Dict[str, int] = {}
        self.watches: Dict[str, ConsoleWatch] = {}
        self.timings: Dict[str, float] = {}

    # -- persistence: `labs up` starts, later `labs run` reattaches ------------------------

    @classmethod
    def attach(cls, name: str = "default", progress: Progress = print) -> "QemuLab":
        """Reattach to a lab started by an earlier process (from its state.json)."""
        state_file = lab_state_dir(name) / "state.json"
        if not state_file.exists():
            raise UserError(f"no lab {name!r} is up (run `labs up` first)")
        state = read_state(state_file, name)
        lab = cls(kernel=state["kernel"], topology=state["topology"], name=name, ssh=state["ssh"],
                  memory_mib=state["memory_mib"], vcpus=state["vcpus"], accel=state["accel"],
                  project_dir=Path(state["project_dir"]), progress=progress)
        lab.image = ImageInfo.from_json(state["image"])
        lab.nodes = [Node(**node) for node in state["nodes"]]
        lab.pids = {k: int(v) for k, v in state["pids"].items()}
        lab.watches = {node.name: ConsoleWatch(lab.label(node.name), lab.console_log(node.name),
                                               offset=state["console_offsets"].get(node.name, 0))
                       for node in lab.nodes}
        return lab

    def _save(self) -> None:
        assert self.image is not None
        state = {
            "backend": self.backend, "kernel": self.kernel, "topology": self.topology,
            "ssh": self.ssh, "memory_mib": self.memory_mib, "vcpus": self.vcpus, "accel": self.accel,
            "project_dir": str(self.project_dir), "image": self.image.to_json(),
            "nodes": [node._asdict() for node in self.nodes],
            "pids": self.pids,
            "console_offsets": {name: watch.offset for name, watch in self.watches.items()},
        }
        tmp = self.state_dir / "state.json.tmp"
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        os.replace(tmp, self.state_dir / "state.json")

    # -- paths ----------------------------------------------------------------------------

    def qemu_name(self, node: str) -> str:
        """QEMU's -name of a node: how `down` tells this lab's guests from any other process."""
        return f"probekit-{self.name}-{node}"

    def console_log(self, node: str) -> Path:
        return self.state_dir / f"{node}.console.log"

    def agent_socket(self, node: str) -> Path:
        return self.state_dir / f"{node}.qga"

    @property
    def results_dir(self) -> Path:
        return self.state_dir / "results"

    def label(self, node: str) -> str:
        """How failures name a guest: node and kernel (a matrix run must say which kernel failed)."""
        release = self.image.kernel_release if self.image else self.kernel
        return f"{node} (kernel {release})"

    def node_name(self, role: str) -> str:
        """The guest that plays a role: "lab" in one guest, "server"/"client" in a pair, "server"
        and "client-a" in a fleet."""
        return self._node(role).name

    def client_names(self) -> List[str]:
        """The guests that mount the server's exports."""
        return [node.name for node in self.nodes[1:] or self.nodes]

    def _node(self, role: str) -> Node:
        """The guest that plays a role (SERVER: the first guest, CLIENT: its topology's client)
        or has a node name."""
        wanted = {SERVER: self.nodes[0].name, CLIENT: TOPOLOGIES[self.topology].client}.get(role, role)
        for node in self.nodes:
            if node.name == wanted:
                return node
        raise UserError(f"no node {role!r} in this lab (nodes: {', '.join(n.name for n in self.nodes)})")

    # -- the exact QEMU command line --------------------------------------------------------

    def guest_vcpus(self, accel: str = "tcg") -> int:
        """1 vCPU under TCG and on 7.x kernels, else 2.

        Enabling function_graph patches kernel text on every CPU: under TCG with 2 vCPUs a
        guest soft-locked and hung (trace-cmd re-enabling the tracer on 6.1), and a 7.x
        guest panicked; with 1 vCPU both worked. Two host cores gain little under TCG.
        """
        if self.vcpus:
            return self.vcpus
        release = self.image.kernel_release if self.image else self.kernel
        major = release.split(".")[0]
        return 1 if accel == "tcg" or (major.isdigit() and int(major) >= 7) else 2

    def plan_nodes(self) -> List[Node]:
        """Name the guests of the topology and pick their ports (before anything starts)."""
        topology = TOPOLOGIES[self.topology]
        return [Node(name=name, index=i, link_address=f"{LAB_SUBNET_PREFIX}{i}" if topology.linked else "",
                     link_port=free_port() if topology.linked and name != topology.listener else 0,
                     ssh_port=free_port() if self.ssh else 0)
                for i, name in enumerate(topology.nodes, start=1)]

    def link_netdevs(self, node: Node) -> List[str]:
        """The -netdev options of a guest's lab link: every guest but the listener connects to
        its own port; the listener listens on each of them, straight behind its NIC for one
        peer, through a hub in its QEMU for several (one subnet, as on a switch). The NIC's
        netdev id is "link"."""
        if node.link_port:
            return ["-netdev", f"socket,id=link,connect=127.0.0.1:{node.link_port}"]
        peers = [peer for peer in self.nodes if peer.link_port]
        if len(peers) == 1:
            return ["-netdev", f"socket,id=link,listen=127.0.0.1:{peers[0].link_port}"]
        return ["-netdev", "hubport,id=link,hubid=0",
                *hub_netdevs([(peer.name, f"listen=127.0.0.1:{peer.link_port}") for peer in peers])]

    def qemu_argv(self, node: Node, accel: str) -> List[str]:
        """The full argv that starts one guest (checked by the network-rule tests)."""
        assert self.image is not None
        d = self.state_dir
        cmdline = ["root=/dev/vda", "rw", "console=ttyS0,115200", "panic=1", "net.ifnames=0",
                   f"systemd.hostname=probekit-{node.name}", "systemd.show_status=1"]
        if accel == "tcg":
            # TCG on a busy host makes honest work look stuck (patching every call site when
            # function_graph starts took 23 s): only far longer stalls count as lockups
            cmdline += ["watchdog_thresh=60", "rcupdate.rcu_cpu_stall_timeout=120"]
            # and systemd's: under load a unit took 2.5 min to start and was failed (networkd by
            # its watchdog, ttyS0 by its 90 s); the lab's own boot wait judges progress instead
            cmdline += ["systemd.default_timeout_start_sec=infinity", "systemd.service_watchdogs=0"]
        if node.link_address:
            cmdline.append(f"probekit.link=52:54:00:77:00:{node.index:02x},{node.link_address}/24")
        argv = [
            "qemu-system-x86_64", "-name", self.qemu_name(node.name),
            "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            "-m", str(self.memory_mib), "-smp", str(self.guest_vcpus(accel)),
            "-kernel", str(self.image.vmlinuz), "-initrd", str(self.image.initrd),
            "-append", " ".join(cmdline),
            "-drive", f"file={d / (node.name + '.qcow2')},if=virtio,format=qcow2,cache=unsafe,discard=unmap",
            "-device", "virtio-rng-pci",
            "-chardev", f"file,id=console,path={self.console_log(node.name)}",
            "-serial", "chardev:console",
            "-chardev", f"socket,id=qga,path={self.agent_socket(node.name)},server=on,wait=off",
            "-device", "virtio-serial-pci",
            "-device", "virtserialport,chardev=qga,name=org.qemu.guest_agent.0",
            "-virtfs", f"local,path={self.project_dir},mount_tag=probekit,security_model=none,"
                       f"readonly=on,id=probekit",
            "-virtfs", f"local,path={self.results_dir},mount_tag=results,security_model=none,id=results",
        ]
        if accel == "kvm":
            argv += ["-accel", "kvm", "-cpu", "host"]
        else:
            argv += ["-accel", "tcg", "-cpu", "max"]
        if node.link_address:
            argv += self.link_netdevs(node)
            argv += ["-device", f"virtio-net-pci,netdev=link,mac=52:54:00:77:00:{node.index:02x}"]
        if node.ssh_port:
            argv += ["-netdev", f"user,id=user,restrict=on,hostfwd=tcp:127.0.0.1:{node.ssh_port}-:22",
                     "-device", f"virtio-net-pci,netdev=user,mac=52:54:00:aa:00:{node.index:02x}"]
        return argv

    def argv_by_node(self, accel: str = "tcg") -> Dict[str, List[str]]:
        """Every guest's exact argv for a planned lab (image must be built or cached)."""
        if self.image is None:
            self.image = build_image(self.kernel, progress=self.progress)
        if not self.nodes:
            self.nodes = self.plan_nodes()
        return {node.name: self.qemu_argv(node, accel) for node in self.nodes}

    # -- lifecycle ----------------------------------------------------------------------------

    def up(self) -> None:
        """Build/reuse the image, boot the guest(s), wait for the agents, export and mount NFS."""
        started = time.monotonic()
        if (self.state_dir / "state.json").exists():
            raise UserError(f"lab {self.name!r} is already up (`labs down` first); state in {self.state_dir}")
        self.image = build_image(self.kernel, progress=self.progress)
        self.timings["image"] = time.monotonic() - started
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.results_dir.mkdir(exist_ok=True)
        self.nodes = self.plan_nodes()
        try:
            accel = self.accel or _remembered_accel()
            boot_started = time.monotonic()
            if accel == "kvm" and not self._boot_all("kvm", stall_after=KVM_STALL_SECONDS):
                self.progress("[lab] KVM stalled or failed here: falling back to TCG (verdict cached)")
                _remember_accel("tcg")
                accel = "tcg"
            if accel == "tcg":
                self._boot_all("tcg", stall_after=None)
            elif self.accel is None:
                _remember_accel("kvm")
            self.accel = accel
            self._save()
            self._wait_ready(BOOT_TIMEOUT_TCG if accel == "tcg" else 120.0)
            self.timings["boot"] = time.monotonic() - boot_started
            nfs_started = time.monotonic()
            self._provision_nfs()
            self.timings["nfs"] = time.monotonic() - nfs_started
            self._save()
        except BaseException:
            self.down()
            raise
        self.timings["up"] = time.monotonic() - started
        self.progress(f"[lab] up in {self.timings['up']:.0f} s ({self.accel}, kernel "
                      f"{self.image.kernel_release}, {self.topology}); state in {self.state_dir}")

    def _wait_listening(self, name: str, port: int) -> None:
        """Until the guest's QEMU listens on 127.0.0.1:port, seen in /proc/net/tcp: a test
        connection would take the netdev's one peer slot, and a busy host starts QEMU late."""
        while not tcp_listening(port):
            pid = self.pids[name]
            if not _alive(pid):
                raise failure(self.label(name), "QEMU exited before its link socket listened",
                              self.watches.get(name))
            time.sleep(0.1)

    def _boot_all(self, accel: str, stall_after: Optional[float]) -> bool:
        """Start every guest; with stall_after, give up (False) if none reaches userspace in time."""
        self._kill_all()
        assert self.image is not None
        self.pids = {}
        self.watches = {}
        for node in sorted(self.nodes, key=lambda n: n.link_port != 0):  # the listener first
            overlay = self.state_dir / f"{node.name}.qcow2"
            overlay.unlink(missing_ok=True)
            subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2",
                            "-b", str(self.image.rootfs), str(overlay)], check=True)
            self.console_log(node.name).write_bytes(b"")
            self.agent_socket(node.name).unlink(missing_ok=True)
            argv = self.qemu_argv(node, accel)
            (self.state_dir / f"{node.name}.argv.json").write_text(json.dumps(argv, indent=1) + "\n")
            stderr_log = (self.state_dir / f"{node.name}.qemu.log").open("wb")
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stderr_log, stderr=stderr_log,
                                    start_new_session=True)
            self.pids[node.name] = proc.pid
            self.watches[node.name] = ConsoleWatch(self.label(node.name), self.console_log(node.name))
            self.progress(f"[lab] booting {node.name} ({accel}, {self.guest_vcpus(accel)} vCPU, "
                          f"pid {proc.pid}, console {self.console_log(node.name)})")
            if not node.link_port:  # the listener: it listens for every peer before a peer's QEMU connects
                for port in (peer.link_port for peer in self.nodes if peer.link_port):
                    self._wait_listening(node.name, port)
        if stall_after is None:
            return True
        deadline = time.monotonic() + stall_after
        while time.monotonic() < deadline:
            if any(not _alive(pid) for pid in self.pids.values()):
                return False
            if all(watch.contains(REACHED_USERSPACE) for watch in self.watches.values()):
                return True
            time.sleep(1.0)
        return False

    def _wait_ready(self, timeout: float) -> None:
        """Wait until every guest's agent answers and its 9p shares are mounted.

        The wait ends on evidence: a guest whose console still prints is booting, however slow
        the host; only `timeout` seconds without a console line (or a panic, or QEMU gone) fail,
        or BOOT_HANG_FACTOR times that in all (systemd's spinner prints while a job hangs)."""
        hang_at = time.monotonic() + timeout * BOOT_HANG_FACTOR
        for node in self.nodes:
            log = self.console_log(node.name)
            printed, deadline = -1, 0.0
            while True:
                self._check_node(node.name)
                size = log.stat().st_size if log.exists() else 0
                if size != printed:
                    printed, deadline = size, time.monotonic() + timeout
                try:
                    res = run_command(self.agent_socket(node.name),
                                      ["/bin/sh", "-c", "mountpoint -q /opt/probekit && mountpoint -q /results"
                                       " && systemctl is-active -q nfs-server"], timeout=30, patience=0.0)
                    if res.exit_code == 0:
                        self.progress(f"[lab] {node.name}: guest agent answers, shares mounted")
                        break
                except (AgentError, OSError):
                    pass
                if time.monotonic() > min(deadline, hang_at):
                    why = (f"console silent for {timeout:.0f} s" if time.monotonic() > deadline
                           else f"still booting after {timeout * BOOT_HANG_FACTOR:.0f} s")
                    raise failure(self.label(node.name), f"not ready: {why} (guest agent silent or shares/nfs-server "
                                             f"missing)", self.watches.get(node.name))
                time.sleep(READY_POLL_S)

    def _provision_nfs(self) -> None:
        """Run the shared provision scripts: exports on the server, mounts on every client."""
        server = self._node(SERVER)
        # hang bounds only: each takes 5-60 s, many times that on a host running other guests
        self._must(f"sh {GUEST_PROVISION}/server.sh", SERVER, 900)
        address = server.link_address or "127.0.0.1"
        for client in self.client_names():
            self._must(f"sh {GUEST_PROVISION}/client.sh {address}", client, 900)
            self.progress(f"[lab] {client}: NFSv3 and NFSv4.2 mounted from {address}")

    def _must(self, cmd: str, node: str, timeout: float) -> CommandResult:
        res = self.run(cmd, node=node, timeout=timeout)
        if res.exit_code != 0:
            raise GuestFailure(f"{self.label(node)}: `{cmd}` failed ({res.exit_code}): {res.stderr.strip()[-300:]}")
        return res

    def _check_node(self, name: str) -> None:
        """Raise GuestFailure when a guest's kernel is in trouble or its QEMU died."""
        watch = self.watches.get(name)
        if watch is not None:
            watch.check()
        pid = self.pids.get(name)
        if pid is not None and not _alive(pid):
            if watch is not None:
                watch.check()
            qemu_log = self.state_dir / f"{name}.qemu.log"
            qemu_err = qemu_log.read_text(errors="replace").strip()[-200:] if qemu_log.exists() else ""
            raise failure(self.label(name), f"QEMU exited ({qemu_err or 'no message'}; qemu log {qemu_log})", watch)
        if pid is not None and _stopped(pid):
            raise failure(self.label(name), f"its QEMU (pid {pid}) is stopped (SIGSTOP or a debugger): the guest "
                                            "cannot answer until it is continued", watch)

    def run(self, cmd: Union[str, Sequence[str]], node: str = CLIENT, timeout: float = 600.0) -> CommandResult:
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        guest = self._node(node)
        self._check_node(guest.name)
        try:
            return run_command(self.agent_socket(guest.name), argv, timeout=timeout,
                               on_poll=lambda: self._check_node(guest.name))
        except AgentTimeout as exc:
            self._check_node(guest.name)
            raise failure(self.label(guest.name), str(exc), self.watches.get(guest.name)) from exc
        except (AgentError, OSError) as exc:
            self._check_node(guest.name)
            raise failure(self.label(guest.name), f"guest agent silent: {exc}", self.watches.get(guest.name)) from exc

    def put(self, local: Path, remote: str, node: str = CLIENT) -> None:
        guest = self._node(node)
        with connect(self.agent_socket(guest.name), lambda: self._check_node(guest.name), 60.0) as agent:
            agent.write_file(remote, Path(local).read_bytes())

    def get(self, remote: str, local: Path, node: str = CLIENT) -> None:
        guest = self._node(node)
        with connect(self.agent_socket(guest.name), lambda: self._check_node(guest.name), 60.0) as agent:
            data = agent.read_file(remote)
        Path(local).parent.mkdir(parents=True, exist_ok=True)
        Path(local).write_bytes(data)

    def down(self) -> None:
        """Stop every guest and remove the lab's overlays, sockets and state.

        The results share (what guests wrote to /results) is kept: it is often the point.
        """
        self._kill_all()
        if self.state_dir.exists():
            for entry in self.state_dir.iterdir():
                if entry != self.results_dir:
                    if entry.is_dir():
                        shutil.rmtree(entry, ignore_errors=True)
                    else:
                        entry.unlink(missing_ok=True)

    def _kill_all(self) -> None:
        for pid in set(self.pids.values()) | self._recorded_pids():
            _terminate(pid)

    def _recorded_pids(self) -> Set[int]:
        """Guests of this lab that an interrupted earlier process left running: every process
        started with one of this lab's QEMU names (`-name probekit-NAME-NODE`). Found by name,
        not through state.json's pids, which a crash or a hand edit can leave unreadable."""
        names = {self.qemu_name(node).encode() for topology in TOPOLOGIES.values() for node in topology.nodes}
        found = set()
        for proc in Path("/proc").iterdir():
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0") if proc.name.isdigit() else []
            except OSError:
                continue
            if any(flag == b"-name" and value in names for flag, value in zip(argv, argv[1:])):
                found.add(int(proc.name))
        return found

    def signal_node(self, node: str, sig: int) -> int:
        """Send a signal to a guest's QEMU process (SIGSTOP/SIGCONT: the fault checks' server
        pause); returns its pid."""
        pid = self.pids[self._node(node).name]
        if not _alive(pid):
            raise GuestFailure(f"{self.label(node)}: QEMU (pid {pid}) is not running")
        os.kill(pid, sig)
        return pid

    def status(self) -> Dict[str, str]:
        if not self.nodes:
            return {name: "absent" for name in TOPOLOGIES[self.topology].nodes}
        return {node.name: ("running" if _alive(self.pids.get(node.name, 0)) else "stopped")
                for node in self.nodes}

    def ssh_command(self, node: str = CLIENT) -> List[str]:
        """ssh argv that logs into a node as root (key from the image cache, 127.0.0.1 forward)."""
        guest = self._node(node)
        if not guest.ssh_port or self.image is None:
            raise UserError("this lab was started without SSH (labs up --ssh)")
        return ["ssh", "-i", str(self.image.ssh_private_key), "-p", str(guest.ssh_port),
                "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                "-o", "LogLevel=ERROR", "root@127.0.0.1"]


def hub_netdevs(ends: Sequence[Tuple[str, str]]) -> List[str]:
    """-netdev options that plug socket links into one QEMU hub (hubid 0): per (name, end) a
    socket netdev `to-NAME` with that end (listen=/connect=127.0.0.1:PORT) and its hub port
    `hub-NAME`. Frames from one link reach every other, as on a switch (the Vagrant backend's
    fleet builds its server's hub from the same options)."""
    argv: List[str] = []
    for name, end in ends:
        argv += ["-netdev", f"socket,id=to-{name},{end}",
                 "-netdev", f"hubport,id=hub-{name},hubid=0,netdev=to-{name}"]
    return argv


def tcp_listening(port: int, table: str = "/proc/net/tcp") -> bool:
    """Whether a socket listens on 127.0.0.1:port (state 0A in the kernel's table)."""
    wanted = f"0100007F:{port:04X}"
    with open(table) as rows:
        next(rows)
        return any(row.split()[1] == wanted and row.split()[3] == "0A" for row in rows)


def _alive(pid: int) -> bool:
    """Whether a QEMU we started still runs (a zombie child counts as gone)."""
    if pid <= 0:
        return False
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
        if waited == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _stopped(pid: int) -> bool:
    """Whether a QEMU we started is stopped: a guest agent that does not answer then is no
    sign of a slow guest worth waiting for (agent.connect's patience)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def _terminate(pid: int) -> None:
    """SIGTERM one QEMU we started (by its pid), SIGKILL if it lingers."""
    if not _alive(pid):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(50):
        if not _alive(pid):
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _accel_file() -> Path:
    return cache_root() / "accel.json"


def _remembered_accel() -> str:
    """The cached KVM-or-TCG verdict for this host kernel ('kvm' to try when unknown)."""
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "tcg"
    try:
        verdicts = json.loads(_accel_file().read_text())
    except (OSError, ValueError):
        verdicts = {}
    return verdicts.get(os.uname().release, "kvm")


def _remember_accel(accel: str) -> None:
    path = _accel_file()
    try:
        verdicts = json.loads(path.read_text())
    except (OSError, ValueError):
        verdicts = {}
    verdicts[os.uname().release] = accel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(verdicts, indent=2) + "\n")

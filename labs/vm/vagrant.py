"""VagrantLab: the NFS lab through python-vagrant, the repository's Vagrantfile and vagrant-libvirt.

Here (and in CI) the Vagrantfile runs in its local mode (PROBEKIT_VAGRANT_LOCAL=1):
the box comes from labs/vm/images.py via labs/vm/vagrant_box.py, QEMU runs under TCG
with direct kernel boot, and the guests have no host network at all: the nodes
share QEMU socket links on 127.0.0.1 and SSH arrives through a restricted
user-mode NIC forwarded on 127.0.0.1. What each machine gets (link NIC, ports, kernel
command line, extra QEMU arguments) is planned here (`plan_machines`) and handed to
the Vagrantfile as JSON in PROBEKIT_MACHINES. Commands, put and get use plain ssh/scp
with the ssh-config vagrant reports. The lab's state (ports, box, ssh-config)
lives in the cache so `labs run` in a later process finds the lab `labs up` made.
"""
from __future__ import annotations

import io
import json
import os
import shlex
import shutil
import subprocess
import tarfile
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Sequence, Set, Tuple, Union

from discover.errors import UserError
from labs.vm.agent import GUEST_ENV
from labs.vm.base import CLIENT, SERVER, CommandResult, Lab
from labs.vm.qemu import LAB_SUBNET_PREFIX, TOPOLOGIES, free_port, hub_netdevs

REPO = Path(__file__).resolve().parents[2]
#: libvirt domain and volume names start with this, then the lab name.
DOMAIN_PREFIX = "probekit_"
#: Vagrant machine names (and hostnames) are the lab node's, after this.
MACHINE_PREFIX = "nfs-"
#: Where the project tree is unpacked in the guests (the QEMU backend's 9p mount point).
GUEST_PROJECT = "/opt/probekit"
GUEST_PROVISION = "/usr/local/lib/probekit/provision"
#: No panic=: a panicked guest halts with its message on the console, where the watcher sees it.
BASE_CMDLINE = "root=/dev/vda rw console=ttyS0,115200 net.ifnames=0 systemd.show_status=1"
#: Console lines that end a boot at once, with the log, instead of a boot_timeout wait.
CONSOLE_FAILURES = ("Kernel panic", "Oops:", "BUG: ", "end Kernel panic", "watchdog: BUG")
SSH_OPTIONS = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
               "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", "-o", "ConnectTimeout=20",
               "-o", "IdentitiesOnly=yes"]
#: idle seconds before a shared SSH connection closes by itself
CONTROL_PERSIST_S = 120


def state_dir(name: str = "default") -> Path:
    from labs.vm.images import cache_root
    return cache_root() / "vagrant" / name


def domain_prefix(name: str) -> str:
    return f"{DOMAIN_PREFIX}{name}_"


def node_names(topology: str) -> Tuple[str, ...]:
    """The lab nodes of a topology, server first (the QEMU backend's, but one machine serves
    itself in `single`)."""
    return (SERVER,) if topology == "single" else TOPOLOGIES[topology].nodes


class Machine(NamedTuple):
    """One Vagrant machine as the Vagrantfile's local mode defines it (PROBEKIT_MACHINES)."""

    name: str            # vagrant machine name and hostname: MACHINE_PREFIX + node
    node: str            # lab node: server, client, client-a, client-b
    link_ip: str         # 10.77.0.N on the lab link
    link_mac: str        # of the link NIC, which probekit.link= on the kernel command line names
    cmdline: str         # the kernel command line
    tunnel: str          # libvirt__tunnel_type of the link NIC: "server" listens, "client" connects
    link_port: int       # 127.0.0.1 port of that NIC's socket
    ssh_port: int        # 127.0.0.1 forward to the guest's port 22
    qemuargs: List[str]  # extra QEMU arguments: the SSH NIC, and a fleet server's hub


def plan_machines(topology: str, port: Callable[[], int] = free_port) -> List[Machine]:
    """The machines of a topology, on distinct 127.0.0.1 ports.

    The server's link NIC is always a libvirt `server` socket of its own: vagrant-libvirt
    learns a domain's address from its first libvirt NIC (through the guest agent) and
    waits for SSH only once it has one. A pair's client connects straight to that socket.
    In a fleet a hub in the server's QEMU (`qemuargs`) connects to it and listens on one
    port per client, as the QEMU backend's hub does, so the three share one subnet; libvirt's
    own -netdev options come first on QEMU's command line, so the NIC's socket listens
    before the hub connects.
    """
    taken: Set[int] = set()

    def fresh() -> int:
        picked = port()
        while picked in taken:
            picked = port()
        taken.add(picked)
        return picked

    nodes = node_names(topology)
    nic_port = fresh()
    hub = len(nodes) > 2
    client_ports = {node: fresh() if hub else nic_port for node in nodes[1:]}
    machines = []
    for index, node in enumerate(nodes, start=1):
        name, ssh_port = MACHINE_PREFIX + node, fresh()
        link_ip, link_mac = f"{LAB_SUBNET_PREFIX}{index}", f"52:54:00:77:00:{index:02x}"
        # The hostname comes from the command line: vagrant's own hostname step restarts
        # systemd-networkd over SSH, which costs a minute under TCG.
        cmdline = f"{BASE_CMDLINE} systemd.hostname={name} probekit.link={link_mac},{link_ip}/24"
        qemuargs = ["-netdev", f"user,id=probekit-ssh,restrict=on,hostfwd=tcp:127.0.0.1:{ssh_port}-:22",
                    "-device", f"virtio-net-pci,netdev=probekit-ssh,addr=0x1e,mac=52:54:00:77:01:{index:02x}"]
        if node == SERVER and hub:
            qemuargs += hub_netdevs([("nic", f"connect=127.0.0.1:{nic_port}")]
                                    + [(peer, f"listen=127.0.0.1:{p}") for peer, p in client_ports.items()])
        machines.append(Machine(name=name, node=node, link_ip=link_ip, link_mac=link_mac, cmdline=cmdline,
                                tunnel="server" if node == SERVER else "client",
                                link_port=nic_port if node == SERVER else client_ports[node],
                                ssh_port=ssh_port, qemuargs=qemuargs))
    return machines


def project_tarball() -> bytes:
    """The project's tracked and new (not ignored) files as a gzip tarball."""
    listing = subprocess.run(["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", "-z"],
                             capture_output=True, check=True).stdout.decode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel in sorted(filter(None, listing.split("\0"))):
            path = REPO / rel
            if path.is_file():
                tar.add(path, arcname=rel, recursive=False)
    return buf.getvalue()


class VagrantLab(Lab):
    """Server and clients (or one node serving both) under vagrant-libvirt, no host network."""

    backend = "vagrant"

    def __init__(self, kernel: str = "6.1", topology: str = "pair", name: str = "default",
                 progress: Callable[[str], None] = print) -> None:
        if topology not in TOPOLOGIES:
            raise UserError(f"unknown topology {topology!r} ({', '.join(TOPOLOGIES)})")
        self.kernel = kernel
        self.topology = topology
        self.name = name
        self.dir = state_dir(name)
        self.state_file = self.dir / "state.json"
        #: console and vagrant stderr logs: kept after down, for the failure they explain
        self.logs = self.dir.parent / "logs" / name
        self.state: Dict[str, object] = (json.loads(self.state_file.read_text())
                                         if self.state_file.exists() else {})
        self.progress = progress
        self.timings: Dict[str, float] = {}

    @classmethod
    def attach(cls, name: str = "default", progress: Callable[[str], None] = print) -> "VagrantLab":
        """The lab an earlier `labs up` started (from its state.json)."""
        state_file = state_dir(name) / "state.json"
        if not state_file.exists():
            raise UserError(f"no vagrant lab {name!r} is up (run `labs up --backend vagrant` first)")
        state = json.loads(state_file.read_text())
        return cls(kernel=str(state["kernel"]), topology=str(state["topology"]), name=name,
                   progress=progress)

    # -- vagrant plumbing -------------------------------------------------------------

    def nodes(self) -> Tuple[str, ...]:
        """The lab nodes this topology boots, server first (single: the server serves itself)."""
        return node_names(self.topology)

    def machines(self) -> List[str]:
        """Their Vagrant machine names."""
        return [MACHINE_PREFIX + node for node in self.nodes()]

    def node_name(self, role: str) -> str:
        """The node that plays a role (SERVER: the first, CLIENT: its topology's one-client
        node) or has that name."""
        if role == SERVER or self.topology == "single" and role == CLIENT:
            return SERVER
        if role == CLIENT:
            return TOPOLOGIES[self.topology].client
        if role not in self.nodes():
            raise UserError(f"no node {role!r} in this lab (nodes: {', '.join(self.nodes())})")
        return role

    def machine(self, node: str) -> str:
        return MACHINE_PREFIX + self.node_name(node)

    def client_names(self) -> List[str]:
        """The nodes that mount the server's exports (single: the server itself)."""
        return list(self.nodes()[1:]) or [SERVER]

    def vagrant_env(self) -> Dict[str, str]:
        """Environment that puts the Vagrantfile in local mode with this lab's values."""
        st = self.state
        env = dict(os.environ)
        env.update({
            "PROBEKIT_VAGRANT_LOCAL": "1",
            "PROBEKIT_BOX": str(st["box"]),
            "PROBEKIT_KERNEL": str(st["vmlinuz"]),
            "PROBEKIT_INITRD": str(st["initrd"]),
            "PROBEKIT_SSH_KEY": str(st["ssh_key"]),
            "PROBEKIT_MACHINES": json.dumps(st["machines"]),
            "PROBEKIT_CONSOLE_DIR": str(st["console_dir"]),
            "PROBEKIT_DOMAIN_PREFIX": domain_prefix(self.name),
            "VAGRANT_DOTFILE_PATH": str(self.dir / "dotfile"),
            "VAGRANT_DEFAULT_PROVIDER": "libvirt",
            "VAGRANT_CHECKPOINT_DISABLE": "1",
            "VAGRANT_BOX_UPDATE_CHECK_DISABLE": "1",
            "LIBVIRT_DEFAULT_URI": "qemu:///system",
        })
        return env

    def vagrant(self):  # -> vagrant.Vagrant (imported lazily)
        """python-vagrant on the repository's Vagrantfile; vagrant's stderr goes to a log."""
        # python-vagrant warns on import when vagrant is missing: import only when used.
        if not shutil.which("vagrant"):
            raise UserError("vagrant is not installed: run `bash scripts/setup`")
        try:
            import vagrant
        except ImportError:
            raise UserError("python-vagrant is missing: pip install 'probekit[lab]'") from None
        self.logs.mkdir(parents=True, exist_ok=True)
        return vagrant.Vagrant(root=str(REPO), env=self.vagrant_env(), quiet_stdout=True,
                               err_cm=vagrant.make_file_cm(str(self.stderr_log), mode="a"))

    @property
    def stderr_log(self) -> Path:
        return self.logs / "vagrant-stderr.log"

    def _save_state(self) -> None:
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        self.state_file.write_text(json.dumps(self.state, indent=2) + "\n")

    # -- Lab interface ----------------------------------------------------------------

    def up(self) -> None:
        from labs.vm.images import build_image
        from labs.vm.libvirt_daemons import ensure_daemons
        from labs.vm.vagrant_box import ensure_box

        ensure_daemons()
        if self.state.get("box"):
            if self.state.get("kernel") != self.kernel or self.state.get("topology") != self.topology:
                raise UserError(f"vagrant lab {self.name!r} is already up (kernel {self.state.get('kernel')}, "
                                f"{self.state.get('topology')}): `labs down --name {self.name}` first")
            if self.state.get("ssh") and set(self.status().values()) == {"running"}:
                return  # already up: `up` twice is harmless (the integration run calls it)
            self.down()  # what an interrupted `up` left: start clean
        started = time.monotonic()
        image = build_image(self.kernel, progress=self.progress)
        box = ensure_box(image, progress=self.progress)
        self.timings["image_and_box_s"] = time.monotonic() - started
        console_dir = self.logs
        console_dir.mkdir(parents=True, exist_ok=True)
        self.stderr_log.unlink(missing_ok=True)
        self.state = {
            "kernel": self.kernel, "topology": self.topology, "box": box.name,
            "vmlinuz": str(box.vmlinuz), "initrd": str(box.initrd),
            "ssh_key": str(image.ssh_private_key), "kernel_release": image.kernel_release,
            "machines": [m._asdict() for m in plan_machines(self.topology)],
            "console_dir": str(console_dir), "ssh": {},
        }
        self._save_state()
        try:
            self._vagrant_up_all()
            t0 = time.monotonic()
            self._read_ssh_config()
            self._provision_nfs()
            self._copy_project()
            self.timings["provision_s"] = time.monotonic() - t0
        except BaseException:
            self.progress("[vagrant] up failed: destroying what was created")
            self.down()
            raise

    def _vagrant_up_all(self) -> None:
        """Server first; the clients' `vagrant up`s start, side by side, once the server's QEMU runs.

        The server's ends of the socket links listen from QEMU's start, so the clients can
        boot while the server still boots: on two cores the pair is up in about the
        time of one node instead of two.
        """
        errors: List[BaseException] = []

        def up(name: str, domain_started: threading.Event) -> None:
            started = time.monotonic()
            try:
                self._vagrant_up(name, domain_started)
            except BaseException as exc:  # re-raised below, in the calling thread
                errors.append(exc)
            finally:
                domain_started.set()
                self.timings[f"vagrant_up_{name}_s"] = round(time.monotonic() - started, 1)

        server, *others = self.machines()
        server_started = threading.Event()
        threads = [threading.Thread(target=up, args=(server, server_started), daemon=True)]
        threads[0].start()
        server_started.wait()
        if not errors:
            for name in others:
                threads.append(threading.Thread(target=up, args=(name, threading.Event()), daemon=True))
                threads[-1].start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]

    def _vagrant_up(self, name: str, domain_started: threading.Event) -> None:
        """`vagrant up NAME`, ended early (with the console tail) on a kernel panic or oops."""
        self.progress(f"[vagrant] up {name} (TCG, this takes minutes)")
        console = self.console_logs()[name]
        console.unlink(missing_ok=True)
        failure: List[str] = []
        done = threading.Event()
        watcher = threading.Thread(target=self._watch_console,
                                   args=(name, console, failure, done), daemon=True)
        watcher.start()
        try:
            for line in self.vagrant().up(vm_name=name, provider="libvirt", stream_output=True):
                if "Waiting for domain to get an IP address" in line:
                    domain_started.set()  # QEMU runs: the socket link's server end listens
                if "Progress:" not in line:  # the box upload's percentage, redrawn in place
                    self.progress(f"[vagrant] {line.rstrip()}")
        except subprocess.CalledProcessError as exc:
            errors = self.stderr_log.read_text(errors="replace").strip().splitlines()[-6:] \
                if self.stderr_log.exists() else []
            tail = console.read_text(errors="replace").splitlines()[-8:] if console.exists() else []
            why = failure[0] if failure else f"vagrant up {name} exited {exc.returncode}"
            raise UserError(f"{why}: {' | '.join(errors)}; console {console}: "
                            + " | ".join(tail)) from None
        finally:
            done.set()
            watcher.join()

    def _watch_console(self, name: str, console: Path, failure: List[str],
                       done: threading.Event) -> None:
        """Stop the domain when its console shows a panic/oops, so `vagrant up` fails now."""
        while not done.wait(2.0):
            if not console.exists():
                continue
            text = console.read_text(errors="replace")
            hit = next((m for m in CONSOLE_FAILURES if m in text), None)
            if hit:
                failure.append(f"{name}: guest kernel reported {hit!r}")
                subprocess.run(["virsh", "-c", "qemu:///system", "destroy",
                                domain_prefix(self.name) + name],
                               capture_output=True)
                return

    def _read_ssh_config(self) -> None:
        """Record user/port/key from `vagrant ssh-config` (what later commands use)."""
        handle = self.vagrant()
        ssh: Dict[str, Dict[str, str]] = {}
        for name in self.machines():
            conf = handle.conf(vm_name=name)
            ssh[name] = {"host": conf["HostName"], "port": conf["Port"], "user": conf["User"],
                         "key": conf["IdentityFile"].strip('"')}
            if ssh[name]["host"] != "127.0.0.1":
                raise UserError(f"{name}: vagrant reports SSH at {ssh[name]['host']}, not 127.0.0.1")
        self.state["ssh"] = ssh
        self._save_state()

    def _provision_nfs(self) -> None:
        """Export on the server, mount NFSv3 and v4.2 on each client (the image's scripts)."""
        for node in self.nodes():
            # The hostname comes from the kernel command line and the image has no DNS:
            # without this line sudo warns on every command that it cannot resolve it.
            name = self.machine(node)
            self.run(f"grep -qw {name} /etc/hosts || echo '127.0.1.1 {name}' >> /etc/hosts",
                     node=node, timeout=120)
        res = self.run(f"sh {GUEST_PROVISION}/server.sh", node=SERVER, timeout=300)
        if res.exit_code != 0:
            raise UserError(f"server.sh failed on the server: {res.stderr.strip()[-300:]}")
        server = "127.0.0.1" if self.topology == "single" else f"{LAB_SUBNET_PREFIX}1"
        for node in self.client_names():
            res = self.run(f"sh {GUEST_PROVISION}/client.sh {server}", node=node, timeout=300)
            if res.exit_code != 0:
                raise UserError(f"client.sh failed on {node}: {res.stderr.strip()[-300:]}")

    def _copy_project(self) -> None:
        """Unpack the project tree in every guest (synced folders would need host networking)."""
        tarball = self.dir / "project.tar.gz"
        tarball.write_bytes(project_tarball())
        for node in self.nodes():
            name = self.machine(node)
            self.put(tarball, "/tmp/probekit-project.tar.gz", node=node)
            res = self.run(f"rm -rf {GUEST_PROJECT} && mkdir -p {GUEST_PROJECT} && "
                           f"tar -xzf /tmp/probekit-project.tar.gz -C {GUEST_PROJECT} && "
                           "rm -f /tmp/probekit-project.tar.gz", node=node, timeout=300)
            if res.exit_code != 0:
                raise UserError(f"unpacking the project on {name} failed: {res.stderr.strip()}")

    def _ssh_target(self, node: str) -> Dict[str, str]:
        ssh = self.state.get("ssh") or {}
        conf = ssh.get(self.machine(node)) if isinstance(ssh, dict) else None
        if not conf:
            raise UserError("no vagrant lab is up: run `labs up --backend vagrant` first")
        return conf

    def _control_path(self, node: str) -> Path:
        """The socket of a node's shared SSH connection."""
        return self.dir / f"ssh-{self.machine(node)}.sock"

    def _ssh_options(self, node: str) -> List[str]:
        """Key, and one shared connection per node: an SSH handshake costs seconds under TCG."""
        conf = self._ssh_target(node)
        return [*SSH_OPTIONS, "-i", conf["key"], "-o", "ControlMaster=auto",
                "-o", f"ControlPath={self._control_path(node)}",
                "-o", f"ControlPersist={CONTROL_PERSIST_S}"]

    def ssh_argv(self, node: str) -> List[str]:
        """ssh to a node as the box user, over the 127.0.0.1 forward (for `labs shell` too)."""
        conf = self._ssh_target(node)
        return ["ssh", *self._ssh_options(node), "-p", str(conf["port"]), f"{conf['user']}@{conf['host']}"]

    def _close_ssh_masters(self) -> None:
        """End the shared SSH connections (the background ssh processes ControlPersist keeps)."""
        for node in self.nodes():
            try:
                argv = self.ssh_argv(node)
            except UserError:
                return
            if self._control_path(node).exists():
                subprocess.run(argv[:-1] + ["-O", "exit", argv[-1]], capture_output=True,
                               stdin=subprocess.DEVNULL, timeout=30)

    def ssh_command(self, node: str = CLIENT) -> List[str]:
        """Interactive root shell on a node (`labs shell`)."""
        argv = self.ssh_argv(node)
        return argv[:1] + ["-t"] + argv[1:] + ["sudo -i"]

    def run(self, cmd: Union[str, Sequence[str]], node: str = CLIENT,
            timeout: float = 600.0) -> CommandResult:
        remote = cmd if isinstance(cmd, str) else shlex.join(cmd)
        # the same command environment as the QEMU backend's guest agent gives
        argv = self.ssh_argv(node) + [shlex.join(["sudo", "-n", "env", "-i", *GUEST_ENV,
                                                  "sh", "-c", remote])]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, errors="replace",
                                  timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            return CommandResult(124, out, f"timed out after {timeout:.0f} s on {node}\n")
        return CommandResult(proc.returncode, proc.stdout, proc.stderr)

    def _scp(self, node: str, src: str, dst: str) -> None:
        conf = self._ssh_target(node)
        argv = ["scp", "-q", *self._ssh_options(node), "-P", str(conf["port"]), src, dst]
        proc = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise UserError(f"scp {src} -> {dst} failed: {proc.stderr.strip()}")

    def _remote(self, node: str, path: str) -> str:
        conf = self._ssh_target(node)
        return f"{conf['user']}@{conf['host']}:{path}"

    def put(self, local: Path, remote: str, node: str = CLIENT) -> None:
        """scp as the box user into /tmp, then move into place as root."""
        if not Path(local).is_file():
            raise UserError(f"no such file: {local}")
        staging = f"/tmp/.probekit-put-{os.getpid()}-{time.monotonic_ns()}"
        self._scp(node, str(local), self._remote(node, staging))
        res = self.run(f"mkdir -p \"$(dirname {shlex.quote(remote)})\" && "
                       f"mv -f {staging} {shlex.quote(remote)} && chown root:root {shlex.quote(remote)}",
                       node=node, timeout=120)
        if res.exit_code != 0:
            raise UserError(f"put {remote} on {node} failed: {res.stderr.strip()}")

    def get(self, remote: str, local: Path, node: str = CLIENT) -> None:
        """Copy as root to a box-user-readable file in /tmp, then scp it out."""
        staging = f"/tmp/.probekit-get-{os.getpid()}-{time.monotonic_ns()}"
        conf = self._ssh_target(node)
        res = self.run(f"cp {shlex.quote(remote)} {staging} && chown {conf['user']} {staging}",
                       node=node, timeout=120)
        if res.exit_code != 0:
            raise UserError(f"get {remote} from {node} failed: {res.stderr.strip()}")
        Path(local).parent.mkdir(parents=True, exist_ok=True)
        try:
            self._scp(node, self._remote(node, staging), str(local))
        finally:
            self.run(f"rm -f {staging}", node=node, timeout=60)

    def down(self) -> None:
        """`vagrant destroy -f`, then make sure no domain, volume or process of ours is left."""
        from labs.vm.libvirt_daemons import ensure_daemons, stop_daemons_started_by_us

        if self.state_file.exists() and self.state.get("box"):
            self._close_ssh_masters()
            ensure_daemons()
            self.progress("[vagrant] destroy -f")
            try:
                self.vagrant().destroy()
            except subprocess.CalledProcessError as exc:
                self.progress(f"[vagrant] destroy exited {exc.returncode}; removing leftovers directly")
        leftovers = remove_leftovers(domain_prefix(self.name))
        if leftovers:
            self.progress("[vagrant] removed leftovers: " + ", ".join(leftovers))
        shutil.rmtree(self.dir, ignore_errors=True)
        self.state = {}
        if not (lab_domains(DOMAIN_PREFIX) or lab_volumes(DOMAIN_PREFIX) or other_vagrant_running()):
            stop_daemons_started_by_us()  # only when no other lab is using or creating anything

    def status(self) -> Dict[str, str]:
        words = {"running": "running", "shutoff": "stopped", "paused": "stopped",
                 "not_created": "absent"}
        # both roles in one machine: `single` answers for the client too, as before
        nodes = (SERVER, CLIENT) if self.topology == "single" else self.nodes()
        if not self.state.get("box"):
            return {node: "absent" for node in nodes}
        from labs.vm.libvirt_daemons import LIBVIRTD, socket_answers
        if not socket_answers(LIBVIRTD.sock):
            return {node: "absent" for node in nodes}
        states = {s.name: words.get(s.state, s.state) for s in self.vagrant().status()}
        return {node: states.get(self.machine(node), "absent") for node in nodes}

    def console_logs(self) -> Dict[str, Path]:
        """Per machine, the serial console log libvirt writes (for failure reports)."""
        console_dir = Path(str(self.state.get("console_dir") or self.logs))
        return {name: console_dir / f"{name}.log" for name in self.machines()}


def _virsh(*args: str) -> List[str]:
    proc = subprocess.run(["virsh", "-c", "qemu:///system", *args], capture_output=True, text=True)
    return [line.strip() for line in proc.stdout.splitlines() if line.strip()] if proc.returncode == 0 else []


def other_vagrant_running() -> bool:
    """True when some other process runs a vagrant command (it may be creating a lab)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")[:2]
        except OSError:
            continue
        if cmdline.parent.name != str(os.getpid()) and any(a.endswith(b"/vagrant") for a in argv):
            return True
    return False


def lab_domains(prefix: str) -> List[str]:
    return [d for d in _virsh("list", "--all", "--name") if d.startswith(prefix)]


def lab_volumes(prefix: str) -> List[str]:
    """Per-machine volumes of ours (the box's base volume is a cache and stays)."""
    names = [row.split()[0] for row in _virsh("vol-list", "default")[2:]]  # under a 2-line header
    return [v for v in names if v.startswith(prefix) and "_vagrant_box_image_" not in v]


def remove_leftovers(prefix: str) -> List[str]:
    """Destroy/undefine lab domains and delete their volumes that a failed run left."""
    removed = []
    for dom in lab_domains(prefix):
        _virsh("destroy", dom)
        _virsh("undefine", dom, "--nvram")
        removed.append(f"domain {dom}")
    for vol in lab_volumes(prefix):
        _virsh("vol-delete", vol, "--pool", "default")
        removed.append(f"volume {vol}")
    return removed

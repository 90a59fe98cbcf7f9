"""The backend-neutral lab interface: what an integration run may ask of a VM lab."""
from __future__ import annotations

import abc
from pathlib import Path
from typing import Dict, List, NamedTuple, Sequence, Union

from discover.errors import UserError

#: Node names. In the single-guest topology both names reach the same guest.
SERVER = "server"
CLIENT = "client"


class BrokenState(UserError):
    """A lab's recorded state that is not a lab's (a crash, a hand edit): every command but
    `labs down` refuses it, saying that `labs down` clears it; `labs down` clears it and
    still says what was wrong, non-zero, so that a script does not take it for a clean stop."""

    def __init__(self, problem: str, name: str) -> None:
        super().__init__(f"{problem}; `labs down --name {name}` clears it")
        self.problem = problem


class CommandResult(NamedTuple):
    exit_code: int
    stdout: str
    stderr: str


class Lab(abc.ABC):
    """An NFS server/client lab on one Debian kernel, reachable without any host network."""

    #: backend name as the CLI spells it ("qemu", "vagrant")
    backend: str = ""
    #: the host can stop and resume a node's VM (the pair's fault checks need it)
    can_pause_nodes: bool = False

    @abc.abstractmethod
    def up(self) -> None:
        """Boot the guest(s), wait until commands run and NFS is exported and mounted."""

    @abc.abstractmethod
    def run(self, cmd: Union[str, Sequence[str]], node: str = CLIENT,
            timeout: float = 600.0) -> CommandResult:
        """Run a command as root in a guest (a string goes through /bin/sh -c)."""

    @abc.abstractmethod
    def put(self, local: Path, remote: str, node: str = CLIENT) -> None:
        """Copy a host file into a guest."""

    @abc.abstractmethod
    def get(self, remote: str, local: Path, node: str = CLIENT) -> None:
        """Copy a guest file to the host."""

    @abc.abstractmethod
    def down(self) -> None:
        """Stop the guest(s) and release every host resource (processes, sockets, ports)."""

    @abc.abstractmethod
    def status(self) -> Dict[str, str]:
        """Per node: a short state word ("running", "stopped", "absent")."""

    def client_names(self) -> List[str]:
        """The nodes that mount the server's exports (CLIENT's is the first)."""
        return [CLIENT]

    def kernel_info(self, node: str = CLIENT) -> Dict[str, str]:
        """uname release/version/machine of a node's running kernel."""
        res = self.run(["uname", "-r", "-v", "-m"], node=node, timeout=60)
        release, _, rest = res.stdout.strip().partition(" ")
        version, _, machine = rest.rpartition(" ")
        return {"release": release, "version": version, "machine": machine}

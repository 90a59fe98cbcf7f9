"""`labs`: bring NFS VM labs up and down, run commands in them, and run the integration test."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import click

from discover.errors import UserError, check_output, run_cli, write_file
from discover.version import version_option
from labs.vm.base import CLIENT, BrokenState, Lab
from labs.vm.qemu import TOPOLOGIES

BACKENDS = ("qemu", "vagrant")


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _state_file(name: str) -> Path:
    from labs.vm.images import cache_root
    return cache_root() / "labs" / f"{name}.backend"


def make_lab(backend: str, kernel: str, topology: str, name: str = "default") -> Lab:
    """A new, not yet started lab of a backend (the vagrant backend is imported lazily)."""
    if backend == "qemu":
        from labs.vm.qemu import QemuLab
        return QemuLab(kernel=kernel, topology=topology, name=name, progress=_progress)
    if backend == "vagrant":
        try:
            from labs.vm.vagrant import VagrantLab  # type: ignore[import-not-found]
        except ImportError as exc:
            raise UserError(f"the vagrant backend is not available: {exc}") from exc
        return VagrantLab(kernel=kernel, topology=topology, name=name, progress=_progress)  # type: ignore[call-arg]
    raise UserError(f"unknown backend {backend!r} ({', '.join(BACKENDS)})")


def _require_access(name: str, write: bool) -> None:
    """A lab another user started (`sudo labs up` with a shared cache) has files this user
    cannot read or remove: say whose lab it is, not a bare "Permission denied", and not
    "`labs down` clears it" when this user's `labs down` cannot."""
    from labs.vm.qemu import lab_state_dir
    marker, state_dir = _state_file(name), lab_state_dir(name)
    needs = [(marker, os.R_OK), (state_dir / "state.json", os.R_OK)]
    if write:
        needs += [(marker.parent, os.W_OK | os.X_OK), (state_dir, os.W_OK | os.X_OK)]
    for path, mode in needs:
        if path.exists() and not os.access(path, mode):
            import pwd
            uid = path.stat().st_uid
            try:
                owner = pwd.getpwuid(uid).pw_name
            except KeyError:
                owner = f"uid {uid}"
            raise UserError(f"{path}: not {'writable' if mode != os.R_OK else 'readable'} by uid {os.geteuid()}: "
                            f"lab {name!r} belongs to {owner}; run `labs` as {owner} (sudo)")


def attach_lab(name: str = "default") -> Lab:
    """The running lab recorded by `labs up`."""
    marker = _state_file(name)
    if not marker.exists():
        raise UserError(f"no lab {name!r} is up (run `labs up` first)")
    _require_access(name, write=False)
    backend = marker.read_text(errors="replace").strip()
    if backend not in BACKENDS:
        raise BrokenState(f"{marker}: unknown backend {backend[:40]!r}", name)
    if backend == "qemu":
        from labs.vm.qemu import QemuLab, lab_state_dir
        if not (lab_state_dir(name) / "state.json").exists():  # `labs up` refuses while the marker is there
            raise UserError(f"lab {name!r} is not running: {marker} is left from a `labs up` that did not "
                            f"finish; `labs down --name {name}` clears it")
        return QemuLab.attach(name, progress=_progress)
    try:
        from labs.vm.vagrant import VagrantLab  # type: ignore[import-not-found]
    except ImportError as exc:
        raise UserError(f"the vagrant backend is not available: {exc}") from exc
    return VagrantLab.attach(name, progress=_progress)  # type: ignore[attr-defined]


def _examples(*lines: str) -> str:
    """A help epilog (printed after the options), kept verbatim by click."""
    return "\b\nExamples:\n" + "\n".join("  " + line for line in lines)


backend_option = click.option("--backend", type=click.Choice(BACKENDS), default="qemu", show_default=True,
                              help="VM backend: QEMU directly, or Vagrant (vagrant-libvirt).")
topology_option = click.option("--topology", type=click.Choice(list(TOPOLOGIES)), default="single",
                               show_default=True,
                               help="single: NFS server+client in one guest; pair: server and client guests; "
                                    "fleet: a server and two clients, client-a and client-b.")
name_option = click.option("--name", default="default", show_default=True, help="Lab name (several can exist).")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@version_option
def labs() -> None:
    """NFS server/client VM labs on real Debian kernels, without host networking."""


@labs.command(epilog=_examples(
    "labs up                              # QEMU, Debian 6.1, server+client in one guest",
    "labs up --kernel 6.12 --topology pair",
    "labs up --kernel 7.3 --topology fleet      # server, client-a, client-b",
    "labs up --backend vagrant",
    "labs up --backend vagrant --topology fleet",
))
@backend_option
@click.option("--kernel", default="6.1", show_default=True,
              help="Kernel series (5.10, 6.1, 6.12, 7.2, 7.3) or a Debian suite name.")
@topology_option
@name_option
def up(backend: str, kernel: str, topology: str, name: str) -> None:
    """Build (or reuse) the image and boot the lab; NFSv3 and v4.2 are mounted when it returns."""
    marker = _state_file(name)
    if marker.exists():
        raise UserError(f"lab {name!r} is already up ({marker.read_text().strip()}); `labs down` first")
    lab = make_lab(backend, kernel, topology, name)
    lab.up()
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(backend + "\n")
    info = lab.kernel_info()
    click.echo(f"lab {name!r} up: {backend}, {topology}, kernel {info['release']}")


@labs.command(context_settings={"ignore_unknown_options": True}, epilog=_examples(
    "labs run -- uname -r",
    "labs run -- 'grep nfs /proc/mounts'",
    "labs run --node server -- exportfs -v",
    "labs run -- python3 -m discover --help",
))
@click.option("--node", default=CLIENT, show_default=True,
              help="server or client (in a fleet: client-a; client-b by name).")
@click.option("--timeout", default=600.0, show_default=True, help="Seconds before the command is killed.")
@name_option
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(node: str, timeout: float, name: str, command: Tuple[str, ...]) -> None:
    """Run a command as root in a lab guest; its output and exit code are passed through."""
    lab = attach_lab(name)
    cmd = command[0] if len(command) == 1 else list(command)
    res = lab.run(cmd, node=node, timeout=timeout)
    sys.stdout.write(res.stdout)
    sys.stderr.write(res.stderr)
    sys.stdout.flush()
    if res.exit_code:
        sys.exit(res.exit_code)


@labs.command(epilog=_examples(
    "labs shell",
    "labs shell --node server",
))
@click.option("--node", default=CLIENT, show_default=True,
              help="server or client (in a fleet: client-a; client-b by name).")
@name_option
def shell(node: str, name: str) -> None:
    """Open an interactive root shell in a lab guest (SSH on a 127.0.0.1 forward)."""
    lab = attach_lab(name)
    ssh_command = getattr(lab, "ssh_command", None)
    if ssh_command is None:
        raise UserError(f"`labs shell` is not supported by the {lab.backend} backend")
    argv: List[str] = ssh_command(node)
    os.execvp(argv[0], argv)


@labs.command(epilog=_examples(
    "labs status",
    "labs status --json",
))
@name_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(name: str, as_json: bool) -> None:
    """Show whether the lab's guests run."""
    marker = _state_file(name)
    if not marker.exists():
        states = {"lab": "absent"}
    else:
        states = attach_lab(name).status()
    if as_json:
        click.echo(json.dumps(states))
    else:
        for node, state in states.items():
            click.echo(f"{node}: {state}")


@labs.command(epilog=_examples(
    "labs down",
    "labs down --name matrix",
))
@name_option
def down(name: str) -> None:
    """Stop the lab's guests and remove their overlays, sockets and state."""
    marker = _state_file(name)
    _require_access(name, write=True)
    try:
        lab = attach_lab(name)
    except BrokenState as exc:  # cleared as a crash's leftovers are, and said: it was not a lab's state
        _clear_stale(name)
        raise UserError(f"{exc.problem}; cleared it: lab {name!r} is down") from None
    except UserError:  # no marker, or a marker without state (a `labs up` killed early): clear what is there
        click.echo(f"lab {name!r} down (stale state cleared)" if _clear_stale(name) else f"lab {name!r} is not up")
        return
    lab.down()
    marker.unlink(missing_ok=True)
    click.echo(f"lab {name!r} down")


def _clear_stale(name: str) -> bool:
    """Remove a lab marker and QEMU state that no longer describe a running lab (guests still
    recorded in the state are stopped first); whether there was anything to remove."""
    from labs.vm.qemu import QemuLab, lab_state_dir
    marker, state = _state_file(name), lab_state_dir(name)
    stale = QemuLab(name=name, progress=_progress)
    found = marker.exists() or (state.is_dir() and any(e != stale.results_dir for e in state.iterdir()))
    if found:
        stale.down()
    marker.unlink(missing_ok=True)
    return found


@labs.command(epilog=_examples(
    "labs test                                   # QEMU, Debian 6.1",
    "labs test --kernel 5.10 --kernel 6.12 --kernel 7",
    "labs test --backend vagrant --topology pair",
    "labs test --kernel 5.10 --kernel 6.12 --lab-results lab.json   # + the generated probes",
    "labs test --topology pair --kernel 7.3 --lab-results lab.json  # + probe and fault checks on the pair",
    "  probes compat probes/specs/nfs.toml --kernel 5.10 --kernel 6.12 --lab-results lab.json",
))
@backend_option
@click.option("--kernel", "kernels", multiple=True, default=("6.1",), show_default=True,
              help="Kernel series to test; repeat for a matrix (one lab at a time).")
@topology_option
@click.option("--artifacts", type=click.Path(file_okay=False, path_type=Path), default=Path("artifacts"),
              show_default=True, help="Where call graphs, tracefs metadata and reports go.")
@click.option("--lab-results", type=click.Path(dir_okay=False, path_type=Path),
              help="Also run the generated NFS probes; write per kernel and operation the candidate "
                   "used and whether it recorded the operation (input of `probes compat --lab-results`); "
                   "an existing file keeps its other kernels (merged per kernel release). "
                   "On a pair: the probe checks on the client and the fault checks (server stopped, "
                   "packet loss, nfs-server restart, nfsv4 loaded late) too; on a fleet the same on "
                   "client-a (the fleet check runs on a fleet with or without it). And the exporter checks: "
                   "nfs-exporter scraped by Debian's Prometheus beside node_exporter, the scraped texts "
                   "kept as metrics/probekit.prom and metrics/node.prom in the run's artefact directory.")
def test(backend: str, kernels: Tuple[str, ...], topology: str, artifacts: Path,
         lab_results: Optional[Path]) -> None:
    """Integration run: boot a lab per kernel, mount NFS, run `discover` in it, write a report.

    Exit code 0 only when every check on every kernel passed.
    """
    from labs.integration import run_integration
    if backend == "vagrant" and topology == "fleet":  # before any guest boots
        raise UserError("labs test --topology fleet needs --backend qemu: the fleet check paces its guests "
                        "through the QEMU backend's results share (`labs up --backend vagrant --topology "
                        "fleet` boots the three nodes)")
    merged: Dict[str, Any] = {}  # kernel release -> results: an earlier run's other kernels are kept
    if lab_results is not None:  # before any guest boots
        check_output(lab_results, option="--lab-results")
        if lab_results.exists():
            from probes.compat import load_lab_results
            merged = load_lab_results(lab_results)
    if artifacts.exists() and not artifacts.is_dir():
        raise UserError(f"--artifacts {artifacts}: not a directory")
    failed = 0
    for kernel in kernels:
        lab = make_lab(backend, kernel, topology, name=f"test-{backend}-{kernel}")
        report = run_integration(lab, artifacts, progress=_progress, probes=lab_results is not None,
                                 exporter=lab_results is not None)
        click.echo(report.text())
        failed += 0 if report.passed else 1
        if lab_results is not None:
            merged.update(report.lab_results)
            write_file(lab_results, json.dumps(merged, indent=1) + "\n")
            click.echo(f"lab results of {len(merged)} kernel(s) in {lab_results}")
    if failed:
        raise UserError(f"{failed} of {len(kernels)} kernel(s) failed; reports under {artifacts}/")


def main() -> None:
    run_cli("labs", labs)

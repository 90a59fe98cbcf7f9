"""probekit's Debian package in a lab guest: built from this tree, installed as a user installs it.

Apart from the runner (labs.integration) and the checks (labs.checks): both need the tools
installed before a guest runs them, and neither needs the other for that.
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Dict, List

from discover.errors import UserError, cache_root
from labs.vm.base import CLIENT, Lab

#: the digest (scripts/build-deb --digest) of the probekit package installed in the guest
GUEST_DEB_MARKER = "/var/lib/probekit-lab/deb.digest"
REPO = Path(__file__).resolve().parent.parent

_DEBS: Dict[str, Path] = {}
_DEB_LOCK = threading.Lock()


def project_deb() -> Path:
    """probekit's Debian package of this tree (what a client installs), built by scripts/build-deb
    once per content: cached under the digest build-deb gives for what it builds from, so an
    unchanged tree reuses it across runs; two labs booting at once wait for the one build."""
    with _DEB_LOCK:
        return _build_deb()


def _build_deb() -> Path:
    if "deb" not in _DEBS:
        script = REPO / "scripts" / "build-deb"
        digest = _run_build_deb([str(script), "--digest"])
        cached = cache_root() / "deb" / digest
        if not list(cached.glob("probekit_*.deb")):
            cached.parent.mkdir(parents=True, exist_ok=True)
            work = Path(tempfile.mkdtemp(prefix=f".{digest}-", dir=cached.parent))
            try:
                _run_build_deb([str(script), str(work)])
                shutil.rmtree(cached, ignore_errors=True)
                work.rename(cached)
            finally:
                shutil.rmtree(work, ignore_errors=True)
        _DEBS["deb"] = next(cached.glob("probekit_*.deb"))
    return _DEBS["deb"]


def _run_build_deb(argv: List[str]) -> str:
    """scripts/build-deb's last line (the digest, or the .deb's path); its failure in one line."""
    res = subprocess.run(["bash", *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    lines = res.stdout.strip().splitlines()
    if res.returncode != 0:
        raise UserError(f"cannot build probekit's Debian package (scripts/build-deb): {lines[-1:]}")
    return lines[-1]


def install_tools(lab: Lab, local_dir: Path, node: str = CLIENT) -> None:
    """On a node (the client), probekit as a user installs it (docs/install.md): its Debian package
    with apt, offline (the image carries every package it depends on), so the lab's tools run from
    /usr/sbin with their packaged specs (read with python3-toml on Debian 11), not from the
    source share. What dpkg then says is installed goes to local_dir (probekit-package.txt for the
    client, probekit-package-NODE.txt for another node). Once per boot, node and package."""
    local_dir.mkdir(parents=True, exist_ok=True)
    deb = project_deb()
    digest = deb.parent.name
    installed = "dpkg -s probekit | grep -qx 'Status: install ok installed'"
    if lab.run(f"grep -qx {digest} {GUEST_DEB_MARKER} && {installed}", node=node).exit_code == 0:
        return
    lab.put(deb, f"/tmp/{deb.name}", node=node)
    # the same version with other contents (an uncommitted change) must replace the installed
    # one: --reinstall; an older commit's package after a newer one: --allow-downgrades.
    # Without the lab agent's PYTHONPATH (the source share): the maintainer scripts' Python
    # would see the share's modules first
    res = lab.run(f"cd / && env -u PYTHONPATH DEBIAN_FRONTEND=noninteractive apt-get install -y -q "
                  f"--no-install-recommends --reinstall --allow-downgrades /tmp/{deb.name} "
                  f"&& mkdir -p {Path(GUEST_DEB_MARKER).parent} && echo {digest} > {GUEST_DEB_MARKER}", node=node,
                  timeout=600)
    if res.exit_code != 0:
        raise UserError(f"apt-get install of {deb.name} in the guest failed: {(res.stdout + res.stderr).strip()[-300:]}")
    # what dpkg says is installed, and that the commands the guest scripts run are its files
    listing = "probekit-package.txt" if node == CLIENT else f"probekit-package-{node}.txt"
    (local_dir / listing).write_text(
        lab.run("dpkg -s probekit; dpkg -S /usr/sbin/nfsslower /usr/sbin/nfs-exporter /usr/sbin/fsslower", node=node).stdout)

"""Run a command as a user without privileges, wherever the checkout lies.

As root a command runs as nobody (uid 65534, no capabilities) in a private mount namespace
with tracefs and debugfs unmounted (the tools would mount tracefs as root). Why the bind
mounts: a checkout under a directory only root may enter (mode 0700, as /root is on Debian)
is out of nobody's reach, and so is its venv; inside the namespace both are bind-mounted onto
a world-readable directory and the command is started from there. A non-root test runner
runs the command as itself, from where the code lies.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

REPO = Path(__file__).resolve().parents[1]
NOBODY = 65534
AS_ROOT = os.geteuid() == 0
#: the uid the commands run as
UID = NOBODY if AS_ROOT else os.geteuid()
TRACEFS = ("/sys/kernel/debug/tracing", "/sys/kernel/tracing", "/sys/kernel/debug")
SETPRIV = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--inh-caps=-all",
           "--bounding-set=-all"]


class View:
    """The checkout and the venv as the unprivileged command sees them."""

    def __init__(self, top: Path) -> None:
        self.binds: List[Tuple[Path, Path]] = []
        if AS_ROOT:
            self.binds.append((REPO, top / "repo"))
            venv = Path(sys.prefix)
            if sys.prefix != sys.base_prefix and not _inside(venv, REPO):
                self.binds.append((venv, top / "venv"))

    def seen(self, path: Path) -> Path:
        """`path` (in the checkout or the venv) as the command sees it."""
        for source, target in self.binds:
            if _inside(path, source):
                return target / path.relative_to(source)
        return path

    @property
    def repo(self) -> Path:
        return self.seen(REPO)

    @property
    def python(self) -> Path:
        return self.seen(Path(sys.executable))

    def script(self, name: str) -> List[str]:
        """A console script of the venv, through its interpreter (the script's #! names the
        interpreter by its own path, which nobody may not reach)."""
        return [str(self.python), str(self.seen(Path(sys.executable).parent / name))]

    def run(self, argv: List[str], cwd: Path, env: Dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
        """Run `argv` as the unprivileged user in `cwd`, PYTHONPATH the checkout as seen."""
        full = dict(os.environ, PYTHONPATH=str(self.repo))
        full.update(env)
        if AS_ROOT:
            steps = [f"for m in {' '.join(TRACEFS)}; do umount -l $m 2>/dev/null; done"]
            steps += [f"mount --bind {shlex.quote(str(s))} {shlex.quote(str(t))} || exit 125" for s, t in self.binds]
            steps += [f"cd {shlex.quote(str(cwd))} || exit 125", 'exec "$@"']
            argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", "; ".join(steps), "sh",
                    *SETPRIV, *argv]
            cwd = Path("/")
        return subprocess.run(argv, cwd=cwd, env=full, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)


def _inside(path: Path, top: Path) -> bool:
    return path == top or top in path.parents


def view() -> Iterator[View]:
    """A View for a pytest fixture; its mount points (world-readable, empty outside the
    namespaces) are removed with rmdir, which cannot reach into a checkout."""
    top = Path(tempfile.mkdtemp(prefix="probekit-view-"))
    top.chmod(0o755)
    made = View(top)
    for _, target in made.binds:
        target.mkdir()
    try:
        yield made
    finally:
        for _, target in made.binds:
            target.rmdir()
        top.rmdir()

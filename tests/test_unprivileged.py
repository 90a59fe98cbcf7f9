"""Commands run as a user without privileges: what they lack is said first, in one line.

Run for real: as root the commands are started through setpriv as nobody (uid 65534, no
capabilities), in a private mount namespace with tracefs and debugfs unmounted (the
tools would mount tracefs as root); a non-root test runner runs them as itself.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator, List

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
NOBODY = 65534
#: as root: a private mount namespace without tracefs, then uid nobody without capabilities
AS_USER = (["unshare", "--mount", "--propagation", "private", "sh", "-c",
            "for m in /sys/kernel/debug/tracing /sys/kernel/tracing /sys/kernel/debug; do umount -l $m 2>/dev/null; done;"
            ' exec "$@"', "sh", "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all"] if os.geteuid() == 0 else [])
UID = NOBODY if os.geteuid() == 0 else os.geteuid()


@pytest.fixture
def place() -> Iterator[Path]:
    """A directory the unprivileged user may enter and write (pytest's tmp_path is root's only)."""
    path = Path(tempfile.mkdtemp(prefix="probekit-unprivileged-"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run(argv: List[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    full = dict(os.environ, HOME=str(cwd), PROBEKIT_CACHE=str(cwd / "cache"), PYTHONPATH=str(REPO))
    full.update(env)
    return subprocess.run(AS_USER + [str(BIN / argv[0])] + argv[1:], cwd=cwd, env=full, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def one_line(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 1 and len(res.stderr.splitlines()) == 1 and "Traceback" not in res.stderr, res.stderr
    return res.stderr.rstrip("\n")


@pytest.mark.parametrize("tool", ["nfsslower", "nfstop", "nfsdist", "nfsdtop"])
def test_tools_say_root_before_tracefs(tool: str, place: Path) -> None:
    """Not "mount it": a user cannot, and root would (the tools mount tracefs themselves)."""
    assert one_line(run([tool], place)) == (
        f"{tool}: error: tracing needs root (running as uid {UID}; tracefs is root-only and mounting it needs "
        "root; or CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN): run with sudo")


def test_read_only_commands_say_root_and_the_way_around(place: Path) -> None:
    assert one_line(run(["discover", "propose", "nfs"], place)) == (
        f"discover: error: tracing needs root (running as uid {UID}; tracefs is root-only; or CAP_BPF, "
        "CAP_PERFMON and CAP_SYS_ADMIN): run with sudo; or pass --kernel-profile PROFILE.json")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs a HOME this user cannot write: as root, nobody's /")
def test_a_home_that_cannot_hold_the_cache_names_it_and_the_variable(place: Path) -> None:
    res = run(["probes", "fetch-kernel", "6.1"], place, HOME="/", PROBEKIT_CACHE="")
    assert one_line(res) == ("probes: error: cannot use the cache directory /.cache/probekit: Permission denied: "
                             "/.cache; set PROBEKIT_CACHE to a writable directory to move it")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs a lab of another user: root's, read as nobody")
def test_another_users_lab_says_whose_it_is(place: Path) -> None:
    """`labs status` and `labs down` of a lab root started in a shared cache: not "`labs down`
    clears it", which this user's `labs down` cannot."""
    state = place / "cache" / "labs" / "x" / "state.json"
    state.parent.mkdir(parents=True)
    (place / "cache" / "labs" / "x.backend").write_text("qemu\n")
    state.write_text(json.dumps({"pids": {}}))
    state.chmod(0o600)
    for command in (["status"], ["down"]):
        assert one_line(run(["labs", *command, "--name", "x"], place)) == (
            f"labs: error: {state}: not readable by uid {NOBODY}: lab 'x' belongs to root; run `labs` as root (sudo)")
    assert state.exists()

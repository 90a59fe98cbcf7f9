"""Commands run as a user without privileges: what they lack is said first, in one line.

Run for real: as root the commands are started through setpriv as nobody (uid 65534, no
capabilities), in a private mount namespace with tracefs and debugfs unmounted (the
tools would mount tracefs as root), from a bind mount of the checkout that nobody can read
wherever the checkout lies (tests/as_nobody.py); a non-root test runner runs them as itself.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, Iterator, List

import pytest

from as_nobody import AS_ROOT, NOBODY, UID, View

Run = Callable[..., subprocess.CompletedProcess]


@pytest.fixture
def place() -> Iterator[Path]:
    """A directory the unprivileged user may enter and write (pytest's tmp_path is root's only)."""
    path = Path(tempfile.mkdtemp(prefix="probekit-unprivileged-"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def run(unprivileged: View) -> Run:
    """Run a console script as the unprivileged user in `cwd`, HOME and the cache there."""
    def run_in(argv: List[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
        return unprivileged.run(unprivileged.script(argv[0]) + argv[1:], cwd,
                                {"HOME": str(cwd), "PROBEKIT_CACHE": str(cwd / "cache"), **env})
    return run_in


def one_line(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 1 and len(res.stderr.splitlines()) == 1 and "Traceback" not in res.stderr, res.stderr
    return res.stderr.rstrip("\n")


def test_the_code_run_is_this_checkouts(unprivileged: View, place: Path) -> None:
    """Not another install's (the venv's editable one may name another checkout), and not
    refused by a directory above the checkout that the user may not enter."""
    res = unprivileged.run([str(unprivileged.python), "-c", "import os, probes; print(os.getuid(), probes.__file__)"],
                           place, {})
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [str(UID), str(unprivileged.repo / "probes" / "__init__.py")]


@pytest.mark.parametrize("tool", ["nfsslower", "nfstop", "nfsdist", "nfsdtop"])
def test_tools_say_root_before_tracefs(tool: str, place: Path, run: Run) -> None:
    """Not "mount it": a user cannot, and root would (the tools mount tracefs themselves)."""
    assert one_line(run([tool], place)) == (
        f"{tool}: error: tracing needs root (running as uid {UID}; tracefs is root-only and mounting it needs "
        "root; or CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN): run with sudo")


def test_read_only_commands_say_root_and_the_way_around(place: Path, run: Run) -> None:
    assert one_line(run(["discover", "propose", "nfs"], place)) == (
        f"discover: error: tracing needs root (running as uid {UID}; tracefs is root-only; or CAP_BPF, "
        "CAP_PERFMON and CAP_SYS_ADMIN): run with sudo; or pass --kernel-profile PROFILE.json")


@pytest.mark.skipif(not AS_ROOT, reason="needs a HOME this user cannot write: as root, nobody's /")
def test_a_home_that_cannot_hold_the_cache_names_it_and_the_variable(place: Path, run: Run) -> None:
    res = run(["probes", "fetch-kernel", "6.1"], place, HOME="/", PROBEKIT_CACHE="")
    assert one_line(res) == ("probes: error: cannot use the cache directory /.cache/probekit: Permission denied: "
                             "/.cache; set PROBEKIT_CACHE to a writable directory to move it")


@pytest.mark.skipif(not AS_ROOT, reason="needs a lab of another user: root's, read as nobody")
def test_another_users_lab_says_whose_it_is(place: Path, run: Run) -> None:
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

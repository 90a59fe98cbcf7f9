"""Lab test: the Debian package's autopkgtest (packaging/debian/tests/commands) in a guest.

The host's package is installed in the guest as a user installs it (labs.install); the
autopkgtest then runs as root there, as autopkgtest's isolation-machine would: each command's
--version against dpkg's version, its place on PATH, its man page, and one real trace
(`fsslower -t ext4` sees dd's writes and fsync on a loop-mounted ext4). CI runs it on the
fleet's first client (trixie's userspace, 7.3), the full matrix on bookworm's 6.1 as well.
"""
from __future__ import annotations

import re
from typing import Any, Dict

import pytest
from conftest import guest_run, on_kernels, once_run

pytestmark = [pytest.mark.lab, on_kernels("package")]

AUTOPKGTEST = "packaging/debian/tests/commands"


@guest_run("package", fixture="autopkgtest")
def _run(kernel_lab: Any) -> Dict[str, Any]:
    share = getattr(kernel_lab.lab, "guest_project_dir", "/opt/probekit")
    with kernel_lab.timed("package"):
        # outside the share and without its PYTHONPATH: the installed package alone answers
        res = kernel_lab.lab.run(f"cd / && env -u PYTHONPATH sh {share}/{AUTOPKGTEST}", timeout=900)
        version = kernel_lab.lab.run("dpkg-query -W -f '${Version}' probekit").stdout.strip()
        listed = kernel_lab.lab.run("dpkg -L probekit | grep -E '^/usr/s?bin/.'").stdout.split()
    kernel_lab.artifacts.mkdir(parents=True, exist_ok=True)
    (kernel_lab.artifacts / "autopkgtest.txt").write_text(res.stdout + res.stderr)
    return {"exit_code": res.exit_code, "stdout": res.stdout, "stderr": res.stderr,
            "version": version, "commands": listed}


@pytest.fixture
def autopkgtest(kernel_lab: Any) -> Dict[str, Any]:
    return once_run(kernel_lab, "package")


def test_autopkgtest_passes(autopkgtest: Dict[str, Any]) -> None:
    assert autopkgtest["exit_code"] == 0, autopkgtest["stderr"][-1500:]


def test_every_command_answers_its_version_from_its_place_with_a_man_page(autopkgtest: Dict[str, Any]) -> None:
    version = autopkgtest["version"]
    assert re.fullmatch(r"\d+\.\d+\.\d+\+git\d+\.[0-9a-f]+", version), version
    oks = {name: printed for name, printed, _man in re.findall(r"^ok: (\S+) (\S+), (/\S+)$", autopkgtest["stdout"], re.M)}
    names = sorted(path.rsplit("/", 1)[1] for path in autopkgtest["commands"])
    assert sorted(oks) == names and len(names) >= 10, (names, autopkgtest["stdout"][-1500:])
    assert all(printed == version for printed in oks.values()), oks
    sbin = {path.rsplit("/", 1)[1] for path in autopkgtest["commands"] if path.startswith("/usr/sbin/")}
    assert {"nfsslower", "nfsdist", "nfstop", "fsslower", "fsdist", "fstop", "nfsdtop", "nfs-exporter"} <= sbin


def test_fsslower_traced_dd_on_ext4(autopkgtest: Dict[str, Any]) -> None:
    out = autopkgtest["stdout"]
    assert "ok: fsslower -t ext4 traced dd's writes and fsync" in out, out[-1500:]
    assert re.search(r"^\S+ +dd +\d+ +F .* probekit-autopkgtest$", out, re.M), out[-1500:]

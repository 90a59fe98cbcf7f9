"""One version everywhere: every command's --version (the exporter's probekit_build_info:
tests/test_exporter.py; the tools' -v: the lab) reads discover.version (the installed distribution's metadata, which
scripts/build-deb stamps with the package's version: tests/test_debian_package.py)."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from discover.version import probekit_version
from probes.manpage import console_scripts, kept_signals

REPO = Path(__file__).resolve().parent.parent


def test_every_command_prints_the_version(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    scripts = console_scripts()
    declared = set(re.findall(r'^([\w-]+) = "', (REPO / "pyproject.toml").read_text().split("[project.scripts]")[1]
                              .split("\n[")[0], re.M))
    assert set(scripts) == declared
    with kept_signals():
        for name, main in scripts.items():
            monkeypatch.setattr(sys, "argv", [name, "--version"])
            with pytest.raises(SystemExit) as exit_:
                main()
            assert exit_.value.code == 0 and capsys.readouterr().out == f"{name} {probekit_version()}\n", name


def test_the_version_is_pyproject_toml_s() -> None:
    base = re.search(r'^version = "([^"]+)"$', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    assert probekit_version().split("+")[0] == base

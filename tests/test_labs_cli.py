"""`labs` command line without a VM: one-line errors, state handling, help with examples."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
from click.testing import CliRunner, Result


def labs(args: List[str], cache: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PROBEKIT_CACHE=str(cache))
    return subprocess.run([sys.executable, "-c", "from labs.cli import main; main()", *args],
                          capture_output=True, text=True, env=env, timeout=60)


def test_run_without_a_lab_is_one_line(tmp_path: Path) -> None:
    res = labs(["run", "--", "uname", "-r"], tmp_path)
    assert res.returncode == 1
    assert res.stderr == "labs: error: no lab 'default' is up (run `labs up` first)\n"


def test_fleet_check_on_vagrant_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """The fleet check paces its guests through the QEMU backend's results share."""
    res = labs(["test", "--backend", "vagrant", "--topology", "fleet", "--artifacts", str(tmp_path / "a")],
               tmp_path / "cache")
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.startswith("labs: error: labs test --topology fleet needs --backend qemu")
    assert res.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []  # no artefacts, nothing cached or built


def test_status_and_down_of_an_absent_lab(tmp_path: Path) -> None:
    assert labs(["status"], tmp_path).stdout == "lab: absent\n"
    assert labs(["status", "--json"], tmp_path).stdout == '{"lab": "absent"}\n'
    res = labs(["down"], tmp_path)
    assert res.returncode == 0 and res.stdout == "lab 'default' is not up\n"


def test_unknown_kernel_fails_before_anything_starts(tmp_path: Path) -> None:
    res = labs(["up", "--kernel", "4.19"], tmp_path)
    assert res.returncode == 1
    assert res.stderr.startswith("labs: error: no Debian suite known for kernel '4.19'")
    assert len(res.stderr.splitlines()) == 1
    assert not (tmp_path / "labs" / "default.backend").exists()


@pytest.mark.parametrize("command", ["up", "run", "shell", "status", "down", "test"])
def test_every_command_help_ends_with_examples(tmp_path: Path, command: str) -> None:
    res = labs([command, "--help"], tmp_path)
    assert res.returncode == 0
    text = res.stdout
    examples = text.index("Examples:")
    assert examples > text.index("Options:")
    assert "  labs " + command in text[examples:]


class _Report:
    """What labs.integration.run_integration returns, for one kernel, without booting it."""

    def __init__(self, release: str) -> None:
        self.passed = True
        self.lab_results = {release: {"read": {"candidate": 0, "ok": True}}}

    def text(self) -> str:
        return "PASS"


def _labs_test(args: List[str], monkeypatch: pytest.MonkeyPatch, booted: List[str]) -> Result:
    import labs.cli
    import labs.integration
    monkeypatch.setattr(labs.cli, "make_lab", lambda backend, kernel, topology, name: kernel)
    monkeypatch.setattr(labs.integration, "run_integration",
                        lambda lab, artifacts, **_: booted.append(lab) or _Report(f"{lab}.0-1-amd64"))
    return CliRunner().invoke(labs.cli.labs, ["test", *args])


def test_lab_results_of_two_runs_are_merged_per_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`labs test --kernel 6.12 --lab-results f` then `--kernel 7.3` into the same f: both kernels
    (the second run used to overwrite the first's)."""
    out = tmp_path / "lab.json"
    booted: List[str] = []
    for kernel in ("6.12", "7.3", "6.12"):
        res = _labs_test(["--kernel", kernel, "--lab-results", str(out), "--artifacts", str(tmp_path / "a")],
                         monkeypatch, booted)
        assert res.exit_code == 0, res.output
    assert booted == ["6.12", "7.3", "6.12"]
    assert sorted(json.loads(out.read_text())) == ["6.12.0-1-amd64", "7.3.0-1-amd64"]


def test_lab_results_that_are_not_lab_results_are_refused_before_a_boot(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "lab.json"
    out.write_text("[]")
    booted: List[str] = []
    res = _labs_test(["--lab-results", str(out)], monkeypatch, booted)
    assert res.exit_code == 1 and booted == [] and out.read_text() == "[]"
    assert str(res.exception) == f"{out}: lab results: (top level): expected an object, got []"


def test_down_of_a_lab_whose_state_is_not_json_clears_it_and_says_so(tmp_path: Path) -> None:
    """What `labs status` says to do with a broken state works (`labs up` is not refused
    after it), but exits 1 with the file and its problem: not a clean stop."""
    (tmp_path / "labs" / "x" / "results").mkdir(parents=True)
    (tmp_path / "labs" / "x.backend").write_text("qemu\n")
    state = tmp_path / "labs" / "x" / "state.json"
    state.write_text('{"pids": ')
    assert labs(["status", "--name", "x"], tmp_path).stderr == (
        f"labs: error: {state}: lab state is not JSON; `labs down --name x` clears it\n")
    res = labs(["down", "--name", "x"], tmp_path)
    assert (res.returncode, res.stdout, res.stderr) == (
        1, "", f"labs: error: {state}: lab state is not JSON; cleared it: lab 'x' is down\n")
    assert sorted(p.name for p in (tmp_path / "labs").rglob("*")) == ["results", "x"]  # the results share is kept
    assert labs(["status", "--name", "x"], tmp_path).stdout == "lab: absent\n"

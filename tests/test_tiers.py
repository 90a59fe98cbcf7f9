"""The unit tier on a contributor's machine (`pytest -m 'not lab'`): a download that cannot
happen says what the test needs, a Debian kernel the archive dropped is replaced by the newest
of its series with a warning saying so, and without QEMU or root the lab tests are left out
with one line, never in CI."""
from __future__ import annotations

from pathlib import Path
from typing import Any, List

import pytest

import debian_kernels
import lab_gate
from discover.errors import UserError


@pytest.fixture
def fresh_cache() -> Any:
    """kernel_dir's cache emptied before and after (the real kernels are looked up again, cached on disk)."""
    debian_kernels.kernel_dir.cache_clear()
    yield
    debian_kernels.kernel_dir.cache_clear()


def test_a_dropped_abi_falls_back_to_the_newest_of_its_series(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                              fresh_cache: Any) -> None:
    asked: List[str] = []

    def fetch(version: str) -> Path:
        asked.append(version)
        if version == "6.1.0-50":
            raise UserError("no Debian amd64 kernel 6.1.0-50 in bookworm (available: 5.10, 6.1)")
        return tmp_path / "6.1.0-57"

    monkeypatch.setattr(debian_kernels, "fetch_kernel", fetch)
    with pytest.warns(UserWarning, match=r"^Debian kernel 6\.1\.0-50 is no longer in the archive: these tests "
                                         r"use 6\.1\.0-57, the newest 6\.1 kernel$"):
        assert debian_kernels.kernel_dir("6.1.0-50") == tmp_path / "6.1.0-57"
    assert asked == ["6.1.0-50", "6.1"]


def test_a_download_that_cannot_happen_says_what_the_test_needs(monkeypatch: pytest.MonkeyPatch,
                                                                fresh_cache: Any) -> None:
    """Offline: a skip on a contributor's machine, a failure in CI; both name the download."""
    def offline(version: str) -> Path:
        raise UserError("apt-get update failed: Temporary failure resolving 'deb.debian.org'")

    monkeypatch.setattr(debian_kernels, "fetch_kernel", offline)
    needs = r"^needs Debian kernel 6\.1\.0-50's packages, downloaded once \(about 100 MB\) into .*: apt-get update failed"
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=needs):
        debian_kernels.kernel_dir("6.1.0-50")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=needs):
        debian_kernels.kernel_dir("6.1.0-50")


def test_lab_tests_need_qemu_and_root_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setattr(lab_gate.shutil, "which", lambda name: None)
    monkeypatch.setattr(lab_gate.os, "geteuid", lambda: 1000)
    assert lab_gate.lab_unavailable() == "no qemu-system-x86_64 on PATH and not root"
    monkeypatch.setattr(lab_gate.os, "geteuid", lambda: 0)
    assert lab_gate.lab_unavailable() == "no qemu-system-x86_64 on PATH"
    monkeypatch.setattr(lab_gate.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert lab_gate.lab_unavailable() is None
    monkeypatch.setattr(lab_gate.shutil, "which", lambda name: None)
    monkeypatch.setenv("CI", "true")
    assert lab_gate.lab_unavailable() is None


class _Item:
    def __init__(self, lab: bool) -> None:
        self.lab = lab

    def get_closest_marker(self, name: str) -> Any:
        return self.lab if name == "lab" else None


class _Config:
    def __init__(self) -> None:
        self.deselected: List[Any] = []
        self.hook = self

    def pytest_deselected(self, items: List[Any]) -> None:
        self.deselected += items


def test_without_qemu_the_lab_tests_are_left_out_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lab_gate, "lab_unavailable", lambda: "no qemu-system-x86_64 on PATH")
    monkeypatch.setattr(lab_gate, "LAB_NOT_RUN", [])
    unit, lab = _Item(False), [_Item(True), _Item(True)]
    items, config = [unit, *lab], _Config()
    lab_gate.pytest_collection_modifyitems(config, items)  # type: ignore[arg-type]
    assert items == [unit] and config.deselected == lab
    assert lab_gate.LAB_NOT_RUN == ["2 lab tests not run: no qemu-system-x86_64 on PATH (they boot QEMU guests "
                                     "as root; `bash scripts/test` installs QEMU; CI runs them all)"]

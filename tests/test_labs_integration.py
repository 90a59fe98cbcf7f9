"""`labs test` after the guest died: one check carries the guest's one-line failure, the rest
are not tried (each would wait for the same dead guest) and say so, and the report is written.

The lab here answers the first commands and then fails the way QemuLab does when the guest
kernel panicked (labs.vm.console.GuestFailure with the kernel and the console log): what is
checked is the integration run's bookkeeping, not a guest.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Sequence, Union

from labs.integration import run_integration
from labs.vm.base import CLIENT, CommandResult, Lab
from labs.vm.console import GuestFailure

DEATH = ("client (kernel 7.2.13+deb14-amd64): kernel panic on the guest console: "
         "'Kernel panic - not syncing: Fatal exception' (console log: /tmp/x/client.console.log)")


class DyingLab(Lab):
    backend = "fake"
    kernel = "7.2"

    def __init__(self) -> None:
        self.commands: List[str] = []

    def up(self) -> None:
        raise AssertionError("already up: the caller booted it")

    def run(self, cmd: Union[str, Sequence[str]], node: str = CLIENT, timeout: float = 600.0) -> CommandResult:
        text = cmd if isinstance(cmd, str) else " ".join(cmd)
        self.commands.append(text)
        if text.startswith("uname"):
            return CommandResult(0, "7.2.13+deb14-amd64 #1 SMP x86_64\n", "")
        if text.startswith("mkdir"):
            return CommandResult(0, "", "")
        raise GuestFailure(DEATH)

    def put(self, local: Path, remote: str, node: str = CLIENT) -> None:
        raise GuestFailure(DEATH)

    def get(self, remote: str, local: Path, node: str = CLIENT) -> None:
        raise GuestFailure(DEATH)

    def down(self) -> None:
        raise AssertionError("the caller takes it down")

    def status(self) -> Dict[str, str]:
        return {"lab": "running"}


def test_a_dead_guest_ends_the_run_with_its_line(tmp_path: Path) -> None:
    lab = DyingLab()
    report = run_integration(lab, tmp_path, progress=lambda message: None, already_up=True)
    by_name = {check.name: check for check in report.checks}
    assert by_name["lab up (boot, NFS export and mounts)"].passed
    failed = [check for check in report.checks if not check.passed]
    assert failed[0].name == "NFSv3 and NFSv4.2 mounted" and DEATH in failed[0].detail
    assert all(check.detail == f"not run: {DEATH}" for check in failed[1:]) and len(failed) > 5
    assert len(lab.commands) == 3  # uname, mkdir, the mount check: nothing after the failure
    saved = json.loads((report.run_dir / "report.json").read_text())
    assert saved["passed"] is False and saved["kernel_release"] == "7.2.13+deb14-amd64"

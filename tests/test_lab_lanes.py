"""A lab session cut short leaves no guest: tests/lab_lanes.py's stop, with jobs that stand in
for a boot by waiting on an event (what a job does between its steps is the scheduler's concern;
the guests' own take-down is tests/test_labs_qemu_down.py's)."""
from __future__ import annotations

import threading
from typing import List

import pytest

from lab_lanes import Job, Lanes, say


class StepJob(Job):
    """A job whose "boot" lasts until `release` is set; records what came up and what went down."""

    def __init__(self, name: str, log: List[str], release: threading.Event) -> None:
        super().__init__()
        self.name, self.log, self.release = name, log, release
        self.up = False
        self.booting = threading.Event()

    def image_kernel(self) -> str:
        return self.name

    def run(self) -> None:
        try:
            if self.stopping.is_set():
                return
            self.booting.set()
            self.release.wait()
            self.up = True  # the boot ended after the stop's take-down: the race that left guests
            self.log.append(f"{self.name} up")
            if self.stopping.is_set():
                return
            self.log.append(f"{self.name} ran its checks")
        finally:
            self.take_down()
            self.done.set()

    def take_down(self) -> None:
        if self.up:
            self.up = False
            self.log.append(f"{self.name} down")


def test_stop_during_a_boot_waits_for_it_and_takes_the_guest_down() -> None:
    log: List[str] = []
    release = threading.Event()
    booting, queued = StepJob("7.3", log, release), StepJob("6.1", log, release)
    lanes = Lanes([booting, queued], 1)
    assert booting.booting.wait(10)
    stopper = threading.Thread(target=lanes.stop)
    stopper.start()
    assert booting.stopping.wait(10)
    release.set()  # the boot completes only after the stop was asked
    stopper.join(10)
    assert not stopper.is_alive()
    assert log == ["7.3 up", "7.3 down"]  # no checks ran, the guest went, the queued job never started
    assert not booting.up and not queued.up and not queued.booting.is_set()
    assert booting.done.is_set()


def test_a_job_finished_before_the_stop_is_not_run_again() -> None:
    log: List[str] = []
    release = threading.Event()
    release.set()
    job = StepJob("6.12", log, release)
    lanes = Lanes([job], 3)
    assert job.done.wait(10)
    lanes.stop()
    assert log == ["6.12 up", "6.12 ran its checks", "6.12 down"]


def test_a_lane_threads_line_stays_out_of_the_running_tests_output(capsys: pytest.CaptureFixture) -> None:
    """A cold CI run failed a unit test that compared its captured stdout exactly: a lane's line
    ("[probes lab] no Debian package for ...") came in from its thread meanwhile."""
    lane = threading.Thread(target=say, args=("[lab] kernel 6.12 (pair): {'up': 1.0}",))
    lane.start()
    lane.join()
    assert capsys.readouterr() == ("", "")

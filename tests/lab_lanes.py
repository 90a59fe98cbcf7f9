"""The lab jobs' scheduler: LANES threads taking jobs in order, and a stop that leaves no guest.

Why apart from tests/lab/conftest.py: a session cut short (collection errors, Ctrl-C, a failed
fixture) must take every guest down even while a lane is still booting it; that is checked by
tests/test_lab_lanes.py without booting anything."""
from __future__ import annotations

import sys
import threading
from typing import List, Optional


def say(message: str) -> None:
    """A lab job's line, from its lane thread: written to the stream pytest started with, not
    to sys.stdout, which the unit test running meanwhile may hold (capsys: its exact output
    then carried the line, and that test failed)."""
    print(message, file=sys.__stdout__, flush=True)


class Job:
    """One lane's piece of work: run() once in a lane thread; its tests wait for `done`.

    run() checks `stopping` between its steps (boot, each guest run) and ends with take_down()
    whatever happened, so a stop that comes mid-step ends the job at that step's end."""

    name = ""

    def __init__(self) -> None:
        self.failure: Optional[str] = None
        self.started_at = 0.0
        self.done = threading.Event()
        self.stopping = threading.Event()

    def image_kernel(self) -> str:
        """The kernel whose image this job boots."""
        raise NotImplementedError

    def run(self) -> None:
        raise NotImplementedError

    def take_down(self) -> None:
        """This job's guests go (idempotent: nothing up is fine)."""
        raise NotImplementedError

    def stop(self) -> None:
        """The session was cut short: no further step starts, and the guests up now go (which
        ends the step in flight: its guest is gone)."""
        self.stopping.set()
        self.take_down()


class Lanes:
    """`lanes` threads taking the session's jobs in order."""

    def __init__(self, jobs: List[Job], lanes: int) -> None:
        self.jobs = jobs
        self.queue = list(jobs)
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._lane, name=f"lab-lane-{i}", daemon=True)
                        for i in range(min(lanes, len(jobs)))]
        for thread in self.threads:
            thread.start()

    def _lane(self) -> None:
        while True:
            with self.lock:
                if not self.queue:
                    return
                job = self.queue.pop(0)
            job.run()

    def stop(self) -> None:
        """A session cut short: the queue empties, every job stops, and this waits for the lanes:
        a lane still booting (or building an image) would otherwise bring a guest up after
        the take-down and leave it running when pytest exits. The jobs' own ends take their
        guests down; a last take-down covers a job that never ran."""
        with self.lock:
            self.queue.clear()
        for job in self.jobs:
            job.stop()
        running = [thread for thread in self.threads if thread.is_alive()]
        if running:
            print(f"\n[lab] stopping: waiting for {len(running)} lane(s) to take their guests down", flush=True)
        for thread in self.threads:
            thread.join()
        for job in self.jobs:
            job.take_down()

"""One lab guest (or pair) per CI kernel for all of tests/lab: each kernel boots once per run.

`kernel_lab` is session-scoped and parametrized over KERNELS; pytest groups the tests of
every module by its param, so a kernel's discovery, probe and fault checks share one boot,
and the hook below runs every kernel_lab test after the others (the Vagrant pair, which
boots its own VMs, never runs beside a QEMU lab). Kernels in PAIR_KERNELS boot a server and
a client guest on a socket link, the others one guest that is both: the probe checks run
on the client either way (netem goes on the client's interface to the server), the fault
checks need a server to stop and so run on the pair kernels only.

On a machine without cached images, the images of the kernels the session will boot are
built in the background from its start, one at a time in boot order, while the Vagrant pair
and the unit tests run (labs/images.py's flock makes a boot wait for a build under way).

Each kernel's boot and guest runs (the functions the test modules register with
@guest_run, in the order its tests ask for them) are a job done in a thread, two jobs at a
time (LANES: the host's two cores, one vCPU per guest), longest first; a kernel's tests
wait for its job and find its results done. Every guest has one vCPU: two 2-vCPU TCG guests
of 7.2 oopsed on an int3, once under function_graph and once while booting (code patched
with int3 seen half-patched by the other vCPU's thread); two 1-vCPU guests use the same
two cores without that.

A guest that panics, oopses or stops answering fails its kernel's tests with one line
(kernel, console log), and the other kernels' jobs go on. PROBEKIT_LAB_KERNELS=6.12,7.3
narrows the run; PROBEKIT_LAB_ARTIFACTS keeps the artefacts (else a pytest temp dir).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

from discover.errors import UserError
from labs.base import Lab
from labs.console import GuestFailure
from labs.integration import install_tools
from labs.qemu import QemuLab

#: the CI kernels, each from its Debian suite's cached image (labs/images.py), longest job
#: first (two lanes finish soonest so: 7.3 about 10 min, 6.1 and 6.12 8, 7.2 7, 5.10 4)
KERNELS: Tuple[str, ...] = ("7.3", "6.1", "6.12", "7.2", "5.10")
#: booted as a server/client pair (the fault checks' kernels); the others as one guest
PAIR_KERNELS = frozenset({"6.12", "7.3"})
#: kernel jobs running at once
LANES = 2


def lab_kernels() -> List[str]:
    """KERNELS, or the subset PROBEKIT_LAB_KERNELS names (comma-separated)."""
    wanted = [k.strip() for k in os.environ.get("PROBEKIT_LAB_KERNELS", "").split(",") if k.strip()]
    unknown = sorted(set(wanted) - set(KERNELS))
    if unknown:
        raise pytest.UsageError(f"PROBEKIT_LAB_KERNELS: unknown kernel(s) {', '.join(unknown)} "
                                f"(known: {', '.join(KERNELS)})")
    return [k for k in KERNELS if not wanted or k in wanted]


class KernelLab:
    """One booted kernel: its lab, what it is, where its artefacts go, and what ran in it."""

    def __init__(self, lab: Lab, kernel: str, release: str, artifacts: Path, root: Path) -> None:
        self.lab = lab
        self.kernel = kernel
        self.release = release
        self.artifacts = artifacts
        self.root = root
        self.topology = getattr(lab, "topology", "single")
        #: seconds per part of this kernel's run (boot, each guest check), for times.json
        self.times: Dict[str, float] = {}
        self._done: Dict[str, Tuple[bool, Any]] = {}
        self.dead: Optional[GuestFailure] = None

    def once(self, key: str, compute: Callable[[], Any]) -> Any:
        """compute() the first time a key is asked for in this boot, its result (or its error) after.

        After a GuestFailure (the guest crashed or went silent) nothing more is tried in this
        boot: every later test fails at once with that one line."""
        if key not in self._done and self.dead is not None:
            self._done[key] = (False, self.dead)
        if key not in self._done:
            started = time.monotonic()
            try:
                self._done[key] = (True, compute())
            except GuestFailure as exc:
                self.dead = exc
                self._done[key] = (False, exc)
            except Exception as exc:  # every test that needs it fails the same way, run once
                self._done[key] = (False, exc)
            finally:
                self.times[key] = round(time.monotonic() - started, 1)
        ok, value = self._done[key]
        if not ok:
            raise value
        return value

    @contextmanager
    def timed(self, part: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.times[part] = round(time.monotonic() - started, 1)


#: guest runs by key (a test module's function of the KernelLab), and the key each test
#: module's fixture stands for: what a kernel run beside another computes ahead
GUEST_RUNS: Dict[str, Callable[[KernelLab], Any]] = {}
RUN_OF_FIXTURE: Dict[Tuple[str, str], str] = {}


def guest_run(key: str, fixture: str) -> Callable[[Callable[[KernelLab], Any]], Callable[[KernelLab], Any]]:
    """Register `run(kernel_lab)` as the guest run `key`, which `fixture` of its module asks for
    with kernel_lab.once_run(key)."""
    def register(run: Callable[[KernelLab], Any]) -> Callable[[KernelLab], Any]:
        GUEST_RUNS[key] = run
        RUN_OF_FIXTURE[(run.__module__, fixture)] = key
        return run
    return register


def once_run(kernel_lab: KernelLab, key: str) -> Any:
    return kernel_lab.once(key, lambda: GUEST_RUNS[key](kernel_lab))


#: per kernel, the guest runs its selected tests need, in the order they will ask (filled at collection)
PLAN: Dict[str, List[str]] = {}


class KernelJob:
    """One kernel's boot and planned guest runs, done by a lane ahead of its tests; its
    fixture waits for `done` and hands over its KernelLab (or its boot failure)."""

    def __init__(self, kernel: str, artifacts_root: Path) -> None:
        self.kernel, self.root = kernel, artifacts_root
        self.lab = new_lab(kernel)
        self.the: Optional[KernelLab] = None
        self.failure: Optional[str] = None
        self.started_at = 0.0
        self.done = threading.Event()

    def run(self) -> None:
        self.started_at = time.monotonic()
        try:
            self.the = boot(self.lab, self.kernel, self.root, self.started_at)
            for key in PLAN.get(self.kernel, []):
                try:
                    once_run(self.the, key)
                except Exception:  # kept by once(): the tests that need it fail with it
                    pass
        except UserError as exc:  # GuestFailure included: one line, kernel and console log
            self.failure = f"kernel {self.kernel} ({self.lab.topology}): {exc}"
        except Exception as exc:  # a bug of the harness: said the same way, not lost in the thread
            self.failure = f"kernel {self.kernel} ({self.lab.topology}): {type(exc).__name__}: {exc}"
        finally:
            self.done.set()


class Lanes:
    """LANES threads taking the session's kernel jobs in KERNELS order."""

    def __init__(self, kernels: List[str], artifacts_root: Path) -> None:
        self.jobs = {kernel: KernelJob(kernel, artifacts_root) for kernel in kernels}
        self.queue = list(kernels)
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._lane, name=f"lab-lane-{i}", daemon=True)
                        for i in range(min(LANES, len(kernels)))]
        for thread in self.threads:
            thread.start()

    def _lane(self) -> None:
        while True:
            with self.lock:
                if not self.queue:
                    return
                kernel = self.queue.pop(0)
            self.jobs[kernel].run()

    def stop(self) -> None:
        """A session cut short: the queue empties and every guest goes, ending the runs in flight."""
        with self.lock:
            self.queue.clear()
        for job in self.jobs.values():
            job.lab.down()
        for thread in self.threads:
            thread.join(120)


_LANES: List[Lanes] = []


def new_lab(kernel: str) -> QemuLab:
    return QemuLab(kernel=kernel, topology="pair" if kernel in PAIR_KERNELS else "single", name=f"pytest-{kernel}",
                   ssh=False, progress=lambda message: print(message, flush=True))


def boot(lab: QemuLab, kernel: str, root: Path, started: float) -> KernelLab:
    """Up, the wheel installed on the client: the KernelLab of one kernel's boot (UserError, one line)."""
    lab.down()  # a lab left over by an interrupted earlier run
    lab.up()
    times = {"up": round(time.monotonic() - started, 1)}
    artifacts = root / f"kernel-{kernel}"
    install_tools(lab, artifacts)
    the = KernelLab(lab, kernel, lab.kernel_info()["release"], artifacts, root)
    the.times = times
    return the


@pytest.fixture(scope="session")
def lab_artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    env = os.environ.get("PROBEKIT_LAB_ARTIFACTS")
    path = Path(env) if env else tmp_path_factory.mktemp("lab")
    path.mkdir(parents=True, exist_ok=True)
    return path


#: this session's per-kernel times, for the terminal summary (CI shows where its minutes went)
SESSION_TIMES: Dict[str, Dict[str, float]] = {}


def _record_times(root: Path, kernel: str, times: Dict[str, float]) -> None:
    """times.json: per kernel, seconds per part (merged with earlier kernels of the run)."""
    SESSION_TIMES[kernel] = times
    path = root / "times.json"
    try:
        every = json.loads(path.read_text())
    except (OSError, ValueError):
        every = {}
    every[kernel] = times
    path.write_text(json.dumps(every, indent=1) + "\n")


@pytest.fixture(scope="session", params=lab_kernels(), ids=lambda kernel: f"k{kernel}")
def kernel_lab(request: pytest.FixtureRequest, lab_artifacts: Path) -> Iterator[KernelLab]:
    assert os.geteuid() == 0, "lab tests build images and boot QEMU: run them as root"
    kernel: str = request.param
    if not _LANES:  # the first kernel's tests: every selected kernel's job starts, two at a time
        _LANES.append(Lanes([k for k in KERNELS if k in PLAN], lab_artifacts))
    job = _LANES[0].jobs[kernel]
    try:
        job.done.wait()
        if job.failure:
            pytest.fail(job.failure, pytrace=False)
        assert job.the is not None
        yield job.the
    finally:
        times = job.the.times if job.the else {}
        down_started = time.monotonic()
        job.lab.down()
        times["down"] = round(time.monotonic() - down_started, 1)
        times["total"] = round(time.monotonic() - job.started_at, 1)
        print(f"[lab] kernel {kernel} ({job.lab.topology}): {times}", flush=True)
        _record_times(lab_artifacts, kernel, times)


def _kernel_of(item: pytest.Item) -> int:
    callspec = getattr(item, "callspec", None)
    if callspec is None or "kernel_lab" not in callspec.params:
        return -1
    return KERNELS.index(callspec.params["kernel_lab"])


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    """Tests without kernel_lab first (order kept), then every kernel's tests together, in
    KERNELS order (pytest groups them already; this also holds across modules that select
    a few kernels with an indirect parametrize). Kernels left out by PROBEKIT_LAB_KERNELS
    are deselected there too."""
    wanted = {KERNELS.index(kernel) for kernel in lab_kernels()}
    dropped = [item for item in items if _kernel_of(item) not in wanted | {-1}]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = sorted((item for item in items if _kernel_of(item) in wanted | {-1}), key=_kernel_of)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One line per kernel booted: minutes in all, then seconds per part."""
    if not SESSION_TIMES:
        return
    terminalreporter.section("lab time per kernel")
    for kernel, times in SESSION_TIMES.items():
        parts = ", ".join(f"{part} {seconds:.0f} s" for part, seconds in times.items() if part != "total")
        terminalreporter.write_line(f"{kernel:>5}: {times.get('total', 0) / 60:.1f} min ({parts})")


class Prebuild(threading.Thread):
    """`python -m labs.images K` for each kernel in turn (a cached image returns at once)."""

    def __init__(self, kernels: List[str], log: Path) -> None:
        super().__init__(daemon=True)
        self.kernels, self.log = kernels, log
        self.stopping = threading.Event()
        self.proc: Optional[subprocess.Popen] = None

    def run(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "a") as out:
            for kernel in self.kernels:
                if self.stopping.is_set():
                    return
                out.write(f"== {time.strftime('%H:%M:%S')} image for {kernel}\n")
                out.flush()
                self.proc = subprocess.Popen([sys.executable, "-m", "labs.images", kernel],
                                             stdout=subprocess.DEVNULL, stderr=out)
                if self.stopping.is_set():  # stop() came while it was being started
                    self.proc.terminate()
                self.proc.wait()

    def stop(self) -> None:
        """Session over: a build still running is ended (its .partial is cleared on the next build)."""
        self.stopping.set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
        self.join(60)
        if self.proc is not None and self.proc.poll() is None:  # a build that ignored SIGTERM
            self.proc.kill()
            self.proc.wait()


_PREBUILD: List[Prebuild] = []


def _plan(items: List[pytest.Item]) -> Dict[str, List[str]]:
    """Per kernel, the guest runs its items need, in item order (RUN_OF_FIXTURE)."""
    plan: Dict[str, List[str]] = {}
    for item in items:
        index = _kernel_of(item)
        if index < 0:
            continue
        keys = plan.setdefault(KERNELS[index], [])
        for fixture in getattr(item, "fixturenames", ()):
            key = RUN_OF_FIXTURE.get((item.module.__name__, fixture))
            if key and key not in keys:
                keys.append(key)
    return plan


def pytest_collection_finish(session: pytest.Session) -> None:
    """Plan each kernel's guest runs; start building the images this session's lab tests
    boot, in the order they boot."""
    PLAN.update(_plan(session.items))
    if os.geteuid() != 0 or session.config.option.collectonly:
        return
    wanted = {_kernel_of(item) for item in session.items} - {-1}
    kernels = [KERNELS[i] for i in sorted(wanted)]
    if any(item.path.name == "test_vagrant_pair.py" for item in session.items):
        kernels = ["6.1"] + [k for k in kernels if k != "6.1"]  # the box is made from 6.1's image
    if kernels:
        from discover.errors import cache_root
        _PREBUILD.append(Prebuild(kernels, cache_root() / "images" / "prebuild.log"))
        _PREBUILD[0].start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    for build in _PREBUILD:
        build.stop()
    for lanes in _LANES:
        lanes.stop()

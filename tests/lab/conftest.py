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

A guest that panics, oopses or stops answering fails its kernel's tests with one line
(kernel, console log) and the next kernel boots as usual. PROBEKIT_LAB_KERNELS=6.12,7.3
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

#: the CI kernels, booted in this order, each from its Debian suite's cached image (labs/images.py)
KERNELS: Tuple[str, ...] = ("5.10", "6.1", "6.12", "7.2", "7.3")
#: booted as a server/client pair (the fault checks' kernels); the others as one guest
PAIR_KERNELS = frozenset({"6.12", "7.3"})
#: booted with 2 vCPUs: their checks run no function_graph (a 2-vCPU 7.2 guest once panicked
#: under it) and start up to three tools at once, whose bcc compiles then run side by side
TWO_VCPU_KERNELS = frozenset({"5.10", "7.2"})


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
    topology = "pair" if kernel in PAIR_KERNELS else "single"
    lab = QemuLab(kernel=kernel, topology=topology, name=f"pytest-{kernel}", ssh=False,
                  vcpus=2 if kernel in TWO_VCPU_KERNELS else None,
                  progress=lambda message: print(message, flush=True))
    lab.down()  # a lab left over by an interrupted earlier run
    started = time.monotonic()
    times: Dict[str, float] = {}
    try:
        try:
            lab.up()
        except UserError as exc:  # GuestFailure included: one line, kernel and console log
            pytest.fail(f"kernel {kernel} ({topology}): {exc}", pytrace=False)
        times["up"] = round(time.monotonic() - started, 1)
        artifacts = lab_artifacts / f"kernel-{kernel}"
        install_tools(lab, artifacts)
        the = KernelLab(lab, kernel, lab.kernel_info()["release"], artifacts, lab_artifacts)
        the.times = times
        yield the
    finally:
        down_started = time.monotonic()
        lab.down()
        times["down"] = round(time.monotonic() - down_started, 1)
        times["total"] = round(time.monotonic() - started, 1)
        print(f"[lab] kernel {kernel} ({topology}): {times}", flush=True)
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


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start building the images this session's lab tests boot, in the order they boot."""
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

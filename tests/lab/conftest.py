"""One lab guest (or pair, or fleet) per CI kernel for all of tests/lab: each kernel boots once per run.

Which kernel runs which check is MATRIX's choice (docs/ci.md): in CI each check runs where it
proves something the others do not; PROBEKIT_LAB_MATRIX=full runs each check on every kernel it
has passed on (a release's run). `kernel_lab` is session-scoped and parametrized over
KERNELS; a test module narrows it with `on_kernels(CHECK)`.

Each kernel's boot, its guest runs (the functions the test modules register with
@guest_run, in the order its tests ask for them) and its lab's end are a job; so is the
Vagrant smoke (@lane_job). The jobs start when collection ends, LANES at a time (one more than
the host's two cores: a guest waiting on a delay, a scrape or a paused server leaves its core
idle), in JOB_ORDER, while the unit tests run in the
main thread; each job takes its guests down as soon as its runs are done, and a kernel's tests
wait for its job and judge what it brought back. Images a job needs that no lane is building
are built ahead in the background (labs/vm/images.py's flock makes a boot wait for a build under
way). Every guest has one vCPU: two 2-vCPU TCG guests of 7.2 oopsed on an int3, once under
function_graph and once while booting (code patched with int3 seen half-patched by the other
vCPU's thread); two 1-vCPU guests use the same two cores without that.

A guest that panics, oopses or stops answering fails its kernel's tests with one line
(kernel, console log), and the other jobs go on. PROBEKIT_LAB_KERNELS=6.12,7.3,vagrant narrows
the run; PROBEKIT_LAB_ARTIFACTS keeps the artefacts (else a temp dir, named at the start).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

from discover.errors import UserError
from labs.install import install_tools
from labs.vm.base import Lab
from labs.vm.console import GuestFailure
from labs.vm.qemu import QemuLab
from lab_lanes import Job, Lanes, say

#: the CI kernels, each from its Debian suite's cached image (labs/vm/images.py)
KERNELS: Tuple[str, ...] = ("7.3", "6.1", "6.12", "7.2", "5.10")
#: kernel jobs and the Vagrant smoke: the three longest first, then the ones that end the lanes
#: together (warm, 2026-12-04, the exporter check still on 7.3: 7.3 as the fleet 24 min, 6.12 23,
#: 6.1 17, 7.2 8, 5.10 7, Vagrant 3)
JOB_ORDER: Tuple[str, ...] = ("7.3", "6.12", "6.1", "7.2", "5.10", "vagrant")
#: jobs running at once
LANES = 3

#: per check, the kernels that prove something the others do not (docs/ci.md says why): probes
#: on each distinct userspace and attach mechanism (5.10: bcc 0.18, kprobes, no module BTF; 6.1:
#: bcc 0.26, kprobes; 6.12: trixie's bcc, fentry; 7.3: the backports kernel, fentry, on the fleet's
#: client-a); the v3-only start (nfsv4 absent) on each single guest's bcc and mechanism (kprobes on
#: 5.10 and 6.1, fentry on 7.2; the fleet's fault run checks its v3-only client); tracefs
#: coexistence on the global tracer (6.1) and in a private instance (6.11+: 7.2); the exporter on
#: kprobes with bookworm's Prometheus (6.1) and on fentry with the cgroup label and a late nfsv4
#: (7.2, sid's Prometheus; the fleet check runs three exporters on 7.3); faults and the fleet
#: check on the fleet (7.3); the fs tools on kprobes without module
#: BTF (5.10) and on fentry (6.12); identity where module BTF names the file on a single guest (7.2);
#: `labs test`'s integration once; the client without LLVM, clang, bcc or headers on trixie (libbpf
#: 1.5, fentry), the one suite whose core runs every tool there; nfsdtop on 6.12's single guest, an
#: NFS server (fentry on nfsd's BTF) that is its own client over 127.0.0.1, so the check costs no
#: second guest; sid's 7.2 the probe checks (core against bcc on sid's libbpf 1.7 and bcc) and the
#: single-guest checks of fentry that 6.12's boot, the longest, has no room for (identity among
#: them); the package's autopkgtest on Debian 13's userspace, on the fleet's first client (7.3).
CI_MATRIX: Dict[str, Tuple[str, ...]] = {
    "probes": ("7.3", "6.1", "6.12", "7.2", "5.10"), "v3only": ("6.1", "7.2", "5.10"), "coexist": ("6.1", "7.2"),
    "exporter": ("6.1", "7.2"), "faults": ("7.3",), "fs": ("6.12", "5.10"), "identity": ("7.2",),
    "integration": ("6.1",), "nollvm": ("6.12",), "nfsdtop": ("6.12",), "fleet": ("7.3",), "package": ("7.3",),
}
#: a release's run: each check on every kernel it has passed on (CI's matrix until 2026-12-03:
#: 6.12 and 7.3 as pairs, coexistence, faults and fs tools on both, 7.2 in CI)
FULL_MATRIX: Dict[str, Tuple[str, ...]] = {
    "probes": KERNELS, "v3only": ("6.1", "6.12", "7.2", "5.10"), "coexist": ("7.3", "6.1", "6.12", "7.2"),
    "exporter": ("7.3", "6.1", "7.2"), "faults": ("7.3", "6.12"), "fs": ("7.3", "6.12", "5.10"), "identity": ("7.2",),
    "integration": ("6.1",), "nollvm": ("6.12",), "nfsdtop": ("6.12",), "fleet": ("7.3",),
    "package": ("6.1", "7.3"),
}
#: the topology a kernel boots, by the first of these checks whose kernels name it (else one guest):
#: the fleet check needs three guests, the fault run a server of its own (it stops it); a fleet's
#: client-a runs the one-client checks as a pair's client does
TOPOLOGY_OF_CHECK: Tuple[Tuple[str, str], ...] = (("fleet", "fleet"), ("faults", "pair"))


def matrix() -> Dict[str, Tuple[str, ...]]:
    """CI_MATRIX, or FULL_MATRIX with PROBEKIT_LAB_MATRIX=full."""
    wanted = os.environ.get("PROBEKIT_LAB_MATRIX", "ci")
    if wanted not in ("ci", "full"):
        raise pytest.UsageError(f"PROBEKIT_LAB_MATRIX: {wanted!r} is neither 'ci' nor 'full'")
    return FULL_MATRIX if wanted == "full" else CI_MATRIX


def lab_topology(kernel: str) -> str:
    """The QEMU topology a kernel's job boots (TOPOLOGY_OF_CHECK)."""
    for check, topology in TOPOLOGY_OF_CHECK:
        if kernel in matrix().get(check, ()):
            return topology
    return "single"


def lab_kernels() -> Tuple[str, ...]:
    """KERNELS the matrix runs a check on: a kernel no check names is not booted."""
    named = {kernel for kernels in matrix().values() for kernel in kernels}
    return tuple(k for k in KERNELS if k in named)


def on_kernels(check: str) -> Any:
    """The parametrize mark that runs a test module's tests on the kernels of `check`."""
    return pytest.mark.parametrize("kernel_lab", [k for k in KERNELS if k in matrix().get(check, ())], indirect=True,
                                   ids=lambda k: f"k{k}")


def lab_jobs() -> List[str]:
    """JOB_ORDER, or the subset PROBEKIT_LAB_KERNELS names (comma-separated kernels, `vagrant`)."""
    wanted = [k.strip() for k in os.environ.get("PROBEKIT_LAB_KERNELS", "").split(",") if k.strip()]
    unknown = sorted(set(wanted) - set(JOB_ORDER))
    if unknown:
        raise pytest.UsageError(f"PROBEKIT_LAB_KERNELS: unknown kernel(s) {', '.join(unknown)} "
                                f"(known: {', '.join(JOB_ORDER)})")
    return [k for k in JOB_ORDER if not wanted or k in wanted]


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
        boot: every later test fails at once with that one line. A key no job computed (its
        guest is down by then) is an error of the plan, said so."""
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
#: module's fixture stands for: what a kernel's job computes before its guests go down
GUEST_RUNS: Dict[str, Callable[[KernelLab], Any]] = {}
RUN_OF_FIXTURE: Dict[Tuple[str, str], str] = {}
#: guest runs that change the guest for good (they uninstall packages): planned after every other
LAST_RUNS: List[str] = []


def guest_run(key: str, fixture: str, last: bool = False) -> Callable[[Callable[[KernelLab], Any]],
                                                                      Callable[[KernelLab], Any]]:
    """Register `run(kernel_lab)` as the guest run `key`, which `fixture` of its module asks for
    with kernel_lab.once_run(key); `last`: its boot runs it after every other guest run."""
    def register(run: Callable[[KernelLab], Any]) -> Callable[[KernelLab], Any]:
        GUEST_RUNS[key] = run
        RUN_OF_FIXTURE[(run.__module__, fixture)] = key
        if last:
            LAST_RUNS.append(key)
        return run
    return register


def guest_script(kernel_lab: KernelLab, part: str, script: str, timeout: float = 1200) -> Dict[str, Any]:
    """`python3 SCRIPT` in the guest's project tree as the boot's timed `part`: the JSON document
    it prints last, kept as `part`.json among the kernel's artefacts."""
    share = getattr(kernel_lab.lab, "guest_project_dir", "/opt/probekit")
    with kernel_lab.timed(part):
        res = kernel_lab.lab.run(f"cd {share} && python3 {script}", timeout=timeout)
    assert res.exit_code == 0, f"{Path(script).stem}: exit {res.exit_code}: {res.stderr[-2000:]}"
    out: Dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    kernel_lab.artifacts.mkdir(parents=True, exist_ok=True)
    (kernel_lab.artifacts / f"{part}.json").write_text(json.dumps(out, indent=1) + "\n")
    say(f"[{part} lab] {kernel_lab.kernel}: {kernel_lab.times[part]:.0f} s")
    return out


def once_run(kernel_lab: KernelLab, key: str) -> Any:
    return kernel_lab.once(key, lambda: _planned_only(kernel_lab, key))


def _planned_only(kernel_lab: KernelLab, key: str) -> Any:
    if kernel_lab.kernel in _JOBS and _JOBS[kernel_lab.kernel].done.is_set():
        raise AssertionError(f"guest run {key!r} was not planned for kernel {kernel_lab.kernel} "
                             "(its guest is down): a fixture missing from RUN_OF_FIXTURE")
    return GUEST_RUNS[key](kernel_lab)


#: per kernel, the guest runs its selected tests need, in the order they will ask (filled at collection)
PLAN: Dict[str, List[str]] = {}


class KernelJob(Job):
    """One kernel's boot, planned guest runs and lab end; its fixture waits for `done` and hands
    over its KernelLab (or its boot failure)."""

    def __init__(self, kernel: str, artifacts_root: Path) -> None:
        super().__init__()
        self.name = self.kernel = kernel
        self.root = artifacts_root
        self.lab = new_lab(kernel)
        self.the: Optional[KernelLab] = None

    def image_kernel(self) -> str:
        return self.kernel

    def run(self) -> None:
        self.started_at = time.monotonic()
        try:
            if self.stopping.is_set():
                return
            self.the = boot(self.lab, self.kernel, self.root, self.started_at)
            for key in PLAN.get(self.kernel, []):
                if self.stopping.is_set():
                    break
                try:
                    once_run(self.the, key)
                except Exception:  # kept by once(): the tests that need it fail with it
                    pass
        except UserError as exc:  # GuestFailure included: one line, kernel and console log
            self.failure = f"kernel {self.kernel} ({self.lab.topology}): {exc}"
        except Exception as exc:  # a bug of the harness: said the same way, not lost in the thread
            self.failure = f"kernel {self.kernel} ({self.lab.topology}): {type(exc).__name__}: {exc}"
        finally:
            times = self.the.times if self.the else {}
            down_started = time.monotonic()
            self.lab.down()
            times["down"] = round(time.monotonic() - down_started, 1)
            times["total"] = round(time.monotonic() - self.started_at, 1)
            say(f"[lab] kernel {self.kernel} ({self.lab.topology}): {times}")
            _record_times(self.root, self.kernel, times)
            self.done.set()

    def take_down(self) -> None:
        self.lab.down()


#: other lane jobs (the Vagrant smoke), by name: a factory of the Job and the test module it serves
LANE_JOBS: Dict[str, Tuple[Callable[[Path], Job], str]] = {}


def lane_job(name: str, module: str) -> Callable[[Callable[[Path], Job]], Callable[[Path], Job]]:
    """Register a Job factory `make(artifacts_root)` as the lane job `name` of test module `module`."""
    def register(make: Callable[[Path], Job]) -> Callable[[Path], Job]:
        LANE_JOBS[name] = (make, module)
        return make
    return register


_LANES: List[Lanes] = []
_JOBS: Dict[str, Job] = {}


def new_lab(kernel: str) -> QemuLab:
    return QemuLab(kernel=kernel, topology=lab_topology(kernel), name=f"pytest-{kernel}",
                   ssh=False, progress=say)


def boot(lab: QemuLab, kernel: str, root: Path, started: float) -> KernelLab:
    """Up, probekit's Debian package installed on the client: the KernelLab of one kernel's boot
    (UserError, one line)."""
    lab.down()  # a lab left over by an interrupted earlier run
    lab.up()
    times = {"up": round(time.monotonic() - started, 1)}
    artifacts = root / f"kernel-{kernel}"
    install_tools(lab, artifacts)
    the = KernelLab(lab, kernel, lab.kernel_info()["release"], artifacts, root)
    the.times = times
    return the


_ARTIFACTS: List[Path] = []


def artifacts_root() -> Path:
    """PROBEKIT_LAB_ARTIFACTS, else a temporary directory made once (said at the start)."""
    if not _ARTIFACTS:
        env = os.environ.get("PROBEKIT_LAB_ARTIFACTS")
        path = Path(env) if env else Path(tempfile.mkdtemp(prefix="probekit-lab-"))
        path.mkdir(parents=True, exist_ok=True)
        _ARTIFACTS.append(path)
    return _ARTIFACTS[0]


@pytest.fixture(scope="session")
def lab_artifacts() -> Path:
    return artifacts_root()


#: this session's per-kernel times, for the terminal summary (CI shows where its minutes went)
SESSION_TIMES: Dict[str, Dict[str, float]] = {}
_TIMES_LOCK = threading.Lock()


def _record_times(root: Path, kernel: str, times: Dict[str, float]) -> None:
    """times.json: per job, seconds per part (merged with the run's other jobs)."""
    with _TIMES_LOCK:
        SESSION_TIMES[kernel] = times
        path = root / "times.json"
        try:
            every = json.loads(path.read_text())
        except (OSError, ValueError):
            every = {}
        every[kernel] = times
        path.write_text(json.dumps(every, indent=1) + "\n")


def wait_for_job(name: str) -> Job:
    """The job's end (started at collection; a test run without them is a harness bug)."""
    assert os.geteuid() == 0, "lab tests build images and boot QEMU: run them as root"
    job = _JOBS[name]
    job.done.wait()
    if job.failure:
        pytest.fail(job.failure, pytrace=False)
    return job


@pytest.fixture(scope="session", params=[k for k in lab_jobs() if k in lab_kernels()], ids=lambda kernel: f"k{kernel}")
def kernel_lab(request: pytest.FixtureRequest) -> KernelLab:
    job = wait_for_job(request.param)
    assert isinstance(job, KernelJob) and job.the is not None
    return job.the


def _job_of(item: pytest.Item) -> int:
    """The item's place in JOB_ORDER: -1 for a unit test, else its job's (-2: no kernel at all,
    PROBEKIT_LAB_KERNELS left kernel_lab none)."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "kernel_lab" in callspec.params:
        kernel = callspec.params["kernel_lab"]
        return JOB_ORDER.index(kernel) if kernel in JOB_ORDER else -2
    for name, (_make, module) in LANE_JOBS.items():
        if item.module is not None and item.module.__name__ == module:
            return JOB_ORDER.index(name)
    return -1


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    """Unit tests first (order kept), then each job's tests together, in JOB_ORDER (the main thread
    judges each job's results as the lanes bring them). Jobs left out by PROBEKIT_LAB_KERNELS
    are deselected."""
    wanted = {JOB_ORDER.index(name) for name in lab_jobs()} | {-1}
    dropped = [item for item in items if _job_of(item) not in wanted]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = sorted((item for item in items if _job_of(item) in wanted), key=_job_of)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One line per job: minutes in all, then seconds per part."""
    if not SESSION_TIMES:
        return
    terminalreporter.section("lab time per kernel")
    for kernel, times in SESSION_TIMES.items():
        parts = ", ".join(f"{part} {seconds:.0f} s" for part, seconds in times.items() if part != "total")
        terminalreporter.write_line(f"{kernel:>7}: {times.get('total', 0) / 60:.1f} min ({parts})")


class Prebuild(threading.Thread):
    """`python -m labs.vm.images K` for each kernel in turn (a cached image returns at once)."""

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
                self.proc = subprocess.Popen([sys.executable, "-m", "labs.vm.images", kernel],
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
    """Per kernel, the guest runs its items need, in item order (RUN_OF_FIXTURE), but LAST_RUNS
    after all the others."""
    plan: Dict[str, List[str]] = {}
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or "kernel_lab" not in callspec.params:
            continue
        keys = plan.setdefault(callspec.params["kernel_lab"], [])
        for fixture in getattr(item, "fixturenames", ()):
            key = RUN_OF_FIXTURE.get((item.module.__name__, fixture))
            if key and key not in keys:
                keys.append(key)
    return {kernel: sorted(keys, key=lambda key: key in LAST_RUNS) for kernel, keys in plan.items()}


def _image_of(kernel: str) -> str:
    from labs.vm.images import base_suite, suite_for_kernel
    return base_suite(suite_for_kernel(kernel))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Plan each kernel's guest runs and start the jobs, LANES at a time; build ahead the images
    of the jobs no lane has started, in the order they will boot."""
    PLAN.update(_plan(session.items))
    if os.geteuid() != 0 or session.config.option.collectonly:
        return
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        return  # pytest ends the run at its collection errors: no guest is started for it
    names = {JOB_ORDER[i] for i in {_job_of(item) for item in session.items} if i >= 0}
    jobs: List[Job] = []
    for name in JOB_ORDER:
        if name in names:
            make = LANE_JOBS[name][0] if name in LANE_JOBS else (lambda root, k=name: KernelJob(k, root))
            jobs.append(make(artifacts_root()))
    if not jobs:
        return
    say(f"\n[lab] jobs {', '.join(job.name for job in jobs)}, {LANES} at a time; artefacts in {artifacts_root()}")
    _JOBS.update({job.name: job for job in jobs})
    ahead, seen = [], {_image_of(job.image_kernel()) for job in jobs[:LANES]}
    for job in jobs[LANES:]:
        image = _image_of(job.image_kernel())
        if image not in seen:
            seen.add(image)
            ahead.append(job.image_kernel())
    if ahead:
        from discover.errors import cache_root
        _PREBUILD.append(Prebuild(ahead, cache_root() / "images" / "prebuild.log"))
        _PREBUILD[0].start()
    _LANES.append(Lanes(jobs, LANES))


def pytest_sessionfinish(session: pytest.Session) -> None:
    for build in _PREBUILD:
        build.stop()
    for lanes in _LANES:
        lanes.stop()

"""`labs test`: the VM integration run, backend-neutral (only the labs.vm.base.Lab interface).

One run = one lab on one kernel: boot, check NFSv3 and v4.2 mounts, run the known
workload, run `discover callgraph` inside the guest for the NFS entry points, kill a
capture with SIGINT and SIGTERM and prove tracefs is restored, copy the results out as
artefacts (call graphs, tracefs metadata) and write a report (text + JSON). On request,
also run the generated NFS probes (nfsdist) around the workload and record, per
operation, the spec candidate they picked and whether it recorded the operation: the
`--lab-results` input of `probes compat` (docs/compat.md).
"""
from __future__ import annotations

import json
import re
import shlex
import tarfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, NamedTuple, Optional

from discover.errors import UserError
from labs.checks.shared import GUEST_SCRIPTS
from labs.install import install_tools
from labs.vm.base import CLIENT, Lab
from labs.vm.console import GuestFailure

Progress = Callable[[str], None]

#: guest-local scratch for one run (tarred and copied out by Lab.get: works on every backend)
GUEST_RESULTS = "/var/tmp/probekit-results"


class Check(NamedTuple):
    name: str
    passed: bool
    seconds: float
    detail: str


class Report:
    """What one integration run found: per-check verdicts, timings, kernel."""

    def __init__(self, backend: str, kernel: str, run_dir: Path) -> None:
        self.backend = backend
        self.kernel_requested = kernel
        self.kernel_release = ""
        self.run_dir = run_dir
        self.checks: List[Check] = []
        self.timings: Dict[str, float] = {}
        #: {uname -r: {op: {"candidate": i, "ok": bool}}} when the probes ran (docs/compat.md)
        self.lab_results: Dict[str, Any] = {}

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(check.passed for check in self.checks)

    def to_json(self) -> Dict[str, Any]:
        return {"backend": self.backend, "kernel_requested": self.kernel_requested,
                "kernel_release": self.kernel_release, "passed": self.passed,
                "timings": {k: round(v, 1) for k, v in self.timings.items()},
                "checks": [c._asdict() for c in self.checks], "artifacts": str(self.run_dir),
                "lab_results": self.lab_results}

    def text(self) -> str:
        lines = [f"labs test: {self.backend}, kernel {self.kernel_release or self.kernel_requested}: "
                 f"{'PASS' if self.passed else 'FAIL'}"]
        for check in self.checks:
            lines.append(f"  {'ok  ' if check.passed else 'FAIL'} {check.name:<34} {check.seconds:6.1f} s  "
                         f"{check.detail}")
        lines.append("  timings: " + ", ".join(f"{k} {v:.0f} s" for k, v in self.timings.items()))
        lines.append(f"  artefacts: {self.run_dir}")
        return "\n".join(lines)

    def write(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "report.json").write_text(json.dumps(self.to_json(), indent=2) + "\n")
        (self.run_dir / "report.txt").write_text(self.text() + "\n")


#: discover callgraph targets: (function, mount, workload step); the open entry point
#: of NFSv4 is nfs4_file_open where the kernel has it
CALLGRAPH_TARGETS = [
    ("nfs_file_read", "/mnt/nfs3", "read"),
    ("nfs_file_write", "/mnt/nfs3", "write"),
    ("nfs_getattr", "/mnt/nfs3", "stat"),
    ("nfs4_file_open", "/mnt/nfs42", "open"),
]


class Integration:
    """The checks of one run, against a lab that is up."""

    def __init__(self, lab: Lab, report: Report, progress: Progress) -> None:
        self.lab = lab
        self.report = report
        self.progress = progress
        self.share = getattr(lab, "guest_project_dir", "/opt/probekit")
        self.guest_run = f"{GUEST_RESULTS}/{report.run_dir.name}"
        #: why the guest cannot be used any more (a crash or silence), once it happened
        self.dead: Optional[str] = None

    def check(self, name: str, body: Callable[[], str]) -> bool:
        """Run one check; its return value is the detail, a raised error is the failure.

        Once the guest crashed or stopped answering (GuestFailure), the remaining checks are
        not tried: each would only wait for the same dead guest."""
        started = time.monotonic()
        self.progress(f"[test] {name} ...")
        if self.dead is not None:
            detail, passed = f"not run: {self.dead}", False
        else:
            try:
                detail, passed = body(), True
            except GuestFailure as exc:
                self.dead = str(exc)
                self.progress(f"[test] guest failed: {exc}")
                detail, passed = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:600], False
            except (UserError, AssertionError, ValueError, KeyError, OSError) as exc:
                detail, passed = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:400], False
        seconds = time.monotonic() - started
        self.report.checks.append(Check(name, passed, round(seconds, 1), detail))
        self.progress(f"[test] {name}: {'ok' if passed else 'FAIL'} ({seconds:.1f} s) {detail}")
        return passed

    def sh(self, cmd: str, timeout: float = 600.0) -> str:
        """A guest command that must succeed; returns its stdout."""
        res = self.lab.run(cmd, node=CLIENT, timeout=timeout)
        if res.exit_code != 0:
            raise AssertionError(f"`{cmd[:80]}` exited {res.exit_code}: {(res.stderr or res.stdout).strip()[-300:]}")
        return res.stdout

    def workload(self, step: str, mount: str) -> str:
        return f"sh {self.share}/{GUEST_SCRIPTS['workload']} {step} {mount}"

    # -- checks --------------------------------------------------------------------------

    def mounts(self) -> str:
        text = self.sh("cat /proc/mounts")
        found = {}
        for line in text.splitlines():
            fields = line.split()
            if len(fields) > 3 and fields[1] in ("/mnt/nfs3", "/mnt/nfs42"):
                found[fields[1]] = re.search(r"\bvers=([\d.]+)", fields[3]).group(1)  # type: ignore[union-attr]
        assert found.get("/mnt/nfs3") == "3", f"/mnt/nfs3 not NFSv3: {found}"
        assert found.get("/mnt/nfs42") == "4.2", f"/mnt/nfs42 not NFSv4.2: {found}"
        return "nfs3 vers=3, nfs42 vers=4.2"

    def run_workload(self) -> str:
        spent = []
        for mount in ("/mnt/nfs3", "/mnt/nfs42"):
            started = time.monotonic()
            self.sh(self.workload("prepare", mount) + " && " + self.workload("all", mount))
            spent.append(f"{mount} {time.monotonic() - started:.1f} s")
        return ", ".join(spent)

    def metadata(self) -> str:
        """uname, lsmod, tracefs listings and NFS event formats into the artefacts."""
        out = f"{self.guest_run}/tracefs"
        script = f"""
set -e
T=/sys/kernel/tracing
mkdir -p {out}/events
uname -a > {out}/uname-a.txt; uname -r > {out}/uname-r.txt
lsmod > {out}/lsmod.txt
grep -E '^(nfs|nfs4|nfsd|sunrpc|rpcgss):' $T/available_events > {out}/available_events.nfs-nfs4-nfsd-sunrpc.txt || true
grep -i nfs $T/available_filter_functions > {out}/available_filter_functions.nfs.txt
cat $T/available_tracers > {out}/available_tracers.txt
cat $T/trace_options > {out}/trace_options.txt
grep nfs /proc/mounts > {out}/proc-mounts-nfs.txt
python3 - {out}/events <<'PY'
import os, sys
# one process instead of a fork per event: under TCG every fork costs
tracing, dest = "/sys/kernel/tracing/events", sys.argv[1]
for system in ("nfs", "nfs4"):
    if not os.path.isdir(os.path.join(tracing, system)):
        continue
    for event in sorted(os.listdir(os.path.join(tracing, system))):
        src = os.path.join(tracing, system, event, "format")
        if os.path.isfile(src):
            os.makedirs(os.path.join(dest, system, event), exist_ok=True)
            with open(src) as fmt, open(os.path.join(dest, system, event, "format"), "w") as copy:
                copy.write(fmt.read())
PY
wc -l < {out}/available_filter_functions.nfs.txt
"""
        count = int(self.sh(script).strip().splitlines()[-1])
        assert count > 100, f"only {count} nfs functions in available_filter_functions"
        return f"{count} nfs functions traceable"

    def callgraph(self, function: str, mount: str, step: str) -> str:
        out = f"{self.guest_run}/callgraph/{function}.json"
        if function == "nfs4_file_open":
            res = self.lab.run("grep -qx 'nfs4_file_open \\[nfsv4\\]' /sys/kernel/tracing/available_filter_functions",
                               node=CLIENT, timeout=60)
            if res.exit_code != 0:
                function = "nfs_file_open"
        cmd = (f"mkdir -p {self.guest_run}/callgraph && cd /tmp && python3 -m discover callgraph {function} "
               f"--workload {shlex.quote(self.workload(step, mount))} --format json -o {out}")
        buffer_before = self.sh(f"cat {BUFFER_SIZE_KB}").strip()
        self.sh(cmd, timeout=900)
        buffer_after = self.sh(f"cat {BUFFER_SIZE_KB}").strip()
        assert ring_buffer_kept(buffer_before, buffer_after), \
            f"the global ring buffer was {buffer_before!r} before discover and {buffer_after!r} after"
        text = self.sh(f"cat {out}")
        graph = json.loads(text)
        roots = graph.get("graph", {}).get("roots", [])
        assert function in roots, f"{function} not a root of its call graph (roots {roots})"
        callees = {link["target"] for link in graph.get("links", []) if link.get("source") == function}
        functions = {node["id"] for node in graph.get("nodes", [])}
        assert callees, f"no callee of {function} captured"
        assert len(functions) >= 4, f"call graph of {function} has only {sorted(functions)}"
        return f"{len(callees)} direct callees, {len(functions)} functions"

    def interrupt(self, sig: str) -> str:
        """Kill discover mid-capture with a signal; tracefs must be exactly as before."""
        script = f"{self.share}/{GUEST_SCRIPTS['interrupt']}"
        workload = "for i in $(seq 1 600); do " + self.workload("stat", "/mnt/nfs3") + "; sleep 0.2; done"
        text = self.sh(f"mkdir -p {self.guest_run}/interrupt && python3 {script} {sig} nfs_getattr "
                       f"{shlex.quote(workload)} > {self.guest_run}/interrupt/{sig}.json && "
                       f"cat {self.guest_run}/interrupt/{sig}.json", timeout=900)
        result = json.loads(text)
        assert result["was_capturing"], f"discover never had function_graph on (exit {result['exit_code']}: " \
                                        f"{result['stderr_tail'][-200:]})"
        assert result["entries_at_signal"], "the signal went before the capture recorded a call (the workload never " \
                                            "reached the function within the 300 s bound)"
        # discover treats a signal as "stop now and report what was captured": exit 0 is fine,
        # so is 128+signal; a traceback (exit 1) is not
        signum = {"INT": 2, "TERM": 15, "HUP": 1}[sig]
        assert result["exit_code"] in (0, 128 + signum, -signum), \
            f"discover exited {result['exit_code']} after SIG{sig}: {result['stderr_tail'][-300:]}"
        assert result["restored"], f"tracefs not restored after SIG{sig}: changed {result['changed']}"
        return f"SIG{sig} mid-capture: exit {result['exit_code']}, tracefs restored ({len(result['before'])} files)"

    def probe_picks(self) -> str:
        """nfsdist around the workload on both mounts: per op the candidate used, and recorded?"""
        install_tools(self.lab, self.report.run_dir)
        result = json.loads(self.sh(f"cd {self.share} && python3 {GUEST_SCRIPTS['probes']} picks", timeout=900)
                            .strip().splitlines()[-1])
        assert result["ok"], result.get("error")
        self.report.lab_results = result["data"]["lab_results"]
        (self.report.run_dir / "lab-results.json").write_text(json.dumps(self.report.lab_results, indent=1) + "\n")
        picks = [(op, run) for ops in self.report.lab_results.values() for op, run in ops.items()]
        failed = [op for op, run in picks if not run["ok"]]
        assert not failed, f"not picked or nothing recorded: {', '.join(failed)}"
        return ", ".join(f"{op} #{run['candidate'] + 1}" for op, run in picks)

    def probe_checks(self, with_faults: bool) -> None:
        """The probe checks of tests/lab/test_probes_lab.py on the pair's client (netem on its link),
        one check per verdict: the guest runs `main` and `v3only`, or only `main` when the fault
        run follows (it checks the v3-only client: labs.checks.probes.verdicts.V3ONLY_CHECKS); `main` also
        gives the lab results of every operation."""
        from labs.checks.probes.verdicts import PROBE_CHECKS, V3ONLY_CHECKS, guest_runs
        install_tools(self.lab, self.report.run_dir)
        found: Dict[str, Any] = {}

        def runs() -> str:
            for what in guest_runs(with_faults):
                out = self.sh(f"cd {self.share} && python3 {GUEST_SCRIPTS['probes']} {what}", timeout=1500)
                found[what] = json.loads(out.strip().splitlines()[-1])
            (self.report.run_dir / "probes.json").write_text(json.dumps(found, indent=1) + "\n")
            assert found["main"]["ok"], found["main"].get("error")
            self.report.lab_results = found["main"]["data"]["lab_results"]
            (self.report.run_dir / "lab-results.json").write_text(json.dumps(self.report.lab_results, indent=1) + "\n")
            failed = [op for ops in self.report.lab_results.values() for op, run in ops.items() if not run["ok"]]
            assert not failed, f"not picked or nothing recorded: {', '.join(failed)}"
            return f"every op recorded; netem on {found['main']['data']['netem_device']}"

        if self.check(f"probe runs: {' and '.join(guest_runs(with_faults))} on the client", runs):
            for name, verify, args in PROBE_CHECKS:
                if not (with_faults and verify in V3ONLY_CHECKS):
                    self.check(name, lambda v=verify, a=args: (v(found, *a), "ok")[1])

    def exporter_checks(self) -> None:
        """nfs-exporter with Debian's Prometheus and node_exporter (labs/checks/exporter/verdicts.py): one
        guest run, one check per verdict; the scraped texts land in metrics/ of the run directory."""
        from labs.checks.exporter.verdicts import EXPORTER_CHECKS, keep_results
        found: Dict[str, Any] = {}

        def exporter_run() -> str:
            install_tools(self.lab, self.report.run_dir)
            found.update(json.loads(self.sh(f"cd {self.share} && python3 {GUEST_SCRIPTS['exporter']}", timeout=1200)
                                    .strip().splitlines()[-1]))
            keep_results(found, self.report.run_dir)
            return f"scraped texts in {self.report.run_dir / 'metrics'}"

        self.report.run_dir.mkdir(parents=True, exist_ok=True)
        if self.check("exporter run: Prometheus and node_exporter around the workload", exporter_run):
            for name, verify, args in EXPORTER_CHECKS:
                self.check(name, lambda v=verify, a=args: (v(found, *a), "ok")[1])

    def fault_checks(self) -> None:
        """The pair's fault checks (labs/checks/faults/): one guest run, one check per fault."""
        from labs.checks.faults.run import run_faults
        from labs.checks.faults.verdicts import FAULT_CHECKS
        found: Dict[str, Any] = {}

        def faults_run() -> str:
            found.update(run_faults(self.lab, progress=self.progress))
            (self.report.run_dir / "faults.json").write_text(json.dumps(found, indent=1) + "\n")
            assert found.get("ok"), found.get("error")
            return f"{len(found['data']['slower_lines'])} nfsslower lines, phases " \
                + ", ".join(f"{name} {p['mono_end'] - p['mono_start']:.0f} s"
                            for name, p in found["data"]["phases"].items())

        self.report.run_dir.mkdir(parents=True, exist_ok=True)
        if self.check("fault run: workload under the tools, server faults", faults_run):
            for name, verify in FAULT_CHECKS:
                self.check(name, lambda v=verify: v(found))

    def fleet_checks(self) -> None:
        """The fleet check (labs/checks/fleet/) on a lab with two clients: one run of the three guests
        at once, one check per verdict; the run's JSON is fleet.json in the run directory."""
        from labs.checks.fleet.run import run_fleet
        from labs.checks.fleet.verdicts import FLEET_CHECKS, summary
        found: Dict[str, Any] = {}

        def fleet_run() -> str:
            found.update(run_fleet(self.lab, self.report.run_dir, progress=self.progress))
            (self.report.run_dir / "fleet.json").write_text(json.dumps(found, indent=1) + "\n")
            assert found["ok"], found.get("error") or {role: doc.get("error") for role, doc in found["data"].items()
                                                       if isinstance(doc, dict) and doc.get("ok") is False}
            return summary(found["data"])

        self.report.run_dir.mkdir(parents=True, exist_ok=True)
        if self.check("fleet run: client-a's load beside client-b's reads, nfsdtop on the server", fleet_run):
            for verify in FLEET_CHECKS:
                self.check(verify.__name__[len("verify_"):].replace("_", " "), lambda v=verify: v(found["data"]) or "ok")

    def collect(self) -> None:
        """Copy the guest's run directory out as artefacts (one tarball through the Lab interface)."""
        tarball = f"/tmp/{self.report.run_dir.name}.tar.gz"
        self.sh(f"tar -czf {tarball} -C {self.guest_run} .")
        local = self.report.run_dir / "guest-results.tar.gz"
        self.lab.get(tarball, local)
        with tarfile.open(local) as archive:
            archive.extractall(self.report.run_dir)
        local.unlink()


BUFFER_SIZE_KB = "/sys/kernel/tracing/buffer_size_kb"


def ring_buffer_kept(before: str, after: str) -> bool:
    """The global ring buffer's size after a capture is what it was, or, for a kernel that had
    not traced yet ('7 (expanded: 1408)'), at least the size it expands to on first use
    (the kernel rounds up to whole pages): never the boot-time minimum."""
    unexpanded = re.fullmatch(r"\d+ \(expanded: (\d+)\)", before)
    if unexpanded and after.isdigit():
        return int(after) >= int(unexpanded.group(1))
    return before == after


def run_integration(lab: Lab, artifacts: Path, progress: Progress = print,
                    keep_up: bool = False, probes: bool = False, already_up: bool = False,
                    exporter: bool = False) -> Report:
    """Bring the lab up, run every check, copy artefacts, write the report, take the lab down.

    `probes`: also run the generated NFS probes for the report's lab results (a bcc compile,
    ~30-60 s under TCG). `exporter`: also the exporter checks (Prometheus and node_exporter
    in the guest, about a minute). `already_up`: the lab was booted by the caller, who also takes it
    down (tests/lab's shared per-kernel guest); the first check then only reports its timings.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S")
    kernel = getattr(lab, "kernel", "?")
    report = Report(lab.backend, kernel, Path(artifacts) / f"{lab.backend}-{kernel}-{stamp}")
    run = Integration(lab, report, progress)
    started = time.monotonic()
    keep_up = keep_up or already_up
    try:
        if run.check("lab up (boot, NFS export and mounts)", lambda: _up(lab, boot=not already_up)):
            report.timings.update(getattr(lab, "timings", {}))
            report.kernel_release = lab.kernel_info()["release"]
            run.sh(f"mkdir -p {run.guest_run}")
            run.check("NFSv3 and NFSv4.2 mounted", run.mounts)
            run.check("known workload on both mounts", run.run_workload)
            run.check("tracefs metadata", run.metadata)
            checks_started = time.monotonic()
            for function, mount, step in CALLGRAPH_TARGETS:
                run.check(f"discover callgraph {function}", lambda f=function, m=mount, s=step: run.callgraph(f, m, s))
            report.timings["callgraphs"] = time.monotonic() - checks_started
            for sig in ("INT", "TERM"):
                run.check(f"SIG{sig} mid-capture restores tracefs", lambda s=sig: run.interrupt(s))
            if probes and getattr(lab, "topology", "single") != "single":
                run.probe_checks(with_faults=lab.can_pause_nodes)
                if lab.can_pause_nodes:  # Vagrant's domains are libvirt's: no SIGSTOP of our own QEMU
                    run.fault_checks()
            elif probes:
                run.check("generated probes: candidate per operation", run.probe_picks)
            if exporter:
                run.exporter_checks()
            if len(lab.client_names()) > 1:
                run.fleet_checks()
            run.check("artefacts copied out", lambda: (run.collect(), "ok")[1])
    finally:
        if not keep_up:
            down_started = time.monotonic()
            lab.down()
            report.timings["down"] = time.monotonic() - down_started
        report.timings["total"] = time.monotonic() - started
        report.write()
    return report


def _up(lab: Lab, boot: bool = True) -> str:
    if boot:
        lab.up()
    timings: Optional[Dict[str, float]] = getattr(lab, "timings", None)
    return ", ".join(f"{k} {v:.0f} s" for k, v in (timings or {}).items())

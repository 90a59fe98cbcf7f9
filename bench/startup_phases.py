"""Where an installed nfsslower's start goes, phase by phase: seconds and peak memory (VmHWM).

Why: bench_core times a whole start (spawn to the first event) beside libbpf-tools; this says
which part of it to cut. Run in a lab guest on probekit's installed Debian package (the
modules from /usr/lib/probekit with their bytecode, as /usr/sbin/nfsslower runs them): it
starts nfsslower's Session on `--backend core` in-process, every phase timed around its
call, VmHWM read after it, then detaches. `--import MODULE` times only that import (the
exporter's: probes.exporter, and on a tree that served through prometheus_client, its parts).

  env -u PYTHONPATH python3 bench/startup_phases.py            # in the guest; prints JSON
  env -u PYTHONPATH python3 bench/startup_phases.py --import probes.exporter
"""
from __future__ import annotations

import functools
import importlib
import json
import os
import re
import sys
import time

TYPE_CHECKING = False  # typing stays out, as out of the tools' start it measures (discover/records.py)
if TYPE_CHECKING:
    from typing import Any, Dict, List

INSTALLED = "/usr/lib/probekit"
#: the serving modules of an exporter before probes.exposition, imported by it once its probe was
#: attached (probes.exposition comes with probes.exporter)
EXPORTER_SERVING = ("prometheus_client", "prometheus_client.exposition")


def status_mib(field: str = "VmHWM") -> float:
    """A memory figure of this process (VmHWM: its peak; VmRSS: what it holds now), in MiB."""
    with open("/proc/self/status") as handle:
        return int(re.search(field + r":\s+(\d+)", handle.read()).group(1)) / 1024  # type: ignore[union-attr]


def since_spawn() -> float:
    """Seconds since this process was spawned (its start time in /proc, against CLOCK_BOOTTIME)."""
    with open("/proc/self/stat") as handle:
        started = int(handle.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
    return time.clock_gettime(time.CLOCK_BOOTTIME) - started


class Phases:
    """Calls timed by name: calls, seconds in all, VmHWM after the last, and VmRSS before and
    after it: what the process held going in (a peak is that plus what the call adds). Nested
    calls count in both."""

    def __init__(self) -> None:
        self.rows: Dict[str, Dict[str, Any]] = {}

    def add(self, name: str, seconds: float, rss_in: float = 0.0) -> None:
        row = self.rows.setdefault(name, {"name": name, "calls": 0, "s": 0.0})
        row.update(calls=row["calls"] + 1, s=row["s"] + seconds, hwm_mib=status_mib(), rss_mib=status_mib("VmRSS"))
        if rss_in:
            row["rss_in_mib"] = rss_in

    def wrap(self, owner: Any, attr: str, name: str, static: bool = False) -> None:
        """Time every call of owner.attr under `name` (a classmethod patched as a static one);
        nothing where the tree has no such call (an older tree's package)."""
        original = getattr(owner, attr, None)
        if original is None:
            return

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            rss_in, began = status_mib("VmRSS"), time.monotonic()
            try:
                return original(*args, **kwargs)
            finally:
                self.add(name, time.monotonic() - began, rss_in)

        setattr(owner, attr, staticmethod(timed) if static else timed)


def timed_import(phases: Phases, name: str) -> None:
    began = time.monotonic()
    importlib.import_module(name)
    phases.add(f"import {name}", time.monotonic() - began)


def nfsslower_start(phases: Phases) -> None:
    """nfsslower 0's Session on core, as run_slower makes it, attached and detached."""
    timed_import(phases, "probes.commands")
    from probes import core_backend, libbpf, runtime
    from probes.commands import nfs_target
    from probes.layout import KernelLayout
    from probes.model import Tool
    from probes.select import KernelFacts
    phases.wrap(KernelFacts, "live", "KernelFacts.live (tracefs, BTF look-ups; layout below)", static=True)
    phases.wrap(KernelLayout, "live", "KernelLayout.live (libbpf parses vmlinux, nfs, nfsv4, sunrpc BTF)", static=True)
    phases.wrap(runtime, "select", "select")
    phases.wrap(runtime, "choose", "backend choice (libbpf loaded, object read)")
    phases.wrap(runtime, "open_backend", "backend opened (core_backend imported)")
    phases.wrap(core_backend.CoreBackend, "generate", "generate (settings, targets)")
    phases.wrap(KernelLayout, "release", "layout released")
    phases.wrap(libbpf.BpfObject, "__init__", "object opened (bpf_object__open_mem)")
    phases.wrap(libbpf.BpfObject, "set_attach_target", "fentry targets named (module BTFs loaded)")
    phases.wrap(core_backend, "kernel_btf_fds", "module BTF objects found by name (no parse)")
    phases.wrap(libbpf.BpfObject, "set_attach_btf", "fentry targets given by BTF object and type id")
    phases.wrap(libbpf.Libbpf, "trim_heap", "heap trimmed (malloc_trim, before the load)")
    phases.wrap(libbpf.BpfObject, "load", "bpf_object__load")
    phases.wrap(core_backend.CoreBackend, "attach", "attach")
    target = nfs_target(None)
    tool = Tool(events=True, tgid=0, min_lat_ns=0, inflight=True, mount_dev=0)
    began = time.monotonic()
    session = runtime.Session("nfsslower", tool, target.ops(None), target.spec, False, backend="core")
    with session:
        phases.add("Session up (all of the above from KernelFacts.live on)", time.monotonic() - began)


def main(argv: List[str]) -> int:
    sys.path.insert(0, INSTALLED)
    phases = Phases()
    phases.add("interpreter up (spawn to the script's first line)", since_spawn())
    if "--import" in argv:
        timed_import(phases, argv[argv.index("--import") + 1])
        served_before = argv[argv.index("--import") + 1] == "probes.exporter" and "probes.exposition" not in sys.modules
        for name in EXPORTER_SERVING if served_before else ():
            timed_import(phases, name)
    else:
        nfsslower_start(phases)
    out: Dict[str, Any] = {"kernel": os.uname().release, "phases": list(phases.rows.values()),
                           "spawn_to_end_s": since_spawn(), "hwm_mib": status_mib()}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

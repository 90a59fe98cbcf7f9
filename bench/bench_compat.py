"""Compatibility-report speed, measured side by side in one run.

1. one Debian kernel package analysed from scratch as `probes compat` does (no profile
   cache): data.tar decompressed, vmlinuz and its BTF, every module decompressed and its
   string table searched for the spec's names, the few modules that define one read in
   full: target <= 10 s. Measured on 6.1.0-50 (modules shipped as .ko, like 5.10 and 6.1)
   and 6.12.95 (.ko.xz, like 6.12 .. 7.x); the complete profile (every module's symbols,
   `probes kernel-profile`) is timed beside them for comparison;
2. `probes compat probes/specs/nfs.toml` over eight kernels once downloaded: target
   <= 60 s, measured cold (an empty profile cache: every package analysed, which is what
   the target is about) and warm (profiles cached by the cold run, for comparison only).

Wall time and CPU time (this process, its worker processes and their xz children) are
both printed, with the load average: the host's 2 cores are shared, so wall time includes
waiting for other jobs. Downloads (first run only) are not timed: `probes fetch-kernel`
caches them under ~/.cache/probekit/kernels.

    .venv/bin/python bench/bench_compat.py                 # everything, then the eight-kernel matrix
    .venv/bin/python bench/bench_compat.py --one-only      # only step 1
    .venv/bin/python bench/bench_compat.py --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from probes.compat import (build_report, load_kernels, render, spec_events, spec_functions,  # noqa: E402
                           spec_modules)
from probes.fetch import fetch_kernel  # noqa: E402
from probes.kernelpkg import Lookup, profile_from_package  # noqa: E402
from discover.spec import load_spec  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "probes" / "specs" / "nfs.toml"
#: bullseye, bookworm (two ABIs), bookworm-backports, trixie, trixie-backports (6.16, 7.3), sid
EIGHT = ("5.10.0-32", "6.1.0-47", "6.1.0-50", "6.12.95+deb12", "6.12.117+deb13", "6.16.12+deb13",
         "7.2.13+deb14", "7.3.4+deb13")
ONE = ("6.1.0-50", "6.12.95+deb12")
TARGET_ONE_S, TARGET_EIGHT_S = 10.0, 60.0


def _cpu() -> float:
    """CPU seconds of this process and its finished children (module/kernel workers, xz)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def timed(fn: Callable[[], Any]) -> Tuple[Any, float, float]:
    wall, cpu = time.perf_counter(), _cpu()
    result = fn()
    return result, time.perf_counter() - wall, _cpu() - cpu


def _line(what: str, wall: float, cpu: float, target: float) -> str:
    return (f"{what}: wall {wall:.1f} s, cpu {cpu:.1f} s; target {target:.0f} s: "
            f"wall {wall / target:.2f}x, cpu {cpu / target:.2f}x of it")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--one-only", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    spec = load_spec(SPEC)
    functions, events, modules = spec_functions(spec), spec_events(spec), spec_modules(spec)
    lookup = Lookup.of(functions, events, modules)
    results: Dict[str, Any] = {"load_average": round(os.getloadavg()[0], 1)}
    dirs = {abi: fetch_kernel(abi) for abi in (EIGHT if not args.one_only else ONE)}
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")

    for abi in ONE:
        _p, wall, cpu = timed(lambda: profile_from_package([dirs[abi]], lookup.functions, (), None, lookup))
        results[f"one_{abi}"] = {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1)}
        print(_line(f"one package {abi}, compat analysis (uncached)", wall, cpu, TARGET_ONE_S))
        _p, wall, cpu = timed(lambda: profile_from_package([dirs[abi]], lookup.functions))
        results[f"one_{abi}_complete"] = {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1)}
        print(_line(f"one package {abi}, complete profile (every module read)", wall, cpu, TARGET_ONE_S))

    if not args.one_only:
        def matrix() -> str:
            loaded = load_kernels([str(dirs[abi]) for abi in EIGHT], functions, modules, events=events)
            kernels = [k for _a, k in loaded]
            return render(build_report(spec, kernels, kernels[2], str(SPEC)), "table")

        saved = os.environ.get("PROBEKIT_PROFILE_CACHE")
        with tempfile.TemporaryDirectory() as tmp:
            os.environ["PROBEKIT_PROFILE_CACHE"] = tmp  # empty profile cache: every package analysed
            try:
                _t, wall_c, cpu_c = timed(matrix)
                table, wall_w, cpu_w = timed(matrix)  # the profiles the cold run cached
            finally:
                if saved is None:
                    os.environ.pop("PROBEKIT_PROFILE_CACHE")
                else:
                    os.environ["PROBEKIT_PROFILE_CACHE"] = saved
        results["eight_cold"] = {"wall_s": round(wall_c, 1), "cpu_s": round(cpu_c, 1)}
        results["eight_warm"] = {"wall_s": round(wall_w, 1), "cpu_s": round(cpu_w, 1)}
        print(_line("eight kernels, cold (every package analysed, no profile cache)", wall_c, cpu_c, TARGET_EIGHT_S))
        print(f"eight kernels, warm (profile cache; not the target's measure): wall {wall_w:.1f} s, cpu {cpu_w:.1f} s")
        print()
        print(table)
    results["load_average_end"] = round(os.getloadavg()[0], 1)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""Compatibility-report speed, measured side by side in one run.

1. one Debian kernel package analysed from scratch (decompress data.tar, vmlinuz, every
   module; BTF, symbol tables, tracepoints): target <= 10 s;
2. `probes compat probes/specs/nfs.toml` over eight kernels once downloaded: target
   <= 60 s, measured cold (every package analysed, no profile cache) and warm (profiles
   cached under ~/.cache/probekit/profiles by an earlier run).

Wall time and CPU time (this process and its worker processes) are both printed, with the
load average: the host's 2 cores are shared, so wall time includes waiting for other jobs. Downloads (first run only) are not
timed: `probes fetch-kernel` caches them under ~/.cache/probekit/kernels.

    .venv/bin/python bench/bench_compat.py                 # the eight-kernel matrix, printed
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

from probes.compat import build_report, load_kernels, render, spec_functions  # noqa: E402
from probes.fetch import fetch_kernel  # noqa: E402
from probes.kernelpkg import profile_from_package  # noqa: E402
from probes.spec import load_spec  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "probes" / "specs" / "nfs.toml"
#: bullseye, bookworm (two ABIs), bookworm-backports, trixie, trixie-backports (6.16, 7.3), sid
EIGHT = ("5.10.0-32", "6.1.0-47", "6.1.0-50", "6.12.95+deb12", "6.12.117+deb13", "6.16.12+deb13",
         "7.2.13+deb14", "7.3.4+deb13")
TARGET_ONE_S, TARGET_EIGHT_S = 10.0, 60.0


def _cpu() -> float:
    """CPU seconds of this process and its finished children (the module/kernel workers)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def timed(fn: Callable[[], Any]) -> Tuple[Any, float, float]:
    wall, cpu = time.perf_counter(), _cpu()
    result = fn()
    return result, time.perf_counter() - wall, _cpu() - cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--one-only", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    spec = load_spec(SPEC)
    functions = spec_functions(spec)
    results: Dict[str, Any] = {}

    dirs = {abi: fetch_kernel(abi) for abi in (EIGHT if not args.one_only else ("6.1.0-50",))}
    _p, wall, cpu = timed(lambda: profile_from_package([dirs["6.1.0-50"]], functions))
    results["one_package"] = {"kernel": "6.1.0-50", "wall_s": round(wall, 1), "cpu_s": round(cpu, 1)}
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"one package (6.1.0-50) analysed: wall {wall:.1f} s, cpu {cpu:.1f} s (target {TARGET_ONE_S:.0f} s)")

    if not args.one_only:
        def matrix(cold: bool) -> str:
            kernels = [k for _a, k in load_kernels([str(dirs[abi]) for abi in EIGHT], functions, [])]
            return render(build_report(spec, kernels, kernels[2], str(SPEC)), "table")

        with tempfile.TemporaryDirectory() as tmp:
            saved = os.environ.get("PROBEKIT_PROFILE_CACHE")
            os.environ["PROBEKIT_PROFILE_CACHE"] = tmp  # empty profile cache: every package analysed
            try:
                _t, wall_c, cpu_c = timed(lambda: matrix(True))
            finally:
                if saved is None:
                    os.environ.pop("PROBEKIT_PROFILE_CACHE")
                else:
                    os.environ["PROBEKIT_PROFILE_CACHE"] = saved
        matrix(False)  # fill the normal profile cache
        table, wall_w, cpu_w = timed(lambda: matrix(False))
        results["eight_cold"] = {"wall_s": round(wall_c, 1), "cpu_s": round(cpu_c, 1)}
        results["eight_warm"] = {"wall_s": round(wall_w, 1), "cpu_s": round(cpu_w, 1)}
        print(f"eight kernels, cold (all analysed): wall {wall_c:.1f} s, cpu {cpu_c:.1f} s (target {TARGET_EIGHT_S:.0f} s)")
        print(f"eight kernels, warm (profile cache): wall {wall_w:.1f} s, cpu {cpu_w:.1f} s")
        print(f"cold/warm ratio: {wall_c / max(wall_w, 0.01):.1f}x")
        print()
        print(table)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()

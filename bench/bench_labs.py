"""Lab speed, measured side by side in one run: image build cold vs cached, boot to ready,
and the full `labs test` on the QEMU backend (target: warm run under TCG <= 5 minutes).

Usage (root; boots one VM at a time):
    .venv/bin/python bench/bench_labs.py [--kernel 6.1] [--skip-cold] [--json out.json]

The cold build uses a fresh cache directory (so it downloads and builds everything);
the cached figure is the lookup in the normal cache.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from labs.integration import run_integration  # noqa: E402
from labs.vm.images import build_image  # noqa: E402
from labs.vm.qemu import QemuLab  # noqa: E402

TARGET_WARM_TEST_S = 300.0


def quiet(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def timed_build(kernel: str, cache: str = "") -> float:
    saved = os.environ.get("PROBEKIT_CACHE")
    if cache:
        os.environ["PROBEKIT_CACHE"] = cache
    try:
        started = time.monotonic()
        build_image(kernel, progress=quiet)
        return time.monotonic() - started
    finally:
        if cache:
            if saved is None:
                del os.environ["PROBEKIT_CACHE"]
            else:
                os.environ["PROBEKIT_CACHE"] = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", default="6.1")
    parser.add_argument("--skip-cold", action="store_true", help="skip the cold image build (~4 min)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    figures: Dict[str, float] = {}
    if not args.skip_cold:
        cold_cache = tempfile.mkdtemp(prefix="probekit-bench-cache-")
        try:
            figures["image_build_cold_s"] = timed_build(args.kernel, cold_cache)
        finally:
            shutil.rmtree(cold_cache, ignore_errors=True)
    timed_build(args.kernel)  # make sure the normal cache holds it
    figures["image_build_cached_s"] = timed_build(args.kernel)

    lab = QemuLab(kernel=args.kernel, name="bench", ssh=False, progress=quiet)
    lab.down()
    lab.up()
    figures["boot_to_ready_s"] = lab.timings["boot"]
    figures["nfs_export_and_mounts_s"] = lab.timings["nfs"]
    figures["up_total_s"] = lab.timings["up"]
    lab.down()

    artifacts = Path(tempfile.mkdtemp(prefix="probekit-bench-artifacts-"))
    started = time.monotonic()
    report = run_integration(QemuLab(kernel=args.kernel, name="bench", ssh=False, progress=quiet),
                             artifacts, progress=quiet)
    figures["labs_test_warm_s"] = time.monotonic() - started
    figures["labs_test_passed"] = float(report.passed)
    for name, value in report.timings.items():
        figures[f"labs_test_{name}_s"] = value
    shutil.rmtree(artifacts, ignore_errors=True)

    print(f"QEMU lab, kernel {report.kernel_release or args.kernel}")
    for name, value in figures.items():
        print(f"  {name:<32} {value:8.1f}")
    if "image_build_cold_s" in figures:
        print(f"  cached/cold image ratio           {figures['image_build_cached_s'] / figures['image_build_cold_s']:.5f}")
    verdict = "meets" if figures["labs_test_warm_s"] <= TARGET_WARM_TEST_S else "MISSES"
    print(f"  warm labs test {figures['labs_test_warm_s']:.0f} s {verdict} the {TARGET_WARM_TEST_S:.0f} s target "
          f"({figures['labs_test_warm_s'] / TARGET_WARM_TEST_S:.2f} of it)")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()

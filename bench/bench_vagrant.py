"""Vagrant lab benchmark: box packaging (cold and cached), `vagrant up` of the pair, and a
full integration run (`labs test --backend vagrant --topology pair`), in one process.

Run as root on the lab host, with no other lab of yours running (TCG is CPU-bound):

    .venv/bin/python bench/bench_vagrant.py              # box + up/down + full labs test
    .venv/bin/python bench/bench_vagrant.py --skip-test  # box + up/down only
    .venv/bin/python bench/bench_vagrant.py --json out.json

The image itself is built (or reused) by labs.vm.images first and timed separately: its
cold build is the image builder's number (bench it there). Ratios at the end compare
steps measured in this same run, so a busy host slows all of them alike.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from labs.integration import run_integration  # noqa: E402
from labs.vm.images import build_image  # noqa: E402
from labs.vm.libvirt_daemons import ensure_daemons  # noqa: E402
from labs.vm.vagrant import VagrantLab  # noqa: E402
from labs.vm.vagrant_box import box_installed, box_name, ensure_box  # noqa: E402


def timed(label: str, results: Dict[str, float], fn) -> object:
    started = time.monotonic()
    out = fn()
    results[label] = round(time.monotonic() - started, 1)
    print(f"{label:<28} {results[label]:8.1f} s", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", default="6.1")
    parser.add_argument("--skip-test", action="store_true", help="no full integration run")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()
    quiet = lambda message: None  # noqa: E731
    results: Dict[str, float] = {}
    ensure_daemons()
    image = timed("image (build or cached)", results, lambda: build_image(args.kernel, progress=quiet))
    name = box_name(image)
    if box_installed(name):
        subprocess.run(["vagrant", "box", "remove", "--force", name], check=True, capture_output=True)
    timed("box cold (package + add)", results, lambda: ensure_box(image, progress=quiet))
    timed("box cached", results, lambda: ensure_box(image, progress=quiet))

    lab = VagrantLab(kernel=args.kernel, topology="pair", name="bench")
    lab.progress = quiet
    lab.down()
    timed("pair up (to NFS mounted)", results, lab.up)
    results.update({f"  {k}": round(v, 1) for k, v in lab.timings.items()})
    timed("pair down", results, lab.down)

    if not args.skip_test:
        with tempfile.TemporaryDirectory(prefix="bench-vagrant-") as artifacts:
            lab = VagrantLab(kernel=args.kernel, topology="pair", name="bench")
            report = timed("full labs test (pair)", results,
                           lambda: run_integration(lab, Path(artifacts), progress=quiet))
            results["full labs test passed"] = float(report.passed)  # type: ignore[attr-defined]

    up = results["pair up (to NFS mounted)"]
    print(f"ratio box cold / pair up:    {results['box cold (package + add)'] / up:.2f}")
    if "full labs test (pair)" in results:
        print(f"ratio full test / pair up:   {results['full labs test (pair)'] / up:.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()

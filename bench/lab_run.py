"""Host side of the benchmarks that measure inside a lab guest: boot a lab (6.1 unless told; or use one
that is up), run the benchmark's guest half from the project share, print its report and
its JSON; a lab booted here goes down again, on SIGTERM too."""
from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence, Union

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def help_asked(argv: Sequence[str], doc: Optional[str]) -> bool:
    """-h or --help: the script's docstring (what it measures, its options and examples) printed,
    and nothing booted."""
    if "-h" not in argv and "--help" not in argv:
        return False
    print((doc or "").strip())
    return True


def run_in_lab(lab_name: Optional[str], name: str, guest_command: Union[str, Callable[[], str]], timeout: int,
               report: Callable[[Dict[str, Any]], str], kernel: str = "6.1",
               prepare: Optional[Callable[[Any], None]] = None) -> int:
    """`guest_command` runs in the share (e.g. `python3 bench/x.py --in-guest`) and prints
    its JSON last; 0 when it did. `prepare(lab)` runs first (e.g. installs packages). A callable
    `guest_command` is called once the lab is up (e.g. to give the guest what time is left)."""
    sys.path.insert(0, PROJECT)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: the lab below goes down
    from labs.cli import attach_lab
    from labs.vm.qemu import QemuLab
    lab = attach_lab(lab_name) if lab_name else QemuLab(kernel=kernel, topology="single", name=name,
                                                       ssh=False, progress=print)
    if not lab_name:
        lab.up()
    try:
        if prepare is not None:
            prepare(lab)
        share = getattr(lab, "guest_project_dir", "/opt/probekit")
        command = guest_command() if callable(guest_command) else guest_command
        res = lab.run(f"cd {share} && {command}", timeout=timeout)
        if res.exit_code != 0:
            print(res.stdout, res.stderr, file=sys.stderr)
            return 1
        data = json.loads(res.stdout.strip().splitlines()[-1])
        print(report(data))
        print(json.dumps(data))
        return 0
    finally:
        if not lab_name:
            lab.down()


def install_probekit(lab: Any) -> None:
    """probekit's Debian package of this tree installed in the guest, as the lab tests do (its
    tools then run from /usr/bin with their bytecode, not from the 9p share)."""
    from labs.install import install_tools
    install_tools(lab, Path(tempfile.mkdtemp(prefix="probekit-bench-")))

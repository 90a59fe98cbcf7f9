"""What each attach method adds to an NFS read: ours with fentry/fexit, ours with kprobes
(`--kprobes`), and Debian's nfsslower-bpfcc (kprobes), one after the other in one guest.

Why not bpf_stats: run_time_ns counts only the BPF program's body, which is the same code
for fentry and kprobes; what fentry saves is the way in (an int3 or ftrace handler and a
kretprobe's return trampoline against a direct call from a BPF trampoline). So this times
the traced operation itself: a loop of cached 4 KiB preads on the NFSv3 mount (each one
nfs_file_read, no RPC), with nothing attached and with each tool attached alone at its
default threshold (nothing printed). Added time per read = (median loop with the tool -
median loop with none) / reads. States run in the order none, A, B, C, none, C, B, A, none
(each tool started twice, once in each half), so a drift of the host's speed meets every
tool alike. Needs bcc 0.28+ and the nfs module's BTF for the fentry figure (trixie's bcc:
the 6.12 and 7.x labs); elsewhere ours falls back to kprobes and says so.

  python3 bench/bench_attach.py                 # host: boot a 7.3 lab, run, tear down
  python3 bench/bench_attach.py --kernel 6.12   # another lab kernel
  python3 bench/bench_attach.py --lab NAME      # host: a lab that is already up
  python3 bench/bench_attach.py --in-guest      # inside a guest (root, bcc, NFS mounts)
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

from bench_probes import BCC, OURS, start, wait_for
from lab_run import run_in_lab

PATH = "/mnt/nfs3/work/bench/attach.bin"
READS = 20000
LOOPS = 25  # loops timed per visit of a state; the median over its visits counts
TOOLS = {"fentry": OURS + ["-v"], "kprobes": OURS + ["-v", "--kprobes"], "bcc": BCC}
ORDER = ("none", "fentry", "kprobes", "bcc", "none", "bcc", "kprobes", "fentry", "none")


def read_loops(reads: int, loops: int) -> List[float]:
    """Seconds per loop of `reads` cached 4 KiB preads of one page."""
    fd = os.open(PATH, os.O_RDONLY)
    try:
        os.pread(fd, 4096, 0)  # the page cached (and the attributes fresh) before timing
        out = []
        for _ in range(loops):
            began = time.perf_counter()
            for _ in range(reads):
                os.pread(fd, 4096, 0)
            out.append(time.perf_counter() - began)
        return out
    finally:
        os.close(fd)


def attached_kinds(log: str) -> str:
    """Our tool's --verbose `attach:` verdict (bcc's tool: kprobes)."""
    with open(log) as handle:
        for line in handle:
            if ": attach: " in line:
                return line.split(": attach: ", 1)[1].strip()
    return "kprobes (nfsslower-bpfcc)"


def in_guest(reads: int, loops: int) -> Dict[str, Any]:
    os.makedirs(os.path.dirname(PATH), exist_ok=True)
    with open(PATH, "wb") as handle:
        handle.write(b"x" * 4096)
    seconds: Dict[str, List[float]] = {state: [] for state in TOOLS}
    seconds["none"] = []
    how: Dict[str, str] = {}
    startup: Dict[str, List[float]] = {name: [] for name in TOOLS}
    for step, state in enumerate(ORDER):
        if state == "none":
            seconds[state] += read_loops(reads, loops)
            continue
        log = f"/tmp/bench-attach-{state}-{step}.out"
        proc = start(TOOLS[state], log)
        try:
            startup[state].append(wait_for(log, proc, lambda lines: any(l.startswith("TIME ") for l in lines)))
            how[state] = attached_kinds(log)
            seconds[state] += read_loops(reads, loops)
        finally:
            proc.terminate()
            proc.wait(120)
    base = statistics.median(seconds["none"])
    added = {name: (statistics.median(seconds[name]) - base) / reads * 1e9 for name in TOOLS}
    ratio = lambda a, b: added[a] / added[b] if added[b] > 0 else None
    return {"kernel": os.uname().release, "reads": reads, "loops": loops, "order": ORDER,
            "seconds": seconds, "attach": how, "startup_s": startup,
            "none_ns_per_read": base / reads * 1e9, "added_ns_per_read": added,
            "ratios": {"fentry_over_kprobes": ratio("fentry", "kprobes"), "fentry_over_bcc": ratio("fentry", "bcc"),
                       "kprobes_over_bcc": ratio("kprobes", "bcc")}}


def report(res: Dict[str, Any]) -> str:
    fmt = lambda value: f"{value:.2f}" if value is not None else "n/a"
    added, ratio = res["added_ns_per_read"], res["ratios"]
    lines = [f"bench_attach on {res['kernel']}: {res['reads']} cached 4 KiB NFSv3 preads x {res['loops']} loops "
             f"per state, states {' '.join(res['order'])}",
             f"  nothing attached: {res['none_ns_per_read']:.0f} ns per read (median loop)"]
    for name in ("fentry", "kprobes", "bcc"):
        lines.append(f"  {name:<8} +{added[name]:.0f} ns per read; attach: {res['attach'].get(name, '?')}")
    lines.append(f"  ratios of the added time: fentry/kprobes {fmt(ratio['fentry_over_kprobes'])}, "
                 f"fentry/nfsslower-bpfcc {fmt(ratio['fentry_over_bcc'])} (target <= 0.5), "
                 f"kprobes/nfsslower-bpfcc {fmt(ratio['kprobes_over_bcc'])}")
    return "\n".join(lines)


def main(argv: List[str]) -> int:
    reads = int(argv[argv.index("--reads") + 1]) if "--reads" in argv else READS
    loops = int(argv[argv.index("--loops") + 1]) if "--loops" in argv else LOOPS
    if "--in-guest" in argv:
        print(json.dumps(in_guest(reads, loops)))
        return 0
    lab: Optional[str] = argv[argv.index("--lab") + 1] if "--lab" in argv else None
    kernel = argv[argv.index("--kernel") + 1] if "--kernel" in argv else "7.3"
    return run_in_lab(lab, "bench-attach", f"python3 bench/bench_attach.py --in-guest --reads {reads} --loops {loops}",
                      3600, report, kernel=kernel)


if __name__ == "__main__":
    sys.exit(main(sys.argv))

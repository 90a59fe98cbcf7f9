"""What our probes add to an NFS read, tool against tool, one after the other in one guest.

The comparisons (--set):
- attach (default): ours with fentry/fexit, ours with kprobes (`--kprobes`) and Debian's
  nfsslower-bpfcc (kprobes), each at its default threshold (nothing printed). Needs bcc
  0.28+ and the nfs module's BTF for the fentry figure (trixie's bcc: the 6.12 lab;
  trixie's nfsslower-bpfcc does not compile against 7.3's headers).
- identity: nfsdist against nfsdist --per-mount (each operation's mount found at its
  start: the identity capture the exporter always does). Target: at most 1.1x.
- core: the installed nfsslower (probekit's Debian package, which the host installs first)
  on `--backend core` against `--backend bcc`, both with fentry/fexit where the loader can
  (bcc 0.28+: the 6.12 lab). Target: core at most 1.0x bcc.
- core-tree: the same two loaders run from the tree shared into the guest (no package built
  or installed: the CO-RE objects the host built last, `python -m probes.build_core`), to
  compare one object against another in one boot.
- dist-tree: the same with nfsdist (each operation into its histogram and totals: the path the
  exporter's programs take, where nfsslower's take the event's).
- core-trees: nfsslower on core from each tree given (`--tree NAME=PATH`, paths in the share,
  each with its CO-RE objects built), the last against the first: one object against another
  on the same reads, without bcc's noise between them.

Two measures per tool: the added time per read, and the BPF programs' own run time per
run (kernel.bpf_stats_enabled), with each program's size after the verifier and the JIT
(its runs and time apart, under "programs"). The second covers only the program body, the same code for
fentry and kprobes: what fentry saves is the way in (an ftrace or int3 handler and a
kretprobe's return trampoline against a direct call from a BPF trampoline), which only the
first shows. The operation: a loop of cached 4 KiB preads of one page on the NFSv3 mount
(each one nfs_file_read, no RPC), timed with nothing attached and with each tool alone.
Added time per read = (median loop with the tool - median loop with none) / reads. States
run none, A, B, C, none, C, B, A, none (each tool started twice, once in each half), so a
drift of the host's speed meets every tool alike (`--visits N`: N such passes). With
`--together` the tools are attached at once instead (none, A+B, none, B+A, none: each read runs
every tool's programs, in the order they were started): a host that slows the guest then
slows every program alike, and the ratio is of their BPF time per run.

  python3 bench/bench_attach.py                  # host: boot a 6.12 lab, run, tear down
  python3 bench/bench_attach.py --set identity   # nfsdist with and without --per-mount
  python3 bench/bench_attach.py --set core --visits 3  # the installed nfsslower, core against bcc
  python3 bench/bench_attach.py --set core-tree --together --lab NAME  # both loaders on each read
  python3 bench/bench_attach.py --set dist-tree --together --lab NAME  # the same with nfsdist
  python3 bench/bench_attach.py --set core-trees --together --tree before=.before --tree after=.
  python3 bench/bench_attach.py --kernel 7.3     # another lab kernel
  python3 bench/bench_attach.py --lab NAME       # host: a lab that is already up
  python3 bench/bench_attach.py --in-guest       # inside a guest (root, bcc, NFS mounts)
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from bench_probes import BCC, OURS, prog_stats, start, wait_for
from bench_scale import parse_trees
from lab_run import help_asked, install_probekit, run_in_lab

PATH = "/mnt/nfs3/work/bench/attach.bin"
READS = 20000
LOOPS = 25  # loops timed per visit of a state; the median over its visits counts
DIST = OURS[:-1] + ["nfsdist"]
#: the packaged nfsslower as a user runs it: without the lab agent's PYTHONPATH (the source share)
INSTALLED = ["env", "-u", "PYTHONPATH", sys.executable, "-u", "/usr/sbin/nfsslower"]
#: per set: the tools (name -> command), what a ready tool's output starts a line with, and
#: the ratios of added time reported (numerator, denominator, target or None)
SETS: Dict[str, Tuple[Dict[str, List[str]], str, List[Tuple[str, str, Optional[float]]]]] = {
    "attach": ({"fentry": OURS + ["-v"], "kprobes": OURS + ["-v", "--kprobes"], "bcc": BCC}, "TIME ",
               [("fentry", "kprobes", None), ("fentry", "bcc", 0.5), ("kprobes", "bcc", None)]),
    "identity": ({"plain": DIST + ["-v", "99"], "per_mount": DIST + ["-v", "--per-mount", "99"]}, "Tracing",
                 [("per_mount", "plain", 1.1)]),
    "core": ({"core": INSTALLED + ["-v", "--backend", "core"], "bcc": INSTALLED + ["-v", "--backend", "bcc"]},
             "TIME ", [("core", "bcc", 1.0)]),
    "core-tree": ({"core": OURS + ["-v", "--backend", "core"], "bcc": OURS + ["-v", "--backend", "bcc"]},
                  "TIME ", [("core", "bcc", 1.0)]),
    "dist-tree": ({"core": DIST + ["-v", "--backend", "core", "99"], "bcc": DIST + ["-v", "--backend", "bcc", "99"]},
                  "Tracing", [("core", "bcc", 1.0)]),
}
#: sets that run the installed package (the host installs it before the guest half)
PACKAGED = {"core"}


def tree_set(trees: Dict[str, str]) -> Tuple[Dict[str, List[str]], str, List[Tuple[str, str, Optional[float]]]]:
    """--set core-trees: each tree's nfsslower on core, run from that tree (its own objects)."""
    tools = {name: ["env", "-C", path, f"PYTHONPATH={path}", sys.executable, "-u", "-m", "probes.commands",
                    "nfsslower", "-v", "--backend", "core"] for name, path in trees.items()}
    names = list(trees)
    return tools, "TIME ", [(names[-1], names[0], None)]


def order(tools: Sequence[str], visits: int = 2) -> List[str]:
    """none, then `visits` passes over the tools, each the reverse of the one before and
    followed by none (two: none, A, B, none, B, A, none)."""
    states = ["none"]
    for visit in range(visits):
        states += [*(tools if visit % 2 == 0 else reversed(tools)), "none"]
    return states


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
    """Our tool's --verbose `backend:` and `attach:` verdicts (bcc's tool: kprobes)."""
    said = []
    with open(log) as handle:
        for line in handle:
            for what in (": backend: ", ": attach: "):
                if what in line:
                    said.append(what.strip(" :") + ": " + line.split(what, 1)[1].strip())
    return "; ".join(said) or "kprobes (nfsslower-bpfcc)"


def together_order(tools: Sequence[str], visits: int = 2) -> List[str]:
    """none, then `visits` states of every tool attached at once, started in turn in one order
    and then the reverse (a trampoline runs its programs in the order they were attached)."""
    states = ["none"]
    for visit in range(visits):
        states += ["+".join(tools if visit % 2 == 0 else reversed(tools)), "none"]
    return states


def in_guest(name: str, reads: int, loops: int, visits: int = 2, together: bool = False,
             trees: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    tools, ready, ratios = tree_set(trees or {}) if name == "core-trees" else SETS[name]
    os.makedirs(os.path.dirname(PATH), exist_ok=True)
    with open(PATH, "wb") as handle:
        handle.write(b"x" * 4096)
    states = together_order(list(tools), visits) if together else order(list(tools), visits)
    seconds: Dict[str, List[float]] = {state: [] for state in ["none", *(["together"] if together else tools)]}
    bpf = {tool: [0, 0] for tool in tools}  # [runs, ns]
    programs: Dict[str, Dict[str, Dict[str, int]]] = {tool: {} for tool in tools}
    how: Dict[str, str] = {}
    startup: Dict[str, List[float]] = {tool: [] for tool in tools}
    subprocess.run(["sysctl", "-q", "-w", "kernel.bpf_stats_enabled=1"], check=True)
    try:
        for step, state in enumerate(states):
            if state == "none":
                seconds[state] += read_loops(reads, loops)
                continue
            procs = []
            owned: Dict[str, List[int]] = {}  # per tool, the programs it loaded
            try:
                for tool in state.split("+"):
                    log = f"/tmp/bench-attach-{tool}-{step}.out"
                    existing = set(prog_stats())
                    procs.append(start(tools[tool], log))
                    startup[tool].append(wait_for(log, procs[-1],
                                                  lambda lines: any(l.startswith(ready) for l in lines)))
                    how[tool] = attached_kinds(log)
                    owned[tool] = sorted(set(prog_stats()) - existing)
                before = prog_stats()
                seconds["together" if together else state] += read_loops(reads, loops)
                after = prog_stats()
                for tool, ids in owned.items():
                    named: Dict[str, int] = {}
                    for prog in ids:
                        runs = after[prog].get("run_cnt", 0) - before[prog].get("run_cnt", 0)
                        ns = after[prog].get("run_time_ns", 0) - before[prog].get("run_time_ns", 0)
                        bpf[tool][0] += runs
                        bpf[tool][1] += ns
                        # bcc names a function's entry and exit programs alike: the second is NAME.1
                        program = after[prog].get("name", str(prog))
                        named[program] = named.get(program, -1) + 1
                        if runs:
                            add_program(programs[tool], f"{program}.{named[program]}" if named[program] else program,
                                        after[prog], runs, ns)
            finally:
                for proc in procs:
                    proc.terminate()
                    proc.wait(120)
    finally:
        subprocess.run(["sysctl", "-q", "-w", "kernel.bpf_stats_enabled=0"], check=False)
    base = statistics.median(seconds["none"])
    added = {state: (statistics.median(seconds[state]) - base) / reads * 1e9 for state in seconds if state != "none"}
    per_run = {tool: ns / runs if runs else None for tool, (runs, ns) in bpf.items()}
    # attached together, the added time is the tools' sum: the ratio is of their programs' time per run
    compared = per_run if together else added
    return {"set": name, "kernel": os.uname().release, "reads": reads, "loops": loops, "order": states,
            "together": together, "seconds": seconds, "attach": how, "startup_s": startup,
            "none_ns_per_read": base / reads * 1e9, "added_ns_per_read": added,
            "bpf_ns_per_run": per_run, "programs": programs,
            "ratios": [[a, b, compared[a] / compared[b] if compared[b] else None, target] for a, b, target in ratios]}


def add_program(seen: Dict[str, Dict[str, int]], name: str, prog: Dict[str, Any], runs: int, ns: int) -> None:
    """One program's runs and time over a visit's loops, added to its earlier visits', with its
    size after the verifier (bytes_xlated: what is left once it pruned the branches a setting
    turns off) and the JIT's: the steady part of what a run costs, beside the noisy time."""
    mine = seen.setdefault(name, {"run_cnt": 0, "run_time_ns": 0})
    mine["run_cnt"] += runs
    mine["run_time_ns"] += ns
    mine["bytes_xlated"] = prog.get("bytes_xlated", 0)
    mine["bytes_jited"] = prog.get("bytes_jited", 0)


def per_visit(res: Dict[str, Any]) -> Dict[str, List[float]]:
    """Per tool, the added ns per read of each visit: its median loop against the mean of the
    two nothing-attached visits around it (the spread the medians over all visits hide)."""
    loops, reads, taken = res["loops"], res["reads"], {state: 0 for state in res["seconds"]}
    medians = []
    for state in res["order"]:
        state = "together" if "+" in state else state
        start = taken[state] * loops
        medians.append(statistics.median(res["seconds"][state][start:start + loops]))
        taken[state] += 1
    nones = [i for i, state in enumerate(res["order"]) if state == "none"]
    out: Dict[str, List[float]] = {}
    for i, state in enumerate(res["order"]):
        if state != "none":
            before, after = max(j for j in nones if j < i), min(j for j in nones if j > i)
            base = (medians[before] + medians[after]) / 2
            out.setdefault(state, []).append((medians[i] - base) / reads * 1e9)
    return out


def report(res: Dict[str, Any]) -> str:
    fmt = lambda value: f"{value:.2f}" if value is not None else "n/a"
    lines = [f"bench_attach --set {res['set']} on {res['kernel']}: {res['reads']} cached 4 KiB NFSv3 preads "
             f"x {res['loops']} loops per visit, states {' '.join(res['order'])}",
             f"  nothing attached: {res['none_ns_per_read']:.0f} ns per read (median loop)"]
    added = res["added_ns_per_read"]
    if res.get("together"):
        lines.append(f"  all attached at once: +{added['together']:.0f} ns per read")
    for tool, per_run in res["bpf_ns_per_run"].items():
        said = [f"+{added[tool]:.0f} ns per read"] if tool in added else []
        said += [f"BPF {per_run:.0f} ns per program run"] if per_run is not None else []
        lines.append(f"  {tool:<9} {', '.join(said)}")
        lines.append(f"            attach: {res['attach'].get(tool, '?')}")
        for prog, seen in sorted(res.get("programs", {}).get(tool, {}).items()):
            lines.append(f"            {prog}: {seen['run_time_ns'] / seen['run_cnt']:.0f} ns per run over "
                         f"{seen['run_cnt']} runs, {seen['bytes_xlated']} bytes xlated, {seen['bytes_jited']} jited")
    lines.append("  added ns per read by visit (against the nothing-attached visits around it): " + "; ".join(
        f"{tool} {', '.join(f'{value:+.0f}' for value in values)}" for tool, values in per_visit(res).items()))
    lines.append(("  ratios of the BPF time per run: " if res.get("together") else "  ratios of the added time: ")
                 + ", ".join(f"{a}/{b} {fmt(value)}" + (f" (target <= {target})" if target else "")
                             for a, b, value, target in res["ratios"]))
    return "\n".join(lines)


def main(argv: List[str]) -> int:
    if help_asked(argv, __doc__):
        return 0
    reads = int(argv[argv.index("--reads") + 1]) if "--reads" in argv else READS
    loops = int(argv[argv.index("--loops") + 1]) if "--loops" in argv else LOOPS
    visits = int(argv[argv.index("--visits") + 1]) if "--visits" in argv else 2
    name = argv[argv.index("--set") + 1] if "--set" in argv else "attach"
    if name not in [*SETS, "core-trees"]:
        print(f"bench_attach: --set {name}: choose one of {', '.join(SETS)}, core-trees", file=sys.stderr)
        return 2
    if name == "core-trees" and argv.count("--tree") < 2:
        print("bench_attach: --set core-trees needs two trees or more (--tree NAME=PATH)", file=sys.stderr)
        return 2
    together = "--together" in argv
    trees = " ".join(f"--tree {argv[i + 1]}" for i, arg in enumerate(argv[:-1]) if arg == "--tree")
    if "--in-guest" in argv:
        print(json.dumps(in_guest(name, reads, loops, visits, together, parse_trees(argv))))
        return 0
    lab: Optional[str] = argv[argv.index("--lab") + 1] if "--lab" in argv else None
    kernel = argv[argv.index("--kernel") + 1] if "--kernel" in argv else "6.12"
    command = (f"python3 bench/bench_attach.py --in-guest --set {name} --reads {reads} --loops {loops} "
               f"--visits {visits}{' --together' if together else ''} {trees}")
    return run_in_lab(lab, "bench-attach", command, 3600, report, kernel=kernel,
                      prepare=install_probekit if name in PACKAGED else None)


if __name__ == "__main__":
    sys.exit(main(sys.argv))

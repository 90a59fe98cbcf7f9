"""Our generated nfsslower against Debian's nfsslower-bpfcc, side by side in one lab guest.

Measures, in the same guest on the same workload (three tools attached at once: ours with
in-flight tracking (the default), ours without it (`--stall-interval 0`), and bcc's):
- BPF cost per event: kernel.bpf_stats_enabled=1, then run_time_ns / run_cnt summed over
  each tool's programs (bpftool prog show: the programs that appeared when it started; Debian's
  bpftool lists no owner pids, and nothing else loads programs meanwhile), over the fixed
  workload run four times with attach orders rotated (ROTATION) so that ours and bcc each
  come first once (runs 1-2) and ours with and without in-flight tracking each come first
  twice (runs 1-4), all at their default 10 ms, after a short warm-up; targets: ours/bcc
  <= 1.0, in-flight on/off <= 1.1. Also per attach order and per operation group.
- start-up time to first event: spawn -> first event line while O_SYNC writes (> 10 ms
  under TCG) keep coming; bcc compiles its C at start (70-125 s under TCG); target ratio <= 0.5.

  python3 bench/bench_probes.py            # host: boot the QEMU lab (6.1), run, tear down
  python3 bench/bench_probes.py --lab NAME # host: use a lab that is already up
  python3 bench/bench_probes.py --lab NAME --spec /tmp/other.json  # ours with another spec
  python3 bench/bench_probes.py --in-guest # inside a guest (root, bcc, NFS mounts)
  python3 bench/bench_probes.py --in-guest --solo "nfsslower 0"  # ours alone, per program
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

from lab_run import help_asked, run_in_lab

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MOUNTS = ("/mnt/nfs3", "/mnt/nfs42")
#: both unbuffered (-u): bcc's tool prints to a file block-buffered otherwise
OURS = [sys.executable, "-u", "-m", "probes.commands", "nfsslower"]
BCC = [sys.executable, "-u", "/usr/sbin/nfsslower-bpfcc"]
#: the tools compared; "ours" keeps operations in flight readable (stall lines), "ours_off" not
TOOLS = ("ours", "ours_off", "bcc")
#: the tool restarted (so attached last) before each run after the first: attach orders
#: ours<off<bcc, off<bcc<ours, bcc<ours<off, bcc<off<ours. bcc is never restarted (its
#: compile takes minutes under TCG)
ROTATION = (None, "ours", "ours_off", "ours")
#: which runs each ratio is taken over (balanced attach orders for that pair)
OURS_BCC_RUNS, ON_OFF_RUNS = (0, 1), (0, 1, 2, 3)


def workload(rounds: int) -> int:
    """Fixed mix per mount: stat, 4 KiB pread, 4 KiB write, fsync every 10 rounds."""
    issued = 0
    for mount in MOUNTS:
        work = os.path.join(mount, "work", "bench")
        os.makedirs(work, exist_ok=True)
        path = os.path.join(work, "data.bin")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        for i in range(rounds):
            os.stat(path)
            os.pwrite(fd, b"x" * 4096, i * 4096)
            os.pread(fd, 4096, i * 4096)
            issued += 3
            if i % 10 == 9:
                os.fsync(fd)
                issued += 1
        os.close(fd)
    return issued


def prog_stats() -> Dict[int, Dict[str, Any]]:
    out = subprocess.run(["bpftool", "prog", "show", "--json"], stdout=subprocess.PIPE, check=True,
                         universal_newlines=True).stdout
    return {p["id"]: p for p in json.loads(out)}


def start(cmd: List[str], log: str) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=PROJECT, stdout=open(log, "w"), stderr=subprocess.STDOUT)


def wait_for(log: str, proc: subprocess.Popen, predicate: Any, timeout: float = 600, every: float = 0.2) -> float:
    """Seconds until predicate(the log's lines) holds, looked at every `every` seconds."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        with open(log) as handle:
            if predicate(handle.read().splitlines()):
                return time.monotonic() - started
        if proc.poll() is not None:
            raise RuntimeError(f"{log}: exited {proc.returncode}: {open(log).read()[-1500:]}")
        time.sleep(every)
    raise RuntimeError(f"{log}: timed out")


def event_lines(lines: List[str]) -> List[str]:
    """Lines after the `TIME COMM ...` header (both tools print the same header)."""
    for i, line in enumerate(lines):
        if line.startswith("TIME ") and "FILENAME" in line:
            return lines[i + 1:]
    return []


def cost_of(ids: set, before: Dict[int, Dict[str, Any]], after: Dict[int, Dict[str, Any]],
            issued: int) -> Dict[str, Any]:
    """BPF run time and runs of the programs `ids` between two bpftool snapshots."""
    delta = {i: (after[i].get("run_cnt", 0) - before[i].get("run_cnt", 0),
                 after[i].get("run_time_ns", 0) - before[i].get("run_time_ns", 0)) for i in ids}
    run_ns = sum(ns for _, ns in delta.values())
    runs = sum(cnt for cnt, _ in delta.values())
    per_program: Dict[str, List[int]] = {}
    for i in ids:  # a fentry and a fexit program share their function's name: summed
        total = per_program.setdefault(after[i].get("name", str(i)), [0, 0])
        total[0] += delta[i][0]
        total[1] += delta[i][1]
    return {"programs": len(ids), "run_time_ns": run_ns, "run_cnt": runs, "issued_ops": issued,
            "ns_per_run": run_ns / runs if runs else None, "per_program": per_program}


#: what each of bcc's programs times (its read and write entries share one program)
BCC_OPS = {"trace_rw_entry": "read+write", "trace_read_return": "read", "trace_write_return": "write",
           "trace_file_open_entry": "open", "trace_file_open_return": "open",
           "trace_getattr_entry": "getattr", "trace_getattr_return": "getattr",
           "raw_tracepoint__nfs_initiate_commit": "commit", "raw_tracepoint__nfs_commit_done": "commit"}
#: program groups compared op by op: read/write/open both tools time and print; bcc 0.26
#: runs its getattr programs too but never prints a getattr (its entry reads the argument of
#: an older nfs_getattr signature, so the name check at exit fails); fsync only ours times
GROUPS = {"read": "read/write/open", "write": "read/write/open", "read+write": "read/write/open",
          "open": "read/write/open", "getattr": "getattr", "fsync": "fsync", "commit": "commit"}


#: characters of a BPF program's name the kernel keeps (BPF_OBJ_NAME_LEN less the NUL)
BPF_NAME_CHARS = 15


def our_program_ops(spec: Optional[str]) -> Dict[str, str]:
    """Our BPF program names -> operation, from the same selection the tool makes here."""
    sys.path.insert(0, PROJECT)
    from pathlib import Path

    from probes.generate import tracepoint_program_name
    from probes.model import points_of
    from probes.runtime import DEFAULT_SPEC
    from probes.select import KernelFacts, select
    from discover.spec import DEFAULT_OPS, load_spec
    names: Dict[str, str] = {}
    chosen = select(load_spec(Path(spec) if spec else DEFAULT_SPEC), KernelFacts.live(), list(DEFAULT_OPS)).chosen
    for point in points_of(chosen, None):
        if point.kind == "kprobe":
            names[f"p{point.id}_kprobe"] = names[f"p{point.id}_kretprobe"] = point.op
            # attached as fentry/fexit (bcc 0.28+), the kernel names both programs after the function
            names[point.entry[:BPF_NAME_CHARS]] = names[point.exit[:BPF_NAME_CHARS]] = point.op
        else:
            for event in (point.entry, point.exit):
                names[tracepoint_program_name(event)[:BPF_NAME_CHARS]] = point.op
    return names


def by_group(cost: Dict[str, Any], ops: Dict[str, str]) -> Dict[str, List[int]]:
    """[runs, ns] per GROUPS group (programs of no known op under "other")."""
    out: Dict[str, List[int]] = {}
    for name, (runs, ns) in cost["per_program"].items():
        group = GROUPS.get(ops.get(name, ""), "other")
        total = out.setdefault(group, [0, 0])
        total[0] += runs
        total[1] += ns
    return out


def add_costs(parts: List[Dict[str, Any]]) -> Dict[str, Any]:
    runs = sum(p["run_cnt"] for p in parts)
    run_ns = sum(p["run_time_ns"] for p in parts)
    per_program: Dict[str, List[int]] = {}
    for part in parts:
        for name, (cnt, ns) in part["per_program"].items():
            total = per_program.setdefault(name, [0, 0])
            total[0] += cnt
            total[1] += ns
    return {"programs": parts[0]["programs"], "run_time_ns": run_ns, "run_cnt": runs,
            "issued_ops": sum(p["issued_ops"] for p in parts), "ns_per_run": run_ns / runs if runs else None,
            "per_program": per_program}


#: rounds run before each measurement: under TCG the first runs of a freshly loaded program
#: include translating its code (seen: 1 ms for one first run of bcc's open probe, 0.1 ms
#: for ours), a one-time cost of either tool, not a per-event one
WARMUP_ROUNDS = 10  # includes one fsync


def measure(progs: Dict[str, set], rounds: int) -> Dict[str, Dict[str, Any]]:
    workload(WARMUP_ROUNDS)
    time.sleep(1)
    before = prog_stats()
    issued = workload(rounds)
    time.sleep(1)
    after = prog_stats()
    return {name: cost_of(ids, before, after, issued) for name, ids in progs.items()}


def run_side_by_side(rounds: int, spec: Optional[str] = None) -> Dict[str, Any]:
    """The three TOOLS attached at once, the workload run once per ROTATION step, the step's
    tool restarted (so attached last) before it; each ratio sums the runs of its pair.

    Why rotate: on one function the kprobe attached last runs first, the tracepoint program
    attached first runs first, and under TCG the first program to run after user space or a
    sleep pays for cold TLB/translation caches that the next ones find warm (measured: the
    first of two write-entry kprobes costs 2-4x the second, whichever tool it belongs to;
    ours with and without in-flight tracking share the getattr tracepoint, bcc does not).
    Each pair compared over runs in which either comes first equally often cancels that.
    All run at their default threshold (10 ms), under the same host load; each tool's
    programs are the ones that appeared when it started.
    """
    ours_cmd = OURS + (["--spec", spec] if spec else [])
    cmds = {"ours": ours_cmd, "ours_off": ours_cmd + ["--stall-interval", "0"], "bcc": BCC}
    busy_cmd = ["sh", "-c", f"while :; do dd if=/dev/zero of={MOUNTS[0]}/work/busy.bin bs=4k count=1 "
                            "oflag=sync conv=notrunc status=none; sleep 0.2; done"]
    procs: Dict[str, subprocess.Popen] = {}
    progs: Dict[str, set] = {}
    order: List[str] = []
    logs: Dict[str, List[str]] = {name: [] for name in TOOLS}
    res: Dict[str, Any] = {"startup_s": {}, "cost": {}, "phases": {}}

    def launch(name: str) -> float:
        """Start one tool while O_SYNC writes (> 10 ms under TCG) come, until its first event."""
        busy = subprocess.Popen(busy_cmd)
        try:
            existing = set(prog_stats())
            log = f"/tmp/bench-{name}-{len(logs[name])}.out"
            logs[name].append(log)
            procs[name] = start(cmds[name], log)
            took = wait_for(log, procs[name], lambda lines: len(event_lines(lines)) > 0)
            progs[name] = set(prog_stats()) - existing
            order.append(name)
            return took
        finally:
            busy.kill()
            busy.wait()

    try:
        for name in TOOLS:
            res["startup_s"][name] = launch(name)
        for restart in ROTATION:
            if restart:
                order.remove(restart)
                procs[restart].terminate()
                procs[restart].wait(120)
                launch(restart)
            time.sleep(1)
            res["phases"]["attached " + " < ".join(order)] = measure(progs, rounds)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
                proc.wait(120)
    ours_ops = our_program_ops(spec)
    phases = list(res["phases"].values())
    for name, runs in (("ours", OURS_BCC_RUNS), ("bcc", OURS_BCC_RUNS), ("ours_off", OURS_BCC_RUNS),
                       ("ours_on_all", ON_OFF_RUNS), ("ours_off_all", ON_OFF_RUNS)):
        tool = name.replace("ours_on_all", "ours").replace("_all", "")
        res["cost"][name] = add_costs([phases[i][tool] for i in runs])
        res["cost"][name]["groups"] = by_group(res["cost"][name], BCC_OPS if tool == "bcc" else ours_ops)
    res["getattr_events_printed"] = {
        name: sum(1 for log in logs[name] for line in event_lines(open(log).read().splitlines())
                  if line[31:33].strip() == "G") for name in TOOLS}
    return res


def run_solo(tool_args: List[str], rounds: int) -> Dict[str, Any]:
    """One tool alone (ours: `nfsdist 1`; another: its path first), per-program cost over one workload.

    For finding where our BPF time goes without waiting for bcc's compile; not a ratio.
    """
    log = "/tmp/bench-solo.out"
    existing = set(prog_stats())
    command = tool_args if tool_args[0].startswith("/") else ["-m", "probes.commands"] + tool_args
    proc = start([sys.executable, "-u"] + command, log)
    try:
        startup = wait_for(log, proc, lambda lines: any(line.startswith(("Tracing", "{", "ENDTIME"))
                                                         for line in lines), timeout=900)
        ids = set(prog_stats()) - existing
        time.sleep(1)
        before = prog_stats()
        issued = workload(rounds)
        time.sleep(1)
        after = prog_stats()
    finally:
        proc.terminate()
        proc.wait(120)
    with open(log) as handle:
        lines = handle.read().splitlines()
    return {"kernel": os.uname().release, "rounds": rounds, "tool": tool_args, "startup_s": startup,
            "output_lines": len(lines), "cost": cost_of(ids, before, after, issued)}


def ns_ratio(ours: List[int], bcc: List[int]) -> Optional[float]:
    """ours ns/run over bcc ns/run, from [runs, ns] pairs."""
    if not ours[0] or not bcc[0] or not bcc[1]:
        return None
    return (ours[1] / ours[0]) / (bcc[1] / bcc[0])


def in_guest(rounds: int, spec: Optional[str] = None) -> Dict[str, Any]:
    subprocess.run(["sysctl", "-q", "-w", "kernel.bpf_stats_enabled=1"], check=True)
    try:
        res: Dict[str, Any] = {"kernel": os.uname().release, "rounds": rounds, "spec": spec}
        res.update(run_side_by_side(rounds, spec))
    finally:
        subprocess.run(["sysctl", "-q", "-w", "kernel.bpf_stats_enabled=0"], check=False)
    ours, off, bcc = res["cost"]["ours"], res["cost"]["ours_off"], res["cost"]["bcc"]
    pair = lambda c: [c["run_cnt"], c["run_time_ns"]]
    res["ratios"] = {
        "startup_ours_over_bcc": res["startup_s"]["ours"] / res["startup_s"]["bcc"],
        "cost_per_event_ours_over_bcc": ns_ratio(pair(ours), pair(bcc)),
        "cost_per_event_inflight_off_over_bcc": ns_ratio(pair(off), pair(bcc)),
        "cost_per_event_inflight_on_over_off": ns_ratio(pair(res["cost"]["ours_on_all"]),
                                                        pair(res["cost"]["ours_off_all"])),
        "total_bpf_ns_ours_over_bcc": ours["run_time_ns"] / bcc["run_time_ns"] if bcc["run_time_ns"] else None,
        "per_phase": {phase: [ns_ratio(pair(costs["ours"]), pair(costs["bcc"])),
                              ns_ratio(pair(costs["ours"]), pair(costs["ours_off"]))]
                      for phase, costs in res["phases"].items()},
        "per_group": {group: ns_ratio(ours["groups"][group], bcc["groups"].get(group, [0, 0]))
                      for group in ours["groups"]},
    }
    return res


def report(res: Dict[str, Any]) -> str:
    ours, bcc, ratio = res["cost"]["ours"], res["cost"]["bcc"], res["ratios"]
    per = lambda c: f"{c['ns_per_run']:.0f} ns/run" if c["ns_per_run"] else "n/a"
    fmt = lambda value: f"{value:.2f}" if value is not None else "n/a"
    lines = [
        f"bench_probes on {res['kernel']} (same guest, same workload, each attach order once)",
        f"  start-up to first event: ours {res['startup_s']['ours']:.1f} s, nfsslower-bpfcc "
        f"{res['startup_s']['bcc']:.1f} s -> ratio {ratio['startup_ours_over_bcc']:.2f} (target <= 0.5)",
        f"  BPF cost per event: ours {per(ours)} ({ours['run_cnt']} runs, {ours['programs']} progs), "
        f"bcc {per(bcc)} ({bcc['run_cnt']} runs, {bcc['programs']} progs) -> ratio "
        f"{fmt(ratio['cost_per_event_ours_over_bcc'])} (target <= 1.0)",
        f"  in-flight tracking (runs 1-4): on {per(res['cost']['ours_on_all'])}, off "
        f"{per(res['cost']['ours_off_all'])} -> on/off {fmt(ratio['cost_per_event_inflight_on_over_off'])} "
        f"(target <= 1.1); off/bcc (runs 1-2) {fmt(ratio['cost_per_event_inflight_off_over_bcc'])}",
        "    by attach order (ours/bcc, on/off): " + ", ".join(
            f"{phase}: {fmt(values[0])}, {fmt(values[1])}" for phase, values in ratio["per_phase"].items()),
        "    getattr events printed: " + ", ".join(f"{name} {count}"
                                                  for name, count in res["getattr_events_printed"].items()),
    ]
    for group, (runs, ns) in sorted(ours["groups"].items()):
        theirs = bcc["groups"].get(group, [0, 0])
        lines.append(f"    {group:<16} ours {runs:5d} runs {ns / runs / 1000 if runs else 0:6.1f} us/run, "
                     f"bcc {theirs[0]:5d} runs {theirs[1] / theirs[0] / 1000 if theirs[0] else 0:6.1f} us/run "
                     f"-> {fmt(ratio['per_group'][group])}")
    if ratio["total_bpf_ns_ours_over_bcc"]:
        lines.append(f"  total BPF time for the workload: ours/bcc {ratio['total_bpf_ns_ours_over_bcc']:.2f} "
                     "(ours also times fsync)")
    return "\n".join(lines)


def on_host(lab_name: Optional[str], rounds: int, spec: Optional[str] = None) -> int:
    extra = f" --spec {spec}" if spec else ""
    return run_in_lab(lab_name, "bench-probes", f"python3 bench/bench_probes.py --in-guest --rounds {rounds}{extra}",
                      1800, report)


def main(argv: List[str]) -> int:
    if help_asked(argv, __doc__):
        return 0
    rounds = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else 100
    #: a probe spec for our tool (a path in the guest), e.g. to compare attach points
    spec = argv[argv.index("--spec") + 1] if "--spec" in argv else None
    if "--in-guest" in argv:
        if "--solo" in argv:
            subprocess.run(["sysctl", "-q", "-w", "kernel.bpf_stats_enabled=1"], check=True)
            try:
                print(json.dumps(run_solo(argv[argv.index("--solo") + 1].split(), rounds)))
            finally:
                subprocess.run(["sysctl", "-q", "-w", "kernel.bpf_stats_enabled=0"], check=False)
            return 0
        print(json.dumps(in_guest(rounds, spec)))
        return 0
    return on_host(argv[argv.index("--lab") + 1] if "--lab" in argv else None, rounds, spec)


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""nfsslower under a write load on one vCPU: every operation the workload issued, counted or
reported missed, on both loaders (issue 33 item 4, issue 34 item 4).

The load: WRITERS processes at once, each ROUNDS rounds of create (O_CREAT|O_EXCL), a 4 KiB
write, close, stat and unlink of a file of its own in /mnt/nfs3 (NFSv3). The tool:
`nfsslower --ops all --json 0` (every operation and RPC printed), run alone per loader and per
tree, in one guest (7.3 unless told; its Debian kernel is preemptible). Per op (create, open,
write, getattr, unlink) what the writers issued against the lines the tool printed for the
writers' processes, and what the tool said it did not count ("warning: not counted: ..." on
stderr, per cause: the kernel's skipped runs, kprobe misses, the starts the probe could not
store) over the whole run. Beside them, what makes a miss possible on that kernel: its
preemption model (/boot/config) and whether task storage still has its per-CPU busy counter
(/proc/kallsyms).

Trees: `--tree NAME=PATH` (repeatable) runs the tool of another checkout in the share (a copy
of main with its CO-RE objects built as `.before`: `--tree before=.before --tree after=.`);
default the share's own, as "after". `--attach fentry,kprobes` (default fentry): the tool as
it chooses (fentry/fexit where the kernel and loader can), and/or with `--kprobes` (kprobe pairs
instead of fentry/fexit). `--runs N` repeats every (tree, loader, attach) N times, alternated.

  flock /tmp/probekit-lab.lock .venv/bin/python bench/bench_load.py [--lab NAME] [--kernel 7.3] [--tree ...]
      [--attach fentry,kprobes] [--runs N]
  python3 bench/bench_load.py --in-guest [--tree ...] [--attach ...] [--runs N]   # inside a guest, as root
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from multiprocessing import Process, Queue
from typing import Any, Dict, List, Tuple

from bench_exporter import start, stop
from bench_scale import parse_trees
from lab_run import PROJECT, help_asked, run_in_lab

sys.path.insert(0, PROJECT)  # in a guest the share's tree is not on sys.path by itself
from probes.runtime import read_described  # noqa: E402

WRITERS, ROUNDS = 4, 200
MOUNT = "/mnt/nfs3"
LOADERS = ("core", "bcc")
#: the operations one round issues, once each, in the writer's own process
OPS = ("create", "open", "write", "getattr", "unlink")
LOG = "/tmp/bench-load-nfsslower.log"
LOST = re.compile(r"warning: (\d+) events lost")


def writer(index: int, directory: str, done: "Queue[int]") -> None:
    """One writer's rounds; its pid on `done` once all ran (the tool's lines are matched by it)."""
    block = b"w" * 4096
    for i in range(ROUNDS):
        path = os.path.join(directory, f"w{index}-{i}")
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.write(fd, block)
        os.close(fd)
        os.stat(path)
        os.unlink(path)
    done.put(os.getpid())


def load(directory: str) -> Tuple[List[int], float]:
    """The WRITERS at once; their pids and the wall time they took."""
    done: "Queue[int]" = Queue()
    procs = [Process(target=writer, args=(i, directory, done)) for i in range(WRITERS)]
    began = time.monotonic()
    for proc in procs:
        proc.start()
    pids = [done.get(timeout=3600) for _ in procs]
    for proc in procs:
        proc.join()
        if proc.exitcode != 0:
            raise RuntimeError(f"writer exited {proc.exitcode}")
    return pids, time.monotonic() - began


def parse_missed(line: str) -> Dict[str, Dict[str, int]]:
    """One "not counted" warning: per op, per cause and place ("recursion at nfs_file_write",
    "start_not_stored"), the count it says."""
    out: Dict[str, Dict[str, int]] = {}
    for (op, cause, where), n in read_described(line).items():
        out.setdefault(op, {})[f"{cause} at {where}" if where else cause] = n
    return out


def settled(path: str) -> None:
    """Until the tool's output stops growing: it has read every event and said, on its
    once-a-second check, what it did not count."""
    size = -1
    while os.path.getsize(path) != size:
        size = os.path.getsize(path)
        time.sleep(5)


def one_run(tree: str, loader: str, attach: str, directory: str) -> Dict[str, Any]:
    """The tool of `tree` on `loader`, alone, around one load."""
    argv = ["env", f"PYTHONPATH={tree}", sys.executable, "-c", "from probes.commands import main_nfsslower as m; m()",
            "--ops", "all", "--json", "--backend", loader, "-v", "0"] + (["--kprobes"] if attach == "kprobes" else [])
    began = time.monotonic()
    proc = start(argv, '"tracing"', LOG, timeout=1800, cwd=tree)
    attached_s = time.monotonic() - began
    try:
        pids, load_s = load(directory)
        settled(LOG)
    finally:
        stop(proc)
    counted = {op: 0 for op in OPS}
    missed: Dict[str, Dict[str, int]] = {}
    lines = 0
    for line in open(LOG):
        if line.startswith("{"):
            event = json.loads(line)
            lines += 1
            if not event.get("in_flight") and event.get("pid") in pids and event.get("op") in counted:
                counted[event["op"]] += 1
        elif "not counted:" in line:
            for op, causes in parse_missed(line).items():
                for cause, n in causes.items():
                    missed.setdefault(op, {})[cause] = missed.get(op, {}).get(cause, 0) + n
    return {"loader": loader, "attach": attach, "rc": proc.returncode, "start_s": round(attached_s, 1), "load_s": round(load_s, 1),
            "lines": lines, "issued": {op: WRITERS * ROUNDS for op in OPS}, "counted": counted, "missed": missed,
            "stderr": [line.rstrip() for line in open(LOG) if not line.startswith("{")]}


def kernel_facts() -> Dict[str, Any]:
    """What decides whether a program's run can be skipped under this load."""
    release = os.uname().release
    config = open(f"/boot/config-{release}").read().splitlines()
    symbols = subprocess.run(["grep", "-cw", "bpf_task_storage_busy", "/proc/kallsyms"], capture_output=True,
                             text=True).stdout.strip()
    return {"kernel": release, "cpus": os.cpu_count(),
            "preempt": sorted(line for line in config if line.startswith("CONFIG_PREEMPT") and line.endswith("=y")),
            "task_storage_busy_counter": symbols not in ("", "0")}


def in_guest(trees: Dict[str, str], attaches: List[str], runs: int) -> Dict[str, Any]:
    directory = os.path.join(MOUNT, "bench-load")
    os.makedirs(directory, exist_ok=True)
    res: Dict[str, Any] = {**kernel_facts(), "writers": WRITERS, "rounds": ROUNDS, "trees": list(trees), "runs": []}
    for n in range(runs):
        for name, tree in trees.items():
            for attach in attaches:
                for loader in LOADERS:
                    row = {"tree": name, "run": n, **one_run(tree, loader, attach, directory)}
                    res["runs"].append(row)
                    print(json.dumps({k: row[k] for k in ("tree", "loader", "attach", "counted", "missed")}),
                          file=sys.stderr, flush=True)
    return res


def missed_total(row: Dict[str, Any], op: str) -> int:
    return sum(row["missed"].get(op, {}).values())


def events_lost(row: Dict[str, Any]) -> int:
    """The events the ring buffer dropped, as the tool said ("warning: N events lost"): of
    every op and process, not only the writers'."""
    return sum(int(n) for line in row["stderr"] for n in LOST.findall(line))


def report(res: Dict[str, Any]) -> str:
    lines = [f"bench_load on {res['kernel']} ({res['cpus']} CPU, {' '.join(res['preempt'])}; task storage busy "
             f"counter: {'yes' if res['task_storage_busy_counter'] else 'no'}), {res['writers']} writers x "
             f"{res['rounds']} rounds, nfsslower --ops all --json 0",
             "| tree | loader | attach | run | " + " | ".join(f"{op} counted / missed" for op in OPS) + " | causes | events lost | load s |"]
    for row in res["runs"]:
        causes = "; ".join(f"{op}: " + ", ".join(f"{c} {n}" for c, n in sorted(by.items()))
                           for op, by in sorted(row["missed"].items()))
        lines.append(f"| {row['tree']} | {row['loader']} | {row['attach']} | {row['run']} | " +
                     " | ".join(f"{row['counted'][op]} / {missed_total(row, op)}" for op in OPS) +
                     f" | {causes or '-'} | {events_lost(row)} | {row['load_s']} |")
    return "\n".join(lines)


def main(argv: List[str]) -> int:
    if help_asked(argv, __doc__):
        return 0
    runs = int(argv[argv.index("--runs") + 1]) if "--runs" in argv else 1
    attaches = argv[argv.index("--attach") + 1].split(",") if "--attach" in argv else ["fentry"]
    if not set(attaches) <= {"fentry", "kprobes"}:
        print(f"bench_load: --attach takes fentry and/or kprobes, not {','.join(attaches)}", file=sys.stderr)
        return 2
    if "--in-guest" in argv:
        print(json.dumps(in_guest(parse_trees(argv), attaches, runs)))
        return 0
    extra = " ".join(a for i, a in enumerate(argv[1:], 1) if a in ("--tree", "--runs", "--attach") or
                     (i > 1 and argv[i - 1] in ("--tree", "--runs", "--attach")))
    lab = argv[argv.index("--lab") + 1] if "--lab" in argv else None
    kernel = argv[argv.index("--kernel") + 1] if "--kernel" in argv else "7.3"
    return run_in_lab(lab, "bench-load", f"python3 bench/bench_load.py --in-guest {extra}", 7200, report,
                      kernel=kernel)


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""Workload of capture_migration_cases.sh: threads that sleep in a loop (one
hrtimer_nanosleep per time.sleep) while another thread keeps moving them between CPUs.

Only the sleeping threads are in set_ftrace_pid: with one thread a CPU prints no
context-switch banner after its first line; with two, it prints one whenever it switches
between them. The number of calls in the trace is known from the workload's own clock,
apart from any parser:
  whole  tracing on before the sleeps start, off after they end: 80 sleeps in all
  cut    tracing on and off while the threads sleep: the sleeps that began inside the
         window (a call that began with tracing off records neither its entry nor its
         return: its callees show at depth 0). A sleep whose start may fall inside a write
         to tracing_on cannot be classed; such a capture is thrown away and taken again.
Usage: migrating_sleepers.py TRACEFS whole|cut THREADS TRUTH.json
"""
from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from typing import List, Optional, Tuple

WHOLE_CALLS, WHOLE_SLEEP_S = 80, 0.010
CUT_SLEEP_S, CUT_LEAD_S, CUT_WINDOW_S = 0.040, 0.3, 0.8
MOVE_EVERY_S = 0.002
ATTEMPTS = 20
#: the kernel enters the call a little after the workload reads its clock
ENTRY_SLACK_S = 0.002


def write(tracefs: str, name: str, value: str) -> Tuple[float, float]:
    """Write a tracefs file; the monotonic clock before and after the write."""
    before = time.monotonic()
    with open(os.path.join(tracefs, name), "w") as f:
        f.write(value)
    return before, time.monotonic()


def mover(tids: List[int], stop: threading.Event) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    while not stop.is_set():
        for tid in tids:
            try:
                os.sched_setaffinity(tid, {random.choice(cpus)})
            except ProcessLookupError:
                pass
        time.sleep(MOVE_EVERY_S)


def run(tracefs: str, mode: str, threads: int) -> Optional[dict]:
    """One capture; None when a sleep lies across a tracing_on write (cut mode)."""
    spans: List[List[Tuple[float, float]]] = [[] for _ in range(threads)]
    tids: List[int] = [0] * threads
    ready = threading.Barrier(threads + 1)
    go, halt = threading.Event(), threading.Event()

    def sleeper(k: int) -> None:
        tids[k] = threading.get_native_id()
        ready.wait()
        go.wait()
        n = 0
        while (n < WHOLE_CALLS // threads) if mode == "whole" else not halt.is_set():
            t0 = time.monotonic()
            time.sleep(WHOLE_SLEEP_S if mode == "whole" else CUT_SLEEP_S)
            spans[k].append((t0, time.monotonic()))
            n += 1

    workers = [threading.Thread(target=sleeper, args=(k,)) for k in range(threads)]
    for t in workers:
        t.start()
    ready.wait()
    write(tracefs, "set_ftrace_pid", " ".join(map(str, tids)))
    with open(os.path.join(tracefs, "trace"), "w"):
        pass
    stop = threading.Event()
    moving = threading.Thread(target=mover, args=(tids, stop))
    moving.start()
    if mode == "whole":
        on = write(tracefs, "tracing_on", "1")
        go.set()
        for t in workers:
            t.join()
        off = write(tracefs, "tracing_on", "0")
    else:
        go.set()
        time.sleep(CUT_LEAD_S)
        on = write(tracefs, "tracing_on", "1")
        time.sleep(CUT_WINDOW_S)
        off = write(tracefs, "tracing_on", "0")
        halt.set()
        for t in workers:
            t.join()
    stop.set()
    moving.join()
    counts = []
    for k in range(threads):
        inside = 0
        for t0, t1 in spans[k]:
            if mode == "whole":
                inside += 1
                continue
            # the kernel enters at k0 in [t0, t1 - sleep + slack]: the deadline is read
            # before the call and the return comes at or after it; tracing switched at
            # some moment inside each write
            first, last = t0, t1 - CUT_SLEEP_S + ENTRY_SLACK_S
            if last < on[0] or first > off[1]:
                continue
            if first <= on[1] or last >= off[0]:
                return None
            inside += 1
        counts.append(inside)
    return {"mode": mode, "threads": threads, "calls": sum(counts), "per_thread": counts,
            "sleep_s": WHOLE_SLEEP_S if mode == "whole" else CUT_SLEEP_S,
            "tracing_on_write": on, "tracing_off_write": off,
            "moves_every_s": MOVE_EVERY_S, "sleeps": spans}


def main() -> int:
    tracefs, mode, threads, truth = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    for attempt in range(1, ATTEMPTS + 1):
        result = run(tracefs, mode, threads)
        if result is not None:
            result["attempt"] = attempt
            with open(truth, "w") as f:
                json.dump(result, f, indent=1)
            return 0
    print(f"migrating_sleepers: every one of {ATTEMPTS} captures had a sleep across a "
          "tracing_on write", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())

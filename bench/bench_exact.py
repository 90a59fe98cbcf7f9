"""The fs check's exact counts, run again and again in one boot (issue 34): does a tool ever count
fewer operations than the workload issued without saying so?

In one lab guest (the package installed, as the lab tests have it), the fs check's guest run
(labs/checks/fs/guest.py's run(): its tools, filesystems, workload and phases, unchanged) is
repeated RUNS times. Each run is judged by the fs check's own verdicts: verify_counts_exact
per filesystem and tool (and verify_exporter_counts_exact with `--exporter`). Where a count is
not exact, each phase's operations are set beside what the tool reported not counting: the
JSON intervals' "missed" (fsdist, fstop) of the intervals inside the phase, or fsslower's
"warning: not counted" lines over its whole run (its events carry no interval). A run is then
`exact`, `reported` (every operation short is one the tool reported missed) or `unreported`
(short, or over, beyond what it reported: what the issue hunts). Each run's raw JSON stays in
the guest's /results/bench_exact/ (the lab's results share on the host); the summary keeps
only the numbers. The host's load average is sampled while the guest runs: the host is shared,
and a loaded host is what the issue asks for.

  .venv/bin/python bench/bench_exact.py [--lab NAME | --kernel 6.12] [--runs 10] [--exporter] [FS:TOOL ...]
  python3 bench/bench_exact.py --in-guest [--runs 10] [--exporter] [FS:TOOL ...]   # in a guest, as root
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, PROJECT)  # in a guest the share's tree is not on sys.path by itself
from labs.checks.fs import verdicts as fc  # noqa: E402
from probes.runtime import read_described  # noqa: E402

RUNS = 10
#: where the guest keeps each run's raw JSON (the lab's results share)
RAW_DIR = "/results/bench_exact"
#: seconds between two samples of the host's load average
LOAD_EVERY_S = 30.0
#: the warning Session._check_missed gives (its list: runtime.describe_missed)
NOT_COUNTED = "warning: not counted: "
VERDICTS = ("exact", "reported", "unreported")


def failure(check: Callable[..., None], *args: Any) -> str:
    """The verdict function's message, "" when it passed."""
    try:
        check(*args)
    except AssertionError as exc:
        return str(exc)
    return ""


def said_missed(stderr: str) -> Dict[str, int]:
    """Per op, what a tool's "warning: not counted" lines added up to over its run."""
    out: Dict[str, int] = {}
    for line in stderr.splitlines():
        for (op, _cause, _where), count in read_described(line).items() if NOT_COUNTED in line else ():
            out[op] = out.get(op, 0) + count
    return out


def reported_missed(run: Dict[str, Any]) -> Tuple[Dict[str, Dict[str, int]], Dict[str, int], List[str]]:
    """(phase -> op -> missed reported in its intervals, op -> missed reported outside any
    phase (fsslower: all of it), what the tool said it cannot vouch for)."""
    per_phase: Dict[str, Dict[str, int]] = {name: {} for name in run["phases"]}
    outside: Dict[str, int] = {}
    unvouched: List[str] = []
    if run["tool"] == "fsslower":
        return per_phase, said_missed(run["stderr"]), unvouched
    for record in run["records"]:
        name = fc._phase_of_interval(record["ts"], run["phases"])
        into = per_phase[name] if name else outside
        for op, count in record.get("missed", {}).items():
            into[op] = into.get(op, 0) + count
        unvouched += [what for what in record.get("unvouched", []) if what not in unvouched]
    return per_phase, outside, unvouched


def judge_counts(phases: Dict[str, Dict[str, Dict[str, int]]], run_wide: Dict[str, int]) -> str:
    """Of a run whose counts were not exact: `reported` when some op was short and every op
    short in a phase is short by no more than the tool reported missed in that phase's intervals
    (fsslower: in its run, `run_wide`, each miss covering one op once), else `unreported` (over,
    short beyond the report, or bytes off with every count right)."""
    left = dict(run_wide)
    shorts = 0
    for ops in phases.values():
        for op, n in ops.items():
            short = n["issued"] - n["counted"]
            if short < 0 or short > n["missed"] + left.get(op, 0):
                return "unreported"
            left[op] = left.get(op, 0) - max(short - n["missed"], 0)
            shorts += short
    return "reported" if shorts else "unreported"


def judge_run(data: Dict[str, Any], fs: str, exporter: bool) -> Dict[str, Any]:
    """One filesystem's tool in one run: the verdicts' messages, per phase and op the counts,
    and whether what was not counted was reported."""
    run = data["runs"][fs]
    out: Dict[str, Any] = {"tool": run["tool"], "ran": failure(fc.verify_tool_ran, run, fs)}
    if "phases" not in run:
        return dict(out, verdict="unreported", counts="no phases")
    seen = fc.seen_by_phase(run)
    missed, outside, unvouched = reported_missed(run)
    phases = {name: {op: {"counted": int(seen[name].get(op, {}).get("count", 0)), "issued": phase["issued"][op],
                          "missed": missed[name].get(op, 0)}
                     for op in phase["issued"] if not op.endswith("_bytes")}
              for name, phase in run["phases"].items()}
    out.update(counts=failure(fc.verify_counts_exact, run, fs), phases=phases, missed_outside=outside,
               unvouched=unvouched)
    out["verdict"] = "exact" if not out["counts"] else \
        judge_counts(phases, outside if run["tool"] == "fsslower" else {})
    if exporter:
        out["exporter"] = failure(fc.verify_exporter_counts_exact, data, fs)
    return out


def in_guest(plan: List[Tuple[str, str]], runs: int, exporter: bool) -> Dict[str, Any]:
    """`runs` fs check runs one after the other, each judged; raw JSON kept under RAW_DIR."""
    from labs.checks.fs import guest as fs_guest
    fs_guest.sbin_on_path()
    os.makedirs(RAW_DIR, exist_ok=True)
    res: Dict[str, Any] = {"kernel": os.uname().release, "plan": [f"{fs}:{tool}" for fs, tool in plan],
                           "exporter": exporter, "runs_asked": runs, "runs": []}
    for i in range(1, runs + 1):
        started = time.monotonic()
        entry: Dict[str, Any] = {"run": i, "started": time.strftime("%H:%M:%S", time.gmtime())}
        try:
            data = fs_guest.run(plan, exporter)
        except Exception as exc:  # a run that broke is a result too; the next one still runs
            entry.update(seconds=round(time.monotonic() - started, 1), error=f"{type(exc).__name__}: {exc}")
            res["runs"].append(entry)
            continue
        entry["seconds"] = round(time.monotonic() - started, 1)
        with open(os.path.join(RAW_DIR, f"run-{i}.json"), "w") as raw:
            json.dump(data, raw)
        entry["fs"] = {fs: judge_run(data, fs, exporter) for fs, _ in plan}
        res["runs"].append(entry)
        print(f"run {i}: " + ", ".join(f"{fs} {j['verdict']}" for fs, j in entry["fs"].items()),
              file=sys.stderr, flush=True)
    return res


class LoadSampler(threading.Thread):
    """The host's 1-minute load average every LOAD_EVERY_S while the guest runs."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: List[float] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while True:
            self.samples.append(round(os.getloadavg()[0], 2))
            if self.stopping.wait(LOAD_EVERY_S):
                return

    def summary(self) -> Dict[str, Any]:
        self.stopping.set()
        got = self.samples or [round(os.getloadavg()[0], 2)]
        return {"every_s": LOAD_EVERY_S, "min": min(got), "max": max(got), "mean": round(sum(got) / len(got), 2),
                "samples": got}


def tally(res: Dict[str, Any]) -> Dict[str, Dict[str, int]]:
    """Per fs:tool, how many runs got each verdict (and `error`: the run broke before a verdict)."""
    out: Dict[str, Dict[str, int]] = {pair: {v: 0 for v in VERDICTS + ("error",)} for pair in res["plan"]}
    for entry in res["runs"]:
        for pair in res["plan"]:
            fs = pair.split(":")[0]
            out[pair]["error" if "error" in entry else entry["fs"][fs]["verdict"]] += 1
    return out


def report(res: Dict[str, Any]) -> str:
    lines = [f"bench_exact on {res['kernel']}: {len(res['runs'])} of {res['runs_asked']} runs, "
             f"host load {res['host_load']['min']}-{res['host_load']['max']} (mean {res['host_load']['mean']})",
             "| fs:tool | " + " | ".join(VERDICTS) + " | error |"]
    for pair, counts in tally(res).items():
        lines.append(f"| {pair} | " + " | ".join(str(counts[v]) for v in VERDICTS + ("error",)) + " |")
    for entry in res["runs"]:
        if "error" in entry:
            lines.append(f"run {entry['run']}: {entry['error']}")
            continue
        for fs, judged in entry["fs"].items():
            for what in ("ran", "counts", "exporter"):
                if judged.get(what):
                    lines.append(f"run {entry['run']} {fs} {what}: {judged[what]}")
    return "\n".join(lines)


def parse(argv: List[str]) -> Tuple[Optional[str], str, int, bool, List[Tuple[str, str]]]:
    """(--lab, --kernel, --runs, --exporter, the FS:TOOL plan: the fs check's RUNS if none)."""
    from labs.checks.fs.guest import RUNS as FS_RUNS
    opts: Dict[str, str] = {}
    plan: List[Tuple[str, str]] = []
    args = iter(argv)
    for arg in args:
        if arg in ("--lab", "--kernel", "--runs"):
            opts[arg] = next(args, "")
        elif ":" in arg:
            fs, tool = arg.split(":", 1)
            plan.append((fs, tool))
        elif arg not in ("--exporter", "--in-guest"):
            raise SystemExit(f"bench_exact: unknown argument {arg!r}")
    if not opts.get("--runs", "1").isdigit() or int(opts.get("--runs", "1")) < 1:
        raise SystemExit(f"bench_exact: --runs wants a positive count, not {opts['--runs']!r}")
    return (opts.get("--lab"), opts.get("--kernel", "6.12"), int(opts.get("--runs", RUNS)), "--exporter" in argv,
            plan or list(FS_RUNS))


def main(argv: List[str]) -> int:
    from lab_run import help_asked, install_probekit, run_in_lab
    if help_asked(argv, __doc__):
        return 0
    lab, kernel, runs, exporter, plan = parse(argv[1:])
    if "--in-guest" in argv:
        print(json.dumps(in_guest(plan, runs, exporter)))
        return 0
    sampler = LoadSampler()
    sampler.start()

    def with_load(res: Dict[str, Any]) -> str:  # the host's load joins the guest's JSON before it is printed
        res["host_load"] = sampler.summary()
        return report(res)

    guest = f"python3 bench/bench_exact.py --in-guest --runs {runs}" + (" --exporter" if exporter else "") + \
        "".join(f" {fs}:{tool}" for fs, tool in plan)
    return run_in_lab(lab, f"bench-exact-{kernel}", guest, runs * 1200, with_load, kernel=kernel,
                      prepare=install_probekit)


if __name__ == "__main__":
    sys.exit(main(sys.argv))

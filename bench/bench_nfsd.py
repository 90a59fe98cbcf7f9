"""What the NFS server probe (nfsdtop's, on bcc; also `nfs-exporter --nfsd`'s) adds to each
request a knfsd server serves: the same workload with the probe attached and without it,
alternated in one lab guest.

No other tool traces a knfsd server's requests (bcc and libbpf-tools have client-side NFS
tools only), so the comparison is the server against itself. The 6.12 lab guest serves its
own export over 127.0.0.1; the workload is on its NFSv3 mount: 4 KiB O_DIRECT preads of one
page of a file made beforehand, each exactly one NFSv3 READ the server serves (no client
page cache, no attribute revalidation, no path walk: the client's share of each request is
small and fixed, and the server's counters can be held to an exact count). A READ also runs
both parts of the probe, the request's (rpc) and the read's.

Rounds alternate probe off / probe on in ABBA order (off on on off, off on on off, ...). An
`on` round starts the installed `nfsdtop --by client --json -v 1`, waits for its first line
(attached), runs the round, and stops it (SIGTERM). A round: WARMUP reads, then LOOPS timed
loops of REQUESTS reads; its figure is the median loop's microseconds per request. Checked
per round: the server's /proc/net/rpc/nfsd moved by exactly that many NFSv3 READs and 4 KiB
each (nothing else on NFSv3), and in an `on` round nfsdtop counted them all, as many as the
server counted while it ran. kernel.bpf_stats_enabled=1 for the whole run: the run time and
runs of nfsdtop's programs (those that appeared when it started) over the timed loops give
the BPF time per program run and per request. The kernel reads the clock twice around each
program run for those stats, a cost of its own on the probe's side: `--no-bpf-stats` leaves
them off, for the added time alone.

  flock /tmp/probekit-lab.lock .venv/bin/python bench/bench_nfsd.py   # boot a 6.12 lab, run, tear down
  .venv/bin/python bench/bench_nfsd.py --lab NAME --pairs 8           # a lab that is up
  .venv/bin/python bench/bench_nfsd.py --json /tmp/nfsd.json          # where the JSON goes
  .venv/bin/python bench/bench_nfsd.py --lab NAME --no-bpf-stats      # the added time without bpf_stats
  python3 bench/bench_nfsd.py --in-guest                              # inside a guest (root, the package)
"""
from __future__ import annotations

import json
import mmap
import os
import signal
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from bench_attach import attached_kinds
from bench_probes import prog_stats
from lab_run import PROJECT, help_asked, install_probekit, run_in_lab

sys.path.insert(0, PROJECT)
from labs.checks.nfsdtop.guest import server_counters  # noqa: E402
from labs.checks.nfsdtop.verdicts import totals  # noqa: E402
from labs.checks.probes.guest import kernel_attachments, stop, tool, wait_ready  # noqa: E402

PATH = "/mnt/nfs3/work/bench/nfsd.bin"
BLOCK = 4096
#: what the options default to: reads per timed loop, timed loops per round, untimed reads
#: before them (a freshly loaded program's first runs include TCG translating it), off/on pairs
DEFAULTS = {"requests": 2000, "loops": 5, "warmup": 200, "pairs": 6}
NFSDTOP = ["nfsdtop", "--by", "client", "--json", "-v", "1"]
READ = "NFSv3 READ"
JSON_OUT = "/tmp/bench_nfsd.json"


def schedule(pairs: int) -> List[str]:
    """ABBA: off on, on off, off on, ...: each state first in as many pairs as the other, so a
    drift of the host's speed meets both alike."""
    return [state for pair in range(pairs) for state in (("off", "on") if pair % 2 == 0 else ("on", "off"))]


def reads(fd: int, buf: mmap.mmap, count: int) -> None:
    """`count` O_DIRECT 4 KiB preads of the file's first page: each one NFSv3 READ."""
    for _ in range(count):
        if os.preadv(fd, [buf], 0) != BLOCK:
            raise RuntimeError(f"{PATH}: a short O_DIRECT read")


def nfsv3(delta: Dict[str, int]) -> Dict[str, int]:
    """The NFSv3 procedures that moved, from a difference of server_counters()."""
    return {key: value for key, value in delta.items() if key.startswith("NFSv3 ") and value}


def difference(after: Dict[str, int], before: Dict[str, int]) -> Dict[str, int]:
    return {key: after[key] - before.get(key, 0) for key in after if after[key] - before.get(key, 0)}


def program_costs(ids: set, before: Dict[int, Dict[str, Any]],
                  after: Dict[int, Dict[str, Any]]) -> Dict[str, List[int]]:
    """[runs, run ns] per program name (a fentry and its fexit share their function's name: summed)."""
    out: Dict[str, List[int]] = {}
    for prog in ids:
        total = out.setdefault(after[prog].get("name", str(prog)), [0, 0])
        total[0] += after[prog].get("run_cnt", 0) - before[prog].get("run_cnt", 0)
        total[1] += after[prog].get("run_time_ns", 0) - before[prog].get("run_time_ns", 0)
    return out


def cpu_seconds(pid: int) -> float:
    """A process's user and system time so far, all its threads (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_round(fd: int, buf: mmap.mmap, opts: Dict[str, int], probe: Optional[set] = None,
              pid: Optional[int] = None) -> Dict[str, Any]:
    """The warm-up and the timed loops; the server's counters around both, the probe's
    programs' bpf_stats and its tool's CPU time (its map reads every second) around the timed loops."""
    counters = server_counters()
    reads(fd, buf, opts["warmup"])
    stats = prog_stats() if probe else {}
    cpu = cpu_seconds(pid) if pid else 0.0
    seconds = []
    for _ in range(opts["loops"]):
        began = time.perf_counter()
        reads(fd, buf, opts["requests"])
        seconds.append(time.perf_counter() - began)
    record: Dict[str, Any] = {"seconds": seconds, "requests": opts["requests"], "warmup": opts["warmup"]}
    if pid:
        record["tool_cpu_s"] = round(cpu_seconds(pid) - cpu, 3)
    if probe:
        record["programs"] = program_costs(probe, stats, prog_stats())
    record["server_delta"] = difference(server_counters(), counters)
    return record


def probed_round(fd: int, buf: mmap.mmap, opts: Dict[str, int], number: int) -> Dict[str, Any]:
    """nfsdtop started and attached, the round, nfsdtop stopped; what it printed and what the
    server counted while it ran."""
    log = f"/tmp/bench-nfsd-{number}.log"
    existing = set(prog_stats())
    counters = server_counters()
    proc = tool(NFSDTOP, log)
    try:
        ready_s = wait_ready(proc, log)
        probe = set(prog_stats()) - existing
        record = one_round(fd, buf, opts, probe, proc.pid)
    finally:
        stopped = stop(proc, log)
    record["tool"] = {"argv": NFSDTOP, "rc": stopped["rc"], "ready_s": round(ready_s, 1), "lines": stopped["lines"],
                      "stderr": stopped["stderr"], "attach": attached_kinds(log + ".err"),
                      "server_delta": difference(server_counters(), counters)}
    return record


def in_guest(opts: Dict[str, int], bpf_stats: bool = True) -> Dict[str, Any]:
    os.makedirs(os.path.dirname(PATH), exist_ok=True)
    with open(PATH, "wb") as handle:
        handle.write(b"x" * BLOCK)
        os.fsync(handle.fileno())
    with open("/proc/sys/kernel/bpf_stats_enabled") as handle:
        stats_were = handle.read().strip()
    buf = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT wants
    fd = os.open(PATH, os.O_RDONLY | os.O_DIRECT)
    rounds: List[Dict[str, Any]] = []
    attachments = {"before": kernel_attachments()}
    subprocess.run(["sysctl", "-q", "-w", f"kernel.bpf_stats_enabled={int(bpf_stats)}"], check=True)
    try:
        for number, state in enumerate(schedule(opts["pairs"])):
            record = probed_round(fd, buf, opts, number) if state == "on" else one_round(fd, buf, opts)
            rounds.append(dict(record, state=state))
    finally:
        os.close(fd)
        buf.close()
        subprocess.run(["sysctl", "-q", "-w", f"kernel.bpf_stats_enabled={stats_were}"], check=False)
    attachments["after"] = kernel_attachments()
    bcc = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "python3-bpfcc"], stdout=subprocess.PIPE,
                         universal_newlines=True).stdout
    return {"kernel": os.uname().release, "bcc": bcc, "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            **opts, "bpf_stats": bpf_stats, "rounds": rounds, "attachments": attachments}


def problems(record: Dict[str, Any]) -> List[str]:
    """What does not add up in one round: the server's NFSv3 counts over the round are not its
    reads alone (warm-up and timed), its read bytes not 4 KiB each; with the probe, nfsdtop's
    NFSv3 counts are not the server's over nfsdtop's run, or not the round's reads."""
    expected = record["warmup"] + record["requests"] * len(record["seconds"])
    said = []
    served = nfsv3(record["server_delta"])
    if served != {READ: expected}:
        said.append(f"the server counted {served}, not {{'{READ}': {expected}}}")
    if record["server_delta"].get("io read") != BLOCK * expected:
        said.append(f"the server read {record['server_delta'].get('io read')} bytes, not {BLOCK * expected}")
    if "tool" in record:
        run = record["tool"]
        if run["rc"] != 0:
            said.append(f"nfsdtop exited {run['rc']}")
        counted = {label: entry for label, entry in totals({"nfsdtop": run}).items() if label.startswith("NFSv3 ")}
        while_running = nfsv3(run["server_delta"])
        seen = {label: entry["count"] for label, entry in counted.items() if entry["count"]}
        if seen != while_running or seen != {READ: expected}:
            said.append(f"nfsdtop counted {seen}, the server {while_running} while it ran, the round {expected}")
        if counted.get(READ, {}).get("read_bytes") != BLOCK * expected:
            said.append(f"nfsdtop counted {counted.get(READ, {}).get('read_bytes')} bytes read, not {BLOCK * expected}")
    return said


def us_per_request(record: Dict[str, Any]) -> float:
    """The round's figure: its median loop, in microseconds per request."""
    return statistics.median(record["seconds"]) / record["requests"] * 1e6


def tool_cpu_us(record: Dict[str, Any]) -> Optional[float]:
    """nfsdtop's own CPU time over a round's timed loops, per request (None: not recorded)."""
    if "tool_cpu_s" not in record:
        return None
    return record["tool_cpu_s"] / (record["requests"] * len(record["seconds"])) * 1e6


def bpf_totals(records: List[Dict[str, Any]]) -> Tuple[int, int, int, Dict[str, List[int]]]:
    """Over rounds with the probe: runs, run ns, timed requests, and [runs, ns] per program."""
    runs = ns = requests = 0
    per_program: Dict[str, List[int]] = {}
    for record in records:
        requests += record["requests"] * len(record["seconds"])
        for name, (count, took) in record["programs"].items():
            runs, ns = runs + count, ns + took
            total = per_program.setdefault(name, [0, 0])
            total[0] += count
            total[1] += took
    return runs, ns, requests, per_program


def summary(res: Dict[str, Any]) -> Dict[str, Any]:
    """Per round its figure and checks; the medians of each state's rounds, their ratio and
    difference; per ABBA pair the same; the BPF time over the probe's rounds."""
    rounds = [{"state": r["state"], "us_per_request": us_per_request(r), "problems": problems(r),
               **({"bpf_ns_per_run": per_run(*map(sum, zip(*r["programs"].values()))),
                   "tool_cpu_us_per_request": tool_cpu_us(r), "ready_s": r["tool"]["ready_s"]}
                  if r["state"] == "on" else {})} for r in res["rounds"]]
    off, on = (statistics.median(r["us_per_request"] for r in rounds if r["state"] == state) for state in ("off", "on"))
    pairs = []
    for first, second in zip(rounds[0::2], rounds[1::2]):
        a, b = (first, second) if first["state"] == "off" else (second, first)
        pairs.append({"off": a["us_per_request"], "on": b["us_per_request"],
                      "ratio": b["us_per_request"] / a["us_per_request"],
                      "added_us": b["us_per_request"] - a["us_per_request"]})
    probed = [r for r in res["rounds"] if r["state"] == "on"]
    runs, ns, requests, per_program = bpf_totals(probed)
    cpu = [r["tool_cpu_s"] for r in probed if "tool_cpu_s" in r]
    return {"rounds": rounds, "pairs": pairs, "off_us": off, "on_us": on, "ratio": on / off, "added_us": on - off,
            "pair_ratio_median": statistics.median(p["ratio"] for p in pairs),
            "tool_cpu_us_per_request": sum(cpu) / requests * 1e6 if len(cpu) == len(probed) else None,
            "bpf": {"runs": runs, "ns": ns, "requests": requests, "ns_per_run": per_run(runs, ns),
                    "runs_per_request": runs / requests, "us_per_request": ns / requests / 1000,
                    "per_program": {name: {"runs": count, "ns_per_run": per_run(count, took)}
                                    for name, (count, took) in sorted(per_program.items())}}}


def per_run(runs: int, ns: int) -> Optional[float]:
    """ns per program run; None where nothing ran or bpf_stats was off (no run counted)."""
    return ns / runs if runs else None


def shown_ns(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.0f} ns"


def shown_us(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.1f} us"


def report(res: Dict[str, Any]) -> str:
    got = summary(res)
    lines = [f"bench_nfsd on {res['kernel']} (bcc {res['bcc']}): {res['requests']} O_DIRECT 4 KiB NFSv3 preads "
             f"x {res['loops']} loops per round (+{res['warmup']} warm-up), {res['pairs']} pairs, ABBA, bpf_stats "
             f"{'on' if res['bpf_stats'] else 'off'}"]
    for number, row in enumerate(got["rounds"]):
        extra = f", BPF {shown_ns(row['bpf_ns_per_run'])} per run, nfsdtop's CPU " \
            f"{shown_us(row['tool_cpu_us_per_request'])}/request, ready in {row['ready_s']:.1f} s" \
            if row["state"] == "on" else ""
        checked = "checks ok" if not row["problems"] else "CHECK FAILED: " + "; ".join(row["problems"])
        lines.append(f"  round {number + 1} {row['state']:<3} {row['us_per_request']:8.1f} us/request{extra}; "
                     f"{checked}")
    lines.append("  per pair (on/off, added us): " + ", ".join(
        f"{p['ratio']:.3f} {p['added_us']:+.1f}" for p in got["pairs"]))
    lines.append(f"  medians: off {got['off_us']:.1f} us/request, on {got['on_us']:.1f} us/request -> on/off "
                 f"{got['ratio']:.3f}, added {got['added_us']:+.1f} us/request (median of the pairs' ratios "
                 f"{got['pair_ratio_median']:.3f})")
    lines.append(f"  nfsdtop's own CPU time (user+system, its map reads every second) over the timed loops: "
                 f"{shown_us(got['tool_cpu_us_per_request'])} per request")
    bpf = got["bpf"]
    if res["bpf_stats"]:
        lines.append(f"  BPF (probe's rounds, timed loops): {shown_ns(bpf['ns_per_run'])} per program run, "
                     f"{bpf['runs_per_request']:.2f} runs and {bpf['us_per_request']:.2f} us per request")
        lines += [f"    {name:<34} {entry['runs']:7d} runs {shown_ns(entry['ns_per_run']):>8} per run"
                  for name, entry in bpf["per_program"].items()]
    attach = {r["tool"]["attach"] for r in res["rounds"] if r["state"] == "on"}
    lines.append("  nfsdtop: " + " | ".join(sorted(attach)))
    left = res["attachments"]["after"] != res["attachments"]["before"]
    lines.append("  after the run: " + ("LEFT ATTACHED: " + json.dumps(res["attachments"]) if left
                                        else "nothing left attached"))
    return "\n".join(lines)


def options(argv: List[str]) -> Dict[str, Any]:
    """--requests/--loops/--warmup/--pairs N, --lab NAME, --json PATH, --no-bpf-stats, --in-guest; ValueError
    says what is wrong."""
    opts: Dict[str, Any] = dict(DEFAULTS, lab=None, json=JSON_OUT, in_guest=False, bpf_stats=True)
    args = list(argv[1:])
    while args:
        arg = args.pop(0)
        if arg == "--in-guest":
            opts["in_guest"] = True
        elif arg == "--no-bpf-stats":
            opts["bpf_stats"] = False
        elif arg.startswith("--") and arg[2:] in DEFAULTS or arg in ("--lab", "--json"):
            if not args:
                raise ValueError(f"{arg} needs a value")
            value = args.pop(0)
            if arg[2:] in DEFAULTS:
                if not value.isdigit() or int(value) < (0 if arg == "--warmup" else 1):
                    raise ValueError(f"{arg} takes a whole number{'' if arg == '--warmup' else ' above 0'}: {value!r}")
                opts[arg[2:]] = int(value)
            else:
                opts[arg[2:]] = value
        else:
            raise ValueError(f"unknown argument {arg!r}")
    return opts


def main(argv: List[str]) -> int:
    if help_asked(argv, __doc__):
        return 0
    try:
        opts = options(argv)
    except ValueError as exc:
        print(f"bench_nfsd: {exc}", file=sys.stderr)
        return 2
    numbers = {key: opts[key] for key in DEFAULTS}
    if opts["in_guest"]:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: nfsdtop stopped, bpf_stats restored
        print(json.dumps(in_guest(numbers, opts["bpf_stats"])))
        return 0
    began, load = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), os.getloadavg()
    printed: List[Dict[str, Any]] = []

    def keep(data: Dict[str, Any]) -> str:
        printed.append(data)
        return report(data)

    flags = " ".join(f"--{key} {value}" for key, value in numbers.items())
    flags += "" if opts["bpf_stats"] else " --no-bpf-stats"
    code = run_in_lab(opts["lab"], "bench-nfsd", f"python3 bench/bench_nfsd.py --in-guest {flags}", 3600, keep,
                      kernel="6.12", prepare=install_probekit)
    host = {"began": began, "ended": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "load_start": load, "load_end": os.getloadavg(), "cpus": os.cpu_count()}
    print(f"bench_nfsd: {host['began']} to {host['ended']}, host load average {load[0]:.1f} at the start, "
          f"{host['load_end'][0]:.1f} at the end ({host['cpus']} CPUs)")
    if printed:
        with open(opts["json"], "w") as handle:
            json.dump(dict(printed[0], host=host), handle, indent=1)
        print(f"bench_nfsd: JSON in {opts['json']}")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))

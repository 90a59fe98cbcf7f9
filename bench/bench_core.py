"""The CO-RE loader's four figures against bcc and libbpf-tools, side by side in one lab guest.

One 6.12 guest (libbpf 1.5, bcc 0.31, trixie's libbpf-tools), probekit's Debian package and
libbpf-tools unpacked beside it (the two conflict), by the host first (offline). Every
comparison runs its tools in turn, ROUNDS rounds, each round in the reverse order of the one
before (A B, B A, A B), and takes the median per tool:

- startup: spawn to the first event line of `nfsslower 0` on `--backend core` and `--backend
  bcc`, and of libbpf-tools' `fsslower -t nfs -m 0`; spawn to the "Tracing" line of `nfsdist
  --backend core 1` and of libbpf-tools' `fsdist -t nfs 1`, and to nfs-exporter's (core)
  "probe attached"; all while an O_SYNC 4 KiB write to the NFSv3 mount comes every 0.2 s;
  each one's peak resident memory (VmHWM) a second after that line. Beside them the floor:
  python3 up and printing a line, alone and after `import argparse`. Targets: core <= 0.1x
  bcc; nfsslower, nfsdist and the exporter <= 2x libbpf-tools' fsslower / fsdist in time,
  the terminal tools <= 2x in peak memory (the exporter's: < 40 MiB, said beside).
- exporter: on MOUNTS NFSv3 mounts (bench_exporter's), nfs-exporter on core and on bcc,
  nfsdist-bpfcc (bcc-tools) and libbpf-tools' `fsdist -t nfs`, each alone over the six
  operations on every mount; the exporters then serve SCRAPES scrapes (bench_exporter's
  median). Peak and current resident memory of each. Target: exporter on core <= 0.3x
  nfsdist-bpfcc's peak. The exporter reads its maps key by key on both loaders (no batched
  path exists), so the scrape is compared core against bcc.
- attach: bench_attach's `--set core` (added time per cached 4 KiB NFSv3 read, core fentry
  against bcc fentry, ROUNDS passes). Target: core <= 1.0x bcc.

  flock /tmp/probekit-lab.lock .venv/bin/python bench/bench_core.py    # boot a 6.12 lab, run, tear down
  .venv/bin/python bench/bench_core.py --lab NAME      # a lab that is up (packages installed here)
  .venv/bin/python bench/bench_core.py --parts startup,attach   # some of the comparisons
  .venv/bin/python bench/bench_core.py --parts startup,exporter --without-bcc   # beside libbpf-tools only
  python3 bench/bench_core.py --in-guest              # inside a guest that has the packages
"""
from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import bench_attach
import bench_exporter
from bench_exporter import EXPORTER_PORT, SCRAPES, bench_dir, drop_caches, nfs_mounts, scrape_times, status_kib, stop
from bench_probes import event_lines, start, wait_for
from lab_run import help_asked, install_probekit, run_in_lab

ROUNDS = 3
PARTS = ("startup", "exporter", "attach")
BUSY = "/mnt/nfs3/work/bench/busy.bin"
LIBBPF_TOOLS = "libbpf-tools"
#: where the host unpacks libbpf-tools in the guest (dpkg-deb -x), with its version in VERSION:
#: installing it would remove probekit's package, which conflicts with it (the same tool names)
LIBBPF_TOOLS_ROOT = "/opt/libbpf-tools"
#: the interpreter the tools run on, alone and with argparse (their command line) imported, kept
#: up like a tool: the part of a start and of its peak that no change inside probekit removes
FLOORS = {"python3": "", "python3 + argparse": "import argparse; "}
#: (numerator, denominator, measure, target or None) of each part's ratios of medians
RATIOS: Dict[str, List[Tuple[str, str, str, Optional[float]]]] = {
    "startup": [("core", "bcc", "s", 0.1), ("core", "libbpf-tools", "s", 2.0),
                ("core", "bcc", "hwm_kib", None), ("core", "libbpf-tools", "hwm_kib", 2.0),
                ("nfsdist core", "fsdist libbpf-tools", "s", 2.0), ("nfsdist core", "fsdist libbpf-tools", "hwm_kib", 2.0),
                ("exporter core", "fsdist libbpf-tools", "s", 2.0),
                ("python3", "libbpf-tools", "s", None), ("python3", "libbpf-tools", "hwm_kib", None)],
    "exporter": [("exporter core", "nfsdist-bpfcc", "hwm_kib", 0.3), ("exporter core", "exporter bcc", "hwm_kib", None),
                 ("exporter core", "fsdist libbpf-tools", "hwm_kib", None),
                 ("exporter core", "exporter bcc", "median_s", None)],
}


def alternated(names: Sequence[str], rounds: int) -> List[List[str]]:
    """Each round's order: the names, then reversed, and so on (each first as often as the
    rounds allow, so a drift of the host's speed meets them alike)."""
    return [list(names) if r % 2 == 0 else list(reversed(names)) for r in range(rounds)]


def installed(command: str, *args: str) -> List[str]:
    """A command of probekit's package as a user runs it: by its own #! line (the interpreter's
    options there are part of its start), without the lab agent's PYTHONPATH, which points at
    the source share; unbuffered, so each line is in the log when printed."""
    return ["env", "-u", "PYTHONPATH", "PYTHONUNBUFFERED=1", f"/usr/sbin/{command}", *args]


def libbpf_tool(name: str) -> Optional[str]:
    """Where libbpf-tools' `name` is unpacked (Debian names it NAME-libbpf; other builds NAME or
    libbpf-tools-NAME); None when the package is not there."""
    wanted = re.compile(rf"(libbpf-tools-)?{re.escape(name)}(-libbpf)?")
    for where in ("usr/sbin", "usr/bin"):
        folder = os.path.join(LIBBPF_TOOLS_ROOT, where)
        for entry in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            path = os.path.join(folder, entry)
            if wanted.fullmatch(entry) and os.access(path, os.X_OK):
                return path
    return None


def line_buffered(path: str, *args: str) -> List[str]:
    """A C tool whose stdout is a file prints a line at a time (stdio buffers whole blocks)."""
    return ["stdbuf", "-oL", path, *args]


def startup(rounds: int, bcc: bool = True) -> Dict[str, Any]:
    """Per tool, per round: seconds from spawn to its first event line (the slower tools) or
    to the line that says it traces (the histogram tools, the exporter), and VmHWM a second
    after it. Without `bcc` the bcc backend's nfsslower is left out (on a loaded host one
    start of it took minutes, and none of the libbpf-tools targets needs it)."""
    port = str(EXPORTER_PORT)
    first_event = lambda lines: len(event_lines(lines)) > 0  # noqa: E731
    tools = {"core": (installed("nfsslower", "--backend", "core", "0"), first_event),
             **({"bcc": (installed("nfsslower", "--backend", "bcc", "0"), first_event)} if bcc else {}),
             "nfsdist core": (installed("nfsdist", "--backend", "core", "1"), said("Tracing")),
             "exporter core": (installed("nfs-exporter", "--port", port, "--backend", "core"), said("probe attached")),
             **{name: (["env", "-u", "PYTHONPATH", sys.executable, "-u", "-c",
                        f"{imports}print('up'); import time; time.sleep(600)"], said("up"))
                for name, imports in FLOORS.items()}}
    missing = []
    for name, peer, argv, ready in (("libbpf-tools", "fsslower", ("-t", "nfs", "-m", "0"), first_event),
                                    ("fsdist libbpf-tools", "fsdist", ("-t", "nfs", "1"), said("Tracing"))):
        path = libbpf_tool(peer)
        if path:
            tools[name] = (line_buffered(path, *argv), ready)
        else:
            missing.append(f"{LIBBPF_TOOLS} is not unpacked: no {peer}")
    os.makedirs(os.path.dirname(BUSY), exist_ok=True)
    busy = subprocess.Popen(["sh", "-c", f"while :; do dd if=/dev/zero of={BUSY} bs=4k count=1 oflag=sync "
                                         "conv=notrunc status=none; sleep 0.2; done"])
    runs: Dict[str, List[Dict[str, Any]]] = {name: [] for name in tools}
    try:
        for number, order in enumerate(alternated(list(tools), rounds)):
            for name in order:
                log = f"/tmp/bench-core-start-{name.replace(' ', '-')}-{number}.out"
                argv, ready = tools[name]
                proc = start(argv, log)
                try:
                    took = wait_for(log, proc, ready, every=0.05)
                    time.sleep(1)
                    runs[name].append({"s": took, "hwm_kib": status_kib(proc.pid, "VmHWM")})
                except RuntimeError as exc:
                    runs[name].append({"error": str(exc)[-300:]})
                finally:
                    proc.terminate()
                    proc.wait(120)
    finally:
        busy.kill()
        busy.wait()
    return {"commands": {name: argv for name, (argv, _ready) in tools.items()},
            "order": alternated(list(tools), rounds), "runs": runs, "missing": missing}


def said(text: str) -> Callable[[List[str]], bool]:
    """Whether a tool's output so far has a line holding `text` (its "tracing now" line)."""
    return lambda lines: any(text in line for line in lines)


def exporter(rounds: int, bcc: bool = True) -> Dict[str, Any]:
    """Per tool, per round, on MOUNTS mounts: VmHWM and VmRSS after the workload; for the
    exporters also the scrape (median of SCRAPES) and its samples. Without `bcc` the bcc
    exporter and nfsdist-bpfcc are left out (each start compiles for minutes under TCG; the
    exporter's < 40 MiB target stands alone)."""
    port = str(EXPORTER_PORT)
    tools: Dict[str, Tuple[List[str], str, bool]] = {
        "exporter core": (installed("nfs-exporter", "--port", port, "--backend", "core"), "probe attached", True)}
    if bcc:
        tools.update({
            "exporter bcc": (installed("nfs-exporter", "--port", port, "--backend", "bcc"), "probe attached", True),
            "nfsdist-bpfcc": ([sys.executable, "-u", "/usr/sbin/nfsdist-bpfcc", "1"], "Tracing", False)})
    fsdist = libbpf_tool("fsdist")
    if fsdist:
        tools["fsdist libbpf-tools"] = (line_buffered(fsdist, "-t", "nfs", "1"), "Tracing", False)
    runs: Dict[str, List[Dict[str, Any]]] = {name: [] for name in tools}
    with nfs_mounts() as points:
        for number, order in enumerate(alternated(list(tools), rounds)):
            for name in order:
                argv, ready, scraped = tools[name]
                try:
                    proc = bench_exporter.start(argv, ready, f"/tmp/bench-core-{name.replace(' ', '-')}-{number}.log")
                except RuntimeError as exc:
                    runs[name].append({"error": str(exc)[-300:]})
                    continue
                try:
                    drop_caches()
                    for point in points:
                        bench_exporter.workload(bench_dir(point))
                    time.sleep(2)
                    record: Dict[str, Any] = scrape_times(EXPORTER_PORT) if scraped else {}
                    record.update(hwm_kib=status_kib(proc.pid, "VmHWM"), rss_kib=status_kib(proc.pid, "VmRSS"))
                    runs[name].append(record)
                finally:
                    stop(proc)
        mounts = len(points)
    return {"commands": {name: argv for name, (argv, _, _) in tools.items()}, "mounts": mounts, "scrapes": SCRAPES,
            "order": alternated(list(tools), rounds), "runs": runs,
            "missing": [] if fsdist else [f"{LIBBPF_TOOLS} is not unpacked: no fsdist"]}


def medians(runs: Dict[str, List[Dict[str, Any]]], measure: str) -> Dict[str, Optional[float]]:
    """Per tool, the median of `measure` over its rounds that have it (None: none has)."""
    out: Dict[str, Optional[float]] = {}
    for name, records in runs.items():
        values = [record[measure] for record in records if measure in record]
        out[name] = statistics.median(values) if values else None
    return out


def summary(res: Dict[str, Any]) -> List[Dict[str, Any]]:
    """One row per ratio of medians: the part, the pair, the measure, both medians, the ratio,
    the target, whether it is met (None: a side has no measurement), and the per-round ratios."""
    rows = []
    for part, ratios in RATIOS.items():
        if part not in res:
            continue
        runs = res[part]["runs"]
        for top, bottom, measure, target in ratios:
            if top not in runs or bottom not in runs:
                continue
            middle = medians(runs, measure)
            a, b = middle[top], middle[bottom]
            ratio = a / b if a is not None and b else None
            rounds = [x[measure] / y[measure] for x, y in zip(runs[top], runs[bottom])
                      if measure in x and y.get(measure)]
            rows.append({"part": part, "pair": [top, bottom], "measure": measure, "medians": [a, b],
                         "ratio": ratio, "target": target,
                         "met": None if ratio is None or target is None else ratio <= target, "per_round": rounds})
    if "attach" in res:
        attach = res["attach"]
        for top, bottom, ratio, target in attach["ratios"]:
            added, body = attach["added_ns_per_read"], attach["bpf_ns_per_run"]
            rows.append({"part": "attach", "pair": [top, bottom], "measure": "added_ns_per_read",
                         "medians": [added[top], added[bottom]], "ratio": ratio, "target": target,
                         "met": None if ratio is None else ratio <= target, "per_round": []})
            rows.append({"part": "attach", "pair": [top, bottom], "measure": "bpf_ns_per_run",
                         "medians": [body[top], body[bottom]],
                         "ratio": body[top] / body[bottom] if body[top] and body[bottom] else None,
                         "target": None, "met": None, "per_round": []})
    return rows


def shown(value: Optional[float], measure: str) -> str:
    if value is None:
        return "n/a"
    return {"s": f"{value:.1f} s", "hwm_kib": f"{value / 1024:.1f} MiB", "median_s": f"{value * 1000:.0f} ms",
            "added_ns_per_read": f"{value:.0f} ns", "bpf_ns_per_run": f"{value:.0f} ns"}[measure]


#: the measures each part's report line gives the medians of
MEASURES = {"startup": ("s", "hwm_kib"), "exporter": ("hwm_kib", "median_s")}


def report(res: Dict[str, Any]) -> str:
    lines = [f"bench_core on {res['kernel']}, {res['rounds']} rounds, each in the reverse order of the one before; "
             f"libbpf-tools: {res['libbpf_tools'] or 'not unpacked'}"]
    for part, measures in MEASURES.items():
        if part not in res:
            continue
        for measure in measures:
            lines.append(f"  {part} {measure} medians: " + ", ".join(
                f"{name} {shown(value, measure)}" for name, value in medians(res[part]["runs"], measure).items()))
        for name, records in res[part]["runs"].items():
            lines += [f"    {name}: failed: {record['error']}" for record in records if "error" in record]
        lines += [f"    missing: {why}" for why in res[part]["missing"]]
    if "attach" in res:
        lines.append("  " + bench_attach.report(res["attach"]).replace("\n", "\n  "))
    lines += [f"  {part}: failed: {why}" for part, why in res.get("failed", {}).items()]
    for row in summary(res):
        verdict = {None: "", True: " (target met)", False: " (target NOT met)"}[row["met"]]
        target = f" target <= {row['target']}" if row["target"] is not None else ""
        spread = f"; per round {', '.join(f'{r:.2f}' for r in row['per_round'])}" if row["per_round"] else ""
        ratio = f"{row['ratio']:.3f}" if row["ratio"] is not None else "n/a"
        lines.append(f"  {row['part']} {row['measure']}: {row['pair'][0]} / {row['pair'][1]} = "
                     f"{shown(row['medians'][0], row['measure'])} / {shown(row['medians'][1], row['measure'])} = "
                     f"{ratio}{target}{verdict}{spread}")
    return "\n".join(lines)


def libbpf_tools_version() -> str:
    """`libbpf-tools\tVERSION` of the unpacked package, as dpkg-query -W says it; "" without it."""
    try:
        with open(os.path.join(LIBBPF_TOOLS_ROOT, "VERSION")) as handle:
            return f"{LIBBPF_TOOLS}\t{handle.read().strip()}"
    except OSError:
        return ""


def in_guest(parts: Sequence[str], rounds: int, bcc: bool = True) -> Dict[str, Any]:
    res: Dict[str, Any] = {"kernel": os.uname().release, "rounds": rounds,
                           "libbpf_tools": libbpf_tools_version()}
    measure = {"startup": lambda: startup(rounds, bcc), "exporter": lambda: exporter(rounds, bcc),
               "attach": lambda: bench_attach.in_guest("core", bench_attach.READS, bench_attach.LOOPS, rounds)}
    for part in parts:
        try:
            res[part] = measure[part]()
        except Exception as exc:  # said in the report; the other parts' figures are kept
            res.setdefault("failed", {})[part] = f"{type(exc).__name__}: {exc}"[-1000:]
    return res


def install_libbpf_tools(lab: Any) -> None:
    """Debian's libbpf-tools of the guest's release, fetched on the host with the project's
    private apt (the guest has no network) and unpacked in LIBBPF_TOOLS_ROOT; said and skipped
    when that fails (the guest half then measures the rest)."""
    from discover.errors import UserError
    from probes.fetch import PrivateApt
    suite = lab.run(". /etc/os-release && echo $VERSION_CODENAME").stdout.strip()
    dest = Path(tempfile.mkdtemp(prefix="bench-core-deb-"))
    try:
        apt = PrivateApt()
        apt.ensure_indexes()  # a fresh machine has no package lists yet
        apt.download([f"{LIBBPF_TOOLS}/{suite}"], dest)
        deb = next(dest.glob(f"{LIBBPF_TOOLS}_*.deb"))
    except (UserError, StopIteration) as exc:
        print(f"bench_core: {LIBBPF_TOOLS} for {suite} not fetched ({exc}): measuring without it", flush=True)
        return
    try:
        lab.put(deb, f"/tmp/{deb.name}")
    finally:
        shutil.rmtree(dest)
    res = lab.run(f"rm -rf {LIBBPF_TOOLS_ROOT} && dpkg-deb -x /tmp/{deb.name} {LIBBPF_TOOLS_ROOT} && "
                  f"dpkg-deb -f /tmp/{deb.name} Version > {LIBBPF_TOOLS_ROOT}/VERSION", timeout=300)
    if res.exit_code != 0:
        print(f"bench_core: {deb.name} does not unpack: {(res.stdout + res.stderr).strip()[-300:]}", flush=True)


def prepare(lab: Any) -> None:
    install_probekit(lab)
    install_libbpf_tools(lab)


def main(argv: List[str]) -> int:
    if help_asked(argv, __doc__):
        return 0
    rounds = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else ROUNDS
    parts = argv[argv.index("--parts") + 1].split(",") if "--parts" in argv else list(PARTS)
    unknown = [part for part in parts if part not in PARTS]
    if unknown or rounds < 1:
        print(f"bench_core: --parts takes {','.join(PARTS)}, --rounds a positive number", file=sys.stderr)
        return 2
    if "--in-guest" in argv:
        print(json.dumps(in_guest(parts, rounds, "--without-bcc" not in argv)))
        return 0
    began, load = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), os.getloadavg()
    lab = argv[argv.index("--lab") + 1] if "--lab" in argv else None
    code = run_in_lab(lab, "bench-core", f"python3 bench/bench_core.py --in-guest --parts {','.join(parts)} "
                      f"--rounds {rounds}{' --without-bcc' if '--without-bcc' in argv else ''}", 7200, report, kernel="6.12", prepare=prepare)
    print(f"bench_core: {began} to {time.strftime('%H:%M:%S UTC', time.gmtime())}, host load average "
          f"{load[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end ({os.cpu_count()} CPUs)")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))

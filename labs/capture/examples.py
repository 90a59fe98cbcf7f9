"""docs/examples/TOOL_example.txt: per tool, the command, its real output, how to read it, caveats, --help.

Why generated: the outputs must be a lab's (CAPTURES, written by labs/capture/capture_examples.sh
in a lab guest; discover's from the real captures in tests/fixtures/6.1.0-50-amd64) and the
--help the code's of today. Written by hand, both drift from what the tools print;
tests/test_examples.py checks the files against the captures, the help and the tools' headers.

    python3 -m labs.capture.examples          # rewrite docs/examples/ (no root, no VM)
"""
from __future__ import annotations

import gzip
import json
import os
import shlex
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[2]
#: the lab runs the tool examples quote (README.md there: where, when, how); fs/: the -t FS tools'
CAPTURES = REPO / "tests" / "fixtures" / "6.12.117+deb13-amd64" / "examples"
FS_CAPTURES = CAPTURES / "fs"
#: discover's inputs: real function_graph captures and the profile of a Debian 6.1.0-50 lab guest
DISCOVER_61 = "tests/fixtures/6.1.0-50-amd64"
OUT = REPO / "docs" / "examples"
#: the width --help and discover's tables are rendered at (a terminal's is not reproducible)
COLUMNS = "100"
#: a cut output ends with this line (the rest is in the capture)
CUT = "[... {n} more lines: {where}]"


class Section(NamedTuple):
    """One command of an example: what is run, what it printed, how to read it."""

    command: str
    output: List[str]
    read: str


class Example(NamedTuple):
    """One docs/examples file: what the tool is, where the outputs come from, its commands."""

    tool: str
    about: str
    provenance: str
    sections: List[Section]
    caveats: str
    helps: Tuple[Tuple[str, ...], ...]


def capture(name: str, where: Path = CAPTURES) -> Tuple[str, List[str], List[str]]:
    """(command as typed, stdout lines, stderr lines) of one run in `where`."""
    command = (where / f"{name}.cmd").read_text().strip()
    err = where / f"{name}.err"
    return (command, (where / f"{name}.out").read_text().splitlines(),
            err.read_text().splitlines() if err.exists() else [])


def cut(lines: List[str], keep: int, where: str) -> List[str]:
    """The first `keep` lines, and one line saying how many more there are and where."""
    if len(lines) <= keep:
        return lines
    return lines[:keep] + [CUT.format(n=len(lines) - keep, where=where)]


def lab_section(name: str, read: str, keep: Optional[int] = None, where: Path = CAPTURES) -> Section:
    """A Section from a lab capture: stdout, cut to `keep` lines, then what the tool wrote on stderr."""
    command, out, err = capture(name, where)
    shown = out if keep is None else cut(out, keep, f"{where.relative_to(REPO)}/{name}.out")
    return Section(command, shown + [f"(stderr) {line}" for line in err], read)


def lab_provenance(part: str, where: Path = CAPTURES) -> str:
    """Where and when the captures of `part` (nfs, exporter, fs: the parts of
    capture_examples.sh) in `where` were made, from its env.txt (a part run again is dated there)."""
    lines = (where / "env.txt").read_text().splitlines()
    kernel, when, python, bcc = lines[:4]
    tree = "/opt/probekit"
    for line in lines:
        if line.startswith(f"rerun {part} "):
            when, tree = (line.split() + [tree])[2:4]
    source = "" if tree == "/opt/probekit" else f", the tools from {tree.rsplit('/', 1)[-1]}"
    return (f"Real output of a lab run: Debian kernel {kernel}, bcc {bcc}, {python}, {when[:10]}, a "
            f"single-guest QEMU lab (NFS server and client in one VM, mounts over 127.0.0.1), "
            f"labs/capture/capture_examples.sh {part}{source}; the captures: {where.relative_to(REPO)}/, "
            f"how they were made: {CAPTURES.relative_to(REPO)}/README.md.")


def run(argv: Sequence[str], cwd: Path = REPO) -> Tuple[str, str]:
    """(stdout, stderr) of a probekit command run as `python3 -m` from this tree."""
    env = {**os.environ, "COLUMNS": COLUMNS, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout, done.stderr


#: how each tool is started from a checkout (`python3 -m MODULE [SUBCOMMAND]`)
MODULES: Dict[str, Tuple[str, ...]] = {
    "nfsslower": ("probes.commands", "nfsslower"), "nfsdist": ("probes.commands", "nfsdist"),
    "nfstop": ("probes.commands", "nfstop"), "nfsdtop": ("probes.commands", "nfsdtop"),
    "fsslower": ("probes.commands", "fsslower"),
    "fsdist": ("probes.commands", "fsdist"), "fstop": ("probes.commands", "fstop"),
    "nfs-exporter": ("probes.exporter",), "discover": ("discover",),
}


def help_text(argv: Tuple[str, ...]) -> List[str]:
    """`TOOL [SUBCOMMAND] --help` as the code prints it today."""
    out, _ = run([*MODULES[argv[0]], *argv[1:], "--help"])
    return out.rstrip("\n").splitlines()


def render(example: Example) -> str:
    """The example file: bcc's X_example.txt order (commands and output, reading, caveats, usage)."""
    title = f"{example.tool}: examples"
    parts = [title, "=" * len(title), "", *_wrap(example.about), "", *_wrap(example.provenance), ""]
    for section in example.sections:
        parts += [f"# {section.command}", *section.output, "", *_wrap(section.read), ""]
    parts += ["Caveats", "-------", *_wrap(example.caveats), "", "USAGE", "-----"]
    for argv in example.helps:
        parts += [f"# {' '.join(argv)} --help", *help_text(argv), ""]
    return "\n".join(line.rstrip() for line in parts).rstrip("\n") + "\n"


def _wrap(text: str) -> List[str]:
    """Paragraphs (blank-line separated) wrapped at 88 columns."""
    out: List[str] = []
    for paragraph in textwrap.dedent(text).strip().split("\n\n"):
        out += textwrap.wrap(" ".join(paragraph.split()), 88) + [""]
    return out[:-1]


#: the tools with an example, in the order of the README
TOOLS = ("nfsslower", "nfsdist", "nfstop", "nfsdtop", "fsslower", "fsdist", "fstop", "nfs-exporter", "discover")


def example(tool: str) -> Example:
    """One tool's example, its outputs read from the captures (discover's run on its fixtures)."""
    if tool == "discover":
        return discover()
    if tool == "nfsdtop":
        return nfsdtop()
    if tool in ("fsslower", "fsdist", "fstop"):
        return {"fsslower": fsslower, "fsdist": fsdist, "fstop": fstop}[tool](lab_provenance("fs", FS_CAPTURES))
    build, part = {"nfsslower": (nfsslower, "nfs"), "nfsdist": (nfsdist, "nfs"), "nfstop": (nfstop, "nfs"),
                   "nfs-exporter": (exporter, "exporter")}[tool]
    return build(lab_provenance(part))


def nfsslower(lab: str) -> Example:
    return Example(
        "nfsslower",
        "nfsslower prints one line per NFS operation slower than a threshold (default 10 ms): "
        "read, write, open, getattr, fsync and commit by default (--ops all adds the metadata "
        "operations and every RPC), in bcc nfsslower's columns and CSV; operations that stay "
        "stuck are printed while they are stuck.",
        lab + " netem added 50 ms to every packet on lo, so each NFS round trip took about "
        "100 ms more; the workload is labs/checks/workload.sh (64 KiB writes with fsync, eight "
        "4 KiB O_SYNC writes, a read after dropping the page cache, stat, cat).",
        [lab_section(
            "nfsslower",
            "TIME is when the operation ended, T its type (R read, W write, O open, G getattr, F "
            "fsync, C commit), BYTES and OFF_KB the size and file offset (KiB) of a read or "
            "write, LAT(ms) the time from the call into NFS to its return. Each O_SYNC dd "
            "write (W, 4 KiB at offsets 0, 4, 8 ... KiB) waited for the server, and the flush "
            "inside it shows as its own F line just before it. Of read.bin's four 64 KiB "
            "reads, two waited (offsets 0 and 128 KiB); the others found their pages already "
            "read ahead. A line whose probe carries no name (getattr, fsync) shows `[ino N]` "
            "when no earlier line and none of the process's open files named that inode: the "
            "first F is write.bin's fsync, whose buffered writes were all under 50 ms."),
         lab_section(
            "nfsslower-M",
            "-M adds the MOUNT column (the mount point of the file's superblock): the same "
            "writes on the NFSv3 and the NFSv4.2 mount of one server. On NFSv4.2 some opens "
            "took a round trip too (O): NFSv4 opens a file on the server, NFSv3 has no such "
            "call."),
         lab_section(
            "nfsslower-csv",
            "-j (--csv) is bcc's parsable layout: ENDTIME_us is the monotonic clock in "
            "microseconds, OFFSET_b the offset in bytes, LATENCY_us the latency in "
            "microseconds; with -M a MOUNT field comes before FILE (the file name stays last, "
            "as it may hold commas)."),
         lab_section(
            "nfsslower-json", "--json prints one object per line: first what is traced, then "
            "each operation with its mount and the cgroup v2 path of the task that started it "
            "(here the guest agent's, which ran the workload). fileid is the inode number.",
            keep=6),
         lab_section(
            "nfsslower-stall",
            "With 800 ms added to every packet (1.6 s per round trip), each stat waited longer "
            "than the threshold: the tool printed the operation while it was still in flight "
            "(LAT(ms) `>ms so far`, BYTES and OFF_KB `-`, `(in flight)` after the file name, "
            "`?` where it could not tell the file yet), then its completion line when it "
            "ended. While an operation lasts its line repeats every --stall-interval seconds "
            "(here 1), which is how a server that stopped answering shows at once, not only "
            "when it comes back; with RPCs traced too (--ops with P) the line names the RPC "
            "the thread waits for and its server. The check runs about once a second, so an "
            "operation that ends soon after crossing the threshold (stat 1454) may have no "
            "in-flight line. In CSV, LATENCY_us reads `>us`; in JSON, \"in_flight\": true "
            "with \"in_flight_ms\".")],
        "Latency is measured in the client: it includes the network and the server, and for "
        "writes only what the call waited for (a buffered write returns before its data "
        "reaches the server; the wait shows in fsync, commit and the RPCs). Commit (C) is "
        "mostly started by writeback kworkers, so -p PID sees only the commits its own "
        "fsync starts. The threshold is applied in the kernel; below it nothing is copied to "
        "user space. Stuck-operation lines start at max(MIN_MS, 1000) ms. On Debian 11 (5.10, "
        "no module BTF) kprobe-timed lines carry no file name and no mount (docs/probes.md).",
        (("nfsslower",),))


def nfsdist(lab: str) -> Example:
    return Example(
        "nfsdist",
        "nfsdist summarizes NFS operation latency as one log2 histogram per operation, every "
        "INTERVAL seconds COUNT times or, as here, once at Ctrl-C; the histograms are kept in "
        "the kernel, so the cost per operation is a map update.",
        lab + " netem added 50 ms to every packet on lo; the workload is labs/checks/workload.sh "
        "`all` (writes with fsync, O_SYNC writes, a read after dropping the cache, stat, cat).",
        [lab_section(
            "nfsdist",
            "The HH:MM:SS: line is when the interval ended (-T leaves it out, as bcc's -T). "
            "Each row counts the operations whose latency fell in [low, high] microseconds. "
            "The reads spread from microseconds (served from the page cache) to 65-262 ms (a "
            "READ round trip with netem's delay); the opens stayed local (NFSv3 has no OPEN "
            "call); the five stats that asked the server took a round trip each (65-131 ms), "
            "the others were answered from the attribute cache; every fsync took at least one "
            "round trip. An operation with no count in the interval has no section (here "
            "commit). The stars are scaled to the largest row of each histogram."),
         lab_section(
            "nfsdist-per-mount",
            "--per-mount splits each histogram by the file's mount (operations without one, "
            "RPCs, under `(no mount: RPC or other)`); -m counts in milliseconds. The same "
            "workload on the NFSv3 and NFSv4.2 mounts: five of NFSv4.2's opens went to the "
            "server (64-255 ms), none of NFSv3's took over 7 ms.", keep=66)],
        "Only completed operations are counted: one stuck on a server that does not answer "
        "shows when it ends (nfsslower and nfstop show it while it lasts). The buckets are "
        "powers of two, so a value is known to a factor of two; --json gives the same counts "
        "with byte totals per operation. Commit is mostly started by kworker threads, so -p "
        "PID counts only the commits of the process's own fsync.",
        (("nfsdist",),))


def nfstop(lab: str) -> Example:
    return Example(
        "nfstop",
        "nfstop shows NFS activity per process (or per comm, cgroup or mount with --by): "
        "operations per second, read and write MB/s, average and p99 latency per operation "
        "from in-kernel per-process histograms, and operations in flight now.",
        lab + " netem added 50 ms to every packet on lo.",
        [lab_section(
            "nfstop",
            "One table per interval (-C: not cleared), heaviest first. `R avg/p99 ms` is the "
            "average and the 99th percentile of the interval's reads in ms (p99 is the upper "
            "edge of its log2 bucket, hence 131.07 and 262.14); `-` means no such operation. "
            "INFL counts the process's threads inside an NFS operation at the end of the "
            "interval and OLDEST(s) how long the oldest has been there: a process stuck on a "
            "dead server shows there although it completes nothing: stat 1248 and 1249 had "
            "completed nothing yet and each had one getattr in flight when the second table "
            "was drawn. CGROUP is the cgroup v2 path of the process's first operation (its "
            "last 40 characters); `?` when the process had ended before it was read. Two "
            "workloads ran at once, one per mount.", keep=32),
         lab_section(
            "nfstop-cgroup",
            "--by cgroup sums the processes of each cgroup into one row (PIDS counts them), "
            "histograms included, so a row's p99 is as exact as a process's: here two systemd "
            "units (systemd-run --unit=backup and --unit=report), each running many short "
            "dd, stat and cat processes that one row per PID would scatter. report.service "
            "(one read of read.bin) ended within the interval, before nfstop named its "
            "cgroup: its row shows the cgroup's id, `cgroup:3088`. The first and last tables "
            "are empty: nothing ran then.")],
        "The screen is cleared between tables on a terminal unless -C. A cgroup removed "
        "before the tool names it (a unit that ended within the interval) shows as "
        "`cgroup:ID`. p99 is `-` when the interval's count and histogram were read while an "
        "operation was being added (they are two maps); the next interval has it.",
        (("nfstop",),))


#: nfsdtop's lab check run kept as a fixture (README.md there): labs/checks/nfsdtop/guest.py's output
NFSDTOP_LAB = REPO / "tests" / "fixtures" / "6.12.117+deb13-amd64" / "nfsdtop" / "guest-run.json.gz"


def nfsdtop_run() -> Dict[str, Any]:
    """The data of NFSDTOP_LAB: the runs' outputs, the server's counters, the guest's versions."""
    return json.loads(gzip.decompress(NFSDTOP_LAB.read_bytes()))["data"]


def nfsdtop_section(run: Dict[str, Any], where: str, read: str, keep: int) -> Section:
    """One nfsdtop run of NFSDTOP_LAB: stderr first (as a terminal shows it), then its first
    `keep` lines of stdout."""
    out = cut(run["lines"], keep, f"{NFSDTOP_LAB.relative_to(REPO)}, {where}")
    return Section(" ".join(run["argv"]), [f"(stderr) {line}" for line in run["stderr"].splitlines() if line] + out,
                   read)


def table_totals(lines: List[str], interval_s: float = 2.0) -> Dict[str, Tuple[int, float, float]]:
    """Per row name of nfsdtop's text tables: (requests, MB read, MB written) over the run, from
    each interval's REQ/s, RD_MB/s and WR_MB/s (the numbers the reader sees, summed)."""
    out: Dict[str, Tuple[int, float, float]] = {}
    for line in lines:
        fields = line.rsplit(None, 7)
        if len(fields) != 8 or fields[0] in ("CLIENT", "PROC", "EXPORT"):
            continue
        try:
            rate, read, written = (float(field) for field in fields[1:4])
        except ValueError:  # a banner line
            continue
        requests, mb_read, mb_written = out.get(fields[0], (0, 0.0, 0.0))
        out[fields[0]] = (requests + round(rate * interval_s), mb_read + read * interval_s,
                          mb_written + written * interval_s)
    return out


def nfsdtop_read(data: Dict[str, Any]) -> Dict[str, str]:
    """How to read each nfsdtop run of NFSDTOP_LAB (texts.client, texts.proc, texts.export, the
    --json run), its figures taken from the run itself."""
    clients = table_totals(data["texts"]["client"]["lines"])
    procs = table_totals(data["texts"]["proc"]["lines"])
    exports = table_totals(data["texts"]["export"]["lines"])
    local, neighbour = clients.get("127.0.0.1", (0, 0.0, 0.0)), clients.get("10.77.0.9", (0, 0.0, 0.0))
    v3 = ", ".join(f"{n} {name.split()[1]}" for name, (n, _r, _w) in sorted(procs.items(), key=lambda i: -i[1][0])
                   if name.startswith("NFSv3 "))
    compound = procs.get("NFSv4 COMPOUND", (0, 0.0, 0.0))
    v4 = ", ".join(f"{n} {name.split()[1]}" for name, (n, _r, _w) in sorted(procs.items(), key=lambda i: -i[1][0])
                   if name.startswith("NFSv4 ") and name != "NFSv4 COMPOUND")
    on_export = exports.get("/srv/nfs", (0, 0.0, 0.0))
    delta = data["server_delta"]
    return {
        "client": "One table per interval (-C: not cleared), the busiest client first. The guest is "
                  "its own NFS client, 127.0.0.1 (its NFSv3 and NFSv4.2 mounts), and a second one, "
                  "10.77.0.9 (an NFSv3 mount through an address added to lo for the run). Over the "
                  f"workload's intervals 127.0.0.1 sent {local[0]} requests and the server read "
                  f"{local[1]:.1f} MB and wrote {local[2]:.1f} MB for it (2 MiB each way per mount); "
                  f"10.77.0.9 sent {neighbour[0]} for the 4 KiB it wrote with fsync. AVG_ms is the "
                  "average service time, from nfsd's dispatch of the decoded call to the encoded "
                  "reply; P99_ms the upper edge of the log2 bucket holding the 99th percentile. "
                  "INPROG counts the requests being served when the table was drawn, OLDEST(s) how "
                  "long the oldest of them had been. The first table is the interval before the "
                  "workload; the last, empty, is the part of an interval left at Ctrl-C.",
        "proc": "The same workload, --by proc, in another nfsdtop at the same time: one row per RPC "
                "program, version and procedure, sorted by the nfsd time they took. The NFSv3 mounts "
                f"show each procedure ({v3}: the fsynced writes, the reads after the cache drop, "
                "the COMMIT of an fsync, and the MKDIRs, CREATEs, LOOKUPs and ACCESSes of making "
                "the files), NFSACL its own GETACL, and the NFSv4.2 mount its work in "
                f"{compound[0]} COMPOUNDs, which moved its 2 MiB each way, and beside them each "
                f"operation the COMPOUNDs carried, in a row of its own ({v4}): an operation's time runs "
                "from the end of the previous operation of its COMPOUND to its own encoded reply.",
        "export": "The same workload, --by export: one row per export, the path /proc/fs/nfs/exports "
                  "lists for the export of each request's file handle. Both clients' requests were "
                  f"on /srv/nfs ({on_export[0]} requests, {on_export[1]:.1f} MB read, "
                  f"{on_export[2]:.1f} MB written). A request that verifies no file handle (an NFSv4 "
                  "lease renewal: a COMPOUND of SEQUENCE alone) is a `-` row.",
        "json": "--json prints what it traces first, then one object per interval: `rows` as the "
                "table (every row, with each client's requests per procedure under `procs` and its "
                "NFSv4 operations under `operations`), "
                "`requests` with each (client, program, version, procedure, export)'s count, service "
                "time sum (`lat_ns`), bytes and log2 usec `slots`, `in_progress` and `missed`. -v "
                "says on stderr which attach point times what (nfsd_dispatch by fentry on this "
                "kernel, the nfsd read and write tracepoints for the bytes, fh_verify for the "
                "export) and which loader runs the probe. Over this run the lab check compared it "
                "with the server's own counters (/proc/net/rpc/nfsd): the same count for every "
                f"NFSv3 procedure and the same {delta['io read']} bytes read and {delta['io write']} "
                "written; `nfsdtop --backend bcc`, run beside it, counted the same.",
    }


NFSDTOP_CAVEATS = ("nfsdtop runs on the server. The service time is the nfsd thread's, not "
                   "the client's latency: the network and the client's queues are outside it. "
                   "An NFSv4 client's requests are COMPOUNDs; --by proc also shows each "
                   "operation inside them (NFSv4 READ_PLUS), which the client and export rows "
                   "do not count again. The probe runs from the prebuilt CO-RE object where the kernel has "
                   "BTF (libbpf1 and Python on the server), on bcc with --backend bcc, and "
                   "reads the client's address through nfsd's BTF (a kernel without it is "
                   "refused in one line). The screen is cleared between tables "
                   "on a terminal unless -C; -r limits the table, not --json.")


def nfsdtop() -> Example:
    data = nfsdtop_run()
    read = nfsdtop_read(data)
    return Example(
        "nfsdtop",
        "nfsdtop runs on an NFS server (knfsd) and shows its requests per client address (or "
        "--by proc per procedure, --by export per export): requests per second, read and write "
        "MB/s, average and p99 service time, requests in progress and how long the oldest has "
        "been served.",
        f"Real output of a lab run: Debian kernel {data['release']}, libbpf (core), bcc {data['bcc']} beside it, Python "
        f"{data['python']}, {data['date']}, a single-guest QEMU lab (NFS server and client in one VM, "
        "mounts over 127.0.0.1), labs/checks/nfsdtop/guest.py (the CI check of tests/lab/"
        f"test_nfsdtop_lab.py); the run: {NFSDTOP_LAB.relative_to(REPO)}, how it was kept: README.md "
        "there. The workload, on the NFSv3 and then the NFSv4.2 mount: a 2 MiB file written in "
        "64 KiB blocks and fsynced, the page cache dropped, the file read back, five stats; then "
        "4 KiB written with fsync on a third mount, through 10.77.0.9 (a second client).",
        [nfsdtop_section(data["texts"]["client"], "texts.client.lines", read["client"], 40),
         nfsdtop_section(data["texts"]["proc"], "texts.proc.lines", read["proc"], 60),
         nfsdtop_section(data["texts"]["export"], "texts.export.lines", read["export"], 40),
         nfsdtop_section(data["nfsdtop"], "nfsdtop.lines", read["json"], 3)],
        NFSDTOP_CAVEATS,
        (("nfsdtop",),))


#: a CI-style fs lab run kept as a fixture (README.md there): fsslower -t xfs -v --json 0
FS_LAB = REPO / "tests" / "fixtures" / "6.12.117+deb13-amd64" / "fs-lab" / "guest-run.json.gz"


def fs_lab_run(fs: str) -> Tuple[str, List[str], List[str]]:
    """(command as typed, stdout lines, stderr lines) of one tool run in FS_LAB."""
    run_data = json.loads(gzip.decompress(FS_LAB.read_bytes()))["data"]["runs"][fs]
    return " ".join(run_data["args"]), run_data["lines"], run_data["stderr"].splitlines()


def fsslower(lab: str) -> Example:
    return Example(
        "fsslower",
        "fsslower -t FS is nfsslower for another filesystem (a spec in probes/specs: ext4, "
        "xfs, btrfs, cifs, nfs), with libbpf-tools' flags (-m MIN, -c, -d) and bcc's columns.",
        lab + " XFS on a device-mapper `delay` device adding 20 ms to every I/O; dd wrote 512 "
        "KiB with fsync, the page cache was dropped, the file read back, then stat.",
        [lab_section(
            "fsslower",
            "Columns as nfsslower's; the banner names the filesystem as its spec's title says. "
            "Four of dd's eight 64 KiB writes took over 1 ms (the first 20 ms); the fsync (F, "
            "242 ms) waited for the delayed device, and so did the reads after the page cache "
            "was dropped, the first (167 ms) longest; the reads not shown took under 1 ms "
            "(their pages had been read ahead).", where=FS_CAPTURES),
         fs_section(
            f"The same tool in the lab's fs check ({FS_LAB.parent.relative_to(REPO)}/: the same "
            "kernel and bcc, 2026-12-03; a worker's reads, writes, two fsyncs and stats on XFS, "
            "once as it was and once with 600 ms added to every I/O). -v says on stderr which "
            "attach point times each operation (fentry on the XFS functions under the VFS) "
            "and how the tool runs; --json prints one object per operation, with nfsslower's "
            "fields; MIN_MS 0 prints every operation. In the first round the reads and writes "
            "took microseconds to a few ms and the fsync 14 ms. With the delay, the two reads "
            "that missed the page cache took 633 and 732 ms and each fsync about 1.9 s (several "
            "delayed writes), and each fsync was printed while in flight (\"in_flight\": "
            "true, past 1 s) before its completion line.", keep=14, tail=8)],
        "As nfsslower's: latency from the call into the filesystem to its return, buffered "
        "writes return before the device is written. -t takes the names in probes/specs "
        "(--spec FILE for a spec of your own, from `discover propose`). SMB/CIFS with "
        "cache=none reads through netfs functions the cifs spec does not attach "
        "(docs/probes.md).",
        (("fsslower",),))


def fsdist(lab: str) -> Example:
    return Example(
        "fsdist",
        "fsdist -t FS is nfsdist for another filesystem, with libbpf-tools fsdist's flags: -T "
        "adds the HH:MM:SS: line (off by default, the opposite of bcc nfsdist's -T).",
        lab + " ext4 on a device-mapper `delay` device adding 20 ms to every I/O; dd wrote 512 "
        "KiB with fsync, the page cache was dropped, the file read back, then stat; twice.",
        [lab_section(
            "fsdist",
            "Three 5-second intervals, each after its HH:MM:SS: line (-T), of the operations "
            "on the mount holding /mnt/ex-ext4 only (--mount-point; the guest's root "
            "filesystem is ext4 too). Both rounds of the workload fell in the first: the two "
            "fsyncs waited for the delayed device (65-262 ms), and so did six of the reads "
            "(16-32 ms) after the page cache was dropped; the other reads took 1 us to 4 ms. "
            "An interval without operations prints its time line only.", where=FS_CAPTURES)],
        "As nfsdist's: completed operations only, log2 buckets. The local filesystems' specs "
        "have no commit operation, so the default operations are R W O G F.",
        (("fsdist",),))


def fstop(lab: str) -> Example:
    return Example(
        "fstop",
        "fstop -t FS is nfstop for another filesystem: per process (or --by comm, cgroup, "
        "mount) ops/s, MB/s, average and p99 latency per operation, in flight now.",
        lab + " btrfs on a device-mapper `delay` device adding 20 ms to every I/O; two shells "
        "each wrote 512 KiB with fsync, dropped the page cache, read it back and ran stat.",
        [lab_section(
            "fstop",
            "Columns as nfstop's, without C (the local filesystems' specs have no commit). "
            "Two shells ran the workload at once: dd 875 and 876 wrote 512 KiB each (W) and "
            "flushed it (F: 218 and 488 ms on the delayed device), 877 and 878 read it back "
            "after the page cache was dropped, 879 and 880 ran stat. The last two tables are "
            "an interval with nothing and the part of one left at Ctrl-C.", where=FS_CAPTURES)],
        "As nfstop's. btrfs reports a per-subvolume device in stat, so --mount-point and "
        "--by mount use the longest mount point above the path.",
        (("fstop",),))


def exporter_lines(scrape: List[str]) -> List[str]:
    """probekit's own series of a scrape (not the process and Python collectors'), the
    latency buckets of one operation and mount only (every other one has as many)."""
    def wanted(line: str) -> bool:
        if "probekit_" not in line:
            return False
        if "probekit_nfs_op_latency_seconds_bucket" in line:
            return 'op="read"' in line and 'mountpoint="/mnt/nfs3"' in line
        return True
    return [line for line in scrape if wanted(line)]


def exporter(lab: str) -> Example:
    command, scrape, err = capture("nfs-exporter")
    shown = exporter_lines(scrape)
    left = len(scrape) - len(shown)
    return Example(
        "nfs-exporter",
        "nfs-exporter serves the NFS latency histograms of nfsdist, per operation and mount, "
        "as Prometheus metrics (127.0.0.1:19910 by default), with node_exporter's mount "
        "labels (export, protocol, mountaddr) plus mountpoint and nfs_version.",
        lab + " One scrape of http://127.0.0.1:19910/metrics after labs/checks/workload.sh "
        "`all` on the NFSv3 mount (no netem), then Ctrl-C.",
        [Section(command, [f"(stderr) {line}" for line in err], "On stderr: where it serves (at "
                 "once: a scrape meanwhile says probekit_nfs_probe_attached 0), the operations "
                 "once the probe is compiled and attached (here 2.5 minutes later, in an "
                 "emulated guest), and how it ended. With -v it says which attach point each "
                 "operation uses."),
         Section("curl -s http://127.0.0.1:19910/metrics   # the scrape; shown: probekit's series, "
                 "latency buckets of read on /mnt/nfs3 (capture_examples.sh fetched it with Python's urllib)",
                 shown + [CUT.format(n=left, where="the other latency buckets, and the process and "
                          f"Python collectors' series; all in {CAPTURES.relative_to(REPO)}/nfs-exporter.out")],
                 "probekit_nfs_probe_attached is 1 while the probes are attached. "
                 "probekit_nfs_op_latency_seconds is a histogram per operation and mount, with "
                 "node_exporter's mount labels: its `le` edges are 2^k-1 ns (the kernel's log2 "
                 "slots) in seconds, and _sum is exact (11 reads, 60 ms in all, most from the "
                 "page cache). probekit_nfs_ops_total and _bytes_total count completed "
                 "operations; probekit_nfs_ops_in_flight those running at the scrape; "
                 "probekit_probe_info the attach point timing each operation; "
                 "probekit_nfs_missed_total the operations the probes could not time. "
                 "docs/exporter.md has every series and PromQL for each.")],
        "The exporter serves NFS only (-t FS specs of other filesystems are refused: its "
        "labels are NFS's). It listens on 127.0.0.1 unless --address says otherwise; a "
        "remote Prometheus needs --address and a firewall rule (docs/exporter.md). A mount "
        "gone for longer than the grace period drops its series.",
        (("nfs-exporter",),))


def fs_section(read: str, keep: int, tail: int) -> Section:
    """fsslower's run in FS_LAB: stderr first (as a terminal shows it), then the first `keep`
    and last `tail` lines of stdout."""
    command, out, err = fs_lab_run("xfs")
    where = f"{FS_LAB.relative_to(REPO)}, runs.xfs.lines"
    shown = out[:keep] + [CUT.format(n=len(out) - keep - tail, where=where)] + out[-tail:]
    return Section(command, [f"(stderr) {line}" for line in err if line] + shown, read)


def discover_section(argv: List[str], read: str, keep: int, shown: Optional[str] = None) -> Section:
    """A discover command run now on the repository's real captures (no root, no tracefs)."""
    out, err = run(["discover", *argv])
    lines = out.rstrip("\n").splitlines() + [f"(stderr) {line}" for line in err.rstrip("\n").splitlines()]
    return Section(shown or "discover " + " ".join(shlex.quote(a) for a in argv),
                   cut(lines, keep, "run the command to see them all"), read)


def discover() -> Example:
    trace = f"{DISCOVER_61}/function_graph/nfs3.nfs_file_read.default.trace"
    profile = f"{DISCOVER_61}/profile.json.gz"
    with tempfile.TemporaryDirectory(prefix="probekit-examples-") as tmp:
        graphs = Path(tmp) / "graphs"
        graphs.mkdir()
        run(["discover", "callgraph", "--from-file", trace, "--format", "json", "-o", str(graphs / "read3.json")])
        sections = [
            discover_section(
                ["callgraph", "nfs_file_read", "--from-file", trace, "--depth", "2"],
                "The call graph of nfs_file_read from a function_graph capture of NFSv3 reads in "
                "a Debian 6.1.0-50 lab guest (on a live kernel, as root: --workload CMD captures "
                "it). Per function: calls, total, average and self time (self: not in a traced "
                "callee). Interrupts that hit the capture are counted apart, not in the "
                "functions they interrupted.", keep=30),
            discover_section(
                ["events", "nfs", "--kernel-profile", profile],
                "The tracepoint pairs of the nfs subsystem that bracket an operation, from the "
                "same kernel's profile (`discover snapshot`): sync pairs match on the task, "
                "async ones on the fields listed.", keep=30),
            discover_section(
                ["propose", "nfs", "--ops", "read,getattr", "--kernel-profile", profile,
                 "--callgraphs", str(graphs)],
                "Ranked attach points per operation, each with why: stability, coverage, what "
                "falls in the timed window, traceability on this kernel, and the evidence of "
                "the call graphs given (/tmp/graphs holds the nfs_file_read graph above, written "
                "with --format json -o /tmp/graphs/read3.json). With -o FILE it "
                "writes the probe spec the tools read; a person reviews it before it replaces "
                "one in probes/specs.", keep=40,
                shown=f"discover propose nfs --ops read,getattr --kernel-profile {profile} --callgraphs /tmp/graphs")]
    return Example(
        "discover",
        "discover finds what a kernel function calls (callgraph), which tracepoint pairs "
        "bracket a filesystem's operations (events), and ranks attach points for timing "
        "each operation (propose), which the tools are generated from.",
        "Real kernel data: function_graph captures and the kernel profile of a Debian 6.1.0-50 "
        f"lab guest ({DISCOVER_61}/, README.md there). These commands need neither root nor "
        "tracefs; the outputs below are what they print on those files today (python3 -m "
        "labs.capture.examples runs them).",
        sections,
        "callgraph on a live kernel needs root and function_graph (tracefs settings are "
        "restored on exit; 6.11 and later capture in a private instance). A capture holds "
        "what the workload made the kernel do, not every path: propose says when an attach "
        "point's events did not fire in the captures given. Tables are as wide as the "
        "terminal (COLUMNS); these were rendered at 100.",
        (("discover", "callgraph"), ("discover", "events"), ("discover", "propose")))


def write_all(out: Path = OUT) -> List[Path]:
    """Every example file, rewritten."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for tool in TOOLS:
        path = out / f"{tool}_example.txt"
        path.write_text(render(example(tool)))
        written.append(path)
    return written


if __name__ == "__main__":
    for path in write_all():
        print(path.relative_to(REPO))

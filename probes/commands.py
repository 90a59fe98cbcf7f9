"""nfsslower, nfsdist, nfstop, and fsslower, fsdist, fstop -t FS: latency tools generated from a probe spec.

Output follows bcc's nfsslower / nfsdist (same columns, CSV header and histogram layout)
so that they can replace Debian's bpfcc tools; the fs tools take libbpf-tools' fsslower /
fsdist flags (-t FS; fsslower's -m MIN, -c, -d) for any spec in probes/specs or --spec.
nfstop and fstop are the per-process view no bcc tool offers. The nfs tools are the
`-t nfs` case of the same code. Commit (C) mostly starts in kworker writeback context:
-p PID sees only the commits the process's own fsync starts.
"""
from __future__ import annotations

import functools
import json
import os
import re
import sys
import time
from pathlib import Path

from discover.arguments import Parser, file_path, float_at_least, int_range
from discover.errors import UserError, run_cli
from probes.backend_choice import BACKENDS
from probes.cgroups import CgroupNames, filter_dir, task_cgroup
from probes.filenames import FileNames
from probes.model import Tool
from probes.histogram import buckets, format_log2, percentile
from probes.inflight import Stall, StallReporter, stalls, still_in_flight
from probes.mounts import MountTable, mount_dev
from probes.runtime import DEFAULT_SPEC, SPECS_DIR, Session, load_tool_spec, missed_by_op, missed_json
from discover.spec import DEFAULT_OPS, OPS, parse_ops, serves_fstype, spec_title

TYPE_CHECKING = False  # typing's constant without typing (discover/records.py)
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple
    from probes.runtime import ServerKey
else:
    from discover.records import NamedTuple

OPS_HELP = ("Comma-separated operations (names or letters), or all: "
            + ", ".join(f"{name} ({letter})" for name, letter in OPS.items())
            + f". Default: {','.join(OPS[op] for op in DEFAULT_OPS)}. P times every RPC (sunrpc),"
            " whoever started it; RPCs are tracked in flight whatever --ops says, so an operation"
            " stuck outside it shows as the RPC it waits in.")
COMMIT_NOTE = ("Commit (C) is mostly started by writeback in kworker threads, not by the writing process:\n"
               "with -p PID only the commits its own fsync starts are shown.")


class Target(NamedTuple):
    """The filesystem a tool traces: its spec (path and contents) and its name in banners."""

    spec_path: Path
    spec: Dict[str, Any]
    title: str

    def ops(self, text: Optional[str]) -> List[str]:
        """--ops, or by default DEFAULT_OPS the spec has (no commit where there is no COMMIT)."""
        if text is None:
            return [op for op in DEFAULT_OPS if op in self.spec["ops"]]
        return parse_ops(text)


@functools.lru_cache(maxsize=None)
def known_types() -> Tuple[str, ...]:
    """The specs' filesystems (three commands' --help name them: one directory read)."""
    return tuple(sorted(path.stem for path in SPECS_DIR.glob("*.toml")))


def find_target(fs_type: Optional[str], spec_path: Optional[str]) -> Target:
    """-t FS and/or --spec FILE -> the Target; one-line UserError for an unknown type, a spec
    that does not load, or a -t that is not the spec's filesystem."""
    if spec_path is None and fs_type is None:
        raise UserError("which filesystem? -t FS (" + ", ".join(known_types()) + ") or --spec FILE")
    path = Path(spec_path) if spec_path else SPECS_DIR / f"{fs_type}.toml"
    if spec_path is None and (not re.fullmatch(r"[a-z0-9_]+", str(fs_type)) or not path.is_file()):
        raise UserError(f"-t {fs_type}: no spec for it in probekit (known: {', '.join(known_types())}); "
                        f"write one with `discover propose {fs_type}` and pass it with --spec FILE")
    spec = load_tool_spec(path)
    if fs_type is not None and spec["filesystem"] != fs_type:
        raise UserError(f"-t {fs_type}: {path} is a spec for {spec['filesystem']}")
    return Target(path, spec, spec_title(spec))


def nfs_target(spec_path: Optional[str]) -> Target:
    """The nfs tools' filesystem: nfs.toml, or the --spec given (any filesystem's)."""
    return find_target(None if spec_path else "nfs", spec_path)


def spec_option(parser: Parser) -> None:
    parser.add_argument("--spec", dest="spec_path", metavar="FILE", type=file_path,
                        help="Probe spec (default: the filesystem's in probes/specs/).")


def loader_options(parser: Parser) -> None:
    """-v, --kprobes and --backend: how the probe is chosen and loaded (every tool's)."""
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="Say which attach point each operation uses, and why others were skipped.")
    parser.add_argument("--kprobes", dest="kprobes_only", action="store_true",
                        help="Attach kprobe pairs even where fentry/fexit work (they cost more per operation; for "
                             "comparing the two, or a kernel whose trampolines misbehave).")
    parser.add_argument("--backend", choices=BACKENDS, default="auto",
                        help="BPF loader: core loads the prebuilt CO-RE object with libbpf (no compiler on this "
                             "machine), bcc compiles the probe at start-up; auto takes core where libbpf 1.0+, a "
                             "5.15+ kernel, its BTF and the object allow, else bcc (-v says which and why). "
                             "[default: auto]")


def common(parser: Parser) -> None:
    """The client tools' filters and loader options."""
    parser.add_argument("--ops", dest="ops_text", metavar="TEXT", help=OPS_HELP)
    parser.add_argument("--cgroup", metavar="PATH",
                        help="Only tasks in this cgroup v2 subtree (a directory under /sys/fs/cgroup, or its path "
                             "as /proc/PID/cgroup writes it; filtered in the kernel).")
    parser.add_argument("--mount-point", dest="mount_point", metavar="PATH",
                        help="Only operations on the mount holding PATH (filtered in the kernel; RPCs, which have "
                             "no file, are left out).")
    spec_option(parser)
    loader_options(parser)


def fs_type_option(parser: Parser) -> None:
    """libbpf-tools' -t/--type: which filesystem's spec (probes/specs/FS.toml)."""
    parser.add_argument("-t", "--type", dest="fs_type", metavar="FS",
                        help="Filesystem to trace: a spec in probes/specs (" + ", ".join(known_types())
                             + "); or give --spec FILE.")


def pid_option(parser: Parser) -> None:
    parser.add_argument("-p", "--pid", type=int_range(1), help="Trace this process (TGID) only.")


class Filters:
    """--cgroup and --mount-point, checked before anything is compiled or attached."""

    def __init__(self, target: Target, cgroup: Optional[str], mount_point: Optional[str]) -> None:
        self.mounts = MountTable(serves=lambda fstype: serves_fstype(target.spec, fstype))
        self.cgroup_dir = filter_dir(cgroup) if cgroup else None
        self.mount_dev = mount_dev(mount_point, self.mounts, target.title) if mount_point else 0


#: bcc nfsslower's column header and CSV header, unchanged
SLOWER_HEADER = "%-8s %-14s %-6s %1s %-7s %-8s %7s %s" % ("TIME", "COMM", "PID", "T", "BYTES", "OFF_KB",
                                                         "LAT(ms)", "FILENAME")
CSV_HEADER = "ENDTIME_us,TASK,PID,TYPE,BYTES,OFFSET_b,LATENCY_us,FILE"


def slower_row(clock: str, comm: str, pid: int, letter: str, nbytes: int, offset: int, lat_ns: int,
               name: str, mount: Optional[str] = None) -> str:
    """One nfsslower line in bcc's layout (offset in KiB, latency in ms with 2 decimals); with
    -M the mount point comes before the file name."""
    return "%-8s %-14.14s %-6s %1s %-7s %-8d %7.2f %s" % (clock, comm, pid, letter, nbytes, offset // 1024,
                                                         lat_ns / 1e6, _with_mount(name, mount))


def _with_mount(name: str, mount: Optional[str]) -> str:
    return name if mount is None else "%-12s %s" % (mount, name)


def _stall_file(stall: Stall) -> str:
    """FILENAME of a stall line: the file, and the RPC the thread waits for (and where); an RPC
    line names the file only where its thread's system call does (not a kworker's)."""
    if stall.op == "rpc":
        to = f" in flight{' to ' + stall.server if stall.server else ''})"
        if stall.file not in ("?", stall.rpc):
            return f"{stall.file} (RPC {stall.rpc or '?'}{to}"
        return f"{stall.rpc or '?'} (RPC{to}"
    rpc = f"; RPC {stall.rpc}{' to ' + stall.server if stall.server else ''}" if stall.rpc else ""
    return f"{stall.file} (in flight{rpc})"


def _csv_file(name: str, mount: Optional[str]) -> str:
    """CSV's last field(s): FILE, or MOUNT,FILE with -M (the file name stays last: it may hold commas)."""
    return name if mount is None else f"{mount},{name}"


def stall_row(clock: str, stall: Stall, letter: str, mount: Optional[str] = None) -> str:
    """A stall in bcc's layout: `>` before the time in flight so far, `-` for size and offset
    (not known until the operation ends), `(in flight...)` after the file name."""
    return "%-8s %-14.14s %-6s %1s %-7s %-8s %7s %s" % (clock, stall.comm, stall.pid, letter, "-", "-",
                                                        ">%.2f" % (stall.age_ns / 1e6),
                                                        _with_mount(_stall_file(stall), mount))


SLOWER_EXAMPLES = f"""

{COMMIT_NOTE}

Examples:
  nfsslower                # trace NFS operations slower than 10 ms
  nfsslower 1              # trace NFS operations slower than 1 ms
  nfsslower 0              # trace every NFS operation (verbose output)
  nfsslower -j 1           # ... 1 ms, parsable CSV output
  nfsslower --json 5       # ... 5 ms, one JSON object per line
  nfsslower -p 185         # trace PID 185 only
  nfsslower --ops R,W -v   # reads and writes; show the attach points chosen (fentry or kprobes)
  nfsslower --kprobes      # kprobe pairs even where fentry/fexit work (to compare their cost)
  nfsslower --ops all 1000 # every operation and RPC slower than 1 s, stuck ones included
  nfsslower -M 1           # ... 1 ms, with a MOUNT column (the mount point)
  nfsslower --mount-point /mnt/nfs 1     # one mount only
  nfsslower --cgroup /sys/fs/cgroup/system.slice/backup.service 1  # one unit (and its children)

Operations still in flight past MIN_MS are printed while they last (a server that stops
answering shows at once, not only when it comes back): LAT(ms) reads `>ms so far`,
BYTES/OFF_KB `-`, and the file name is followed by `(in flight; RPC proc to server)`; CSV:
LATENCY_us `>us`; JSON: "in_flight": true, "in_flight_ms" (completed lines: "in_flight":
false, "lat_us"). Each is printed when it crosses MIN_MS (at least 1 s) and again every
--stall-interval seconds; its completion line follows when it ends.

JSON lines always carry "mount" (mount point, null for RPCs) and "cgroup" (cgroup v2 path).
"""


def slower_options(parser: Parser) -> None:
    """The options nfsslower and fsslower share (bcc's, and probekit's own)."""
    pid_option(parser)
    parser.add_argument("--json", dest="as_json", action="store_true", help="One JSON object per event.")
    parser.add_argument("--stall-interval", metavar="SECONDS", type=float_at_least(0), default=10.0,
                        help="Seconds between repeats of a stuck operation's line; 0: no in-flight lines. "
                             "[default: 10.0]")
    parser.add_argument("-M", "--mount", dest="show_mount", action="store_true",
                        help="A MOUNT column (mount point) before FILENAME.")
    common(parser)


FS_SLOWER_EXAMPLES = """

Examples:
  fsslower -t ext4             # trace ext4 operations slower than 10 ms
  fsslower -t xfs 1            # trace XFS operations slower than 1 ms (or: -m 1)
  fsslower -t btrfs -m 0 -d 10 # every btrfs operation, for 10 seconds
  fsslower -t cifs -c 5        # SMB/CIFS operations slower than 5 ms, CSV
  fsslower -t ext4 --mount-point /srv/data 1   # one mount only (the root fs is ext4 too)
  fsslower -t xfs --json -M 0  # every operation as JSON, with its mount
  fsslower --spec my-fs.toml 1 # a spec of your own (discover propose FS)

Columns, CSV and JSON as nfsslower's; the filesystems known: probes/specs/*.toml.
Operations still in flight past MIN_MS are printed while they last (LAT(ms) `>ms so far`).
"""


def nfsslower_parser() -> Parser:
    parser = Parser("nfsslower", "[OPTIONS] [MIN_MS]", nfsslower.__doc__, SLOWER_EXAMPLES)
    parser.add_argument("min_ms", metavar="MIN_MS", nargs="?", type=int_range(0), default=10,
                        help="Latency threshold in ms. [default: 10]")
    parser.add_argument("-j", "--csv", dest="as_csv", action="store_true",
                        help="CSV output, times in microseconds (bcc's -j).")
    slower_options(parser)
    return parser


def nfsslower(argv: Optional[Sequence[str]] = None) -> None:
    """Trace NFS reads, writes, opens, getattrs, fsyncs and commits slower than MIN_MS
    (default 10; 0 traces all), with process, size, offset and file name, and operations
    stuck longer than that while they are stuck."""
    a = nfsslower_parser().parse(argv)
    run_slower("nfsslower", nfs_target(a.spec_path), a.min_ms, a.pid, a.as_csv, a.as_json, a.stall_interval,
               a.show_mount, a.cgroup, a.mount_point, a.ops_text, a.verbose, a.kprobes_only, a.backend)


def fsslower_parser() -> Parser:
    parser = Parser("fsslower", "[OPTIONS] [MIN_MS]", fsslower.__doc__, FS_SLOWER_EXAMPLES)
    parser.add_argument("min_arg", metavar="MIN_MS", nargs="?", type=int_range(0),
                        help="Latency threshold in ms, as bcc's tools take it (or -m).")
    fs_type_option(parser)
    parser.add_argument("-m", "--min", dest="min_opt", type=int_range(0), metavar="MIN_MS",
                        help="Min latency to trace, in ms (default 10; 0 traces all): libbpf-tools' -m, or MIN_MS "
                             "as bcc.")
    parser.add_argument("-c", "-j", "--csv", dest="as_csv", action="store_true",
                        help="CSV output, times in microseconds (libbpf-tools' -c, bcc's -j).")
    parser.add_argument("-d", "--duration", type=int_range(1), metavar="S", help="Trace for S seconds, then exit.")
    slower_options(parser)
    return parser


def fsslower(argv: Optional[Sequence[str]] = None) -> None:
    """Trace a filesystem's reads, writes, opens, fsyncs and getattrs slower than MIN_MS
    (default 10; 0 traces all), with process, size, offset and file name, and operations
    stuck longer than that while they are stuck. -t FS picks the spec (probes/specs/FS.toml)."""
    a = fsslower_parser().parse(argv)
    if a.min_arg is not None and a.min_opt is not None and a.min_arg != a.min_opt:
        raise UserError(f"two minimum latencies: MIN_MS {a.min_arg} and -m {a.min_opt}")
    min_ms = next((m for m in (a.min_opt, a.min_arg) if m is not None), 10)
    run_slower("fsslower", find_target(a.fs_type, a.spec_path), min_ms, a.pid, a.as_csv, a.as_json,
               a.stall_interval, a.show_mount, a.cgroup, a.mount_point, a.ops_text, a.verbose, a.kprobes_only,
               a.backend, a.duration)


def run_slower(prog: str, target: Target, min_ms: int, pid: Optional[int], as_csv: bool, as_json: bool,
               stall_interval: float, show_mount: bool, cgroup: Optional[str], mount_point: Optional[str],
               ops_text: Optional[str], verbose: bool, kprobes_only: bool, backend: str,
               duration: Optional[int] = None) -> None:
    """nfsslower and fsslower: one line per operation slower than min_ms, in bcc's layout."""
    if as_csv and as_json:
        raise UserError("choose one of -j/--csv and --json")
    ops = target.ops(ops_text)
    where = Filters(target, cgroup, mount_point)
    tool = Tool(events=True, tgid=pid or 0, min_lat_ns=min_ms * 1000000, inflight=stall_interval > 0,
                mount_dev=where.mount_dev)
    session = Session(prog, tool, ops, target.spec, verbose, where.cgroup_dir, fentry=not kprobes_only, backend=backend)
    letters = dict(zip(session.probe.ops, session.probe.letters))
    reporter = StallReporter(max(min_ms, 1000) * 1000000, stall_interval)
    cgroups = CgroupNames()
    names = FileNames()

    def mount_of(dev: int) -> Optional[str]:
        mount = where.mounts.get(dev)
        return mount.mountpoint if mount is not None else None

    def column(dev: int) -> Optional[str]:
        """The MOUNT column's text with -M, else None (no column)."""
        return (mount_of(dev) or "-") if show_mount else None

    def show_stalls() -> None:
        now = time.monotonic_ns()
        found = stalls(session.in_flight(), now, reporter.min_age_ns)
        if found:
            found = still_in_flight(found, session.in_flight())
        for stall in reporter.due(found, now):
            letter = letters.get(stall.op, "?")
            if as_json:
                print(json.dumps({"in_flight": True, "in_flight_ms": round(stall.age_ns / 1e6, 3),
                                  "start_us": stall.start_ns // 1000, "comm": stall.comm, "pid": stall.pid,
                                  "tid": stall.tid, "op": stall.op, "type": letter, "file": stall.file,
                                  "rpc": stall.rpc, "server": stall.server, "mount": mount_of(stall.dev),
                                  "cgroup": task_cgroup(stall.pid)}), flush=True)
            elif as_csv:
                print("%d,%s,%d,%s,-,-,>%d,%s" % (now // 1000, stall.comm, stall.pid, letter, stall.age_ns // 1000,
                                                   _csv_file(_stall_file(stall), column(stall.dev))), flush=True)
            else:
                print(stall_row(time.strftime("%H:%M:%S"), stall, letter, column(stall.dev)), flush=True)

    def show_all(events: List[Dict[str, Any]]) -> None:
        for event in events:  # names first, from every line of this read (see FileNames)
            if event["name"] and session.op_name(event["op"]) != "rpc":
                names.learn(event["dev"], event["fileid"], event["name"])
        for event in events:
            show(event)

    def show(event: Dict[str, Any]) -> None:
        letter = session.letter(event["op"])
        name = ((event["name"] or "?") if session.op_name(event["op"]) == "rpc" else
                names.name(event["name"], event["dev"], event["fileid"], event["pid"]))
        if as_json:
            op = session.op_name(event["op"])
            print(json.dumps({"in_flight": False, "end_us": event["end_ns"] // 1000, "comm": event["comm"],
                              "pid": event["pid"], "op": op, "type": letter, "bytes": event["bytes"],
                              "offset": event["offset"], "lat_us": event["lat_ns"] // 1000,
                              "file": name, "fileid": event["fileid"],
                              "rpc": event["name"] if op == "rpc" else None, "mount": mount_of(event["dev"]),
                              "cgroup": cgroups.name(event["cgroup"])}), flush=True)
        elif as_csv:
            print("%d,%s,%d,%s,%d,%d,%d,%s" % (event["end_ns"] // 1000, event["comm"], event["pid"], letter,
                                               event["bytes"], event["offset"], event["lat_ns"] // 1000,
                                               _csv_file(name, column(event["dev"]))), flush=True)
        else:
            print(slower_row(time.strftime("%H:%M:%S"), event["comm"], event["pid"], letter, event["bytes"],
                             event["offset"], event["lat_ns"], name, column(event["dev"])), flush=True)

    with session:
        session.on_events(show_all)
        if tool.inflight:
            session.on_tick(show_stalls)
        if as_csv:
            print(CSV_HEADER if not show_mount else CSV_HEADER.replace(",FILE", ",MOUNT,FILE"), flush=True)
        elif not as_json:
            print(f"Tracing {target.title} operations... Ctrl-C to quit" if min_ms == 0 else
                  f"Tracing {target.title} operations that are slower than {min_ms} ms... Ctrl-C to quit")
            print(SLOWER_HEADER if not show_mount else SLOWER_HEADER.replace("FILENAME", "%-12s FILENAME" % "MOUNT"),
                  flush=True)
        else:
            print(json.dumps({"tracing": session.ops, "min_ms": min_ms}), flush=True)
        session.poll_until_stopped(duration)


DIST_EXAMPLES = """

Examples:
  nfsdist              # summarize NFS operation latency as a histogram per operation
  nfsdist 1 10         # print 1 second summaries, 10 times
  nfsdist -mT 1        # 1s summaries, milliseconds, no timestamp lines
  nfsdist -p 181       # trace PID 181 only
  nfsdist --json 5 1   # one 5 s summary as JSON (counts, bytes, buckets per op)
  nfsdist --per-mount 10 1  # one histogram per operation per NFS mount
  nfsdist --cgroup /system.slice/nfs-backup.service 5   # one unit's operations
  nfsdist --ops open,getattr -v
"""


FS_DIST_EXAMPLES = """

Examples:
  fsdist -t ext4           # summarize ext4 operation latency as a histogram per operation
  fsdist -t xfs 1 10       # print 1 second summaries, 10 times
  fsdist -t btrfs -mT 1    # 1s summaries, milliseconds, and timestamps (libbpf-tools' -T)
  fsdist -t ext4 -p 181    # trace PID 181 only
  fsdist -t ext4 --mount-point /srv/data --json 5 1   # one mount, one 5 s summary as JSON
  fsdist -t xfs --per-mount 10 1   # one histogram per operation per mount
"""


def _json_hist(entry: Dict[str, Any]) -> Dict[str, Any]:
    vals = buckets(entry["slots"])
    hist = []
    for i in range(1, len(vals)):
        hist.append({"interval-start": (1 << i) >> 1 if i > 1 else 0,
                     "interval-end": (1 << i) - 1, "count": vals[i]})
    if vals:
        hist.insert(0, {"interval-start": 0, "interval-end": 0, "count": vals[0]})
    return {"count": entry["count"], "bytes": entry["bytes"], "hist": hist}


def mount_name(mounts: MountTable, dev: int) -> str:
    """How --per-mount names a superblock: its mount point, or why there is none."""
    mount = mounts.get(dev)
    if mount is not None:
        return mount.mountpoint
    return "(no mount: RPC or other)" if dev == 0 else f"(dev {dev >> 20}:{dev & 0xfffff}, not mounted now)"


def missed_fields(session: Session) -> Dict[str, Any]:
    """A JSON interval's missed operations: "missed" per op; where any, "missed_by" per op,
    cause and place (the counter that says so); where the kernel may skip operations without
    a count the tool can read, "unvouched" says what (Session.unvouched)."""
    causes = session.missed_causes_since("interval")
    out: Dict[str, Any] = {"missed": missed_by_op(causes)}
    if causes:
        out["missed_by"] = missed_json(causes)
    if session.unvouched:
        out["unvouched"] = session.unvouched
    return out


def _dist_json(session: Session, data: Dict[str, Dict[str, Any]], unit: str, mounts: Optional[MountTable]) -> str:
    ops: Dict[str, Any] = {}
    for op, entry in data.items():
        ops[op] = _json_hist(entry)
        if mounts is not None:
            ops[op]["mounts"] = {mount_name(mounts, dev): _json_hist(e) for dev, e in entry["mounts"].items()
                                 if e["count"]}
    return json.dumps({"ts": time.strftime("%Y-%m-%d %H:%M:%S"), "val_type": unit, "ops": ops,
                       "anomalies": session.anomalies(), **missed_fields(session)})


def _dist_sections(data: Dict[str, Dict[str, Any]], mounts: Optional[MountTable]) -> List[Tuple[str, List[int]]]:
    """(section title, buckets) per op with operations, or per op and mount (--per-mount)."""
    if mounts is None:
        return [(op, buckets(e["slots"])) for op, e in data.items() if e["count"]]
    return [(f"{op}, mount = {mount_name(mounts, dev)}", buckets(e["slots"]))
            for op, entry in data.items() for dev, e in sorted(entry["mounts"].items()) if e["count"]]


def dist_text(sections: List[Tuple[str, List[int]]], unit: str, clock: Optional[str]) -> List[str]:
    """One interval as bcc's nfsdist prints it: blank line, `HH:MM:SS:`, a section per op."""
    lines = [""] + ([f"{clock}:"] if clock else [])
    for op, vals in sections:
        lines += ["", f"operation = {op}"] + format_log2(vals, unit)
    return lines


def dist_options(parser: Parser) -> None:
    """nfsdist's and fsdist's arguments and options but -T (bcc's and libbpf-tools' agree on
    the others; -T is bcc nfsdist's "no timestamp" and libbpf-tools fsdist's "timestamp")."""
    parser.add_argument("interval", metavar="INTERVAL", nargs="?", type=int_range(1), default=99999999,
                        help="Seconds between histograms (default: one at Ctrl-C).")
    parser.add_argument("count", metavar="COUNT", nargs="?", type=int_range(1), default=99999999,
                        help="Histograms to print, then exit.")
    parser.add_argument("-m", "--milliseconds", dest="millis", action="store_true", help="Histograms in milliseconds.")
    pid_option(parser)
    parser.add_argument("--json", dest="as_json", action="store_true", help="One JSON object per interval.")
    parser.add_argument("--per-mount", action="store_true",
                        help="One histogram per operation per mount (the file's superblock; RPCs have none).")
    common(parser)


def nfsdist_parser() -> Parser:
    parser = Parser("nfsdist", "[OPTIONS] [INTERVAL [COUNT]]", nfsdist.__doc__, DIST_EXAMPLES)
    parser.add_argument("-T", "--notimestamp", dest="no_timestamp", action="store_true",
                        help="No HH:MM:SS: line before each output (bcc nfsdist's -T; the line is printed by "
                             "default).")
    dist_options(parser)
    return parser


def nfsdist(argv: Optional[Sequence[str]] = None) -> None:
    """Summarize NFS operation latency (read, write, open, getattr, fsync, commit) as one
    log2 histogram per operation, every INTERVAL seconds, COUNT times (or until Ctrl-C).
    Only completed operations are counted: one stuck on a server that does not answer
    shows when it ends (nfsslower and nfstop show it while it lasts).
    Commit mostly starts in kworker threads: with -p only the process's own fsync commits count."""
    a = nfsdist_parser().parse(argv)
    run_dist("nfsdist", nfs_target(a.spec_path), a.interval, a.count, not a.no_timestamp, a.millis, a.pid,
             a.as_json, a.per_mount, a.cgroup, a.mount_point, a.ops_text, a.verbose, a.kprobes_only, a.backend)


def fsdist_parser() -> Parser:
    parser = Parser("fsdist", "[OPTIONS] [INTERVAL [COUNT]]", fsdist.__doc__, FS_DIST_EXAMPLES)
    fs_type_option(parser)
    parser.add_argument("-T", "--timestamp", dest="timestamp", action="store_true",
                        help="An HH:MM:SS: line before each output (libbpf-tools fsdist's -T; none by default).")
    parser.add_argument("--notimestamp", dest="timestamp", action="store_false", help="No HH:MM:SS: line (the default).")
    dist_options(parser)
    return parser


def fsdist(argv: Optional[Sequence[str]] = None) -> None:
    """Summarize a filesystem's operation latency (read, write, open, fsync, getattr) as one
    log2 histogram per operation, every INTERVAL seconds, COUNT times (or until Ctrl-C).
    -t FS picks the spec (probes/specs/FS.toml). Only completed operations are counted."""
    a = fsdist_parser().parse(argv)
    run_dist("fsdist", find_target(a.fs_type, a.spec_path), a.interval, a.count, a.timestamp, a.millis, a.pid,
             a.as_json, a.per_mount, a.cgroup, a.mount_point, a.ops_text, a.verbose, a.kprobes_only, a.backend)


def run_dist(prog: str, target: Target, interval: int, count: int, timestamp: bool, millis: bool,
             pid: Optional[int], as_json: bool, per_mount: bool, cgroup: Optional[str], mount_point: Optional[str],
             ops_text: Optional[str], verbose: bool, kprobes_only: bool, backend: str) -> None:
    """nfsdist and fsdist: a log2 histogram per operation (per mount too) every interval."""
    unit = "msecs" if millis else "usecs"
    ops = target.ops(ops_text)
    where = Filters(target, cgroup, mount_point)
    tool = Tool(dist=True, tgid=pid or 0, dist_unit_ns=1000000 if millis else 1000, per_mount=per_mount,
                mount_dev=where.mount_dev)
    mounts = where.mounts if per_mount else None
    session = Session(prog, tool, ops, target.spec, verbose, where.cgroup_dir, fentry=not kprobes_only, backend=backend)
    with session:
        if not as_json:
            print(f"Tracing {target.title} operation latency... Hit Ctrl-C to end.", flush=True)
        else:
            print(json.dumps({"tracing": session.ops, "val_type": unit}), flush=True)
        remaining = count
        stopping = False
        while remaining > 0 and not stopping:
            stopping = not session.wait(interval)
            remaining -= 1
            data = session.dist(clear=True)
            if as_json:
                print(_dist_json(session, data, unit, mounts), flush=True)
                continue
            clock = time.strftime("%H:%M:%S") if timestamp else None
            print("\n".join(dist_text(_dist_sections(data, mounts), unit, clock)), flush=True)


TOP_EXAMPLES = f"""

{COMMIT_NOTE}

Examples:
  nfstop               # per-process NFS ops/s, MB/s, avg and p99 latency, every 1 s
  nfstop -i 5          # refresh every 5 seconds
  nfstop -p 1234       # one process
  nfstop --by cgroup   # one row per cgroup (systemd unit, container): a build's hundreds of
                       # short processes in one row
  nfstop --by mount    # one row per NFS mount
  nfstop --json -i 2   # one JSON object per interval

INFL is how many of the process's threads are inside an NFS operation now, OLDEST(s)
how long the oldest of them has been there: a process stuck on a server that does not
answer shows here although it completes nothing. CGROUP is the cgroup v2 path of the
process's first operation (its last 40 characters); with --by, PIDS counts the processes
of a row.
"""

FS_TOP_EXAMPLES = """

Examples:
  fstop -t btrfs             # per-process btrfs ops/s, MB/s, avg and p99 latency, every 1 s
  fstop -t ext4 -i 5         # refresh every 5 seconds
  fstop -t xfs --by mount    # one row per XFS mount
  fstop -t cifs --json -i 2  # one JSON object per interval

Columns as nfstop's: INFL is how many of the process's threads are inside an operation of
the filesystem now, OLDEST(s) how long the oldest of them has been there.
"""

#: what one nfstop row stands for (--by)
TOP_BY = ("pid", "comm", "cgroup", "mount")
#: width of the CGROUP column and of a --by cgroup|mount key (paths keep their end: the unit)
TOP_PATH_WIDTH = 40


def top_header(clear: bool) -> None:
    """The line above each table of nfstop and nfsdtop, as top prints it: the screen cleared
    first (unless -C or not a terminal), then the time and the load averages."""
    if clear:
        print("\033[H\033[2J", end="")
    print(time.strftime("%H:%M:%S"), f"loadavg: {' '.join(open('/proc/loadavg').read().split()[:3])}")


def _interval_p99_ms(entry: Dict[str, Any]) -> Optional[float]:
    """p99 of an interval's histogram difference, or None when that difference does not hold
    exactly the interval's operations: the count and the histogram are two maps, updated one
    after the other and read one after the other, and a key added while the hash is walked can
    be missed until the next read. A p99 from the wrong difference read 0.00 beside an average
    of 13.89 ms; None prints as '-' (null in JSON)."""
    if sum(entry["slots"].values()) != entry["count"]:
        return None
    return round(percentile(entry["slots"], 99) / 1000.0, 3)


def _top_rows(data: Dict[Tuple[int, int], Dict[str, Dict[str, Any]]], seconds: float, stuck: List[Stall],
              by: str = "pid", cgroup_name: Callable[[int], str] = str,
              mount_of: Callable[[int], str] = str,
              stall_cgroup: Callable[[int], Optional[str]] = task_cgroup) -> List[Dict[str, Any]]:
    """One interval's rows: per process (`by` pid), or summed per comm, cgroup or mount.

    `data` is Session.top()'s (tgid, dev) -> op -> entry; `stuck` the operations in flight now
    (nfstop's INFL and OLDEST). Histograms are summed slot by slot, so a group's p99 is as
    exact as a process's."""
    groups: Dict[Any, Dict[str, Any]] = {}

    def group(pid: int, dev: int, comm: str, cgroup: str) -> Dict[str, Any]:
        """The row a process's entries add to (its mount is looked up only for --by mount)."""
        key = {"pid": pid, "comm": comm, "cgroup": cgroup}[by] if by != "mount" else mount_of(dev)
        found = groups.setdefault(key, {"pids": set(), "comm": comm, "cgroup": cgroup, "ops": {},
                                        "in_flight": 0, "oldest_ms": None})
        found["pids"].add(pid)
        return found

    for (tgid, dev), per_op in data.items():
        comm = next((e["comm"] for e in per_op.values() if e.get("comm")), "?")
        cgroup = cgroup_name(next((e["cgroup"] for e in per_op.values() if e.get("cgroup")), 0))
        acc = group(tgid, dev, comm, cgroup)["ops"]
        for op, entry in per_op.items():
            total = acc.setdefault(op, {"count": 0, "lat_ns": 0, "bytes": 0, "slots": {}})
            for field in ("count", "lat_ns", "bytes"):
                total[field] += entry[field]
            for slot, count in entry["slots"].items():
                total["slots"][slot] = total["slots"].get(slot, 0) + count
    for stall in stuck:  # stuck: possibly nothing completed in this interval
        cgroup = stall_cgroup(stall.pid) or "?"
        found = group(stall.pid, stall.dev, stall.comm, cgroup)
        found["in_flight"] += 1
        found["oldest_ms"] = round(max(found["oldest_ms"] or 0.0, stall.age_ns / 1e6), 3)
    rows = []
    for key, found in groups.items():
        per_op = found["ops"]
        ops = {op: {"count": e["count"], "bytes": e["bytes"],
                    "avg_ms": round(e["lat_ns"] / e["count"] / 1e6, 3) if e["count"] else 0.0,
                    "p99_ms": _interval_p99_ms(e)} for op, e in per_op.items()}
        row: Dict[str, Any] = ({"pid": key, "comm": found["comm"], "cgroup": found["cgroup"]} if by == "pid"
                               else {by: key, "pids": len(found["pids"])})
        row.update({"ops_per_s": round(sum(e["count"] for e in per_op.values()) / seconds, 1),
                    "read_mb_s": round(per_op.get("read", {}).get("bytes", 0) / seconds / 1e6, 3),
                    "write_mb_s": round(per_op.get("write", {}).get("bytes", 0) / seconds / 1e6, 3),
                    "ops": ops, "in_flight": found["in_flight"], "oldest_ms": found["oldest_ms"]})
        rows.append(row)
    rows.sort(key=lambda row: (row["ops_per_s"], row["oldest_ms"] or 0), reverse=True)
    return rows


def _tail(text: str, width: int) -> str:
    return text if len(text) <= width else "..." + text[-(width - 3):]


def top_text(rows: List[Dict[str, Any]], ops: List[str], letters: Dict[str, str], by: str) -> List[str]:
    """nfstop's table: identity columns, rates, avg/p99 per op, in flight (and CGROUP per process)."""
    if by == "pid":
        header = "%-7s %-16s" % ("PID", "COMM")
    else:
        width = 16 if by == "comm" else TOP_PATH_WIDTH
        header = "%-*s %5s" % (width, by.upper(), "PIDS")
    header += " %8s %9s %9s" % ("OPS/s", "RD_MB/s", "WR_MB/s")
    header += "".join(" %15s" % f"{letters[op]} avg/p99 ms" for op in ops)
    header += " %5s %10s" % ("INFL", "OLDEST(s)") + (" CGROUP" if by == "pid" else "")
    lines = [header]
    for row in rows:
        if by == "pid":
            line = "%-7d %-16.16s" % (row["pid"], row["comm"])
        else:
            width = 16 if by == "comm" else TOP_PATH_WIDTH
            line = "%-*s %5d" % (width, _tail(str(row[by]), width), row["pids"])
        line += " %8.1f %9.3f %9.3f" % (row["ops_per_s"], row["read_mb_s"], row["write_mb_s"])
        for op in ops:
            entry = row["ops"].get(op)
            if entry:
                p99 = "-" if entry["p99_ms"] is None else f"{entry['p99_ms']:.2f}"
            line += " %15s" % (f"{entry['avg_ms']:.2f}/{p99}" if entry else "-")
        oldest = row["oldest_ms"]
        line += " %5d %10s" % (row["in_flight"], f"{oldest / 1000:.1f}" if oldest is not None else "-")
        if by == "pid":
            line += " " + _tail(row["cgroup"], TOP_PATH_WIDTH)
        lines.append(line)
    return lines


def top_options(parser: Parser) -> None:
    """nfstop's and fstop's options."""
    parser.add_argument("-i", "--interval", metavar="SECONDS", type=int_range(1), default=1,
                        help="Seconds between refreshes. [default: 1]")
    pid_option(parser)
    parser.add_argument("--by", choices=TOP_BY, default="pid",
                        help="One row per process, or per comm, cgroup or mount (summed, histograms too). "
                             "[default: pid]")
    parser.add_argument("--json", dest="as_json", action="store_true", help="One JSON object per interval.")
    parser.add_argument("-C", "--noclear", action="store_true", help="Do not clear the screen between refreshes.")
    common(parser)


def nfstop_parser() -> Parser:
    parser = Parser("nfstop", "[OPTIONS]", nfstop.__doc__, TOP_EXAMPLES)
    top_options(parser)
    return parser


def nfstop(argv: Optional[Sequence[str]] = None) -> None:
    """Per-process NFS activity: operations per second, read and write MB/s, and average
    and p99 latency per operation (R W O G F C) from in-kernel per-process histograms."""
    a = nfstop_parser().parse(argv)
    run_top("nfstop", nfs_target(a.spec_path), a.interval, a.pid, a.by, a.as_json, a.noclear, a.cgroup,
            a.mount_point, a.ops_text, a.verbose, a.kprobes_only, a.backend)


def fstop_parser() -> Parser:
    parser = Parser("fstop", "[OPTIONS]", fstop.__doc__, FS_TOP_EXAMPLES)
    fs_type_option(parser)
    top_options(parser)
    return parser


def fstop(argv: Optional[Sequence[str]] = None) -> None:
    """Per-process activity on one filesystem (-t FS): operations per second, read and write
    MB/s, and average and p99 latency per operation from in-kernel per-process histograms."""
    a = fstop_parser().parse(argv)
    run_top("fstop", find_target(a.fs_type, a.spec_path), a.interval, a.pid, a.by, a.as_json, a.noclear,
            a.cgroup, a.mount_point, a.ops_text, a.verbose, a.kprobes_only, a.backend)


def run_top(prog: str, target: Target, interval: int, pid: Optional[int], by: str, as_json: bool, noclear: bool,
            cgroup: Optional[str], mount_point: Optional[str], ops_text: Optional[str], verbose: bool,
            kprobes_only: bool, backend: str) -> None:
    """nfstop and fstop: a table per interval, one row per process (or --by group)."""
    ops = target.ops(ops_text)
    where = Filters(target, cgroup, mount_point)
    tool = Tool(top=True, tgid=pid or 0, inflight=True, per_mount=by == "mount", mount_dev=where.mount_dev)
    session = Session(prog, tool, ops, target.spec, verbose, where.cgroup_dir, fentry=not kprobes_only, backend=backend)
    letters = dict(zip(session.probe.ops, session.probe.letters))
    clear = not as_json and not noclear and sys.stdout.isatty()
    cgroups = CgroupNames()
    with session:
        if not as_json:
            print(f"Tracing {target.title} operations per {by}, every {interval} s... Ctrl-C to end.", flush=True)
        stopping = False
        while not stopping:
            started = time.monotonic()
            stopping = not session.wait(interval)
            now = time.monotonic_ns()
            rows = _top_rows(session.top(), max(time.monotonic() - started, 1e-3),
                             stalls(session.in_flight(), now, 0, describe=False), by, cgroups.name,
                             lambda dev: mount_name(where.mounts, dev))
            if as_json:
                print(json.dumps({"ts": time.strftime("%Y-%m-%d %H:%M:%S"), "interval_s": interval, "by": by,
                                  "processes" if by == "pid" else "rows": rows,
                                  **missed_fields(session)}), flush=True)
                continue
            top_header(clear)
            print("\n".join(top_text(rows, session.ops, letters, by)))
            sys.stdout.flush()


NFSDTOP_EXAMPLES = """

Examples:
  nfsdtop              # per-client requests/s, MB/s, avg and p99 service time, every 1 s
  nfsdtop 5            # refresh every 5 seconds
  nfsdtop 2 10         # every 2 seconds, 10 times, then exit
  nfsdtop --by proc    # one row per procedure or NFSv4 operation: NFSv3 READ, NFSv4 COMPOUND, NFSv4 READ_PLUS...
  nfsdtop --by export  # one row per export (/srv/nfs...): which export the load goes to
  nfsdtop -C -r 5      # do not clear the screen; the 5 busiest rows only
  nfsdtop --json 10    # one JSON object per 10 s: the rows, and every (client, procedure)

On the NFS server (knfsd). A request is timed on its nfsd thread from the dispatch of the
decoded call to its encoded reply (an NFSv4 COMPOUND whole, all its operations inside);
--by proc adds a row per NFSv4 operation (`NFSv4 OPEN`, from the end of the COMPOUND's
previous operation to its own encoded reply), which client and export rows do not count again;
RD_MB/s and WR_MB/s are the bytes its reads and writes moved. Rows are sorted by load: the
nfsd time their requests took in the interval, then requests/s. INPROG is how many of the
row's requests nfsd threads are serving now, OLDEST(s) how long the oldest has been served:
a client whose requests are stuck shows there although none completes. CLIENT is the
request's source address (an IPv4 client of a dual-stack socket as IPv4). EXPORT is the
export of the request's file handle, its path as /proc/fs/nfs/exports lists it (an NFSv4
COMPOUND's last handle), `-` for requests with none (NULL, a lease renewal). The probe reads
the client through nfsd's BTF (Debian 12 and later) and is loaded as the client tools' probes
are (--backend; -v says which loader and why). --json has every row (-r is for the table) and, under
"requests", each (client, procedure, export)'s counts and histogram.
"""

#: what one nfsdtop row stands for (--by)
NFSDTOP_BY = ("client", "proc", "export")
#: the operations of a server spec nfsdtop uses: requests (rpc) and the bytes of reads and writes
NFSDTOP_OPS = ("rpc", "read", "write", "v4op")
#: RPC program numbers as nfsdtop prints them
RPC_PROGRAMS = {100003: "NFS", 100227: "NFSACL"}


def serves_requests(spec: Dict[str, Any]) -> bool:
    """Whether a spec times a server's requests with their client (nfsd.toml's rpc), not a
    client's RPCs (nfs.toml's)."""
    rpc = spec["ops"].get("rpc", {})
    return any("client" in (point.get("args") or {}) for cand in rpc.get("candidates", []) for point in cand["attach"])


def server_ops(spec: Dict[str, Any]) -> List[str]:
    """The operations of a server spec nfsdtop's probe traces (NFSDTOP_OPS it has)."""
    return [op for op in NFSDTOP_OPS if op in spec["ops"]]


def proc_label(prog: int, vers: int, name: str) -> str:
    """`NFSv3 READ`: the procedure with its program and version (NFSACL has a GETATTR too)."""
    if not prog:
        return name
    return f"{RPC_PROGRAMS.get(prog, str(prog))}v{vers} {name}"


#: NFSv4's procedures: every other name under NFSv4 is an operation inside a COMPOUND
NFSV4_PROCEDURES = ("NULL", "COMPOUND")


def is_operation(label: str) -> bool:
    """Whether a proc_label() names NFSv4 operations inside COMPOUNDs (`NFSv4 READ`), not
    requests: a COMPOUND's operations are inside its one request, so a sum of requests leaves
    them out."""
    program, _, name = label.partition(" ")
    return program == "NFSv4" and name not in NFSV4_PROCEDURES


#: what Session.requests() counts per (client, procedure, export), beside its log2 slots
REQUEST_FIELDS = ("count", "lat_ns", "read_bytes", "write_bytes")


def request_totals() -> Dict[str, Any]:
    """Empty sums of requests, to add_request() into."""
    return {**dict.fromkeys(REQUEST_FIELDS, 0), "slots": {}}


def add_request(into: Dict[str, Any], entry: Dict[str, Any]) -> None:
    """Add one (client, procedure, export)'s counts and histogram to a sum (a row, a series):
    slot by slot, so the sum's percentiles are as exact as the entry's."""
    for field in REQUEST_FIELDS:
        into[field] += entry[field]
    for slot, count in entry["slots"].items():
        into["slots"][slot] = into["slots"].get(slot, 0) + count


def server_rows(data: Dict[ServerKey, Dict[str, Any]], seconds: float,
                in_progress: List[Tuple[ServerKey, float]], by: str = "client") -> List[Dict[str, Any]]:
    """One interval's nfsdtop rows, per client, procedure or export (`by`), busiest first.

    `data` is Session.requests()'s (client, program, version, procedure, export) -> counts
    and log2 usec slots; `in_progress` each request being served now, with its age in ms.
    Histograms are summed slot by slot, so a row's p99 is as exact as a pair's. Each row
    names another dimension's counts (a client's per procedure, a procedure's or an
    export's per client)."""
    groups: Dict[str, Dict[str, Any]] = {}

    def group(key: ServerKey) -> Tuple[Dict[str, Any], str]:
        """The row a request adds to, and the name it has in that row's split."""
        client, label, export = key[0], proc_label(*key[1:4]), key[4]
        found = groups.setdefault({"client": client, "proc": label, "export": export}[by], {
            **request_totals(), "split": {}, "in_progress": 0, "oldest_ms": None})
        return found, label if by == "client" else client

    for key, entry in data.items():
        if by != "proc" and is_operation(proc_label(*key[1:4])):  # inside a COMPOUND counted already: its client's split only
            if by == "client":
                ops = group(key)[0].setdefault("operations", {})
                ops[proc_label(*key[1:4])] = ops.get(proc_label(*key[1:4]), 0) + entry["count"]
            continue
        found, other = group(key)
        add_request(found, entry)
        found["split"][other] = found["split"].get(other, 0) + entry["count"]
    for key, age_ms in in_progress:
        found = group(key)[0]
        found["in_progress"] += 1
        found["oldest_ms"] = round(max(found["oldest_ms"] or 0.0, age_ms), 3)
    rows = []
    for key, found in groups.items():
        count = found["count"]
        rows.append({by: key, "requests": count, "requests_per_s": round(count / seconds, 1),
                     "read_bytes": found["read_bytes"], "write_bytes": found["write_bytes"],
                     "read_mb_s": round(found["read_bytes"] / seconds / 1e6, 3),
                     "write_mb_s": round(found["write_bytes"] / seconds / 1e6, 3),
                     "service_ms": round(found["lat_ns"] / 1e6, 3),
                     "avg_ms": round(found["lat_ns"] / count / 1e6, 3) if count else None,
                     "p99_ms": _interval_p99_ms(found) if count else None,
                     "in_progress": found["in_progress"], "oldest_ms": found["oldest_ms"],
                     "procs" if by == "client" else "clients": dict(sorted(found["split"].items())),
                     **({"operations": dict(sorted(found["operations"].items()))} if "operations" in found else {})})
    rows.sort(key=lambda row: str(row[by]))  # equal loads: by name, whatever order the maps gave
    rows.sort(key=lambda row: (row["service_ms"], row["requests"], row["oldest_ms"] or 0), reverse=True)
    return rows


#: width of nfsdtop's key column: an IPv6 address, a procedure or NFSv4 operation (`NFSv4
#: BIND_CONN_TO_SESSION`), or an export's path
NFSDTOP_WIDTH = {"client": 39, "proc": 26, "export": TOP_PATH_WIDTH}


def nfsdtop_text(rows: List[Dict[str, Any]], by: str, max_rows: int) -> List[str]:
    """nfsdtop's table: the key, rates, service time, requests in progress."""
    width = NFSDTOP_WIDTH[by]
    lines = ["%-*s %8s %9s %9s %8s %8s %6s %9s" % (width, by.upper(), "REQ/s", "RD_MB/s", "WR_MB/s",
                                                   "AVG_ms", "P99_ms", "INPROG", "OLDEST(s)")]
    for row in rows[:max_rows]:
        avg = "-" if row["avg_ms"] is None else f"{row['avg_ms']:.2f}"
        p99 = "-" if row["p99_ms"] is None else f"{row['p99_ms']:.2f}"
        oldest = "-" if row["oldest_ms"] is None else f"{row['oldest_ms'] / 1000:.1f}"
        lines.append("%-*s %8.1f %9.3f %9.3f %8s %8s %6d %9s" % (
            width, _tail(str(row[by]) or "-", width), row["requests_per_s"], row["read_mb_s"], row["write_mb_s"],
            avg, p99, row["in_progress"], oldest))
    return lines


def requests_json(data: Dict[ServerKey, Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Session.requests()'s entries as --json lists them (slots as [slot, count] pairs)."""
    return [{"client": client, "program": prog, "version": vers, "proc": name, "export": export,
             **{field: entry[field] for field in REQUEST_FIELDS},
             "slots": sorted([slot, n] for slot, n in entry["slots"].items())}
            for (client, prog, vers, name, export), entry in sorted(data.items())]


def nfsdtop_frame(session: Session, interval: int, seconds: float, by: str, as_json: bool, max_rows: int) -> str:
    """One interval of nfsdtop, its JSON line or its table: apart from the loop so that
    bench/bench_server_scale.py times exactly this as the clients grow."""
    data = session.requests()
    now = time.monotonic_ns()
    in_progress = [(key, round(max(now - ts, 0) / 1e6, 3)) for key, ts in session.requests_in_progress()]
    rows = server_rows(data, seconds, in_progress, by)
    if not as_json:
        return "\n".join(nfsdtop_text(rows, by, max_rows))
    return json.dumps({"ts": time.strftime("%Y-%m-%d %H:%M:%S"), "interval_s": interval, "seconds": seconds, "by": by,
                       "rows": rows, "requests": requests_json(data),
                       "in_progress": [{"client": k[0], "program": k[1], "version": k[2], "proc": k[3], "export": k[4],
                                        "age_ms": age} for k, age in in_progress], **missed_fields(session)})


def nfsdtop_parser() -> Parser:
    parser = Parser("nfsdtop", "[OPTIONS] [INTERVAL [COUNT]]", nfsdtop.__doc__, NFSDTOP_EXAMPLES)
    parser.add_argument("interval", metavar="INTERVAL", nargs="?", type=int_range(1), default=1,
                        help="Seconds between refreshes. [default: 1]")
    parser.add_argument("count", metavar="COUNT", nargs="?", type=int_range(1),
                        help="Refreshes to print, then exit (default: until Ctrl-C).")
    parser.add_argument("--by", choices=NFSDTOP_BY, default="client",
                        help="One row per client address, per procedure (RPC program, version and name), or per "
                             "export. [default: client]")
    parser.add_argument("-r", "--rows", dest="max_rows", metavar="ROWS", type=int_range(1), default=20,
                        help="Rows of the table (the busiest; --json has them all). [default: 20]")
    parser.add_argument("--json", dest="as_json", action="store_true", help="One JSON object per interval.")
    parser.add_argument("-C", "--noclear", action="store_true", help="Do not clear the screen between refreshes.")
    spec_option(parser)
    loader_options(parser)
    return parser


def nfsdtop(argv: Optional[Sequence[str]] = None) -> None:
    """An NFS server's (knfsd) requests per client (or procedure, or export): requests per
    second, read and write MB/s, average and p99 service time, requests in progress and the
    oldest, every INTERVAL seconds (default 1), COUNT times (or until Ctrl-C)."""
    a = nfsdtop_parser().parse(argv)
    interval, count, by, max_rows, as_json, noclear = a.interval, a.count, a.by, a.max_rows, a.as_json, a.noclear
    spec_path, verbose, kprobes_only, backend = a.spec_path, a.verbose, a.kprobes_only, a.backend
    target = find_target(None if spec_path else "nfsd", spec_path)
    if not serves_requests(target.spec):
        raise UserError(f"{target.spec_path}: no request with a client address (rpc with a `client` argument): "
                        "nfsdtop needs an NFS server spec (probes/specs/nfsd.toml, or `discover propose nfsd`)")
    session = Session("nfsdtop", Tool(server=True), server_ops(target.spec), target.spec, verbose, fentry=not kprobes_only,
                      backend=backend)
    clear = not as_json and not noclear and sys.stdout.isatty()
    with session:
        if as_json:
            print(json.dumps({"tracing": session.ops, "by": by}), flush=True)
        else:
            print(f"Tracing {target.title} requests per {by}, every {interval} s... Ctrl-C to end.", flush=True)
        remaining = count
        while remaining is None or remaining > 0:
            started = time.monotonic()
            stopping = not session.wait(interval)
            seconds = round(max(time.monotonic() - started, 1e-3), 3)
            frame = nfsdtop_frame(session, interval, seconds, by, as_json, max_rows)
            if not as_json:
                top_header(clear)
            print(frame, flush=True)
            if stopping:
                break
            remaining = None if remaining is None else remaining - 1


def main_nfsslower() -> None:
    run_cli("nfsslower", nfsslower)


def main_nfsdist() -> None:
    run_cli("nfsdist", nfsdist)


def main_nfstop() -> None:
    run_cli("nfstop", nfstop)


def main_nfsdtop() -> None:
    run_cli("nfsdtop", nfsdtop)


def main_fsslower() -> None:
    run_cli("fsslower", fsslower)


def main_fsdist() -> None:
    run_cli("fsdist", fsdist)


def main_fstop() -> None:
    run_cli("fstop", fstop)


TOOLS: Dict[str, Callable[[], None]] = {
    "nfsslower": main_nfsslower, "nfsdist": main_nfsdist, "nfstop": main_nfstop, "nfsdtop": main_nfsdtop,
    "fsslower": main_fsslower, "fsdist": main_fsdist, "fstop": main_fstop}

if __name__ == "__main__":
    name = os.path.basename(sys.argv[1]) if len(sys.argv) > 1 else ""
    if name not in TOOLS:
        sys.exit(f"usage: python3 -m probes.commands {{{'|'.join(TOOLS)}}} [ARGS]")
    sys.argv = sys.argv[1:]
    TOOLS[name]()

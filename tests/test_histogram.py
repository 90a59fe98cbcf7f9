"""Our output layouts against what Debian's own bcc tools printed in the lab guest.

Fixtures: tests/fixtures/6.1.0-50-amd64/bcc-tools/ (nfsdist-bpfcc and nfsslower-bpfcc run
around the known workload; README there says how). Each bcc histogram is parsed back to
its bucket counts and re-printed with probes.histogram: the text must be identical.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from probes.commands import SLOWER_HEADER, dist_text, slower_row, stall_row
from probes.inflight import Stall
from probes.histogram import buckets, format_log2, percentile, stars

BCC = Path(__file__).resolve().parent / "fixtures" / "6.1.0-50-amd64" / "bcc-tools"
ROW = re.compile(r"^\s+(\d+) -> (\d+)\s+: (\d+)\s+\|")


def bcc_sections(text: str) -> Dict[str, Tuple[str, List[str]]]:
    """operation -> (val_type, the histogram's lines as bcc printed them)."""
    out: Dict[str, Tuple[str, List[str]]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("operation = "):
            current = line.split(" = ", 1)[1]
            out[current] = ("", [])
        elif current is not None and line.strip().endswith(": count     distribution"):
            out[current] = (line.split(":")[0].strip(), [line])
        elif current is not None and ROW.match(line):
            out[current][1].append(line)
    return out


def counts_from(lines: List[str]) -> List[int]:
    vals = [0]
    for line in lines[1:]:
        low, high, count = (int(x) for x in ROW.match(line).groups())
        assert high + 1 == 1 << len(vals)  # bucket i ends at 2^i - 1
        vals.append(count)
    return vals


def test_nfsdist_histograms_match_bcc() -> None:
    sections = bcc_sections((BCC / "nfsdist-bpfcc.txt").read_text())
    assert len(sections) >= 3, sections.keys()
    for op, (val_type, lines) in sections.items():
        assert val_type == "usecs"
        assert format_log2(counts_from(lines), val_type) == lines, op


def test_nfsdist_interval_text_matches_bcc() -> None:
    """The whole interval (blank line, timestamp, sections) re-printed from bcc's counts."""
    text = (BCC / "nfsdist-bpfcc.txt").read_text().splitlines()
    clock = text[2].rstrip(":")
    sections = [(op, counts_from(lines)) for op, (_, lines) in bcc_sections("\n".join(text)).items()]
    assert ["Tracing NFS operation latency... Hit Ctrl-C to end."] + dist_text(sections, "usecs", clock) == text


def test_wide_layout_past_bucket_32() -> None:
    """Above 2^32 bcc switches to 20-digit columns and 20 stars; derived from its narrow rows."""
    lines = format_log2([0] * 34 + [3], "usecs")
    assert lines[0] == "               %-29s : count     distribution" % "usecs"
    assert lines[-1].startswith("%20d -> %-20d : %-8d |" % (1 << 33, (1 << 34) - 1, 3))
    assert lines[-1].endswith("|" + "*" * 20 + "|")


def test_stars() -> None:
    assert stars(10, 10, 40) == "*" * 40
    assert stars(1, 40, 40) == "*"
    assert stars(0, 5, 40) == ""


def test_p99_is_the_bucket_bound() -> None:
    slots = {5: 98, 12: 2}  # 98 ops in 16..31 us, 2 in 2048..4095 us
    assert percentile(slots, 99) == 4095 and percentile(slots, 50) == 31
    assert percentile({}, 99) == 0
    assert buckets({2: 1, 4: 3}) == [0, 0, 1, 0, 3]


def test_nfsslower_layout_matches_bcc() -> None:
    text = (BCC / "nfsslower-bpfcc.txt").read_text().splitlines()
    header = next(i for i, line in enumerate(text) if line.startswith("TIME "))
    assert text[header] == SLOWER_HEADER
    rows = [line for line in text[header + 1:] if re.match(r"^\d\d:\d\d:\d\d ", line)]
    assert rows
    for line in rows:
        # TIME COMM PID T BYTES OFF_KB LAT(ms) FILENAME; COMM may hold spaces, its column is 14 wide
        clock, comm, rest = line[:8], line[9:23].rstrip(), line[24:]
        pid, letter, nbytes, off_kb, lat_ms, *name = rest.split(None, 5)
        again = slower_row(clock, comm, int(pid), letter, int(nbytes), int(off_kb) * 1024,
                           round(float(lat_ms) * 1e6), name[0] if name else "")
        assert again == line


def test_stall_lines_keep_bccs_columns_and_are_marked() -> None:
    """A stuck operation's line has bcc's columns (a parser splitting on them still works)
    and cannot be taken for a completed one: `>` before the time so far, `-` for size and
    offset, `(in flight...)` after the file."""
    stall = Stall(793, 793, "dd", "access", 0, 1_765_033_000, "new.bin", "ACCESS", "127.0.0.1")
    line = stall_row("22:27:43", stall, "A")
    assert line == "22:27:43 dd             793    A -       -        >1765.03 new.bin (in flight; RPC ACCESS to 127.0.0.1)"
    assert len(line.split(None, 7)) == len(SLOWER_HEADER.split())
    rpc = stall._replace(comm="kworker/u4:9", op="rpc", file="SEQUENCE", rpc="SEQUENCE", server=None)
    assert stall_row("22:27:43", rpc, "P").endswith(">1765.03 SEQUENCE (RPC in flight)")
    # a process's RPC with no traced operation around it (a create, outside the default ops)
    mine = stall._replace(op="rpc", file="new-1.bin", rpc="CREATE", server="10.77.0.1")
    assert stall_row("22:27:43", mine, "P").endswith(">1765.03 new-1.bin (RPC CREATE in flight to 10.77.0.1)")


def test_minus_t_means_what_each_original_tool_means(monkeypatch: pytest.MonkeyPatch) -> None:
    """bcc nfsdist's -T drops the timestamp line it prints by default; libbpf-tools fsdist's
    -T adds the line it leaves out by default (--notimestamp keeps it out explicitly)."""
    import probes.commands as commands
    seen: List[bool] = []
    monkeypatch.setattr(commands, "run_dist",
                        lambda prog, target, interval, count, timestamp, *_: seen.append(timestamp))
    for tool, args, expected in ((commands.nfsdist, [], True), (commands.nfsdist, ["-T"], False),
                                 (commands.fsdist, ["-t", "ext4"], False), (commands.fsdist, ["-t", "ext4", "-T"], True),
                                 (commands.fsdist, ["-t", "ext4", "--timestamp"], True),
                                 (commands.fsdist, ["-t", "ext4", "--notimestamp"], False)):
        seen.clear()
        tool(args)
        assert seen == [expected], (tool.__name__, args)

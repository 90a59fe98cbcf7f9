"""`discover events` on real tracepoint formats (Debian 6.1 tracefs/events/nfs)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from discover.events import find_pairs, parse_format, read_system_from_tracefs, singles

TRACEFS = Path(__file__).resolve().parent.parent.parent / "shared" / "fixtures" / "debian-6.1.0-57-amd64" / "tracefs"
REPO = Path(__file__).resolve().parent.parent


def _expected_enter_exit() -> set:
    """Independently from the directory listing: every X_enter with an X_exit beside it."""
    names = {p.name for p in (TRACEFS / "events" / "nfs").iterdir()}
    return {(n, n[:-len("_enter")] + "_exit") for n in names
            if n.endswith("_enter") and n[:-len("_enter")] + "_exit" in names}


def test_every_enter_exit_pair_is_found() -> None:
    expected = _expected_enter_exit()
    assert len(expected) > 15
    pairs = find_pairs("nfs", read_system_from_tracefs(TRACEFS, "nfs"))
    found = {(p.start, p.end) for p in pairs}
    assert expected <= found
    assert all(p.kind == "sync" for p in pairs if (p.start, p.end) in expected)


def test_async_initiate_done_pairs_match_on_shared_fields() -> None:
    events = read_system_from_tracefs(TRACEFS, "nfs")
    pairs = {p.start: p for p in find_pairs("nfs", events)}
    read = pairs["nfs_initiate_read"]
    assert read.end == "nfs_readpage_done" and read.kind == "async" and read.operation == "read"
    assert {"fileid", "offset"} <= set(read.keys)
    assert pairs["nfs_initiate_commit"].end == "nfs_commit_done"
    assert pairs["nfs_initiate_write"].end == "nfs_writeback_done"


def test_singles_are_the_rest() -> None:
    events = read_system_from_tracefs(TRACEFS, "nfs")
    pairs = find_pairs("nfs", events)
    alone = singles(events, pairs)
    paired = {p.start for p in pairs} | {p.end for p in pairs}
    assert set(alone) | paired == set(events) and not set(alone) & paired
    assert "nfs_size_grow" in alone


def test_format_fields_and_arrays() -> None:
    fmt = parse_format((TRACEFS / "events" / "nfs" / "nfs_readdir_lookup" / "format").read_text())
    by_name = {f["name"]: f for f in fmt["fields"]}
    assert by_name["name"]["type"] == "__data_loc char[]"
    assert by_name["dir"] == {"name": "dir", "type": "u64", "offset": 24, "size": 8, "signed": False,
                              "common": False}
    assert by_name["common_pid"]["common"]
    assert fmt["id"] == 1956
    with pytest.raises(ValueError):
        parse_format("hello\nworld\n")


def _discover(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    """Run discover on a tracefs tree with the real file names (symlinks into the capture)."""
    tree = tmp / "tracing"
    tree.mkdir()
    (tree / "available_events").symlink_to(TRACEFS / "available_events.nfs-nfs4-sunrpc.txt")
    (tree / "events").symlink_to(TRACEFS / "events")
    env = dict(os.environ, PROBEKIT_TRACEFS=str(tree))
    return subprocess.run([sys.executable, "-m", "discover", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def test_cli_json_lists_pairs(tmp_path: Path) -> None:
    res = _discover(tmp_path, "events", "nfs", "--json")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    found = {(p["start"], p["end"]) for p in report[0]["pairs"]}
    assert _expected_enter_exit() <= found


def test_cli_unknown_subsystem_is_one_line(tmp_path: Path) -> None:
    res = _discover(tmp_path, "events", "nfz")
    assert res.returncode != 0
    assert res.stderr.count("\n") == 1 and "nfz" in res.stderr and "nfs" in res.stderr

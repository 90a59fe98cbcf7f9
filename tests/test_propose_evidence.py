"""Call-graph evidence for `discover propose`: where the nfs tracepoints fire, from a real
function_graph capture taken with the nfs events enabled (tests/fixtures/6.1.0-50-amd64)."""
from __future__ import annotations

import gzip
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from discover.errors import UserError
from discover.profile import load_profile
from discover.propose import OUTSIDE, CallGraphs, Proposer, build_spec

LAB = Path(__file__).resolve().parent / "fixtures" / "6.1.0-50-amd64"
TRACE = LAB / "function_graph" / "nfs-ops.events.trace.gz"
REPO = Path(__file__).resolve().parent.parent


def _event_lines(event: str) -> int:
    with gzip.open(TRACE, "rt") as fh:
        return sum(1 for line in fh if f"/* {event}:" in line)


@pytest.fixture(scope="module")
def graphs(tmp_path_factory: pytest.TempPathFactory) -> CallGraphs:
    tmp = tmp_path_factory.mktemp("cg")
    shutil.copy(TRACE, tmp / TRACE.name)
    return CallGraphs.load_dir(tmp)


def test_event_sites_from_raw_trace(graphs: CallGraphs) -> None:
    sites = graphs.sites("nfs_getattr_enter")
    assert sum(sites.values()) == _event_lines("nfs_getattr_enter")
    assert {fn for fn, _ in sites} == {"nfs_getattr"}
    # the RPC completion of a WRITE is not inside any traced call: another task
    assert OUTSIDE in {fn for fn, _ in graphs.sites("nfs_writeback_done")}
    assert "nfs_getattr" in graphs.outermost({"nfs", "nfsv3", "nfsv4"})


def test_evidence_explains_choice_over_bcc(graphs: CallGraphs) -> None:
    proposer = Proposer(load_profile(LAB / "profile.json.gz"), "nfs", graphs)
    spec, _ = build_spec(proposer, proposer.propose(["getattr", "fsync", "read", "open"]))
    getattr_first = spec["ops"]["getattr"]["candidates"][0]
    assert getattr_first["kind"] == "tracepoint"
    assert "in nfs_getattr" in getattr_first["evidence"]
    assert any("preferred over the kprobe on nfs_getattr" in r for r in getattr_first["reasons"])
    fsync_first = spec["ops"]["fsync"]["candidates"][0]
    assert "in nfs_file_fsync" in fsync_first["evidence"]
    # read keeps the point the established tools use, now backed by the call graph
    read_first = spec["ops"]["read"]["candidates"][0]
    assert read_first["attach"][0]["entry"] == "nfs_file_read"
    assert "outermost nfs function" in read_first["evidence"]
    opens = {a["entry"] for a in spec["ops"]["open"]["candidates"][0]["attach"]}
    assert opens == {"nfs_file_open", "nfs4_file_open", "nfs_atomic_open"}


def test_callgraph_json_gives_same_sites(graphs: CallGraphs, tmp_path: Path) -> None:
    trace = tmp_path / "fg.trace"
    with gzip.open(TRACE, "rb") as src, open(trace, "wb") as dst:
        shutil.copyfileobj(src, dst)
    (tmp_path / "cg").mkdir()
    res = subprocess.run([sys.executable, "-m", "discover", "callgraph", "--from-file", str(trace),
                          "--format", "json", "-o", str(tmp_path / "cg" / "all.json")],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    from_json = CallGraphs.load_dir(tmp_path / "cg")
    inside = {fn for fn, _ in graphs.sites("nfs_getattr_enter")}
    assert {fn for fn, _ in from_json.sites("nfs_getattr_enter")} == inside
    assert set(from_json.outermost({"nfs", "nfsv3", "nfsv4"})) == set(graphs.outermost({"nfs", "nfsv3", "nfsv4"}))


def test_bad_callgraph_dirs(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such call-graph directory"):
        CallGraphs.load_dir(tmp_path / "missing")
    with pytest.raises(UserError, match="no call graphs"):
        CallGraphs.load_dir(tmp_path)
    (tmp_path / "x.json").write_text("[1, 2]")
    with pytest.raises(UserError, match="not a node-link call graph"):
        CallGraphs.load_dir(tmp_path)


def test_first_choice_matches_established_tools_or_says_why(graphs: CallGraphs) -> None:
    """Issue 4 done-when: each first choice is what bcc/libbpf-tools use, or explains itself."""
    from discover.propose import ESTABLISHED

    proposer = Proposer(load_profile(LAB / "profile.json.gz"), "nfs", graphs)
    spec, _ = build_spec(proposer, proposer.propose(["read", "write", "open", "getattr", "fsync", "commit"]))
    for op, body in spec["ops"].items():
        first = body["candidates"][0]
        used = set(ESTABLISHED["nfs"].get(op, ()))
        entries = {a["entry"] for a in first["attach"]}
        if used and used <= entries:
            continue
        if used:
            assert any("preferred over" in r for r in first["reasons"]), op
            assert "fired" in first["evidence"], op
        else:  # no established tool times it (commit): the evidence must still be stated
            assert first["evidence"], op

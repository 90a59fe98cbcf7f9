"""`discover propose nfsd`: the NFS server's (knfsd) spec from a Debian 6.12 lab pair's
server capture (issue 23).

Data: tests/fixtures/6.12.117+deb13-amd64/nfsd/ (README there: the pair, the script, the
client's workload). probes/specs/nfsd.toml was written from exactly these files; proposing
again must give the same decisions, and what the capture showed is asserted where the
choices rest on it: the nfsd tracepoint pairs fire inside the NFSv3 procedure and the
NFSv4 operation alike, nfsd_dispatch is what svc_process calls for every request, and
fh_verify (the export) runs inside the requests of both versions.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Dict, List

import pytest

from debian_kernels import ABI_61, ABI_612, kernel_dir
from discover.profile import load_profile
from discover.propose import CallGraphs, Proposer, build_spec
from discover.spec import SPEC_OPS, load_spec
from probes.compat import build_report, load_kernel, spec_events, spec_functions, spec_modules

REPO = Path(__file__).resolve().parent.parent
LAB = REPO / "tests" / "fixtures" / "6.12.117+deb13-amd64" / "nfsd"
SPEC = REPO / "probes" / "specs" / "nfsd.toml"


def _decisions(spec: Dict[str, Any]) -> Dict[str, Any]:
    def cands(body: Dict[str, Any], table: str) -> List[Any]:
        return [(c["kind"], c["match"], c["module"], [dict(a, args=a.get("args") or {}) for a in c["attach"]])
                for c in body.get(table, [])]
    return {op: (cands(body, "candidates"), cands(body, "context")) for op, body in spec["ops"].items()}


@pytest.fixture(scope="module")
def proposer(tmp_path_factory: pytest.TempPathFactory) -> Proposer:
    graphs = tmp_path_factory.mktemp("nfsd")
    for trace in LAB.glob("*.trace.gz"):
        shutil.copy(trace, graphs)
    return Proposer(load_profile(LAB / "profile.json.gz"), "nfsd", CallGraphs.load_dir(graphs))


def test_committed_spec_is_what_propose_writes(proposer: Proposer) -> None:
    spec, left_out = build_spec(proposer, proposer.propose(list(SPEC_OPS)), every=True)
    committed = load_spec(SPEC)
    assert left_out == ["fsync"]  # a server has no fsync: its clients' fsyncs arrive as COMMIT
    assert _decisions(spec) == _decisions(committed)
    assert committed["kernel"] == proposer.profile.release == "6.12.117+deb13-amd64"
    assert committed["modules"] == ["nfsd"]


def test_read_and_write_are_timed_by_the_nfsd_pairs_both_versions_fire(proposer: Proposer) -> None:
    """nfsd_read_start/_done bracket a READ of either version on the nfsd thread: the capture
    shows them in nfsd3's path and in nfsd4_read (whose data is read while the reply is
    encoded, where _done fires), so the pair, not nfsd4_read's own return, is the window."""
    for op, event in (("read", "nfsd_read_start"), ("write", "nfsd_write_start")):
        first = proposer.candidates(op)[0]
        assert first.kind == "tracepoint" and first.match == "task"
        assert first.attach[0]["entry"] == f"nfsd:{event}"
        assert first.attach[0]["args"]["bytes"] == "exit.len"
        sites = {fn for fn, _ in proposer.graphs.sites(event)}
        assert f"nfsd4_{op}" in sites, sites
        second = proposer.candidates(op)[1]
        assert [a["entry"] for a in second.attach] == [f"nfsd3_proc_{op}", f"nfsd4_{op}"]
        assert all(a["optional"] for a in second.attach)


def test_commit_of_both_versions_was_seen(proposer: Proposer) -> None:
    """The second capture's larger writes went UNSTABLE: COMMIT reached the server in both versions."""
    first = proposer.candidates("commit")[0]
    assert [a["entry"] for a in first.attach] == ["nfsd3_proc_commit", "nfsd4_commit"]
    assert first.evidence.endswith("calling for this request: nfsd3_proc_commit, nfsd4_commit")


def test_the_request_is_what_svc_process_dispatches(proposer: Proposer) -> None:
    """rpc: nfsd_dispatch first (every nfsd request ends at its return), the sunrpc pair
    below it with the reason; fh_verify names the export inside requests of both versions."""
    cands = proposer.candidates("rpc")
    assert (cands[0].kind, [a["entry"] for a in cands[0].attach]) == ("fentry", ["nfsd_dispatch"])
    assert cands[0].attach[0]["args"] == {"client": "rqstp->rq_addr", "name": "rqstp->rq_procinfo->pc_name"}
    assert cands[0].evidence == "outermost nfsd function(s) in the call graphs: nfsd_dispatch"
    assert proposer.graphs.callers["nfsd_dispatch"] == {"svc_process_common"}
    pair = next(c for c in cands if c.kind == "tracepoint")
    assert pair.attach[0]["entry"] == "sunrpc:svc_process" and pair.attach[0]["exit"] == "sunrpc:svc_send"
    assert any("svc_drop" in r for r in pair.reasons)
    context = proposer.context("rpc")
    assert [(c.kind, [a["entry"] for a in c.attach]) for c in context] == [("fentry", ["fh_verify"]),
                                                                          ("kprobe", ["fh_verify"])]
    assert context[0].attach[0]["args"]["export"] == "fhp->fh_export"
    callers = proposer.graphs.callers["fh_verify"]
    assert any(c.startswith("nfsd3_") for c in callers) and any(c.startswith("nfsd4_") for c in callers), callers


def test_compat_covers_every_request_kind_on_61_and_612() -> None:
    """The committed spec on the two Debian packages the tests fetch and on the lab guest's
    own profile: every operation covered, its context present, no pick that misbehaves."""
    spec = load_spec(SPEC)
    functions, modules, events = spec_functions(spec), spec_modules(spec), spec_events(spec)
    kernels = [load_kernel(str(kernel_dir(abi)), functions, modules, events=events) for abi in (ABI_61, ABI_612)]
    kernels.append(load_kernel(str(LAB / "profile.json.gz"), functions, modules, events=events))
    report = build_report(spec, kernels, kernels[-1], str(SPEC))
    for op, info in report["ops"].items():
        for label, pick in info["kernels"].items():
            assert pick["covered"] and not pick["warnings"], (op, label, pick)

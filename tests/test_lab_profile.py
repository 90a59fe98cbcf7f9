"""A profile taken in the Debian 6.1 lab guest drives `propose` on the host to the guest's spec.

Data: tests/fixtures/6.1.0-50-amd64/ (README there says how it was captured).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

from discover.profile import load_profile
from discover.propose import Proposer, build_spec
from discover.spec import DEFAULT_OPS, OPS, dumps_spec, load_spec

LAB = Path(__file__).resolve().parent / "fixtures" / "6.1.0-50-amd64"
PROFILE = LAB / "profile.json.gz"
REPO = Path(__file__).resolve().parent.parent


def test_lab_profile_has_every_section() -> None:
    prof = load_profile(PROFILE)
    assert prof.release == "6.1.0-50-amd64"
    assert prof.module_loaded("nfs") and prof.module_loaded("nfsv4") and prof.module_loaded("nfsv3")
    assert prof.config("CONFIG_DEBUG_INFO_BTF_MODULES") == "y"
    assert prof.has_blacklist and prof.traceable("nfs_file_read")
    assert {m["fstype"] for m in prof.mounts} >= {"nfs", "nfs4"}
    proto = prof.btf_function("nfs_file_read")
    assert proto["module"] == "nfs" and proto["params"][0] == ["iocb", "struct kiocb *"]
    assert prof.symbol_type("nfs_file_read") in ("T", "t")
    assert prof.event("nfs", "nfs_getattr_enter")["fields"]


def _decisions(spec: Dict[str, Any]) -> Dict[str, List[Any]]:
    """What a generator acts on: per op, each candidate's kind, matching and attach points.

    A tracepoint's name is now read at the exit event where that has it (`exit.name`, only
    for printed operations); the guest spec predates that and names the start field. An exit
    event's `ret` field now gives the error role too (ext4_sync_file_exit's); the guest spec
    predates that and took only `error` fields."""
    def point(a: Dict[str, Any]) -> Dict[str, Any]:
        args = {k: (v[len("exit."):] if k == "name" and v.startswith("exit.") else v)
                for k, v in (a.get("args") or {}).items() if (k, v) != ("error", "exit.ret")}
        return dict(a, args=args)
    return {op: [(c["kind"], c["match"], c.get("keys", []), c["module"], [point(a) for a in c["attach"]])
                 for c in body["candidates"]] for op, body in spec["ops"].items()}


def test_host_propose_from_lab_profile_equals_guest_spec(tmp_path: Path) -> None:
    out = tmp_path / "nfs.toml"
    res = subprocess.run([sys.executable, "-m", "discover", "propose", "nfs", "--kernel-profile", str(PROFILE),
                          "-o", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    host = load_spec(out)
    guest = load_spec(LAB / "nfs.guest.toml")
    # the guest spec was proposed before the metadata and RPC operations existed: its six agree
    assert list(host["ops"]) == list(OPS) and list(guest["ops"]) == list(DEFAULT_OPS)
    assert {op: d for op, d in _decisions(host).items() if op in DEFAULT_OPS} == _decisions(guest)
    assert host["kernel"] == guest["kernel"] == "6.1.0-50-amd64"


def test_host_events_from_lab_profile_equal_guest_events() -> None:
    res = subprocess.run([sys.executable, "-m", "discover", "events", "nfs", "nfs4", "sunrpc", "--json",
                          "--kernel-profile", str(PROFILE)], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == json.loads((LAB / "events.guest.json").read_text())


def test_lab_spec_uses_btf_for_fentry_and_args() -> None:
    prof = load_profile(PROFILE)
    proposer = Proposer(prof, "nfs")
    spec, _ = build_spec(proposer, proposer.propose(["read", "open"]))
    read = spec["ops"]["read"]["candidates"]
    kinds = [c["kind"] for c in read]
    assert kinds[:2] == ["fentry", "kprobe"]
    args = read[0]["attach"][0]["args"]
    assert args == {"file": "iocb->ki_filp", "offset": "iocb->ki_pos", "bytes": "retval"}
    opens = {a["entry"]: a for a in spec["ops"]["open"]["candidates"][0]["attach"]}
    assert set(opens) == {"nfs_file_open", "nfs4_file_open", "nfs_atomic_open"}
    assert opens["nfs4_file_open"]["module"] == "nfsv4"
    assert opens["nfs_file_open"]["args"]["file"] == "filp"
    assert "nfs_atomic_open" in dumps_spec(spec)

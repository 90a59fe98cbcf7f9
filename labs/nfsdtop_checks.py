"""Judging the nfsdtop lab run (labs/guest/nfsdtop_guest.py) against the server's own counters.

Each check takes the guest's `data` and asserts one property: nfsdtop's requests per NFSv3
procedure equal the differences of /proc/net/rpc/nfsd over the run (NFSv3 carries nothing but
the workload; NFSv4 renews its lease in the background, so its COMPOUNDs are bounded by the
counters, not equal), its bytes read and written equal the server's `io` counters and what the
workload moved, the client is the address connected to the NFS port, and nothing stays attached.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List

from probes.commands import proc_label


def intervals(data: Dict[str, Any]) -> List[Dict[str, Any]]:
    """nfsdtop's --json intervals, after its first line (what it traces; -v's lines go to stderr)."""
    records = [json.loads(line) for line in data["nfsdtop"]["lines"] if line.startswith("{")]
    assert records and records[0] == {"tracing": ["rpc", "read", "write"], "by": "client"}, records[:1]
    return records[1:]


def totals(data: Dict[str, Any]) -> Dict[str, Dict[str, int]]:
    """Per procedure label, nfsdtop's requests and bytes summed over every interval."""
    out: Dict[str, Dict[str, int]] = {}
    for interval in intervals(data):
        for pair in interval["requests"]:
            label = proc_label(pair["program"], pair["version"], pair["proc"])
            found = out.setdefault(label, {"count": 0, "read_bytes": 0, "write_bytes": 0})
            for field in found:
                found[field] += pair[field]
    return out


def verify_ran_and_detached(data: Dict[str, Any]) -> None:
    """Each run exited 0 (the JSON one by SIGTERM, the text ones by Ctrl-C), more
    tracing programs while attached, the same programs and kprobe_events as before after."""
    assert data["nfsdtop"]["rc"] == 0, data["nfsdtop"]["stderr"]
    for by, run in data["texts"].items():
        assert run["rc"] == 0, f"{by}: {run['stderr']}"
    before, during = data["attachments"]["before"], data["attachments"]["during"]
    assert len(during["bpf_progs"]) > len(before["bpf_progs"]), f"nothing attached while running: {during}"
    for moment in ("after", "after_text_runs"):
        after = data["attachments"][moment]
        assert after["bpf_progs"] == before["bpf_progs"], f"{moment}: programs left: {after} (before {before})"
        assert after["kprobe_events"] == before["kprobe_events"], f"{moment}: kprobe_events left: {after}"
    assert "backend: bcc" in data["nfsdtop"]["stderr"], data["nfsdtop"]["stderr"]


def verify_nfsv3_requests_equal_the_servers_counts(data: Dict[str, Any]) -> None:
    """Every NFSv3 procedure: nfsdtop's count equals the server's counter difference (the
    workload's WRITE, COMMIT, READ, GETATTR, LOOKUP... and zero where it issued none)."""
    counted = totals(data)
    server = {k: v for k, v in data["server_delta"].items() if k.startswith("NFSv3 ")}
    assert server.get("NFSv3 READ") and server.get("NFSv3 WRITE"), f"the workload reached no READ/WRITE: {server}"
    seen = {label: entry["count"] for label, entry in counted.items() if label.startswith("NFSv3 ")}
    assert seen == server, f"nfsdtop {seen} != /proc/net/rpc/nfsd {server}"


def verify_nfsv4_compounds_bounded(data: Dict[str, Any]) -> None:
    """NFSv4: the workload's COMPOUNDs seen, never more than the server counted over a longer
    window (the lease renewals while nfsdtop compiled are the difference)."""
    seen = totals(data).get("NFSv4 COMPOUND", {}).get("count", 0)
    assert 0 < seen <= data["server_delta"].get("NFSv4 COMPOUND", 0), (seen, data["server_delta"])


def verify_bytes_equal_the_servers_and_the_workloads(data: Dict[str, Any]) -> None:
    """Bytes read and written: nfsdtop's sum over NFSv3 and NFSv4 equals the server's `io`
    counters and what the workload wrote and read back (after a cache drop, every byte)."""
    counted = totals(data)
    read = sum(entry["read_bytes"] for entry in counted.values())
    written = sum(entry["write_bytes"] for entry in counted.values())
    moved = data["moved"]
    assert read == data["server_delta"]["io read"] == sum(m["read_bytes"] for m in moved.values()), (read, data)
    assert written == data["server_delta"]["io write"] == sum(m["write_bytes"] for m in moved.values()), (written, data)
    by_label = {label: (e["read_bytes"], e["write_bytes"]) for label, e in counted.items() if e["read_bytes"] or e["write_bytes"]}
    assert set(by_label) <= {"NFSv3 READ", "NFSv3 WRITE", "NFSv4 COMPOUND"}, by_label


def verify_rows_name_the_client(data: Dict[str, Any]) -> None:
    """One row per client address, the one connected to the server's NFS port; its requests are
    the intervals' sum, its procedures' counts add up to them."""
    clients = {row["client"] for interval in intervals(data) for row in interval["rows"]}
    assert clients and clients <= set(data["clients"]), (clients, data["clients"])
    for interval in intervals(data):
        for row in interval["rows"]:
            assert sum(row["procs"].values()) == row["requests"], row


def verify_text_runs(data: Dict[str, Any]) -> None:
    """The text runs, ended by Ctrl-C: the banner, then one table per interval; by client the
    client's address, by procedure the workload's NFSv3 READ and WRITE."""
    for by, run in data["texts"].items():
        assert run["lines"][0].startswith(f"Tracing NFS server requests per {by}, every 2 s"), run["lines"][:1]
        tables = [i for i, line in enumerate(run["lines"]) if line.startswith(by.upper() + " ")]
        assert len(tables) >= 2, run["lines"]
        rows = [line.split()[0] if by == "client" else " ".join(line.split()[:2]) for line in run["lines"]
                if line and not line.startswith((by.upper() + " ", "Tracing")) and " loadavg: " not in line]
        if by == "client":
            assert set(rows) <= set(data["clients"]) and rows, rows
        else:
            assert {"NFSv3 READ", "NFSv3 WRITE"} <= set(rows), rows


RUN_CHECKS = (verify_ran_and_detached, verify_nfsv3_requests_equal_the_servers_counts, verify_nfsv4_compounds_bounded,
              verify_bytes_equal_the_servers_and_the_workloads, verify_rows_name_the_client, verify_text_runs)

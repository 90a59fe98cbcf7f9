"""Judging the nfsdtop lab run (labs/checks/nfsdtop/guest.py) against the server's own counters.

Each check takes the guest's `data` and asserts one property: nfsdtop's requests per NFSv3
procedure equal the differences of /proc/net/rpc/nfsd over the run (NFSv3 carries nothing but
the workload; NFSv4 renews its lease in the background, so its COMPOUNDs are bounded by the
counters, not equal), its bytes read and written equal the server's `io` counters and what the
workload moved, the client is the address connected to the NFS port, and nothing stays attached.
nfsdtop runs on core (the CO-RE object) with the same probe on bcc beside it: both count alike.
The exporter's server families (`nfs-exporter --nfsd`, beside nfsdtop) are judged the same way
between its scrapes before and after the workload, per client too (127.0.0.1 and a quiet second
client of the same guest), and each request's export is the lab's.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Tuple

from probes.commands import is_operation, proc_label, server_rows
from probes.exports import exported_paths


def intervals(data: Dict[str, Any], run: str = "nfsdtop") -> List[Dict[str, Any]]:
    """nfsdtop's --json intervals (`run`: on core, or nfsdtop_bcc), after its first line (what it
    traces; -v's lines go to stderr)."""
    records = [json.loads(line) for line in data[run]["lines"] if line.startswith("{")]
    # v4op since NFSv4 operations are counted (the bench's earlier recorded rounds have none)
    assert records and records[0]["by"] == "client" and records[0]["tracing"] in (
        ["rpc", "read", "write", "v4op"], ["rpc", "read", "write"]), records[:1]
    return records[1:]


def totals(data: Dict[str, Any], run: str = "nfsdtop") -> Dict[str, Dict[str, int]]:
    """Per procedure label, nfsdtop's requests and bytes summed over every interval."""
    out: Dict[str, Dict[str, int]] = {}
    for interval in intervals(data, run):
        for pair in interval["requests"]:
            label = proc_label(pair["program"], pair["version"], pair["proc"])
            found = out.setdefault(label, {"count": 0, "read_bytes": 0, "write_bytes": 0})
            for field in found:
                found[field] += pair[field]
    return out


def verify_ran_and_detached(data: Dict[str, Any]) -> None:
    """Each run exited 0 (the JSON one by SIGTERM, the text ones by Ctrl-C), more
    tracing programs while attached, the same programs and kprobe_events as before after; the
    second client's mount and address removed."""
    for run in ("nfsdtop", "nfsdtop_bcc"):
        assert data[run]["rc"] == 0, data[run]["stderr"]
    for by, run in data["texts"].items():
        assert run["rc"] == 0, f"{by}: {run['stderr']}"
    before, during = data["attachments"]["before"], data["attachments"]["during"]
    assert len(during["bpf_progs"]) > len(before["bpf_progs"]), f"nothing attached while running: {during}"
    for moment in ("after", "after_text_runs"):
        after = data["attachments"][moment]
        assert after["bpf_progs"] == before["bpf_progs"], f"{moment}: programs left: {after} (before {before})"
        assert after["kprobe_events"] == before["kprobe_events"], f"{moment}: kprobe_events left: {after}"
    # the server probe runs from the CO-RE object where a client's would (6.12: fentry on libbpf)
    assert "backend: core (auto: " in data["nfsdtop"]["stderr"], data["nfsdtop"]["stderr"]
    assert "backend: bcc (--backend bcc)" in data["nfsdtop_bcc"]["stderr"], data["nfsdtop_bcc"]["stderr"]
    assert data["neighbour_undone"] == {"umount": 0, "ip addr del": 0}, data["neighbour_undone"]


def verify_nfsv3_requests_equal_the_servers_counts(data: Dict[str, Any]) -> None:
    """Every NFSv3 procedure: nfsdtop's count equals the server's counter difference (the
    workload's WRITE, COMMIT, READ, GETATTR, LOOKUP... and zero where it issued none)."""
    counted = totals(data)
    server = {k: v for k, v in data["server_delta"].items() if k.startswith("NFSv3 ")}
    assert server.get("NFSv3 READ") and server.get("NFSv3 WRITE"), f"the workload reached no READ/WRITE: {server}"
    seen = {label: entry["count"] for label, entry in counted.items() if label.startswith("NFSv3 ")}
    assert seen == server, f"nfsdtop {seen} != /proc/net/rpc/nfsd {server}"


def missed(data: Dict[str, Any], run: str = "nfsdtop") -> int:
    """The requests a run said it did not count (every op's, every interval's)."""
    return sum(sum(interval.get("missed", {}).values()) for interval in intervals(data, run))


def verify_core_and_bcc_count_the_same(data: Dict[str, Any]) -> None:
    """The one kernel side on both loaders, attached together through the workload: per NFSv3
    procedure the same requests and bytes (nothing but the workload moves NFSv3), short on one
    side by at most what the two said they missed (NFSv4's lease renewals come at their own
    times, so only NFSv3 is compared)."""
    core, bcc = totals(data, "nfsdtop"), totals(data, "nfsdtop_bcc")
    slack = missed(data, "nfsdtop") + missed(data, "nfsdtop_bcc")
    v3 = sorted(label for label in set(core) | set(bcc) if label.startswith("NFSv3 "))
    assert v3 and "NFSv3 READ" in v3, (core, bcc)
    for label in v3:
        mine, theirs = core.get(label, {"count": 0}), bcc.get(label, {"count": 0})
        assert abs(mine["count"] - theirs["count"]) <= slack, f"{label}: core {mine} bcc {theirs} (missed {slack})"
        if not slack:
            assert mine == theirs, f"{label}: core {mine} bcc {theirs}"
    for field in ("read_bytes", "write_bytes"):  # a missed request's bytes are missed with it
        assert slack or sum(e[field] for e in core.values()) == sum(e[field] for e in bcc.values()), (field, core, bcc)


def verify_nfsv4_compounds_bounded(data: Dict[str, Any]) -> None:
    """NFSv4: the workload's COMPOUNDs seen, never more than the server counted over a longer
    window (the lease renewals while nfsdtop compiled are the difference)."""
    seen = totals(data).get("NFSv4 COMPOUND", {}).get("count", 0)
    assert 0 < seen <= data["server_delta"].get("NFSv4 COMPOUND", 0), (seen, data["server_delta"])


def verify_bytes_equal_the_servers_and_the_workloads(data: Dict[str, Any]) -> None:
    """Bytes read and written: nfsdtop's sum over NFSv3 and NFSv4 equals the server's `io`
    counters and what the workload wrote and read back (after a cache drop, every byte)."""
    counted = {label: entry for label, entry in totals(data).items() if not is_operation(label)}  # inside COMPOUNDs
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
        rows = [" ".join(line.split()[:2]) if by == "proc" else line.split()[0] for line in run["lines"]
                if line and not line.startswith((by.upper() + " ", "Tracing")) and " loadavg: " not in line]
        if by == "client":
            assert set(rows) <= set(data["clients"]) and rows, rows
        elif by == "export":  # `-`: requests with no file handle (NFSv4 lease renewals)
            assert lab_export(data) in rows and set(rows) <= set(exported_paths(data["exports"])) | {"-"}, rows
        else:
            assert {"NFSv3 READ", "NFSv3 WRITE"} <= set(rows), rows


def lab_export(data: Dict[str, Any]) -> str:
    """The one export of the lab's /etc/exports (/srv/nfs), which every mount mounts: what
    /proc/fs/nfs/exports lists besides the NFSv4 pseudo root's exports (`v4root`: / and /srv,
    which mountd adds for the v4.2 mount's path to it)."""
    paths = list(exported_paths("\n".join(line for line in data["exports"].splitlines() if "v4root" not in line)))
    assert len(paths) == 1, paths
    return paths[0]


def verify_every_nfsv3_request_names_the_export(data: Dict[str, Any]) -> None:
    """nfsdtop's rows per export, rebuilt from its requests: every NFSv3 request (each carries
    a file handle) is the lab's export's, as many as the server counted; the NFSv4 COMPOUNDs
    with a handle too, those without (lease renewals) under no export."""
    export = lab_export(data)
    by_export: Dict[str, Dict[str, int]] = {}
    for interval in intervals(data):
        for pair in interval["requests"]:
            found = by_export.setdefault(pair["export"], {})
            label = proc_label(pair["program"], pair["version"], pair["proc"])
            found[label] = found.get(label, 0) + pair["count"]
    assert set(by_export) <= {export, ""}, by_export
    server = {k: v for k, v in data["server_delta"].items() if k.startswith("NFSv3 ")}
    assert {k: v for k, v in by_export.get(export, {}).items() if k.startswith("NFSv3 ")} == server, (by_export, server)
    for interval in intervals(data):
        rows = server_rows({(p["client"], p["program"], p["version"], p["proc"], p["export"]):
                            {**p, "slots": dict(p["slots"])} for p in interval["requests"]}, interval["seconds"],
                           [], "export")
        assert sum(row["requests"] for row in rows) == sum(p["count"] for p in interval["requests"]
                                                           if not is_operation(proc_label(p["program"], p["version"],
                                                                                          p["proc"]))), rows


def metrics(text: str) -> Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]:
    """A scrape's samples: (name, sorted labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def increases(data: Dict[str, Any], name: str) -> Dict[Tuple[Tuple[str, str], ...], float]:
    """What each series of `name` grew by between the exporter's scrapes before and after the workload."""
    before, after = (metrics(data["exporter"]["scrapes"][moment]) for moment in ("before", "after"))
    return {labels: value - before.get((n, labels), 0.0) for (n, labels), value in after.items()
            if n == name and value - before.get((n, labels), 0.0)}


def verify_exporter_requests_equal_the_servers_counts(data: Dict[str, Any]) -> None:
    """Between the two scrapes, per client and procedure, probekit_nfsd_requests_total grew by
    the server's own counts over the same window: NFSv3 exactly, NFSv4 COMPOUNDs bounded; every
    series names the lab's export and a client connected to the NFS port."""
    assert data["exporter"]["rc"] == 143, data["exporter"]["stderr"]  # SIGTERM, through the error boundary
    grew = increases(data, "probekit_nfsd_requests_total")
    per_proc: Dict[str, float] = {}
    for labels, value in grew.items():
        named = dict(labels)
        assert named["client"] in data["clients"] and named["export"] in (lab_export(data), ""), named
        per_proc[named["proc"]] = per_proc.get(named["proc"], 0) + value
    server = data["exporter"]["server_delta"]
    assert {k: v for k, v in per_proc.items() if k.startswith("NFSv3 ")} == \
        {k: v for k, v in server.items() if k.startswith("NFSv3 ")}, (per_proc, server)
    assert 0 < per_proc.get("NFSv4 COMPOUND", 0) <= server.get("NFSv4 COMPOUND", 0), (per_proc, server)


def verify_exporter_bytes_equal_the_servers_and_the_workloads(data: Dict[str, Any]) -> None:
    """Bytes read and written grew by the server's `io` counters and by what the workload moved."""
    server, moved = data["exporter"]["server_delta"], data["moved"]
    for name, io, field in (("probekit_nfsd_read_bytes_total", "io read", "read_bytes"),
                            ("probekit_nfsd_write_bytes_total", "io write", "write_bytes")):
        grew = sum(increases(data, name).values())
        assert grew == server[io] == sum(m[field] for m in moved.values()) > 0, (name, grew, server, moved)


def verify_exporter_histograms_count_the_requests(data: Dict[str, Any]) -> None:
    """In the scrape after: each series' duration histogram counts its requests (_count and the
    +Inf bucket), its buckets never decrease, and its sum is positive where it counted any."""
    after = metrics(data["exporter"]["scrapes"]["after"])
    requests = {labels: value for (name, labels), value in after.items() if name == "probekit_nfsd_requests_total"}
    assert requests and any(requests.values()), requests
    for labels, value in requests.items():
        assert after[("probekit_nfsd_request_duration_seconds_count", labels)] == value, labels
        buckets = sorted((float(dict(bl)["le"]), v) for (name, bl), v in after.items()
                         if name == "probekit_nfsd_request_duration_seconds_bucket"
                         and tuple(kv for kv in bl if kv[0] != "le") == labels)
        assert buckets[-1] == (float("inf"), value), (labels, buckets[-1])
        assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:])), (labels, buckets)
        assert (after[("probekit_nfsd_request_duration_seconds_sum", labels)] > 0) == (value > 0), labels


def verify_the_neighbours_apart(data: Dict[str, Any]) -> None:
    """The two clients of the server between the scrapes: the quiet neighbour (its own address)
    wrote its 4 KiB and read nothing, 127.0.0.1 moved the rest, and sent more requests."""
    def per_client(name: str) -> Dict[str, float]:
        out: Dict[str, float] = {}
        for labels, value in increases(data, name).items():
            out[dict(labels)["client"]] = out.get(dict(labels)["client"], 0) + value
        return out

    moved = data["moved"]
    for name, field in (("probekit_nfsd_read_bytes_total", "read_bytes"),
                        ("probekit_nfsd_write_bytes_total", "write_bytes")):
        expected = {"127.0.0.1": sum(m[field] for tag, m in moved.items() if tag != "neighbour"),
                    data["neighbour"]: moved["neighbour"][field]}
        assert per_client(name) == {c: v for c, v in expected.items() if v}, (name, per_client(name), expected)
    requests = per_client("probekit_nfsd_requests_total")
    assert set(requests) == {"127.0.0.1", data["neighbour"]} and requests["127.0.0.1"] > requests[data["neighbour"]] > 0


def verify_exporter_health_series(data: Dict[str, Any]) -> None:
    """The server probe's health: attached, when, what it attached to, missed requests per op,
    and the client label's bound (the run's two clients, of 64)."""
    after = metrics(data["exporter"]["scrapes"]["after"])
    names = {name for name, _labels in after}
    assert after[("probekit_nfsd_probe_attached", ())] == 1.0 and after[("probekit_nfs_probe_attached", ())] == 1.0
    assert after[("probekit_nfsd_probe_attach_time_seconds", ())] > 0
    assert after[("probekit_nfsd_clients_labelled", ())] == len(data["clients"])
    assert after[("probekit_nfsd_clients_labelled_limit", ())] == 64
    missed = {dict(labels)["op"]: value for (name, labels), value in after.items() if name == "probekit_nfsd_missed_total"}
    assert set(missed) == {"rpc", "read", "write", "v4op"}, missed
    points = {dict(labels)["op"] for (name, labels), _ in after.items() if name == "probekit_nfsd_probe_info"}
    assert {"rpc", "rpc context", "read", "write", "v4op"} <= points, (points, names)


#: the NFSv4 client's procedures (/proc/self/mountstats) that carry each operation once
CARRIED_BY = {"OPEN": ("OPEN", "OPEN_NOATTR")}


def verify_nfsv4_operations_equal_the_clients(data: Dict[str, Any]) -> None:
    """The NFSv4.2 client's operations (the guest's V4_OPS; CARRIED_BY: the client's procedures
    that carry each), per operation: nfsdtop's count on core and on bcc equals the client's own count over the run
    (/proc/self/mountstats), and so does probekit_nfsd_operations_total's growth between the
    exporter's scrapes, or is short by at most what the run said it missed; the O_DIRECT workload
    alone sent the known operations."""
    sent = data["v4_client_ops"]
    direct, files, writes = (data["v4_workload"][k] for k in ("sent", "files", "writes"))
    assert direct["OPEN"] >= files and direct["WRITE"] == direct["READ_PLUS"] == writes, direct
    assert direct["REMOVE"] == files and direct["CLOSE"] >= files, direct
    grew: Dict[str, float] = {}
    for labels, value in increases(data, "probekit_nfsd_operations_total").items():
        named = dict(labels)
        assert named["client"] == "127.0.0.1" and named["export"] in (lab_export(data), ""), named
        grew[named["proc"]] = grew.get(named["proc"], 0) + value
    for run in ("nfsdtop", "nfsdtop_bcc", "exporter"):
        if run == "exporter":
            seen, slack = grew, int(sum(increases(data, "probekit_nfsd_missed_total").values()))
        else:
            seen = {label: entry["count"] for label, entry in totals(data, run).items()}
            slack = missed(data, run)
        for op in data["v4_workload"]["ops"]:
            counted = seen.get(f"NFSv4 {op}", 0)
            issued = sum(sent.get(proc, 0) for proc in CARRIED_BY.get(op, (op,)))
            assert issued - slack <= counted <= issued, f"{run} NFSv4 {op}: {counted} of {issued} (missed {slack})"


RUN_CHECKS = (verify_ran_and_detached, verify_nfsv3_requests_equal_the_servers_counts, verify_core_and_bcc_count_the_same,
              verify_nfsv4_compounds_bounded,
              verify_bytes_equal_the_servers_and_the_workloads, verify_rows_name_the_client, verify_text_runs,
              verify_every_nfsv3_request_names_the_export, verify_exporter_requests_equal_the_servers_counts,
              verify_exporter_bytes_equal_the_servers_and_the_workloads,
              verify_exporter_histograms_count_the_requests, verify_the_neighbours_apart, verify_exporter_health_series,
              verify_nfsv4_operations_equal_the_clients)

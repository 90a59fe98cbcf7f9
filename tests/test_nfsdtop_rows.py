"""nfsdtop's rows: per client or per procedure, counts, bytes and histograms summed, requests in
progress joined to their row, sorted by the server time taken; addresses as users read them."""
from __future__ import annotations

import ctypes
import gzip
import json
import socket
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace
from typing import List, Tuple

from probes.commands import is_operation, nfsdtop_text, proc_label, server_rows
from probes.model import PROC_LEN
from probes.runtime import Session, client_address

V3, V4, ACL = (100003, 3), (100003, 4), (100227, 3)


def entry(count: int, lat_ms: float, slots: dict, read: int = 0, written: int = 0) -> dict:
    return {"count": count, "lat_ns": int(lat_ms * 1e6 * count), "read_bytes": read, "write_bytes": written,
            "slots": slots}


def key(client: str, prog_vers: tuple, name: str, export: str = "/srv/nfs") -> tuple:
    return (client, prog_vers[0], prog_vers[1], name, export)


def test_addresses_as_users_read_them() -> None:
    assert client_address(socket.AF_INET, bytes([10, 77, 0, 2]) + bytes(12)) == "10.77.0.2"
    assert client_address(socket.AF_INET6, socket.inet_pton(socket.AF_INET6, "fd00::1:2")) == "fd00::1:2"
    # an IPv4 client on a dual-stack socket: its IPv4 address, not ::ffff:10.77.0.2
    assert client_address(socket.AF_INET6, socket.inet_pton(socket.AF_INET6, "::ffff:10.77.0.2")) == "10.77.0.2"
    assert client_address(0, bytes(16)) == "?"


def test_procedures_carry_program_and_version() -> None:
    assert proc_label(*V3, "READ") == "NFSv3 READ"
    assert proc_label(*ACL, "GETACL") == "NFSACLv3 GETACL"
    assert proc_label(100099, 1, "X") == "100099v1 X" and proc_label(0, 0, "READ") == "READ"


def test_by_client_sums_procedures_and_ranks_by_server_time() -> None:
    """A client with fewer but slower requests outranks one with many quick ones: the load is
    the nfsd time taken. Its procedures' counts add up to its requests; a stuck request joins
    its client's row."""
    data = {key("10.77.0.2", V3, "WRITE"): entry(4, 20.0, {14: 4}, written=4 << 20),
            key("10.77.0.2", V3, "COMMIT"): entry(1, 50.0, {15: 1}),
            key("10.77.0.3", V4, "COMPOUND"): entry(50, 0.2, {7: 50}, read=1 << 20)}
    stuck = [(key("10.77.0.3", V4, "COMPOUND"), 2500.0)]
    rows = server_rows(data, 2.0, stuck)
    assert [row["client"] for row in rows] == ["10.77.0.2", "10.77.0.3"]
    busy, quick = rows
    assert busy["requests"] == 5 and busy["requests_per_s"] == 2.5 and busy["write_mb_s"] == round((4 << 20) / 2e6, 3)
    assert busy["procs"] == {"NFSv3 COMMIT": 1, "NFSv3 WRITE": 4}
    assert busy["avg_ms"] == 26.0 and busy["p99_ms"] == 32.767  # slot 15: 16384..32767 us
    assert quick["in_progress"] == 1 and quick["oldest_ms"] == 2500.0 and quick["read_bytes"] == 1 << 20
    by_proc = server_rows(data, 2.0, stuck, "proc")
    assert {row["proc"]: row["clients"] for row in by_proc} == {
        "NFSv3 WRITE": {"10.77.0.2": 4}, "NFSv3 COMMIT": {"10.77.0.2": 1}, "NFSv4 COMPOUND": {"10.77.0.3": 50}}


def test_a_row_with_requests_in_progress_only() -> None:
    """A client whose every request is stuck: a row with no rate and no latency, its oldest age."""
    rows = server_rows({}, 1.0, [(key("fd00::2", V3, "READ"), 30000.0), (key("fd00::2", V3, "READ"), 10.0)])
    assert rows == [{"client": "fd00::2", "requests": 0, "requests_per_s": 0.0, "read_bytes": 0, "write_bytes": 0,
                     "read_mb_s": 0.0, "write_mb_s": 0.0, "service_ms": 0.0, "avg_ms": None, "p99_ms": None,
                     "in_progress": 2, "oldest_ms": 30000.0, "procs": {}}]
    assert nfsdtop_text(rows, "client", 20)[1].split() == ["fd00::2", "0.0", "0.000", "0.000", "-", "-", "2", "30.0"]


def test_text_keeps_the_busiest_rows() -> None:
    data = {key(f"10.0.0.{i}", V3, "GETATTR"): entry(i, 1.0, {10: i}) for i in range(1, 6)}
    lines = nfsdtop_text(server_rows(data, 1.0, []), "client", 2)
    assert lines[0].split() == ["CLIENT", "REQ/s", "RD_MB/s", "WR_MB/s", "AVG_ms", "P99_ms", "INPROG", "OLDEST(s)"]
    assert [line.split()[0] for line in lines[1:]] == ["10.0.0.5", "10.0.0.4"]


#: a real nfsdtop lab run on Debian 6.12 (README.md there): its JSON intervals and the server's counters
LAB_RUN = Path(__file__).resolve().parent / "fixtures" / "6.12.117+deb13-amd64" / "nfsdtop" / "guest-run.json.gz"


def lab_run() -> dict:
    return json.loads(gzip.decompress(LAB_RUN.read_bytes()))["data"]


def raw(interval: dict) -> tuple:
    """An interval's (client, program, version, procedure) pairs and requests in progress, as
    Session.requests() and the run loop handed them to the rows."""
    data = {(p["client"], p["program"], p["version"], p["proc"], p["export"]):
            {**{f: p[f] for f in ("count", "lat_ns", "read_bytes", "write_bytes")}, "slots": dict(p["slots"])}
            for p in interval["requests"]}
    progress = [((p["client"], p["program"], p["version"], p["proc"], p["export"]), p["age_ms"])
                for p in interval["in_progress"]]
    return data, progress


def test_the_lab_runs_rows_rebuilt_from_its_requests() -> None:
    """Every interval of the real run: the rows nfsdtop printed are the rows its own pairs make."""
    intervals = [json.loads(line) for line in lab_run()["nfsdtop"]["lines"][1:]]
    assert intervals and any(i["requests"] for i in intervals)
    for interval in intervals:
        data, progress = raw(interval)
        assert server_rows(data, interval["seconds"], progress, interval["by"]) == interval["rows"]


def test_the_lab_runs_procedures_are_the_servers_counts() -> None:
    """The same pairs by procedure, summed over the run: each NFSv3 procedure's requests are
    what /proc/net/rpc/nfsd counted, and every byte read and written is the server's; the
    NFSv4 operations' bytes are their COMPOUNDs', split, not added again."""
    run = lab_run()
    totals: dict = {}
    for line in run["nfsdtop"]["lines"][1:]:
        data, progress = raw(json.loads(line))
        for row in server_rows(data, 1.0, progress, "proc"):
            found = totals.setdefault(row["proc"], [0, 0, 0])
            found[0] += row["requests"]
            found[1] += row["read_bytes"]
            found[2] += row["write_bytes"]
    server = run["server_delta"]
    assert {k: v[0] for k, v in totals.items() if k.startswith("NFSv3 ")} == \
        {k: v for k, v in server.items() if k.startswith("NFSv3 ")}
    requests = [v for k, v in totals.items() if not is_operation(k)]
    assert sum(v[1] for v in requests) == server["io read"] > 0
    assert sum(v[2] for v in requests) == server["io write"] > 0
    operations = [v for k, v in totals.items() if is_operation(k)]
    assert operations and [sum(v[i] for v in operations) for i in (1, 2)] == totals["NFSv4 COMPOUND"][1:]


def test_nfsv4_operations_are_rows_by_proc_and_not_requests_again() -> None:
    """An NFSv4 client's operations (`NFSv4 OPEN`, beside NFSv3's `NFSv3 READ`) are rows of their
    own by procedure; its client's and export's rows count its COMPOUNDs once, the operations
    named in the client's split only."""
    data = {key("10.77.0.3", V4, "COMPOUND"): entry(10, 1.0, {10: 10}, read=1 << 16),
            key("10.77.0.3", V4, "SEQUENCE"): entry(10, 0.1, {7: 10}),
            key("10.77.0.3", V4, "READ"): entry(4, 0.5, {9: 4}, read=1 << 16),
            key("10.77.0.3", V4, "OPEN"): entry(2, 0.3, {9: 2}),
            key("10.77.0.2", V3, "READ"): entry(3, 0.4, {9: 3}, read=3 << 16)}
    by_client = {row["client"]: row for row in server_rows(data, 1.0, [])}
    assert by_client["10.77.0.3"]["requests"] == 10 and by_client["10.77.0.3"]["read_bytes"] == 1 << 16
    assert by_client["10.77.0.3"]["procs"] == {"NFSv4 COMPOUND": 10}
    assert by_client["10.77.0.3"]["operations"] == {"NFSv4 OPEN": 2, "NFSv4 READ": 4, "NFSv4 SEQUENCE": 10}
    assert "operations" not in by_client["10.77.0.2"]  # an NFSv3 client's rows as before
    by_export = server_rows(data, 1.0, [], "export")
    assert [(row["export"], row["requests"]) for row in by_export] == [("/srv/nfs", 13)]
    by_proc = {row["proc"]: row["requests"] for row in server_rows(data, 1.0, [], "proc")}
    assert by_proc == {"NFSv4 COMPOUND": 10, "NFSv4 SEQUENCE": 10, "NFSv4 READ": 4, "NFSv4 OPEN": 2,
                       "NFSv3 READ": 3}


def test_only_nfsv4_names_past_its_procedures_are_operations() -> None:
    assert is_operation("NFSv4 READ_PLUS") and is_operation("NFSv4 unknown_operation")
    assert not is_operation("NFSv4 COMPOUND") and not is_operation("NFSv4 NULL")
    assert not is_operation("NFSv3 READ") and not is_operation("NFSACLv3 GETACL")


class _ServerKey(ctypes.Structure):
    """bpf/probe.bpf.c's struct server_key, as the loaders hand its maps' keys over."""

    _fields_ = [("family", ctypes.c_uint32), ("prog", ctypes.c_uint32), ("vers", ctypes.c_uint32),
                ("pad", ctypes.c_uint32), ("addr", ctypes.c_uint8 * 16), ("proc", ctypes.c_char * PROC_LEN),
                ("exp_ino", ctypes.c_uint64), ("exp_dev", ctypes.c_uint32), ("pad2", ctypes.c_uint32)]


class _HistKey(ctypes.Structure):
    _fields_ = [("k", _ServerKey), ("slot", ctypes.c_uint32), ("pad", ctypes.c_uint32)]


def test_session_requests_names_each_key_once_per_read() -> None:
    """Session.requests() from the two server maps: each (client, procedure, export) once with its
    counts and every slot of its histogram, the export named once per key however many slots
    its histogram holds (naming was most of a scrape's map reading at 200 clients)."""
    def server(last: int, proc: bytes) -> _ServerKey:
        k = _ServerKey(family=socket.AF_INET, prog=V3[0], vers=V3[1], proc=proc, exp_ino=2, exp_dev=8)
        k.addr[:4] = [10, 200, 1, last]
        return k

    keys = [server(n, proc) for n in (1, 2) for proc in (b"WRITE", b"GETATTR")]
    stats = [(k, SimpleNamespace(count=3, lat_ns=3000, rd_bytes=0, wr_bytes=4096)) for k in keys]
    hist = [(_HistKey(k=k, slot=slot), SimpleNamespace(value=1 + slot)) for k in keys for slot in (2, 5, 9)]
    named: List[Tuple[int, int]] = []

    def export_name(dev: int, ino: int) -> str:
        named.append((dev, ino))
        return "/srv/nfs"

    session = Session.__new__(Session)
    session.backend = SimpleNamespace(map={"server_stats": SimpleNamespace(items=lambda: stats),
                                           "server_hist": SimpleNamespace(items=lambda: hist)}.__getitem__)
    session.exports, session.reading, session._server_base = SimpleNamespace(name=export_name), nullcontext, {}
    got = session.requests(since_last=False)
    assert got == {(f"10.200.1.{n}", V3[0], V3[1], proc, "/srv/nfs"):
                   {"count": 3, "lat_ns": 3000, "read_bytes": 0, "write_bytes": 4096, "slots": {2: 3, 5: 6, 9: 10}}
                   for n in (1, 2) for proc in ("WRITE", "GETATTR")}
    assert len(named) == len(keys)

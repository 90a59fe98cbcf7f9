"""nfs-exporter --nfsd: the server families from nfsdtop's probe, on a real lab run (Debian 6.12's
single guest serving its own mounts: tests/fixtures/6.12.117+deb13-amd64/nfsdtop, README.md
there). The collector under test is real; what the probe's maps held comes from the run's own
nfsdtop --json requests, and the lab's verdicts are tried on the exporter's real scrapes."""
from __future__ import annotations

import gzip
import json
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, List, Tuple

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from test_exposition import as_client_registry

from labs.checks.nfsdtop import verdicts as nc
from probes.commands import is_operation, proc_label
from probes.exporter import NfsdCollector, cumulative_buckets, server_le_seconds, SERVER_BUCKET_SLOTS
from probes.exposition import encode
from probes.exports import ExportNames, exported_paths
from probes.mounts import kernel_dev
from probes.runtime import MISS_CAUSES

RUN_DIR = Path(__file__).resolve().parent / "fixtures" / "6.12.117+deb13-amd64" / "nfsdtop"


def lab_run() -> Dict[str, Any]:
    return json.loads(gzip.decompress((RUN_DIR / "guest-run.json.gz").read_bytes()))["data"]


def run_requests(data: Dict[str, Any]) -> Dict[Tuple[str, int, int, str, str], Dict[str, Any]]:
    """nfsdtop's requests over the whole run, summed per key: what the probe's cumulative maps held
    at its end (Session.requests(since_last=False))."""
    out: Dict[Tuple[str, int, int, str, str], Dict[str, Any]] = {}
    for line in data["nfsdtop"]["lines"][1:]:
        for pair in json.loads(line)["requests"]:
            key = (pair["client"], pair["program"], pair["version"], pair["proc"], pair["export"])
            into = out.setdefault(key, {"count": 0, "lat_ns": 0, "read_bytes": 0, "write_bytes": 0, "slots": {}})
            for field in ("count", "lat_ns", "read_bytes", "write_bytes"):
                into[field] += pair[field]
            for slot, count in pair["slots"]:
                into["slots"][slot] = into["slots"].get(slot, 0) + count
    return out


class _Served:
    """What Session's server readers return (the collector under test is real)."""

    attached = True

    def __init__(self, requests: Dict[Any, Dict[str, Any]], in_progress: List[Tuple[Any, int]]) -> None:
        self._requests, self._progress = requests, in_progress
        self.probe = SimpleNamespace(points=[])

    def requests(self, since_last: bool = True) -> Dict[Any, Dict[str, Any]]:
        assert not since_last, "the exporter's counters are cumulative"
        return self._requests

    def requests_in_progress(self) -> List[Tuple[Any, int]]:
        return self._progress

    def missed_per_cause(self) -> Dict[Tuple[str, str], int]:
        return {(op, cause): 0 for op in ("rpc", "read", "write") for cause in MISS_CAUSES}


def scrape(collector: NfsdCollector) -> Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(encode(collector.collect()).decode()) for s in family.samples}


def test_the_runs_requests_as_series_per_client_export_and_procedure() -> None:
    """Every (client, export, procedure) of the run is one series whose counter, bytes and
    histogram are the requests' sums; a request in progress joins its client's and export's
    gauges, with its age."""
    data = lab_run()
    requests = run_requests(data)
    first = sorted(requests)[0]
    collector = NfsdCollector(threading.Lock(), 64)
    collector.session = _Served(requests, [(first, time.monotonic_ns() - 3 * 10**9)])
    got = scrape(collector)
    for key, entry in requests.items():
        labels = tuple(sorted({"client": key[0], "export": key[4], "proc": proc_label(*key[1:4])}.items()))
        if is_operation(proc_label(*key[1:4])):  # an NFSv4 operation: its own families
            assert got[("probekit_nfsd_operations_total", labels)] == entry["count"]
            assert got[("probekit_nfsd_operation_duration_seconds_sum", labels)] == entry["lat_ns"] / 1e9
            continue
        assert got[("probekit_nfsd_requests_total", labels)] == entry["count"]
        assert got[("probekit_nfsd_read_bytes_total", labels)] == entry["read_bytes"]
        assert got[("probekit_nfsd_write_bytes_total", labels)] == entry["write_bytes"]
        assert got[("probekit_nfsd_request_duration_seconds_count", labels)] == entry["count"]
        assert got[("probekit_nfsd_request_duration_seconds_sum", labels)] == entry["lat_ns"] / 1e9
    progress = (("client", first[0]), ("export", first[4]))
    assert got[("probekit_nfsd_requests_in_progress", progress)] == 1
    assert 3.0 <= got[("probekit_nfsd_oldest_in_progress_seconds", progress)] < 60
    assert got[("probekit_nfsd_clients_labelled", ())] == len({key[0] for key in requests}) == 2
    assert got[("probekit_nfsd_probe_attached", ())] == 1



def test_the_server_families_are_written_as_prometheus_client_writes_them() -> None:
    """On the real run's clients, exports and procedures ("NFSv4 OPEN" among them), the server
    families are byte for byte what prometheus_client's encoder writes for the same families."""
    requests = run_requests(lab_run())
    assert any(is_operation(proc_label(*key[1:4])) for key in requests)
    collector = NfsdCollector(threading.Lock(), 64)
    collector.session = _Served(requests, [])
    families = list(collector.collect())
    assert encode(families) == generate_latest(as_client_registry(families))

def test_clients_past_the_limit_share_other_for_good() -> None:
    """The run's two clients with one place: the first in address order (the neighbour,
    10.77.0.9) keeps its series, 127.0.0.1's requests are client="other"; with only
    127.0.0.1's requests in a later scrape, it stays `other` (the series only grows)."""
    data = lab_run()
    requests = run_requests(data)
    collector = NfsdCollector(threading.Lock(), 1)
    collector.session = _Served(requests, [])
    got = scrape(collector)

    def per_client(got: Dict[Any, float]) -> Dict[str, float]:
        out: Dict[str, float] = {}
        for (name, labels), value in got.items():
            if name == "probekit_nfsd_requests_total":
                out[dict(labels)["client"]] = out.get(dict(labels)["client"], 0) + value
        return out

    counts: Dict[str, int] = {}
    for key, entry in requests.items():
        if not is_operation(proc_label(*key[1:4])):
            counts[key[0]] = counts.get(key[0], 0) + entry["count"]
    assert sorted(counts) == [data["neighbour"], "127.0.0.1"]
    assert per_client(got) == {data["neighbour"]: counts[data["neighbour"]], "other": counts["127.0.0.1"]}
    assert got[("probekit_nfsd_clients_labelled", ())] == 1 == got[("probekit_nfsd_clients_labelled_limit", ())]
    collector.session = _Served({k: v for k, v in requests.items() if k[0] == "127.0.0.1"}, [])
    assert per_client(scrape(collector)) == {"other": counts["127.0.0.1"]}


def test_server_buckets_hold_whole_microseconds_below_each_power_of_two() -> None:
    """Slot k of the server probe holds service times below 2^k us: its bucket is 2^k us - 1 ns."""
    assert server_le_seconds(1) == 1.999e-06 and server_le_seconds(26) == 67.108863999
    buckets = cumulative_buckets({1: 2, 5: 3, 30: 1}, SERVER_BUCKET_SLOTS, server_le_seconds)
    assert buckets[0] == ("1.999e-06", 2) and buckets[4] == ("3.1999e-05", 5)
    assert buckets[-2] == ("67.108863999", 5) and buckets[-1] == ("+Inf", 6)


def test_without_the_server_probe_a_scrape_says_so() -> None:
    collector = NfsdCollector(threading.Lock(), 64)
    assert scrape(collector) == {("probekit_nfsd_probe_attached", ()): 0.0}


def test_exports_are_named_by_their_roots_dev_and_inode(tmp_path: Path) -> None:
    """/proc/fs/nfs/exports' paths (escaped as the kernel writes them, listed once per client)
    stat()ed: a root's (kernel dev, inode) gives its path; no handle gives "", an unlisted
    export its numbers."""
    spaced, plain = tmp_path / "a b", tmp_path / "c"
    spaced.mkdir()
    plain.mkdir()
    source = tmp_path / "exports"
    source.write_text("# Version 1.1\n# Path Client(Flags) # IPs\n"
                      f"{str(spaced).replace(' ', chr(92) + '040')}\t127.0.0.1(rw,no_root_squash)\n"
                      f"{plain}\t127.0.0.1(ro)\n{plain}\t10.77.0.0/24(ro)\n")
    assert list(exported_paths(source.read_text())) == [str(spaced), str(plain)]
    names = ExportNames(source)
    for path in (spaced, plain):
        st = os.stat(path)
        assert names.name(kernel_dev(os.major(st.st_dev), os.minor(st.st_dev)), st.st_ino) == str(path)
    assert names.name(0, 0) == ""
    assert names.name(kernel_dev(8, 3), 12) == "dev 8:3 ino 12"


def test_the_labs_exports_are_its_export_and_the_nfsv4_pseudo_root() -> None:
    """The run's /proc/fs/nfs/exports: /srv/nfs (listed once per client it is exported to) and
    the pseudo root's / and /srv (`v4root`), which mountd exported for the NFSv4.2 mount's path.
    The kernel lists them in its hash table's order, which differs from run to run."""
    data = lab_run()
    assert sorted(exported_paths(data["exports"])) == ["/", "/srv", "/srv/nfs"]
    assert nc.lab_export(data) == "/srv/nfs"


@pytest.mark.parametrize("verify", nc.RUN_CHECKS, ids=lambda f: f.__name__[len("verify_"):])
def test_the_lab_verdicts_hold_on_the_real_run(verify: Any) -> None:
    """The lab check's verdicts on the kept run: what the CI job decided, decided again."""
    verify(lab_run())


def test_nfsv4_operations_are_a_family_of_their_own() -> None:
    """NFSv4 operations inside COMPOUNDs are probekit_nfsd_operations_total and
    probekit_nfsd_operation_duration_seconds, labelled like the requests (proc="NFSv4 OPEN"):
    summing probekit_nfsd_requests_total per client counts each COMPOUND once."""
    client, export = "127.0.0.1", "/srv/nfs"
    requests = {(client, 100003, 4, "COMPOUND", export): {"count": 6, "lat_ns": 6_000_000, "read_bytes": 0,
                                                          "write_bytes": 0, "slots": {10: 6}},
                (client, 100003, 4, "OPEN", export): {"count": 2, "lat_ns": 900_000, "read_bytes": 0,
                                                      "write_bytes": 0, "slots": {9: 2}},
                (client, 100003, 3, "READ", export): {"count": 3, "lat_ns": 300_000, "read_bytes": 3 << 16,
                                                      "write_bytes": 0, "slots": {7: 3}}}
    collector = NfsdCollector(threading.Lock(), 64)
    collector.session = _Served(requests, [])
    got = scrape(collector)

    def labels(proc: str) -> Tuple[Tuple[str, str], ...]:
        return tuple(sorted({"client": client, "export": export, "proc": proc}.items()))
    assert got[("probekit_nfsd_operations_total", labels("NFSv4 OPEN"))] == 2
    assert got[("probekit_nfsd_operation_duration_seconds_count", labels("NFSv4 OPEN"))] == 2
    assert got[("probekit_nfsd_operation_duration_seconds_sum", labels("NFSv4 OPEN"))] == 900_000 / 1e9
    assert ("probekit_nfsd_requests_total", labels("NFSv4 OPEN")) not in got
    assert got[("probekit_nfsd_requests_total", labels("NFSv4 COMPOUND"))] == 6
    assert got[("probekit_nfsd_requests_total", labels("NFSv3 READ"))] == 3
    assert ("probekit_nfsd_operations_total", labels("NFSv3 READ")) not in got

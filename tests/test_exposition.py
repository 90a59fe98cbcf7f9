"""probes.exposition: the text it writes is prometheus_client's for the same families, byte
for byte (float edges, escaping, name[] filters, the process' own families), and its server
answers as a scraper and a browser expect, over a real socket on 127.0.0.1."""
from __future__ import annotations

import gzip
import math
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, List, Sequence, Tuple

import pytest
from hypothesis import given, strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from probes.exposition import (CONTENT_TYPE, HISTOGRAM, MAX_LINE, Family, MetricsServer, counter, encode, gauge,
                               go_float, histogram, process_families)

REPO = Path(__file__).resolve().parents[1]
#: label values and help the escaping must get right: backslash, quote, newline, and both
#: together with text around them, and a character beyond ASCII
AWKWARD = ["plain", 'a "quoted" word', "back\\slash", "new\nline", '\\"\n\\n', "", "ünïcode ☃"]
EDGES = [0.0, -0.0, 1, 0.5, 1e-9, 5e-324, 999999.0, 999999.9, 1e6, 1234567.0, 1234567.125, 123456789012.0,
         2.0 ** 53, 1e15, 1e16, 1.5e17, 1.7976931348623157e308, -1234567.0, -1e20, math.inf, -math.inf, math.nan]


def as_client_registry(families: Sequence[Family]) -> CollectorRegistry:
    """The same families as prometheus_client's own metric families, in a registry of theirs."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    kinds = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily, "histogram": HistogramMetricFamily}
    theirs = []
    for family in families:
        made = kinds[family.type](family.name, family.help, labels=list(family.labels))
        for values, value in family.samples:
            made.add_metric(list(values), *(value if family.type == HISTOGRAM else (value,)))
        theirs.append(made)

    class Listed:
        def collect(self) -> List[Any]:
            return theirs

        describe = collect  # registers the names, which a name[] filter (restricted_registry) looks up

    registry = CollectorRegistry()
    registry.register(Listed())
    return registry


def sample_families() -> List[Family]:
    """Every type, with and without labels, awkward label values and help, empty families."""
    ops = counter("t_ops", "Ops with a \\ backslash\nand a newline.", ["op", "mount"])
    for i, value in enumerate(AWKWARD):
        ops.add([value, f"/mnt/{i}"], EDGES[i])
    latency = histogram("t_latency_seconds", "Latency.", ["op", "zone"])  # `le` sorts between them
    latency.add(["read", 'q"\\'], ([(go_float(0.001), 1), (go_float(2.5e6), 3), ("+Inf", 4)], 1.5e6))
    latency.add(["write", "x"], ([("+Inf", 0)], 0.0))
    alone = histogram("t_alone_seconds", "No labels.")
    alone.add([], ([("1.0", 2), ("+Inf", 2)], 0.25))
    edges = gauge("t_edges", "Float edges.", ["i"])
    for i, value in enumerate(EDGES):
        edges.add([str(i)], value)
    return [gauge("t_up", "Up.", value=1), ops, latency, alone, edges, counter("t_none", "No samples.", ["op"]),
            histogram("t_empty_seconds", "No samples.", ["op"]), counter("t_zero", "Zero.", value=0)]


@pytest.mark.parametrize("value", EDGES)
def test_go_float_is_prometheus_clients_on_the_edges(value: float) -> None:
    assert go_float(value) == floatToGoString(value)


@given(st.floats(allow_nan=True, allow_infinity=True) | st.integers(-2 ** 60, 2 ** 60))
def test_go_float_is_prometheus_clients_on_any_value(value: float) -> None:
    assert go_float(value) == floatToGoString(value)


def test_the_text_is_prometheus_clients_byte_for_byte() -> None:
    families = sample_families()
    text = encode(families)
    assert text == generate_latest(as_client_registry(families))
    parsed = {f.name: f for f in text_string_to_metric_families(text.decode())}
    assert [s.labels["op"] for s in parsed["t_ops"].samples] == AWKWARD
    assert 'mount="/mnt/4",op="\\\\\\"\\n\\\\n"' in text.decode()


@pytest.mark.parametrize("names", [["t_ops_total"], ["t_latency_seconds_bucket", "t_up"],
                                   ["t_latency_seconds_count", "t_alone_seconds_sum", "t_none_total"],
                                   ["t_empty_seconds_bucket", "nothing"], ["t_ops"]])
def test_a_name_filter_keeps_what_prometheus_clients_keeps(names: List[str]) -> None:
    families = sample_families()
    assert encode(families, set(names)) == generate_latest(as_client_registry(families).restricted_registry(names))


def test_the_process_families_are_prometheus_clients() -> None:
    """Same names, help, types and labels as prometheus_client's process and platform
    collectors, in their order; the values that do not move between two reads are equal."""
    from prometheus_client import PlatformCollector, ProcessCollector

    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    theirs = list(text_string_to_metric_families(generate_latest(registry).decode()))
    ours = list(text_string_to_metric_families(encode(process_families()).decode()))
    assert [(f.name, f.documentation, f.type) for f in ours] == [(f.name, f.documentation, f.type) for f in theirs]
    assert len(ours) == 7
    for mine, their in zip(ours, theirs):
        assert [s.labels for s in mine.samples] == [s.labels for s in their.samples]
        if mine.name in ("process_start_time_seconds", "process_max_fds", "python_info"):
            assert mine.samples == their.samples


class Served:
    """A MetricsServer on 127.0.0.1's port 0, serving sample_families(), for one test."""

    def __init__(self, families: Any = sample_families, timeout: float = 5.0) -> None:
        self.server = MetricsServer("127.0.0.1", 0, families, connection_timeout=timeout)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def raw(self, request: bytes) -> Tuple[int, dict, bytes]:
        """(status, headers lower-cased, body) of one request sent as it is."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as conn:
            conn.sendall(request)
            conn.shutdown(socket.SHUT_WR)
            data = b""
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        version, status, _reason = lines[0].split(" ", 2)
        assert version == "HTTP/1.1"
        headers = dict((k.lower(), v.strip()) for k, _, v in (line.partition(":") for line in lines[1:]))
        assert int(headers["content-length"]) == len(body) or body == b""
        return int(status), headers, body

    def get(self, path: str, method: str = "GET", extra: str = "") -> Tuple[int, dict, bytes]:
        return self.raw(f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}\r\n".encode())

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def served() -> Iterator[Served]:
    server = Served()
    yield server
    server.close()


def test_get_serves_the_scrape_on_metrics_and_the_root(served: Served) -> None:
    for path in ("/metrics", "/"):
        status, headers, body = served.get(path)
        assert status == 200 and headers["content-type"] == CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"
        assert body == encode(sample_families()) and "content-encoding" not in headers


def test_head_has_gets_headers_and_no_body(served: Served) -> None:
    status, headers, body = served.get("/metrics", "HEAD")
    assert status == 200 and body == b"" and headers["content-type"] == CONTENT_TYPE
    assert int(headers["content-length"]) == len(encode(sample_families()))


@pytest.mark.parametrize("accept", ["gzip", "deflate, gzip;q=0.5", "br,  GZIP ", "*"])
def test_gzip_when_accepted(served: Served, accept: str) -> None:
    status, headers, body = served.get("/metrics", extra=f"Accept-Encoding: {accept}\r\n")
    zipped = accept != "*"  # only a named gzip, as prometheus_client's app and node_exporter
    assert status == 200 and (headers.get("content-encoding") == "gzip") == zipped
    assert (gzip.decompress(body) if zipped else body) == encode(sample_families())


def test_name_filter(served: Served) -> None:
    status, _, body = served.get("/metrics?name[]=t_ops_total&name%5B%5D=t_up")
    assert status == 200 and body == encode(sample_families(), {"t_ops_total", "t_up"})
    assert [f.name for f in text_string_to_metric_families(body.decode())] == ["t_up", "t_ops"]


@pytest.mark.parametrize("request_bytes,status", [
    (b"GET /favicon.ico HTTP/1.1\r\n\r\n", 404),
    (b"GET /metricsx HTTP/1.1\r\n\r\n", 404),
    (b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405),
    (b"DELETE / HTTP/1.0\r\n\r\n", 405),
    (b"GET /metrics\r\n\r\n", 400),
    (b"GET /metrics HTTP/2.0\r\n\r\n", 400),
    (b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n", 400),
    (b"GET /metrics HTTP/1.1\r\nHost: x\r\n", 400),  # the head ends without its blank line
    (b"GET /" + b"a" * MAX_LINE + b" HTTP/1.1\r\n\r\n", 414),
    (b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * MAX_LINE + b"\r\n\r\n", 431),
    (b"GET /metrics HTTP/1.1\r\n" + b"X-Many: 1\r\n" * 200 + b"\r\n", 431),
])
def test_refusals(served: Served, request_bytes: bytes, status: int) -> None:
    got, headers, body = served.raw(request_bytes)
    assert got == status and body.startswith(str(status).encode())
    assert ("allow" in headers) == (status == 405)


def test_a_stalled_client_is_let_go_after_the_timeout() -> None:
    """A connection that sends half a request holds its thread no longer than the timeout;
    the server answers others meanwhile."""
    served = Served(timeout=0.5)
    try:
        with socket.create_connection(("127.0.0.1", served.port), timeout=10) as stalled:
            stalled.sendall(b"GET /metrics HTTP/1.1\r\n")
            assert served.get("/metrics")[0] == 200
            start = time.monotonic()
            assert stalled.recv(1024) == b""  # closed without an answer
            assert time.monotonic() - start < 5
    finally:
        served.close()


def test_a_failing_collector_is_a_500_and_the_next_scrape_is_served(capfd: Any) -> None:
    calls: List[int] = []

    def families() -> List[Family]:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("collector bug")
        return sample_families()

    served = Served(families)
    try:
        assert served.get("/metrics")[0] == 500
        assert served.get("/metrics")[0] == 200
    finally:
        served.close()
    assert "RuntimeError: collector bug" in capfd.readouterr().err


def test_a_taken_port_is_an_oserror_when_made() -> None:
    served = Served()
    try:
        with pytest.raises(OSError):
            MetricsServer("127.0.0.1", served.port, list)
    finally:
        served.close()


def test_ipv6_loopback_when_the_host_has_it() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        server = MetricsServer("::1", 0, sample_families)
    except OSError:
        pytest.skip("::1 not configured here")
    try:
        assert server.socket.family == socket.AF_INET6
    finally:
        server.server_close()


def test_serving_the_exporter_imports_no_tls_nor_prometheus_client() -> None:
    """The exporter's runtime path (import, bind, one scrape over a socket) in a fresh
    interpreter: none of the modules that cost it its memory (bench/README.md) is loaded."""
    script = """
import socket, sys, threading
from functools import partial
from probes import exporter
collector = exporter.Collector([exporter.FsCollector(None, threading.Lock())], "6.1", "")
server = exporter.listen("127.0.0.1", 0, partial(exporter.scrape, [collector]))
threading.Thread(target=server.serve_forever, daemon=True).start()
with socket.create_connection(("127.0.0.1", server.server_address[1])) as conn:
    conn.sendall(b"GET /metrics HTTP/1.1\\r\\nAccept-Encoding: gzip\\r\\n\\r\\n")
    assert conn.recv(100).startswith(b"HTTP/1.1 200 OK")
server.shutdown()
print(" ".join(sorted(sys.modules)))
"""
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert res.returncode == 0, res.stderr
    loaded = set(res.stdout.split())
    assert "probes.exposition" in loaded and "gzip" in loaded
    banned = {"prometheus_client", "ssl", "_ssl", "http.server", "http.client", "wsgiref", "hashlib", "_hashlib"}
    assert not {name for name in loaded if name in banned or name.split(".")[0] in banned}

"""The Prometheus text exposition format (0.0.4), and the HTTP server that serves it.

Why not prometheus_client: its exposition module imports http.server, wsgiref and urllib's
request stack, and with them ssl, libssl, libcrypto and hashlib, several MiB of the
exporter's peak memory (bench/README.md) for what is here one text encoder and a request a
scrape at a time. This module imports only socketserver; gzip and urllib.parse where a scrape is
served (the exporter's start, to its probe attached, needs neither).

The text is what prometheus_client's `generate_latest` writes for the same families, byte
for byte (tests/test_exposition.py holds it): labels sorted by name (a histogram's `le`
among them), values as Go's strconv formats them, `_total` after a counter's name.
"""
from __future__ import annotations

import math
import os
import socket
import socketserver
import sys
from functools import partial

TYPE_CHECKING = False  # typing's constant without typing (discover/records.py)
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Set, Tuple, Union
else:
    from discover.records import NamedTuple

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: the paths that serve the scrape (`/` as prometheus_client's app answered it); any other is 404
METRICS_PATHS = ("/metrics", "/")
#: seconds a connection may take to send its request and read the answer: a client that
#: stalls holds its thread no longer
CONNECTION_TIMEOUT_S = 30.0
#: longest request line or header line; more bytes of header than MAX_HEAD, or more than
#: MAX_HEADERS lines, are refused (431)
MAX_LINE = 8192
MAX_HEAD = 65536
MAX_HEADERS = 100
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 414: "URI Too Long",
           431: "Request Header Fields Too Large", 500: "Internal Server Error"}


class Family:
    """One metric family. `name` is the family's (a counter's without `_total`, which the
    text adds); `labels` the label names; each sample is (label values in that order, value),
    a histogram's value being (cumulative (le as text, count) pairs with +Inf last, sum)."""

    __slots__ = ("name", "help", "type", "labels", "samples")

    def __init__(self, name: str, help_text: str, labels: Sequence[str] = (),
                 samples: Optional[List[Tuple[Tuple[str, ...], Any]]] = None, *, kind: str, value: Any = None) -> None:
        self.name, self.help, self.type, self.labels = name, help_text, kind, tuple(labels)
        self.samples = samples if samples is not None else []
        if value is not None:
            self.samples.append(((), value))

    def add(self, values: Sequence[str], value: Any) -> None:
        self.samples.append((tuple(values), value))


#: a family of each type: (name, help[, labels[, samples]][, value=...]) ; `value` is the one
#: sample of a family without labels
counter: Callable[..., Family] = partial(Family, kind=COUNTER)
gauge: Callable[..., Family] = partial(Family, kind=GAUGE)
histogram: Callable[..., Family] = partial(Family, kind=HISTOGRAM)


def go_float(value: float) -> str:
    """A value as Go's strconv.FormatFloat(v, 'g', -1, 64) and so Prometheus write it, as
    prometheus_client does: Python's shortest repr, but exponent form from 1e+06 up, where
    Go switches; NaN and the infinities by Prometheus' names."""
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(value)
    whole, dot, fraction = text.partition(".")
    if value <= 0 or not dot or len(whole) < 7:
        return text
    digits = (whole + fraction).rstrip("0")
    return f"{digits[0]}{'.' + digits[1:] if len(digits) > 1 else ''}e+{len(whole) - 1:02d}"


def escape_label(value: str) -> str:
    """A label value as it goes between the quotes."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def sample_names(family: Family) -> Tuple[str, ...]:
    """The names its sample lines carry (what a `name[]` filter matches)."""
    if family.type == HISTOGRAM:
        return (family.name + "_bucket", family.name + "_count", family.name + "_sum")
    return (family.name + "_total" if family.type == COUNTER else family.name,)


def encode_family(family: Family, names: Optional[Set[str]] = None) -> str:
    """The family's HELP, TYPE and sample lines; with `names`, only the samples so named
    (nothing at all when none is). An integer is formatted once per family: counts repeat
    across a scrape's buckets and series (bench/README.md, bench_scale); a float is not
    cached (-0.0 equals 0.0 and is written otherwise)."""
    written: Dict[int, str] = {}

    def number(value: Any) -> str:
        if type(value) is not int:
            return go_float(value)
        text = written.get(value)
        if text is None:
            text = written[value] = go_float(value)
        return text

    wanted = sample_names(family)
    if names is not None:
        wanted = tuple(name if name in names else "" for name in wanted)
        if not any(wanted) or not family.samples:
            return ""
    order = sorted(range(len(family.labels)), key=family.labels.__getitem__)
    out = []
    if family.type != HISTOGRAM:
        (name,) = wanted
        if name:
            for values, value in family.samples:
                pairs = ",".join(f'{family.labels[i]}="{escape_label(values[i])}"' for i in order)
                out.append(f"{name}{{{pairs}}} {number(value)}\n" if pairs else f"{name} {number(value)}\n")
    else:
        bucket, count, total = wanted
        split = sum(1 for i in order if family.labels[i] < "le")
        for values, (buckets, sum_value) in family.samples:
            pairs = [f'{family.labels[i]}="{escape_label(values[i])}"' for i in order]
            every = "{" + ",".join(pairs) + "}" if pairs else ""
            if bucket:
                before = "".join(pair + "," for pair in pairs[:split])
                after = "".join("," + pair for pair in pairs[split:])
                out.extend(f'{bucket}{{{before}le="{le}"{after}}} {number(cumulative)}\n'
                           for le, cumulative in buckets)
            if count:
                out.append(f"{count}{every} {number(buckets[-1][1])}\n")
            if total:
                out.append(f"{total}{every} {go_float(sum_value)}\n")
    if names is not None and not out:
        return ""
    header = family.name + "_total" if family.type == COUNTER else family.name
    doc = family.help.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {header} {doc}\n# TYPE {header} {family.type}\n" + "".join(out)


def encode(families: Iterable[Family], names: Optional[Set[str]] = None) -> bytes:
    """A whole scrape in the text format, UTF-8; `names` as encode_family's."""
    return "".join(encode_family(family, names) for family in families).encode()


def process_families(proc: str = "/proc/self") -> List[Family]:
    """The process' own families, named, explained and ordered as prometheus_client's process
    and platform collectors write them (dashboards and alerts on a Python exporter expect
    them): CPU, memory, start time and file descriptors from /proc, and python_info."""
    import platform

    out: List[Family] = []
    ticks = os.sysconf("SC_CLK_TCK")
    try:
        with open("/proc/stat", "rb") as stat:
            boot = next(float(line.split()[1]) for line in stat if line.startswith(b"btime "))
        with open(f"{proc}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, StopIteration):
        fields = []
    if fields:  # fields[0] is the state, the third of proc(5)'s list
        out += [gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", value=float(fields[20])),
                gauge("process_resident_memory_bytes", "Resident memory size in bytes.",
                      value=float(fields[21]) * os.sysconf("SC_PAGE_SIZE")),
                gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
                      value=float(fields[19]) / ticks + boot),
                counter("process_cpu_seconds", "Total user and system CPU time spent in seconds.",
                        value=(float(fields[11]) + float(fields[12])) / ticks)]
    try:
        with open(f"{proc}/limits", "rb") as limits:
            most = next(float(line.split()[3]) for line in limits if line.startswith(b"Max open files"))
        out += [gauge("process_open_fds", "Number of open file descriptors.", value=len(os.listdir(f"{proc}/fd"))),
                gauge("process_max_fds", "Maximum number of open file descriptors.", value=most)]
    except (OSError, StopIteration):
        pass
    major, minor, patchlevel = platform.python_version_tuple()
    info = gauge("python_info", "Python platform information", ["version", "implementation", "major", "minor",
                                                                "patchlevel"])
    info.add([platform.python_version(), platform.python_implementation(), major, minor, patchlevel], 1)
    out.append(info)
    return out


class Response(NamedTuple):
    """What a request is answered: status, headers besides the length, body (a HEAD's unsent)."""

    status: int
    headers: Tuple[Tuple[str, str], ...]
    body: bytes


def gzip_accepted(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding header lists gzip (its q-value is not weighed)."""
    return any(part.split(";")[0].strip().lower() == "gzip" for part in accept_encoding.split(","))


def refusal(status: int, allow: bool = False) -> Response:
    """A short plain-text answer for a request not served (`allow`: the methods that are)."""
    headers = (("Content-Type", "text/plain; charset=utf-8"),) + ((("Allow", "GET, HEAD"),) if allow else ())
    return Response(status, headers, f"{status} {REASONS[status]}\n".encode())


class _Handler(socketserver.StreamRequestHandler):
    """One request per connection, then the connection is closed (Connection: close): a
    scraper sends one every scrape interval, so keeping connections open buys nothing."""

    server: "MetricsServer"

    def setup(self) -> None:
        self.timeout = self.server.connection_timeout
        super().setup()

    def handle(self) -> None:
        try:
            head = self.read_head()
        except OSError:  # the timeout, or the client gone
            return
        if isinstance(head, Response):
            self.send(head, False)
            return
        method, target, headers = head
        path, _, query = target.partition("?")
        if method not in ("GET", "HEAD"):
            response = refusal(405, allow=True)
        elif path not in METRICS_PATHS:
            response = refusal(404)
        else:
            from urllib.parse import parse_qs

            response = self.server.scrape(parse_qs(query).get("name[]"), headers.get("accept-encoding", ""))
        self.send(response, method == "HEAD")

    def read_head(self) -> Union[Response, Tuple[str, str, Dict[str, str]]]:
        """(method, target, lower-cased headers) of the request, or the Response refusing it."""
        line = self.rfile.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            return refusal(414)
        parts = line.decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return refusal(400)
        headers: Dict[str, str] = {}
        size = 0
        for _ in range(MAX_HEADERS + 1):
            line = self.rfile.readline(MAX_LINE + 1)
            size += len(line)
            if len(line) > MAX_LINE or size > MAX_HEAD:
                return refusal(431)
            if line in (b"\r\n", b"\n"):
                return parts[0], parts[1], headers
            name, colon, value = line.decode("latin-1").partition(":")
            if not colon or not name or name != name.strip():
                return refusal(400)  # a bare line, EOF before the end of the head, `Name :`
            key = name.lower()
            headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
        return refusal(431)

    def send(self, response: Response, head_only: bool) -> None:
        lines = [f"HTTP/1.1 {response.status} {REASONS[response.status]}", "Connection: close",
                 f"Content-Length: {len(response.body)}"]
        lines += [f"{name}: {value}" for name, value in response.headers]
        data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        try:
            self.wfile.write(data if head_only else data + response.body)
        except OSError:
            pass


class MetricsServer(socketserver.ThreadingTCPServer):
    """Serves `families()`, encoded afresh for every GET or HEAD of /metrics, a thread per
    connection. Bound when made (a taken port fails then), serving from serve_forever()."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: str, port: int, families: Callable[[], Iterable[Family]],
                 connection_timeout: float = CONNECTION_TIMEOUT_S) -> None:
        self.address_family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self.families = families
        self.connection_timeout = connection_timeout
        super().__init__((address, port), _Handler)

    def scrape(self, names: Optional[List[str]], accept_encoding: str) -> Response:
        """The scrape's response: gzipped (level 1: fast, most of the gain on repetitive
        text) when the scraper accepts gzip, whatever format its Accept header prefers, as
        node_exporter answers by default; Prometheus reads 0.0.4 either way."""
        try:
            body = encode(self.families(), set(names) if names is not None else None)
        except Exception:  # a collector's bug: this scrape fails, the exporter goes on
            import traceback

            traceback.print_exc(file=sys.stderr)
            return refusal(500)
        headers: Tuple[Tuple[str, str], ...] = (("Content-Type", CONTENT_TYPE),)
        if gzip_accepted(accept_encoding):
            import gzip

            body = gzip.compress(body, compresslevel=1)
            headers += (("Content-Encoding", "gzip"),)
        return Response(200, headers, body)

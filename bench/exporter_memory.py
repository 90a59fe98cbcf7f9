"""Peak memory (VmHWM) of nfs-exporter's imports and of its serving path, without a probe.

Why: the exporter's HTTP stack and text encoder decide most of what it holds above a
terminal tool (bench/README.md, "Start-up and peak memory beside libbpf-tools"); this reads
that part alone, natively, in a fresh interpreter per figure. `import`: `import
probes.exporter`; `serve`: that, then the server bound on 127.0.0.1 port 0 with the
families nfs-exporter serves (the process' own, a collector without a probe), one gzip GET
of /metrics over a socket, the answer read. On the tree PYTHONPATH names: a tree that
served through prometheus_client is served as it was (its registry and collectors).

  .venv/bin/python bench/exporter_memory.py --rounds 3
  PYTHONPATH=/tmp/main-tree .venv/bin/python bench/exporter_memory.py --rounds 3
"""
from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading


def hwm_mib() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024


def serve_once() -> None:
    """The serving path, in this process (the child's part)."""
    from probes import exporter

    collector = exporter.Collector([exporter.FsCollector(None, threading.Lock())], "6.1.0", "")
    if hasattr(exporter, "scrape"):
        from functools import partial

        server = exporter.listen("127.0.0.1", 0, partial(exporter.scrape, [collector]))
    else:  # a tree that served through prometheus_client
        from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector

        registry = CollectorRegistry()
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        registry.register(collector)
        server = exporter.listen("127.0.0.1", 0, registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with socket.create_connection(("127.0.0.1", server.server_address[1])) as conn:
        conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept-Encoding: gzip\r\n"
                     b"Connection: close\r\n\r\n")
        answer = b"".join(iter(lambda: conn.recv(65536), b""))
    assert answer.split(b"\r\n", 1)[0].endswith(b"200 OK"), answer[:200]
    server.shutdown()
    server.server_close()


def child(part: str) -> None:
    if part == "import":
        import probes.exporter  # noqa: F401
    else:
        serve_once()
    print(json.dumps({"part": part, "hwm_mib": round(hwm_mib(), 1),
                      "prometheus_client": "prometheus_client" in sys.modules, "ssl": "ssl" in sys.modules}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", choices=["import", "serve"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    for _ in range(args.rounds):
        for part in ("import", "serve"):
            out = subprocess.run([sys.executable, "-B", __file__, "--child", part], capture_output=True, text=True,
                                 check=True)
            print(out.stdout.strip())


if __name__ == "__main__":
    main()

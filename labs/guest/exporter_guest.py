"""Guest side of the exporter lab check: nfs-exporter scraped around the known workload.

Runs inside a lab guest (root, bcc, python3-prometheus-client, /mnt/nfs3 and /mnt/nfs42)
from the read-only project share and prints one JSON document: per mount phase what the
workload issued and how much each op's counter and histogram count moved between two
scrapes, `promtool check metrics` on the last scrape, the exporter's exit after SIGTERM,
and the tracing programs / kprobe_events before, during and after it. The scraped text
goes to /results/metrics/probekit.prom.

  python3 labs/guest/exporter_guest.py [PORT]
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from probes_guest import GAP_S, MOUNTS, PROJECT, kernel_attachments, prepare, spec_args, workload  # noqa: E402

OPS = ("read", "write", "open", "getattr", "fsync")
RESULTS = "/results/metrics"


def scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()


def samples(text: str, name: str) -> Dict[str, float]:
    """"op mountpoint" -> value of one per-op, per-mount series."""
    out: Dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line.rsplit(" ", 1)
            fields = dict(part.split("=", 1) for part in labels[len(name) + 1:-1].split(","))
            out[f"{fields['op'].strip(chr(34))} {fields['mountpoint'].strip(chr(34))}"] = float(value)
    return out


def start(port: int, log: str) -> subprocess.Popen:
    """The exporter, ready once it says it serves (compiling takes minutes under TCG)."""
    err = open(log, "w")
    proc = subprocess.Popen([sys.executable, "-m", "probes.exporter", "--port", str(port), "-v"] + spec_args(),
                            cwd=PROJECT, stdout=subprocess.DEVNULL, stderr=err)
    started = time.monotonic()
    while time.monotonic() - started < 400:
        if proc.poll() is not None:
            raise RuntimeError(f"nfs-exporter exited {proc.returncode}: {open(log).read()}")
        if "serving http://" in open(log).read():
            return proc
        time.sleep(0.5)
    raise RuntimeError("nfs-exporter not serving after 400 s")


def main(port: int) -> Dict[str, Any]:
    for tag, mount in MOUNTS.items():
        prepare(mount, tag)
    before = kernel_attachments()
    log = "/tmp/exporter.err"
    started = time.monotonic()
    proc = start(port, log)
    out: Dict[str, Any] = {"ready_s": round(time.monotonic() - started, 1), "phases": {}}
    try:
        during = kernel_attachments()
        text = scrape(port)
        for tag, mount in MOUNTS.items():
            time.sleep(GAP_S)
            first = scrape(port)
            issued = workload(mount, tag)
            time.sleep(GAP_S)
            text = scrape(port)
            moved: Dict[str, Dict[str, float]] = {}
            for series in ("probekit_nfs_ops_total", "probekit_nfs_op_latency_seconds_count",
                           "probekit_nfs_bytes_total"):
                a, b = samples(first, series), samples(text, series)
                moved[series] = {key: b[key] - a.get(key, 0) for key in b if b[key] != a.get(key, 0)}
            out["phases"][tag] = {"issued": issued, "moved": moved}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    out.update(rc=proc.returncode, stderr=open(log).read().splitlines(),
               attached={"before": before, "during": during, "after": kernel_attachments()})
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "probekit.prom"), "w") as handle:
        handle.write(text)
    check = subprocess.run(["promtool", "check", "metrics"], input=text, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, universal_newlines=True)
    out["promtool"] = {"rc": check.returncode, "output": check.stdout}
    out["buckets"] = [line for line in text.splitlines()
                      if line.startswith('probekit_nfs_op_latency_seconds_bucket{') and 'op="read"' in line]
    return out


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 19910)))

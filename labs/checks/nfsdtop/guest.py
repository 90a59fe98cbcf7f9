"""Guest side of the nfsdtop lab check: the NFS server of a single lab guest, its own client.

Runs inside a lab guest that serves /srv/nfs and mounts it over 127.0.0.1 (/mnt/nfs3 and
/mnt/nfs42, labs/provision), root, bcc and probekit's package installed. It reads the server's
own counters (/proc/net/rpc/nfsd: requests per NFSv3 and NFSv4 procedure, bytes read and
written), starts `nfsdtop --json 2` (on core) and the same on bcc beside it, runs a known
workload on both mounts (files written with fsync, the page cache dropped, read back, stat;
then on the NFSv4.2 mount files written, read back with O_DIRECT and removed, the client's
per-operation counts of that mount (/proc/self/mountstats) read around it all),
stops nfsdtop by SIGTERM, reads the counters again, and prints one JSON document: the counters'
differences, what the workload moved, the addresses of the clients connected to port 2049 (ss),
nfsdtop's output and exit, and the tracing programs / kprobe_events before and after. NFSv3
carries nothing between the two reads of the counters but the workload (NFSv4.1 renews its lease
in the background, also while nfsdtop compiles: its COMPOUNDs are only bounded). Beside nfsdtop,
`nfs-exporter --nfsd` runs through the same workload: scraped right before and right after it,
each scrape with the server's counters read next to it. A second client shares the server
meanwhile: an NFSv3 mount of the same export through 10.77.0.9, an address added to `lo` for the
run (the export admits the lab subnet), which writes 4 KiB with fsync while 127.0.0.1 moves its
megabytes: the noisy neighbour and the quiet one, in nfsdtop's rows and the exporter's series.
Then three text runs for the example, `nfsdtop -C 2`, `nfsdtop -C --by proc 2` and `nfsdtop -C
--by export 2`, around the workload again, ended by Ctrl-C (SIGINT).

  python3 labs/checks/nfsdtop/guest.py
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Tuple

# run as a script (python3 PATH in the guest): its project tree is not on sys.path by itself
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
from labs.checks.probes.guest import (EVIDENCE_WAIT_S, MOUNTS, drop_caches, kernel_attachments, said,  # noqa: E402
                                      stop, tool, wait_ready)

#: /proc/net/rpc/nfsd's procedure counts, in the kernel's order, named as nfsd's pc_name
PROC_NAMES = {
    "proc3": ("NULL", "GETATTR", "SETATTR", "LOOKUP", "ACCESS", "READLINK", "READ", "WRITE", "CREATE", "MKDIR",
              "SYMLINK", "MKNOD", "REMOVE", "RMDIR", "RENAME", "LINK", "READDIR", "READDIRPLUS", "FSSTAT",
              "FSINFO", "PATHCONF", "COMMIT"),
    "proc4": ("NULL", "COMPOUND"),
}
#: the workload's files: this many 64 KiB blocks each, written, then read after a cache drop
BLOCKS = 32
BLOCK = 64 * 1024
STATS = 5
#: the exporter's port in this check (the default's neighbour: nothing else listens there)
EXPORTER_PORT = 19911
#: what the exporter says once each probe is attached: the client's, and --nfsd's server one
ATTACHED = ("nfs-exporter: probe attached: ", "nfs-exporter: NFS server probe attached: ")


#: the second client's address (on lo, in the lab subnet the export admits) and its mount
NEIGHBOUR, NEIGHBOUR_MOUNT = "10.77.0.9", "/mnt/nfs3-neighbour"


@contextmanager
def neighbour() -> Iterator[Dict[str, int]]:
    """A second NFS client of this server: NEIGHBOUR on lo, the export mounted through it (NFSv3)
    at NEIGHBOUR_MOUNT; unmounted and the address removed on the way out, their exit codes kept
    in the dict it gives (the run's data is not lost to a failed clean-up: the host judges it)."""
    undone: Dict[str, int] = {}
    subprocess.run(["ip", "addr", "add", f"{NEIGHBOUR}/32", "dev", "lo"], check=True)
    try:
        os.makedirs(NEIGHBOUR_MOUNT, exist_ok=True)
        subprocess.run(["mount", "-t", "nfs", "-o", "vers=3,hard", f"{NEIGHBOUR}:/srv/nfs", NEIGHBOUR_MOUNT],
                       check=True)
        try:
            yield undone
        finally:
            undone["umount"] = subprocess.run(["umount", NEIGHBOUR_MOUNT]).returncode
    finally:
        undone["ip addr del"] = subprocess.run(["ip", "addr", "del", f"{NEIGHBOUR}/32", "dev", "lo"]).returncode


def quiet(mount: str, tag: str) -> Dict[str, int]:
    """The quiet neighbour's work: 4 KiB written with fsync."""
    work = os.path.join(mount, "work", f"nfsdtop-quiet-{tag}")
    os.makedirs(work, exist_ok=True)
    fd = os.open(os.path.join(work, "small.bin"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    written = os.write(fd, os.urandom(4096))
    os.fsync(fd)
    os.close(fd)
    return {"write_bytes": written, "read_bytes": 0}


def exporter_ready(proc: subprocess.Popen, log: str) -> float:
    """Seconds until `nfs-exporter --nfsd` has both probes attached (its server probe compiles
    on bcc, as nfsdtop's)."""
    started = time.monotonic()
    while time.monotonic() - started < 600:
        if proc.poll() is not None:
            raise RuntimeError(f"nfs-exporter exited {proc.returncode}: {said(log)}")
        if all(text in said(log) for text in ATTACHED):
            return time.monotonic() - started
        time.sleep(0.5)
    raise RuntimeError(f"nfs-exporter never attached both probes: {said(log)[-1000:]}")


def scrape_with_counters() -> Tuple[str, Dict[str, int], float]:
    """One scrape of the exporter, the server's counters read right after it, and when (monotonic s)."""
    at = time.monotonic()
    text = urllib.request.urlopen(f"http://127.0.0.1:{EXPORTER_PORT}/metrics",
                                  timeout=EVIDENCE_WAIT_S).read().decode()
    return text, server_counters(), at


def server_counters() -> Dict[str, int]:
    """`NFSv3 READ` -> count, ..., and `io read` / `io write` bytes, from /proc/net/rpc/nfsd."""
    out: Dict[str, int] = {}
    with open("/proc/net/rpc/nfsd") as handle:
        for line in handle:
            fields = line.split()
            if fields and fields[0] == "io":
                out["io read"], out["io write"] = int(fields[1]), int(fields[2])
            elif fields and fields[0] in PROC_NAMES:
                counts = [int(n) for n in fields[2:]]
                for name, count in zip(PROC_NAMES[fields[0]], counts):
                    out[f"NFSv{fields[0][4:]} {name}"] = count
    return out


def workload(mount: str, tag: str) -> Dict[str, int]:
    """Write a file with fsync, drop the caches, read it back, stat it: what it moved."""
    work = os.path.join(mount, "work", f"nfsdtop-{tag}")
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, "data.bin")
    moved = {"write_bytes": 0, "read_bytes": 0}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for _ in range(BLOCKS):
        moved["write_bytes"] += os.write(fd, os.urandom(BLOCK))
    os.fsync(fd)
    os.close(fd)
    drop_caches()
    fd = os.open(path, os.O_RDONLY)
    while True:
        chunk = os.read(fd, BLOCK)
        if not chunk:
            break
        moved["read_bytes"] += len(chunk)
    os.close(fd)
    for _ in range(STATS):
        os.stat(path)
    return moved


#: the NFSv4.2 workload's files, each written in WRITES_PER_FILE and read back in as many
#: O_DIRECT blocks (not past its end), then removed
V4_FILES, WRITES_PER_FILE = 25, 2
#: the NFSv4 operations it is judged by: each carried by one client procedure of the same
#: name (OPEN also by OPEN_NOATTR, the client's open of a file it has the handle of)
V4_OPS = ("OPEN", "WRITE", "READ_PLUS", "CLOSE", "REMOVE")


def mountstats_ops(mount: str) -> Dict[str, int]:
    """The client's per-operation RPC counts of `mount` (/proc/self/mountstats' per-op lines)."""
    out: Dict[str, int] = {}
    here = False
    with open("/proc/self/mountstats") as handle:
        for line in handle:
            if line.startswith("device "):
                here = f" mounted on {mount} " in line
            elif here and line.startswith("\t") and ":" in line:
                name, _, rest = line.strip().partition(":")
                fields = rest.split()
                if name.isupper() and fields and fields[0].isdigit():
                    out[name] = int(fields[0])
    return out


def v4_workload(mount: str) -> Tuple[Dict[str, int], Dict[str, int]]:
    """V4_FILES files written and read back with O_DIRECT (no page cache: every block is an RPC),
    then removed: what the client counted per operation meanwhile, and the bytes moved."""
    import mmap
    before = mountstats_ops(mount)
    work = os.path.join(mount, "work", "nfsdtop-v4")
    os.makedirs(work, exist_ok=True)
    block = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT wants
    block.write(os.urandom(BLOCK))
    moved = {"write_bytes": 0, "read_bytes": 0}
    for i in range(V4_FILES):
        path = os.path.join(work, f"f{i}")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
        for _ in range(WRITES_PER_FILE):
            moved["write_bytes"] += os.write(fd, block)
        os.close(fd)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        for _ in range(WRITES_PER_FILE):
            moved["read_bytes"] += os.readv(fd, [block])
        os.close(fd)
        os.unlink(path)
    after = mountstats_ops(mount)
    return {name: after[name] - before.get(name, 0) for name in after if after[name] - before.get(name, 0)}, moved


def nfs_clients() -> List[str]:
    """Peer addresses of the TCP connections established to the NFS port (ss), without port."""
    out = subprocess.run(["ss", "-Htn", "state", "established", "( sport = :2049 )"], stdout=subprocess.PIPE,
                         check=True, universal_newlines=True).stdout
    peers = {line.split()[-1].rpartition(":")[0].strip("[]") for line in out.splitlines() if line.strip()}
    return sorted(peer[len("::ffff:"):] if peer.startswith("::ffff:") else peer for peer in peers)


def check() -> Dict[str, Any]:
    with neighbour() as undone:
        data = run(NEIGHBOUR_MOUNT)
    return dict(data, neighbour_undone=undone)


def run(second: str) -> Dict[str, Any]:
    run_started = time.monotonic()
    for mount in MOUNTS.values():
        workload(mount, "warm")  # directories made, mounts answering: not what is measured
    quiet(second, "warm")
    before_attach = kernel_attachments()
    log = "/tmp/nfsdtop-json.log"
    counters_before = server_counters()
    argv = ["nfsdtop", "--json", "-v", "2"]
    # the same probe on bcc beside it (auto takes core here): the loaders must count alike
    bcc_argv, bcc_log = ["nfsdtop", "--backend", "bcc", "--json", "-v", "2"], "/tmp/nfsdtop-bcc.log"
    exporter_argv = ["nfs-exporter", "--nfsd", "--port", str(EXPORTER_PORT), "-v"]
    proc = tool(argv, log)
    on_bcc = tool(bcc_argv, bcc_log)
    bcc_ready_s = 0.0
    exporter = tool(exporter_argv, "/tmp/nfs-exporter.log")
    try:
        ready_s = wait_ready(proc, log)
        bcc_ready_s = wait_ready(on_bcc, bcc_log)
        exporter_s = exporter_ready(exporter, "/tmp/nfs-exporter.log")
        time.sleep(2.5)  # one interval's read before the workload: nothing of it is lost at the start
        ops_before = mountstats_ops(MOUNTS["nfs42"])
        before = scrape_with_counters()
        moved = {tag: workload(mount, "json") for tag, mount in MOUNTS.items()}
        moved["neighbour"] = quiet(second, "json")
        v4_started = time.monotonic()
        v4_sent, moved["nfs42-direct"] = v4_workload(MOUNTS["nfs42"])
        v4_s = time.monotonic() - v4_started
        clients = nfs_clients()
        time.sleep(3)
        after = scrape_with_counters()
        ops_after = mountstats_ops(MOUNTS["nfs42"])
        during = kernel_attachments()
    finally:
        result = dict(stop(proc, log), argv=argv)
        result_bcc = dict(stop(on_bcc, bcc_log), argv=bcc_argv, ready_s=round(bcc_ready_s, 1))
        exported = dict(stop(exporter, "/tmp/nfs-exporter.log"), argv=exporter_argv)
    counters_after = server_counters()
    after_attach = kernel_attachments()
    runs = {"client": ["nfsdtop", "-C", "2"], "proc": ["nfsdtop", "-C", "--by", "proc", "2"],
            "export": ["nfsdtop", "-C", "--by", "export", "2"]}
    procs = {by: tool(argv, f"/tmp/nfsdtop-{by}.log") for by, argv in runs.items()}
    for by, started in procs.items():
        wait_ready(started, f"/tmp/nfsdtop-{by}.log")
    time.sleep(2.5)
    for mount in MOUNTS.values():
        workload(mount, "text")
    quiet(second, "text")
    time.sleep(2.5)
    texts = {by: dict(stop(started, f"/tmp/nfsdtop-{by}.log", signal.SIGINT), argv=runs[by])
             for by, started in procs.items()}
    delta = {key: counters_after[key] - counters_before.get(key, 0) for key in counters_after}
    bcc = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "python3-bpfcc"], stdout=subprocess.PIPE,
                         universal_newlines=True).stdout
    return {"release": os.uname().release, "date": time.strftime("%Y-%m-%d"), "bcc": bcc,
            "python": sys.version.split()[0], "ready_s": round(ready_s, 1), "moved": moved, "clients": clients,
            "server_delta": {k: v for k, v in delta.items() if v}, "nfsdtop": result, "nfsdtop_bcc": result_bcc,
            "texts": texts, "v4_workload": dict(sent=v4_sent, files=V4_FILES, writes=V4_FILES * WRITES_PER_FILE,
                                                ops=list(V4_OPS), seconds=round(v4_s, 1)),
            "v4_client_ops": {k: v - ops_before.get(k, 0) for k, v in ops_after.items() if v - ops_before.get(k, 0)},
            "exporter": dict(exported, ready_s=round(exporter_s, 1),
                             scrapes={"before": before[0], "after": after[0]}, window_s=round(after[2] - before[2], 3),
                             server_delta={k: after[1][k] - before[1].get(k, 0) for k in after[1]
                                           if after[1][k] - before[1].get(k, 0)}),
            "exports": open("/proc/fs/nfs/exports").read(), "neighbour": NEIGHBOUR,
            "seconds": round(time.monotonic() - run_started, 1),
            "attachments": {"before": before_attach, "during": during, "after": after_attach,
                            "after_text_runs": kernel_attachments()}}


def main() -> int:
    try:
        result = {"check": "nfsdtop", "ok": True, "data": check()}
    except Exception as exc:  # reported as data: the host test shows it
        result = {"check": "nfsdtop", "ok": False, "error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

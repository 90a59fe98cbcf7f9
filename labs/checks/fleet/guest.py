"""Guest side of the fleet check: one NFS server, two clients, one client's load beside the other's.

Runs in each guest of a QEMU fleet (labs/checks/fleet/run.py drives it from the host), root,
probekit's package installed. The guests meet through the results share: the host writes the
phase (setup, before, heavy, drain, after, pause, resumed, stop, end) to /results/fleet/phase,
each guest notes when it saw each phase and leaves markers there (light.tool, heavy.tool,
server.ready, prom.ready, light.ready, heavy.ready, noisy.fired, heavy.done, heavy.reading,
stuck.fired, light.resumed, heavy.resumed). Each role prints one JSON document:

  prepare light|heavy   the files the role reads and writes, made before any tool runs
  server                `nfsdtop --by client --json -v 2` (core), the same on bcc beside it and
                        `nfs-exporter --nfsd` from before the clients start until the host says
                        end (every request of theirs counted), the exporter scraped then, as
                        `heavy` and `drain` start and at the end, the TCP peers of port 2049.
                        Started detached (--to FILE): the host stops this guest's QEMU in the
                        pause, when no command of its agent may be waiting
  light                 (client-b) one O_DIRECT 64 KiB read at a random offset every 0.1 s,
                        each timed, labelled with the phase seen before and after it; nfsdist
                        --json 1 and nfs-exporter --cgroup-label around them, both started
                        before nfsdtop (whatever a tool's start does on the mounts is outside
                        nfsdtop's count); /proc/net/rpc/nfs and the exporter's scrape before
                        and after; the `prom` role's document
  prom                  (client-b, started by light) Debian's Prometheus scraping the three
                        exporters over the lab link with the package's rules, NFSNoisyClient's
                        `for:` cut to NOISY_FOR: the alerts it fires (noisy.fired, stuck.fired
                        once they name client-a, or both clients' mounts), then every ALERTS
                        sample and every recorded client share of the run. On a client: a
                        Prometheus on the server would stop with it in the pause
  heavy                 (client-a) nfs-exporter --cgroup-label and `nfstop --by cgroup`; the
                        `heavy-load` role in the scope unit HEAVY_UNIT while the phase is heavy;
                        in the pause, timed reads as client-b's; /proc/net/rpc/nfs and the
                        exporter's scrape before and after
  heavy-load            parallel O_DIRECT writers and readers until the phase is no longer heavy;
                        then, its document printed, it stays in its unit until its stdin closes

The clients' NFSv3 requests are only their workloads' (nothing else touches /mnt/nfs3), and
the client's RPC counters are read before its first and after its last: so the differences are
what each client issued, request by request, which nfsdtop and nfs-exporter --nfsd on the
server must show by address.

  python3 labs/checks/fleet/guest.py ROLE [--to FILE]
"""
from __future__ import annotations

import json
import mmap
import multiprocessing
import os
import random
import re
import signal
import subprocess
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Optional

# run as a script (python3 PATH in the guest): its project tree is not on sys.path by itself
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
from labs.checks.exporter.guest import PROM_PORT, RULES, end, fetch, promql, service, start, wait_http  # noqa: E402
from labs.checks.nfsdtop.guest import PROC_NAMES, nfs_clients  # noqa: E402
from labs.checks.probes.guest import (EVIDENCE_WAIT_S, MOUNTS, kernel_attachments, nfs_server, stop, tool,  # noqa: E402
                                      wait_flushed, wait_ready)

SHARE = "/results/fleet"
BLOCK = 64 * 1024
#: light: a 16 MiB file read at random 64 KiB offsets, one read per LIGHT_GAP_S
LIGHT_BLOCKS, LIGHT_GAP_S = 256, 0.1
#: heavy: this many writers and readers, each on its own 8 MiB file in 256 KiB requests
HEAVY_WRITERS, HEAVY_READERS, HEAVY_BLOCK, HEAVY_BLOCKS = 2, 2, 256 * 1024, 32
#: seconds between two reads of the phase file where nothing else paces the loop
POLL_S = 0.2
#: the phases after which a workload stops
OVER = ("stop", "end")
#: the scope unit client-a's load runs in (systemd-run --scope --unit)
HEAVY_UNIT = "probekit-fleet-heavy"
#: every exporter's port, on its guest's lab address
PORT = 19910
#: Prometheus scrapes and evaluates this often (its scrape timeout too: a loaded 1-vCPU server can take
#: seconds to answer)
SCRAPE_S = 5
PROM_DIR = "/tmp/probekit-fleet-prometheus"
#: NFSNoisyClient's `for:` in the lab's copy of the shipped rules (10m there: longer than a phase)
NOISY_FOR = "10s"
#: the series the prom role keeps, every sample of the run
KEPT = {"alerts": 'ALERTS{alertname=~"NFSNoisyClient|NFSOperationsStuck"}',
        "shares": "instance_client:probekit_nfsd_requests:share_rate5m",
        "p99s": "instance_client:probekit_nfsd_request_duration_seconds:p99_rate5m",
        "up": "up"}
SERVER_ATTACHED = "nfs-exporter: NFS server probe attached: "
#: the phases at whose start the server scrapes its exporter: the quiet and the loaded window between
#: them are the promtool tests' series (tests/prometheus_rule_tests.py)
PHASE_SCRAPES = ("heavy", "drain")


def work_dir(role: str) -> str:
    return os.path.join(MOUNTS["nfs3"], "work", f"fleet-{role}")


def phase() -> str:
    """The host's phase. The host renames a new phase file into place; a 9p read that meets the
    rename fails (ENODATA seen) and is read again."""
    for _ in range(50):
        try:
            with open(os.path.join(SHARE, "phase")) as handle:
                found = handle.read().strip()
            if found:
                return found
        except OSError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"{SHARE}/phase: unreadable or empty for 1 s")


def watch(seen: List[List[Any]]) -> str:
    """The phase now, noting in `seen` ([phase, wall time]) when a new one was first seen."""
    now = phase()
    if not seen or seen[-1][0] != now:
        seen.append([now, round(time.time(), 3)])
    return now


def wait_phase(seen: List[List[Any]], done: Callable[[str], bool]) -> str:
    deadline = time.monotonic() + EVIDENCE_WAIT_S * 3
    while not done(watch(seen)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the host never moved on from phase {seen[-1][0]!r}")
        time.sleep(POLL_S)
    return seen[-1][0]


def mark(name: str, text: str = "") -> None:
    """A marker in the share (its text: the time, or what it says), renamed into place whole."""
    path = os.path.join(SHARE, name)
    with open(path + ".tmp", "w") as handle:
        handle.write((text or f"{time.time():.3f}") + "\n")
    os.replace(path + ".tmp", path)


def wait_marker(name: str) -> str:
    """Until another guest leaves marker `name`; its text."""
    deadline = time.monotonic() + EVIDENCE_WAIT_S * 3
    path = os.path.join(SHARE, name)
    while not os.path.exists(path):
        if phase() in OVER or time.monotonic() > deadline:
            raise RuntimeError(f"no {name} in {SHARE} (phase {phase()!r})")
        time.sleep(POLL_S)
    with open(path) as handle:
        return handle.read().strip()


def rpc_counts() -> Dict[str, int]:
    """This client's NFSv3 calls per procedure (/proc/net/rpc/nfs, named as nfsd names them)."""
    with open("/proc/net/rpc/nfs") as handle:
        for line in handle:
            fields = line.split()
            if fields and fields[0] == "proc3":
                return {f"NFSv3 {name}": int(n) for name, n in zip(PROC_NAMES["proc3"], fields[2:])}
    raise RuntimeError("/proc/net/rpc/nfs has no proc3 line: no NFSv3 mount?")


def delta(before: Dict[str, int], after: Dict[str, int]) -> Dict[str, int]:
    return {key: after[key] - before[key] for key in after if after[key] != before[key]}


def own_address(peer: str) -> str:
    """The address this guest sends from towards a peer (what the peer sees)."""
    out = subprocess.run(["ip", "-o", "route", "get", peer], stdout=subprocess.PIPE, check=True,
                         universal_newlines=True).stdout.split()
    return out[out.index("src") + 1]


def scrape(address: str) -> str:
    return fetch(f"http://{address}:{PORT}/metrics", "nfs-exporter")


def exporter(address: str, log: str, extra: List[str], ready: Optional[str] = None) -> subprocess.Popen:
    """nfs-exporter on this guest's lab address, once attached."""
    args = ["--address", address] + extra
    return start(PORT, log, args, ready) if ready else start(PORT, log, args)


def exporter_end(proc: subprocess.Popen, log: str) -> Dict[str, Any]:
    """SIGTERM to the exporter: its exit code and what it said."""
    proc.send_signal(signal.SIGTERM)
    proc.wait(EVIDENCE_WAIT_S)
    with open(log) as handle:
        return {"rc": proc.returncode, "stderr": handle.read().splitlines()}


def fill(path: str, blocks: int, size: int) -> None:
    with open(path, "wb") as handle:
        for _ in range(blocks):
            handle.write(os.urandom(size))
        handle.flush()
        os.fsync(handle.fileno())


def prepare(role: str) -> Dict[str, Any]:
    os.makedirs(work_dir(role), exist_ok=True)
    if role == "light":
        fill(os.path.join(work_dir(role), "read.bin"), LIGHT_BLOCKS, BLOCK)
    else:
        for index in range(HEAVY_WRITERS + HEAVY_READERS):
            fill(os.path.join(work_dir(role), f"heavy-{index}.bin"), HEAVY_BLOCKS, HEAVY_BLOCK)
    return {"files": sorted(os.listdir(work_dir(role)))}


def serve() -> Dict[str, Any]:
    """nfsdtop and nfs-exporter --nfsd from before the clients start until the host says end."""
    seen: List[List[Any]] = []
    before = kernel_attachments()
    address = own_address(wait_marker("heavy.address"))  # towards client-a: this server's lab address
    log, exp_log = "/tmp/fleet-nfsdtop.log", "/tmp/fleet-nfsd-exporter.err"
    argv = ["nfsdtop", "--by", "client", "--json", "-v", "2"]
    # the same probe on bcc beside it (auto takes core here): the two loaders must count alike
    bcc_log, bcc_argv = "/tmp/fleet-nfsdtop-bcc.log", argv[:1] + ["--backend", "bcc"] + argv[1:]
    proc = tool(argv, log)
    on_bcc: Optional[subprocess.Popen] = None
    served: Optional[subprocess.Popen] = None
    exported: Dict[str, Any] = {}
    scrapes: Dict[str, str] = {}
    scraped_at: Dict[str, float] = {}
    try:
        served = exporter(address, exp_log, ["--nfsd"], SERVER_ATTACHED)
        ready_s = wait_ready(proc, log)
        on_bcc = tool(bcc_argv, bcc_log)  # started once core is ready: each loader's start-up is its own
        wait_ready(on_bcc, bcc_log)
        wait_flushed([log, bcc_log], time.time(), "their start")  # a whole interval counted: nothing is missed
        scraped_at["before"] = time.time()
        scrapes["before"] = scrape(address)
        mark("server.ready")
        now = ""
        while now != "end":
            now = wait_phase(seen, lambda phase, was=now: phase != was)
            if now in PHASE_SCRAPES:
                scraped_at[now] = time.time()
                scrapes[now] = scrape(address)
        clients = nfs_clients()  # the host says end after both clients' last request returned
        flushed = wait_flushed([log, bcc_log], time.time(), "the clients' last requests")
        scrapes["after"] = scrape(address)
    finally:
        if served is not None:
            exported = exporter_end(served, exp_log)
        result = dict(stop(proc, log), argv=argv)
        result_bcc = dict(stop(on_bcc, bcc_log), argv=bcc_argv) if on_bcc is not None else None
    return {"nfsdtop": result, "nfsdtop_bcc": result_bcc, "ready_s": round(ready_s, 1), "flushed": flushed, "seen": seen,
            "clients": clients, "address": address, "exporter": exported, "scrapes": scrapes,
            "scraped_at": {key: round(at, 3) for key, at in scraped_at.items()},
            "attachments": {"before": before, "after": kernel_attachments()}}


def timed_reads(path: str, blocks: int, seen: List[List[Any]], role: str) -> List[List[Any]]:
    """One timed O_DIRECT read of BLOCK at a random offset of `path` every LIGHT_GAP_S until the
    host says stop: [wall start, µs, phase seen before and after it ("edge" when they differ)].
    Marks ROLE.reading after the first, ROLE.resumed after the first wholly in `resumed`."""
    buf = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT wants
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    rng = random.Random(12)
    reads: List[List[Any]] = []
    try:
        while True:
            before = watch(seen)
            if before in OVER:
                return reads
            start_at, mono = time.time(), time.monotonic()
            got = os.preadv(fd, [buf], rng.randrange(blocks) * BLOCK)
            took = time.monotonic() - mono
            after = watch(seen)
            if got != BLOCK:
                raise RuntimeError(f"short O_DIRECT read: {got} bytes")
            reads.append([round(start_at, 3), round(took * 1e6), before if before == after else "edge"])
            if len(reads) == 1:
                mark(f"{role}.reading")
            if before == after == "resumed" and not os.path.exists(os.path.join(SHARE, f"{role}.resumed")):
                mark(f"{role}.resumed")
            time.sleep(LIGHT_GAP_S)
    finally:
        os.close(fd)


def light() -> Dict[str, Any]:
    """Timed O_DIRECT reads until the host says stop, under nfsdist and nfs-exporter; the
    Prometheus of the `prom` role beside them."""
    seen: List[List[Any]] = []
    server = nfs_server()
    address = own_address(server)
    log, exp_log = "/tmp/fleet-nfsdist.log", "/tmp/fleet-light-exporter.err"
    argv = ["nfsdist", "--json", "-v", "1"]
    proc = tool(argv, log)
    served: Optional[subprocess.Popen] = None
    watcher: Optional[subprocess.Popen] = None
    out: Dict[str, Any] = {}
    try:
        served = exporter(address, exp_log, ["--cgroup-label"])
        ready_s = wait_ready(proc, log)
        mark("light.tool")
        wait_marker("server.ready")
        watcher = subprocess.Popen([sys.executable, os.path.abspath(__file__), "prom", address], stdout=subprocess.PIPE,
                                universal_newlines=True)
        counts_before = rpc_counts()  # before the first request: open's included
        scraped_before = scrape(address)
        mark("light.ready")
        reads = timed_reads(os.path.join(work_dir("light"), "read.bin"), LIGHT_BLOCKS, seen, "light")
        counts_after = rpc_counts()
        out["scrapes"] = {"before": scraped_before, "after": scrape(address)}
        flushed = wait_flushed([log], time.time(), "the last read")
        said, _ = watcher.communicate(timeout=EVIDENCE_WAIT_S)
        out["prom"] = json.loads(said.strip().splitlines()[-1])
    finally:
        if watcher is not None and watcher.poll() is None:
            watcher.terminate()  # it ends its Prometheus first
            watcher.wait()
        if served is not None:
            out["exporter"] = exporter_end(served, exp_log)
        result = dict(stop(proc, log), argv=argv)
    return dict(out, address=address, server=server, nfsdist=result, ready_s=round(ready_s, 1), flushed=flushed,
                seen=seen, reads=reads, issued=delta(counts_before, counts_after))


def lab_rules() -> str:
    """The shipped rules file with NFSNoisyClient's `for:` cut to NOISY_FOR, nothing else changed."""
    with open(RULES) as handle:
        text = handle.read()
    cut, found = re.subn(r"(- alert: NFSNoisyClient\n(?:(?!\s*- (?:alert|record):).*\n)*?\s+for: )10m\n",
                         rf"\g<1>{NOISY_FOR}\n", text)
    if found != 1:
        raise RuntimeError(f"{RULES}: no `for: 10m` in NFSNoisyClient to cut")
    path = os.path.join(PROM_DIR, "probekit-rules-lab.yml")
    with open(path, "w") as handle:
        handle.write(cut)
    return path


def alerts() -> List[Dict[str, Any]]:
    answer = json.loads(fetch(f"http://127.0.0.1:{PROM_PORT}/api/v1/alerts", "Prometheus"))
    return [dict(alert["labels"], state=alert["state"]) for alert in answer["data"]["alerts"]]


def prom(light_address: str) -> Dict[str, Any]:
    """Prometheus on this client scraping the three exporters; noisy.fired once NFSNoisyClient
    fires for client-a, stuck.fired once NFSOperationsStuck fires for both clients' mounts of the
    server; at stop, every kept series' samples of the run and the rules' health."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # Prometheus ended below, whatever ends this
    seen: List[List[Any]] = []
    server = nfs_server()
    heavy_address = wait_marker("heavy.address")
    targets = [f"{address}:{PORT}" for address in (server, heavy_address, light_address)]
    subprocess.run(["rm", "-rf", PROM_DIR], check=True)
    os.makedirs(PROM_DIR)
    config = os.path.join(PROM_DIR, "prometheus.yml")
    with open(config, "w") as handle:
        handle.write(f"global: {{scrape_interval: {SCRAPE_S}s, evaluation_interval: {SCRAPE_S}s}}\n"
                     f"rule_files: ['{lab_rules()}']\n"
                     f"scrape_configs:\n  - job_name: probekit\n    static_configs: [{{targets: {targets}}}]\n")
    server_proc = service(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={PROM_DIR}/data",
                           f"--web.listen-address=127.0.0.1:{PROM_PORT}"], "/tmp/fleet-prometheus.err")
    fired: Dict[str, float] = {}
    polled: List[List[Any]] = []
    try:
        wait_http(f"http://127.0.0.1:{PROM_PORT}/-/ready", "prometheus", server_proc)
        deadline = time.monotonic() + EVIDENCE_WAIT_S
        while {row["metric"]["instance"] for row in promql("up == 1")} != set(targets):
            if time.monotonic() > deadline:
                raise RuntimeError(f"Prometheus never scraped all of {targets}: {promql('up')}")
            time.sleep(SCRAPE_S / 2)
        mark("prom.ready")
        stuck_mounts = {(f"{address}:{PORT}", server, MOUNTS["nfs3"]) for address in (heavy_address, light_address)}
        while watch(seen) not in OVER:
            firing = [a for a in alerts() if a["state"] == "firing"]
            polled.append([round(time.time(), 3), sorted(json.dumps(a, sort_keys=True) for a in firing)])
            if "noisy" not in fired and any(a["alertname"] == "NFSNoisyClient" and a.get("client") == heavy_address
                                            for a in firing):
                fired["noisy"] = time.time()
                mark("noisy.fired")
            named = {(a.get("instance"), a.get("server"), a.get("mountpoint")) for a in firing
                     if a["alertname"] == "NFSOperationsStuck"}
            if "stuck" not in fired and stuck_mounts <= named:
                fired["stuck"] = time.time()
                mark("stuck.fired")
            time.sleep(1)  # every phase seen, `drain` too (seconds long)
        at = time.time() + SCRAPE_S  # the rules evaluated once more after the workloads stopped
        time.sleep(2 * SCRAPE_S)
        kept = {name: promql(f"{query}[1h]", at=at) for name, query in KEPT.items()}
        groups = json.loads(fetch(f"http://127.0.0.1:{PROM_PORT}/api/v1/rules", "Prometheus"))["data"]["groups"]
    finally:
        end(server_proc)
    return {"targets": targets, "noisy_for": NOISY_FOR, "seen": seen, "fired": fired, "polled": polled,
            "kept": kept, "at": at,
            "rules": [{"group": g["name"], "name": r["name"], "type": r["type"], "health": r.get("health", ""),
                       "error": r.get("lastError", "")} for g in groups for r in g["rules"]]}


def heavy_worker(index: int, writer: bool, halt: Any, done: Any) -> None:
    """One O_DIRECT writer or reader over its own file, whole file in turn, until halted."""
    buf = mmap.mmap(-1, HEAVY_BLOCK)
    if writer:
        buf.write(os.urandom(HEAVY_BLOCK))
    fd = os.open(os.path.join(work_dir("heavy"), f"heavy-{index}.bin"),
                 (os.O_WRONLY if writer else os.O_RDONLY) | os.O_DIRECT)
    count = 0
    try:
        while not halt.is_set():
            offset = (count % HEAVY_BLOCKS) * HEAVY_BLOCK
            moved = os.pwritev(fd, [buf], offset) if writer else os.preadv(fd, [buf], offset)
            if moved != HEAVY_BLOCK:
                raise RuntimeError(f"short O_DIRECT {'write' if writer else 'read'}: {moved} bytes")
            count += 1
    finally:  # the parent waits for every worker's count; a failed one says so by its exit code
        os.close(fd)
        done.put((index, writer, count))


def heavy_load() -> Dict[str, Any]:
    """Parallel writers and readers (started in HEAVY_UNIT) for as long as the phase is heavy."""
    seen: List[List[Any]] = []
    fork = multiprocessing.get_context("fork")
    halt, done = fork.Event(), fork.Queue()
    workers = [fork.Process(target=heavy_worker, args=(i, i < HEAVY_WRITERS, halt, done))
               for i in range(HEAVY_WRITERS + HEAVY_READERS)]
    for worker in workers:
        worker.start()
    try:
        wait_phase(seen, lambda now: now != "heavy")
    finally:
        halt.set()
        ops = [list(done.get(timeout=EVIDENCE_WAIT_S)) for _ in workers]
        for worker in workers:
            worker.join()
    if any(worker.exitcode for worker in workers):
        raise RuntimeError(f"a heavy worker failed: exit codes {[w.exitcode for w in workers]}")
    with open("/proc/self/cgroup") as handle:
        cgroup = handle.read().strip().rpartition("::")[2]
    return {"seen": seen, "cgroup": cgroup,
            "workers": [{"index": i, "writer": w, "requests": n} for i, w, n in sorted(ops)]}


def heavy() -> Dict[str, Any]:
    """The load in its unit while the phase is heavy, timed reads while the server is paused,
    under nfs-exporter and nfstop by cgroup."""
    seen: List[List[Any]] = []
    server = nfs_server()
    address = own_address(server)
    log, exp_log = "/tmp/fleet-nfstop.log", "/tmp/fleet-heavy-exporter.err"
    argv = ["nfstop", "--by", "cgroup", "--json", "-i", "1"]
    proc = tool(argv, log)
    served: Optional[subprocess.Popen] = None
    load: Optional[subprocess.Popen] = None
    out: Dict[str, Any] = {"load": {"workers": []}, "pause_reads": []}
    try:
        served = exporter(address, exp_log, ["--cgroup-label"])
        wait_ready(proc, log)
        mark("heavy.address", address)
        mark("heavy.tool")
        wait_marker("server.ready")
        counts_before = rpc_counts()
        scraped_before = scrape(address)
        mark("heavy.ready")
        if wait_phase(seen, lambda now: now == "heavy" or now in OVER) == "heavy":
            # it stays in its unit once done until its stdin closes: the unit's cgroup, and the
            # exporter's series of it, last until the scrape after the pause
            load = subprocess.Popen(["systemd-run", "--scope", "--quiet", f"--unit={HEAVY_UNIT}", sys.executable,
                                     os.path.abspath(__file__), "heavy-load"], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, universal_newlines=True)
            line = load.stdout.readline() if load.stdout else ""
            doc = json.loads(line) if line.strip() else {}
            if not doc.get("ok"):
                raise RuntimeError(f"heavy-load in {HEAVY_UNIT}: {doc.get('error') or f'exit {load.wait()}'}")
            out["load"] = doc["data"]
        mark("heavy.done")
        if wait_phase(seen, lambda now: now == "pause" or now in OVER) == "pause":
            out["pause_reads"] = timed_reads(os.path.join(work_dir("heavy"), f"heavy-{HEAVY_WRITERS}.bin"),
                                             HEAVY_BLOCK * HEAVY_BLOCKS // BLOCK, seen, "heavy")
        counts_after = rpc_counts()
        out["scrapes"] = {"before": scraped_before, "after": scrape(address)}
        out["flushed"] = wait_flushed([log], time.time(), "the last read")
    finally:
        if load is not None:
            load.communicate()  # its stdin closed: it leaves its unit, which ends
        if served is not None:
            out["exporter"] = exporter_end(served, exp_log)
        out["nfstop"] = dict(stop(proc, log), argv=argv)
    return dict(out, address=address, server=server, seen=seen, unit=HEAVY_UNIT,
                workers=out["load"]["workers"], issued=delta(counts_before, counts_after))


def main() -> int:
    args = [arg for arg in sys.argv[1:]]
    to = args[args.index("--to") + 1] if "--to" in args[:-1] else ""
    if to:
        del args[args.index("--to"):args.index("--to") + 2]
    role = args[0] if args else ""
    roles: Dict[str, Callable[[], Dict[str, Any]]] = {
        "server": serve, "light": light, "heavy": heavy, "heavy-load": heavy_load,
        "prom": lambda: prom(args[1]),
        "prepare": lambda: prepare(args[1])}
    if role not in roles or (role == "prepare" and args[1:2] not in (["light"], ["heavy"])) \
            or (role == "prom" and len(args) != 2):
        print("usage: fleet/guest.py server|light|heavy|heavy-load|prom ADDRESS|prepare light|prepare heavy "
              "[--to FILE]", file=sys.stderr)
        return 2
    try:
        result = {"check": f"fleet-{role}", "ok": True, "data": roles[role]()}
    except Exception as exc:  # reported as data: the host test shows it, and where it was raised
        where = traceback.extract_tb(exc.__traceback__)[-1]
        result = {"check": f"fleet-{role}", "ok": False,
                  "error": f"{type(exc).__name__}: {exc} ({where.name}, line {where.lineno})"}
    # the tools stamp their intervals in local time: the host judging them needs the guest's offset
    result["data"] = dict(result.get("data", {}), release=os.uname().release, gmtoff=time.localtime().tm_gmtoff)
    if to:  # renamed into place whole: the host waits for the file
        with open(to + ".tmp", "w") as handle:
            handle.write(json.dumps(result) + "\n")
        os.replace(to + ".tmp", to)
    else:
        print(json.dumps(result), flush=True)
    if role == "heavy-load":  # in its unit until the caller is done with it (heavy)
        sys.stdin.read()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Guest side of the lab check of a client without LLVM, clang, bcc or kernel headers.

Runs inside a lab guest (root, probekit's Debian package installed) from the read-only project
share, as its boot's last guest run: it purges bcc, LLVM, clang and the kernel headers with
apt-get, as on a client that never had them, and records what shows they are gone (Python
cannot import bcc, no LLVM or clang library in ld.so's cache, no build tree for the running
kernel); then it runs the installed commands on their default `--backend auto` through the
other checks' own guest runs: `v3only` (nfsslower, nfsdist and nfstop around the workload,
the probes guest), `fsslower -t xfs` over dm-delay (the fs guest) and nfs-exporter scraped
around the workload on NFSv3 (the exporter guest's phase). Each part is reported as data,
with its seconds; tests/lab/test_nollvm_lab.py judges them with those checks' verdicts.

  python3 labs/checks/nollvm/guest.py
"""
from __future__ import annotations

import fnmatch
import glob
import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Tuple

# run as a script (python3 PATH in the guest): its project tree is not on sys.path by itself
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
from labs.checks.exporter import guest as eg  # noqa: E402
from labs.checks.fs.guest import run as fs_run, sbin_on_path  # noqa: E402
from labs.checks.probes.guest import (EVIDENCE_WAIT_S, MOUNTS, check_v3only, kernel_attachments, prepare,  # noqa: E402
                                      user_env, workload)

#: what a client on core does without, as dpkg names it: bcc (its Python module, library and
#: tools), LLVM and clang (bcc's compiler) and the kernel headers (bcc compiles against them)
GONE = ("python3-bpfcc", "libbpfcc*", "bpfcc-tools", "clang*", "llvm*", "libllvm*", "libclang*", "linux-headers-*")
#: where those would leave files: libraries, compilers, kernel build trees
GONE_FILES = ("/usr/lib/llvm-*", "/usr/lib/x86_64-linux-gnu/libLLVM*", "/usr/lib/x86_64-linux-gnu/libclang*",
              "/usr/lib/x86_64-linux-gnu/libbcc*", "/usr/bin/clang*", "/usr/bin/llc*", "/usr/src/linux-headers-*",
              "/usr/lib/python3/dist-packages/bcc")
TAG = "nollvm"


def present_packages() -> Dict[str, str]:
    """package -> dpkg's status abbreviation, for every package not purged (installed, or
    removed with its configuration files left)."""
    out = subprocess.run(["dpkg-query", "-W", "-f", "${db:Status-Abbrev}\t${Package}\n"], stdout=subprocess.PIPE,
                         check=True, universal_newlines=True).stdout
    found = (line.split("\t") for line in out.splitlines() if "\t" in line)
    return {name: status.strip() for status, name in found if status[1:2] != "n"}


def gone_packages(present: Dict[str, str]) -> List[str]:
    return sorted(name for name in present if any(fnmatch.fnmatchcase(name, pattern) for pattern in GONE))


def purge() -> Dict[str, Any]:
    """apt-get purge every GONE package there is (and whatever depends on one); what was asked,
    what went, what is left of GONE, and probekit's status after it."""
    before = present_packages()
    asked = gone_packages(before)
    env = dict(user_env(), DEBIAN_FRONTEND="noninteractive")
    res = subprocess.run(["apt-get", "purge", "-y", "-q"] + asked, cwd="/", env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, universal_newlines=True)
    after = present_packages()
    return {"asked": asked, "rc": res.returncode, "output": res.stdout[-3000:],
            "removed": sorted(set(before) - set(after)), "left": gone_packages(after),
            "probekit": after.get("probekit", "")}


def absence() -> Dict[str, Any]:
    """What a program would find of them: `import bcc` in a user's Python, LLVM, clang or bcc
    libraries in ld.so's cache, the running kernel's build tree, their files."""
    imported = subprocess.run([sys.executable, "-c", "import bcc"], cwd="/", env=user_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, universal_newlines=True)
    cache = subprocess.run(["ldconfig", "-p"], stdout=subprocess.PIPE, check=True, universal_newlines=True).stdout
    return {"import_bcc": {"rc": imported.returncode, "output": imported.stdout.strip()[-300:]},
            "ldconfig": [line.strip() for line in cache.splitlines() if re.search(r"libLLVM|libclang|libbcc", line)],
            "ldconfig_entries": len(cache.splitlines()),
            "build_tree": os.path.lexists(f"/lib/modules/{os.uname().release}/build"),
            "files": sorted(path for pattern in GONE_FILES for path in glob.glob(pattern))}


def nfs3_workload() -> Tuple[Dict[str, int], None]:
    return workload(MOUNTS["nfs3"], TAG), None


def exporter() -> Dict[str, Any]:
    """nfs-exporter as installed, with its defaults: one phase of the workload on NFSv3 between
    two scrapes (the exporter guest's scraped_phase), the last scrape's text, its exit after SIGTERM,
    and the tracing programs before, during and after it (the exporter check's keys)."""
    prepare(MOUNTS["nfs3"], TAG)
    before = kernel_attachments()
    log = "/tmp/nollvm-exporter.err"
    proc = eg.start(eg.PORT, log, [])
    try:
        during = kernel_attachments()
        phase, _ended = eg.scraped_phase(nfs3_workload)
        text = eg.scrape(eg.PORT)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(EVIDENCE_WAIT_S)
    with open(log) as handle:
        stderr = handle.read().splitlines()
    return {"phases": {"nfs3": phase}, "texts": {"probekit": text}, "rc": proc.returncode, "stderr": stderr,
            "attached": {"before": before, "during": during, "after": kernel_attachments()}}


#: the parts, in order: nothing runs a tool before the purge
PARTS: Tuple[Tuple[str, Callable[[], Dict[str, Any]]], ...] = (
    ("purge", purge), ("absent", absence), ("v3only", check_v3only),
    ("fs", lambda: fs_run([("xfs", "fsslower")])), ("exporter", exporter))


def main() -> int:
    sbin_on_path()
    out: Dict[str, Any] = {"release": os.uname().release, "seconds": {}}
    for name, part in PARTS:
        started = time.monotonic()
        try:
            out[name] = {"ok": True, "data": part()}
        except Exception as exc:  # reported as data: the host test shows it
            out[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        out["seconds"][name] = round(time.monotonic() - started, 1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

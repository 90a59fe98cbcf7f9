"""What a tool's start imports: what it uses before its first line, nothing kept for later.

Why: nfsslower's, nfsdist's and nfs-exporter's start is on their user's clock (start-up within
2x of libbpf-tools'), and a module costs its import there whether used or not: 0.4-1.3 ms
natively for each of the ones below (Python 3.13), some 20 times that in a TCG guest. Modules
that only an error, a server's tool or a served scrape use are imported where they are used.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Set

import pytest

REPO = Path(__file__).resolve().parent.parent
#: imported where used, not at a start: schema's suggestions and difflib (a spec's or an event
#: format's error), ipaddress (a server's clients), importlib.util (whether bcc is there, asked
#: only where core cannot run), gzip and urllib.parse (a scrape served)
LATER = ("discover.schema", "difflib", "ipaddress", "importlib.util", "gzip", "urllib.parse")
#: the standard library the tools import, and what it imports itself (Python 3.11's pathlib
#: brings urllib.parse and ipaddress): not the tools' to avoid
STDLIB = "import argparse, contextlib, ctypes, json, pathlib, re, signal, socketserver, struct, threading, typing"
#: a start as far as it runs without a kernel: the imports, the command line, the spec, and the
#: modules the Session imports once it has chosen core; the exporter's also binds its port
STARTS = {
    "nfsslower": "from probes import commands\n"
                 "commands.nfs_target(commands.nfsslower_parser().parse(['0']).spec_path)\n"
                 "import discover.events, discover.tracefs, probes.core_backend",
    "nfsdist": "from probes import commands\n"
               "commands.nfs_target(commands.nfsdist_parser().parse(['1']).spec_path)\n"
               "import discover.events, discover.tracefs, probes.core_backend",
    "nfs-exporter": "from probes import exporter\n"
                    "exporter.exporter_parser().parse([])\n"
                    "exporter.listen('127.0.0.1', 0, list).server_close()\n"
                    "import discover.events, discover.tracefs, probes.core_backend",
}
#: what a start uses of LATER: the exporter checks its --address with ipaddress
USES = {"nfs-exporter": {"ipaddress"}}


def loaded(code: str) -> Set[str]:
    """The modules a fresh interpreter holds after running `code` in the checkout."""
    res = subprocess.run([sys.executable, "-c", f"import sys\n{code}\nprint(' '.join(sorted(sys.modules)))"],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert res.returncode == 0, res.stderr
    return set(res.stdout.split())


@pytest.mark.parametrize("tool", sorted(STARTS))
def test_a_start_imports_nothing_kept_for_later(tool: str) -> None:
    started, stdlib = loaded(STARTS[tool]), loaded(STDLIB)
    unused = set(LATER) - USES.get(tool, set())
    assert sorted(name for name in unused if name in started and name not in stdlib) == []

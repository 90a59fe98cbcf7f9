"""probes.manpage renders each command's own --help as a man page (the Debian package's build
runs it: tests/test_debian_package.py reads the installed pages); here every console script
of this checkout's install, rendered and read back with man."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from discover.version import probekit_version
from probes.manpage import console_scripts, help_text, roff, split_help, summary
from needs import missing

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("man")
    sbin = tmp_path_factory.mktemp("sbin")
    (sbin / "nfsslower").touch()
    subprocess.run([sys.executable, "-m", "probes.manpage", str(out), str(REPO / "docs" / "examples"), str(sbin)],
                   check=True, cwd=REPO)
    return out


def test_a_page_per_command_in_its_section(pages: Path) -> None:
    names = set(console_scripts())
    assert {"nfsslower", "discover", "nfs-exporter"} <= names
    assert sorted(p.name for p in pages.iterdir()) == sorted(f"{n}.8" if n == "nfsslower" else f"{n}.1" for n in names)


def test_each_page_says_what_its_help_says(pages: Path) -> None:
    if subprocess.run(["sh", "-c", "command -v man"], stdout=subprocess.PIPE).returncode:
        missing("man (man-db) is not installed")
    for page in sorted(pages.iterdir()):
        name = page.stem
        res = subprocess.run(["man", "--warnings", "-E", "UTF-8", "-l", "-Tutf8", str(page)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, universal_newlines=True,
                             env=dict(os.environ, MANWIDTH="100", LC_ALL="C.UTF-8"))
        assert res.returncode == 0 and not res.stderr, (name, res.stderr)
        text = re.sub(r".\x08", "", res.stdout)
        usage, blocks = split_help(help_text(console_scripts()[name], [name]))
        assert usage in text and f"probekit {probekit_version()}" in text, name
        # every option of --help, and every example line the help ends with
        for line in blocks["Options"] + blocks["epilog"]:
            assert line.strip() in text, (name, line)


def test_the_example_run_and_the_subcommands_are_in_the_page(pages: Path) -> None:
    slower = (pages / "nfsslower.8").read_text()
    example = (REPO / "docs/examples/nfsslower_example.txt").read_text().splitlines()
    assert ".SH EXAMPLE RUN" in slower and roff(example[3]) in slower
    discover = (pages / "discover.1").read_text()
    for sub in ("snapshot", "events", "propose", "callgraph", "diff"):
        assert f".SS discover {sub}" in discover


def test_roff_escapes_what_roff_would_read_as_its_own() -> None:
    assert roff(".not a request") == "\\&.not a request"
    assert roff("-t nfs") == "\\-t nfs" and roff("a\\b") == "a\\eb"
    assert roff("\u00b5s") == "\\[u00B5]s"


def test_the_name_line_is_the_first_sentence() -> None:
    assert summary(["Find what a kernel function calls.", "More."]) == "find what a kernel function calls"
    assert summary(["Per-process NFS activity: operations per second, read and write MB/s, and",
                    "average latency per operation from in-kernel per-", "process histograms."]) == \
        "per-process NFS activity: operations per second, read and write MB/s, and average latency per operation from in-kernel per-process histograms"


def test_help_text_leaves_the_signals_as_they_were() -> None:
    """Rendered in the test run's own process: a SIGTERM ignored after it would be ignored by
    every process the later tests start (tests/test_run_signals.py saw it)."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    help_text(console_scripts()["nfsslower"], ["nfsslower"])
    assert {sig: signal.getsignal(sig) for sig in before} == before

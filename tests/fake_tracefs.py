"""A tracefs-shaped directory built from real kernel files, for session and capture tests.

Read-only kernel files come from the shared Debian 6.1.0-57 capture; the writable
settings start with the values a real 6.1.0-57 guest showed at boot
(tests/fixtures/6.1.0-57-amd64/tracefs-defaults, see its README); trace_pipe is a
FIFO that tests feed with real function_graph lines.

A plain file echoes back what was written, while the kernel re-renders some
files (an empty function list reads as a '####' line, an empty PID list as
'no pid', buffer sizes are rounded to ring-buffer pages). `kernel_view` applies
exactly those renderings, each observed on the real kernel (fixture README), so
tests can compare "what the kernel would show now" with the original bytes.
"""
from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "fixtures" / "debian-6.1.0-57-amd64"
DEFAULTS = REPO / "tests" / "fixtures" / "6.1.0-57-amd64" / "tracefs-defaults"
LAB_TRACES = REPO / "tests" / "fixtures" / "6.1.0-57-amd64" / "function_graph"
READ_TRACE = SHARED / "function_graph" / "nfs3.nfs_file_read.trace"

#: Files whose content a test snapshot compares (everything a session may write).
SETTINGS = ("current_tracer", "tracing_on", "tracing_thresh", "max_graph_depth", "buffer_size_kb",
            "set_ftrace_filter", "set_ftrace_notrace", "set_graph_function", "set_graph_notrace",
            "set_ftrace_pid", "set_ftrace_notrace_pid")
#: bytes per ring-buffer page usable for events (4096 minus the page header), as the
#: 2048 -> 2051 and 1408 -> 1410 read-backs in the fixture README show.
RB_PAGE_DATA = 4080


def build(root: Path, cpus: int = 2) -> Path:
    """Create <root>/sys/kernel/tracing (and /var/tmp for the lock); return the tracefs path."""
    tracefs = root / "sys" / "kernel" / "tracing"
    tracefs.mkdir(parents=True)
    (root / "var" / "tmp").mkdir(parents=True)
    shutil.copy(SHARED / "tracefs" / "available_tracers.txt", tracefs / "available_tracers")
    shutil.copy(SHARED / "tracefs" / "available_filter_functions.nfs.txt", tracefs / "available_filter_functions")
    shutil.copy(SHARED / "tracefs" / "trace_options.default.txt", tracefs / "trace_options")
    for name in SETTINGS:
        shutil.copy(DEFAULTS / name, tracefs / name)
    shutil.copytree(DEFAULTS / "options", tracefs / "options")
    stats = _cpu_stats(SHARED / "function_graph" / "nfs3.nfs_file_read.stats")
    for cpu in range(cpus):
        cpudir = tracefs / "per_cpu" / f"cpu{cpu}"
        cpudir.mkdir(parents=True)
        shutil.copy(DEFAULTS / "per_cpu" / "cpu0" / "buffer_size_kb", cpudir / "buffer_size_kb")
        (cpudir / "stats").write_text(stats[cpu % len(stats)])
    (tracefs / "trace").write_text("")
    os.mkfifo(tracefs / "trace_pipe")
    return tracefs


def _cpu_stats(path: Path) -> List[str]:
    """The per-CPU blocks of a saved `## cpuN` + stats dump."""
    blocks: List[str] = []
    for line in path.read_text().splitlines(keepends=True):
        if line.startswith("## cpu"):
            blocks.append("")
        elif blocks:
            blocks[-1] += line
    return blocks


def snapshot(tracefs: Path) -> Dict[str, bytes]:
    """Every regular file under tracefs (the FIFO excluded), by relative path."""
    files = {}
    for path in sorted(tracefs.rglob("*")):
        if path.is_file() and not path.is_fifo():
            files[str(path.relative_to(tracefs))] = path.read_bytes()
    return files


def kernel_view(name: str, written: bytes) -> bytes:
    """What the kernel shows when this file is read after `written` was written (truncating)."""
    base = name.rsplit("/", 1)[-1]
    text = written.decode()
    if base in ("set_ftrace_filter", "set_graph_function") and not text.split():
        return (DEFAULTS / "set_ftrace_filter").read_bytes()
    if base in ("set_ftrace_notrace", "set_graph_notrace") and not text.split():
        return (DEFAULTS / "set_ftrace_notrace").read_bytes()
    if base in ("set_ftrace_filter", "set_ftrace_notrace", "set_graph_function", "set_graph_notrace",
                "set_ftrace_pid", "set_ftrace_notrace_pid"):
        return "".join(token + "\n" for token in text.split()).encode() if text.split() else b"no pid\n"
    if base == "buffer_size_kb" and text.strip().isdigit():
        pages = math.ceil(int(text) * 1024 / RB_PAGE_DATA)
        return f"{pages * RB_PAGE_DATA // 1024}\n".encode()
    return written


def assert_restored(before: Dict[str, bytes], tracefs: Path) -> None:
    """Every file as it was: byte-for-byte, or through kernel_view for re-rendered files.

    An unexpanded ring buffer ('7 (expanded: 1408)') cannot be shrunk back by any
    write; the restore must write its expanded size instead.
    """
    after = snapshot(tracefs)
    assert sorted(after) == sorted(before)
    for name, original in before.items():
        now = after[name]
        if now == original:
            continue
        if name.endswith("buffer_size_kb") and b"expanded" in original:
            assert now.decode().strip() == original.decode().split("expanded: ")[1].rstrip(")\n"), name
        else:
            assert kernel_view(name, now) == original, (name, now, original)


#: What `mkdir instances/NAME` created on a real 7.3 kernel (see that fixture's README).
INSTANCE_73 = REPO / "tests" / "fixtures" / "7.3.4+deb13-amd64" / "instance"
#: Per-instance files read back as the fixture shows them; the others start like the top's.
_INSTANCE_READBACK = ("available_tracers", "current_tracer", "buffer_size_kb", "set_ftrace_pid",
                      "set_ftrace_notrace_pid", "tracing_on")


def populate_instance(path: Path, listing: Path = INSTANCE_73) -> None:
    """Play the kernel's mkdir of an instance: the files the real listing has that a capture
    uses, with the values read back there; options and the function lists as at the top."""
    top = path.parent.parent
    path.mkdir()
    for name in _INSTANCE_READBACK:
        shutil.copy(listing / name, path / name)
    for name in ("set_ftrace_filter", "set_ftrace_notrace", "trace_options"):
        shutil.copy(top / name, path / name)
    options = set((listing / "options.ls").read_text().split())
    (path / "options").mkdir()
    for option in (top / "options").iterdir():
        if option.name in options:
            shutil.copy(option, path / "options" / option.name)
    for cpu in (listing / "per_cpu.ls").read_text().split():
        (path / "per_cpu" / cpu).mkdir(parents=True)
        shutil.copy(top / "per_cpu" / cpu / "stats", path / "per_cpu" / cpu / "stats")
    (path / "trace").write_text("")
    os.mkfifo(path / "trace_pipe")


def enable_instances(tracefs: Path) -> Path:
    """Give the fake tracefs an instances/ directory (as every kernel since 4.x has)."""
    instances = tracefs / "instances"
    instances.mkdir()
    return instances

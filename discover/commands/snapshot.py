"""`discover snapshot`: save what probekit needs to know about this kernel into one JSON file."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Tuple

import click

from discover.errors import check_output
from discover.profile import dump_profile
from discover.snapshot import DEFAULT_VMLINUX_GLOBS, build_profile, find_live_tracefs, host_paths

EXAMPLES = """
\b
Examples:
  discover snapshot -o /tmp/$(uname -r).json         # everything, default BTF selection
  discover snapshot -o p.json --btf-module nfs --btf-module nfsv4
  discover snapshot -o p.json --btf-function 'vfs_*' --btf-function 'filemap_*'
  PROBEKIT_TRACEFS=/sys/kernel/debug/tracing discover snapshot -o p.json
"""


@click.command("snapshot", epilog=EXAMPLES)
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True,
              help="Profile file to write (JSON).")
@click.option("--btf-module", "btf_modules", multiple=True, metavar="MODULE",
              help="Record BTF prototypes of every function of MODULE (repeatable; default: loaded "
                   "modules named after a filesystem type, e.g. nfs, nfsv3, nfsv4).")
@click.option("--btf-function", "btf_globs", multiple=True, metavar="GLOB",
              help="Record BTF prototypes of vmlinux functions matching GLOB (repeatable; default: "
                   "VFS entry points and generic page-cache paths).")
def snapshot(output: str, btf_modules: Tuple[str, ...], btf_globs: Tuple[str, ...]) -> None:
    """Write a kernel profile: uname, config, modules, traceable functions, tracepoint
    formats, kprobe blacklist and BTF prototypes. Reads only: changes nothing in the kernel.

    `discover events` and `discover propose` accept the file with --kernel-profile, so they
    can run on another machine (no tracefs or root needed there).
    """
    def progress(section: str) -> None:
        click.echo(f"snapshot: reading {section}", err=True)

    check_output(output)  # before the sections are read and their progress printed
    modules: Optional[Tuple[str, ...]] = btf_modules or None
    data = build_profile(find_live_tracefs(), **host_paths(), btf_modules=modules,
                         vmlinux_globs=btf_globs or DEFAULT_VMLINUX_GLOBS, progress=progress)
    dump_profile(data, Path(output))
    for section, why in sorted(data["unavailable"].items()):
        click.echo(f"snapshot: {section} unavailable: {why}", err=True)
    n_events = sum(len(v) for v in (data["events"] or {}).values())
    n_btf = len((data["btf"] or {}).get("functions") or {})
    click.echo(f"snapshot: {data['uname']['release']}: {len(data['filter_functions'] or [])} functions, "
               f"{n_events} events, {len(data['modules'] or {})} modules, {n_btf} BTF prototypes -> {output}",
               err=True)

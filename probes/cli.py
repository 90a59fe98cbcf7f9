"""`probes`: the command-line entry point for Debian kernel fetching and compatibility reports."""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import click

from discover.errors import UserError, check_output, run_cli, write_file
from discover.version import version_option


def _log(msg: str) -> None:
    click.echo(f"probes: {msg}", err=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@version_option
def probes() -> None:
    """Probe specs on many kernels: fetch Debian kernels, profile them, report compatibility."""


@probes.command("fetch-kernel")
@click.argument("version")
@click.option("--refresh", is_flag=True, help="Ask the mirror again even if a matching kernel is cached.")
def fetch_kernel_cmd(version: str, refresh: bool) -> None:
    """Download a Debian amd64 kernel's packages into ~/.cache/probekit/kernels/ and print the directory.

    VERSION is a Debian kernel version: 5.10 (bullseye), 6.1 (bookworm), 6.12
    (bookworm-backports/trixie), 6.16..7.x (trixie-backports, sid), or a full ABI such as
    6.1.0-50 or 7.2.13+deb14. The newest match wins; a cached match is used without asking
    the mirror (use --refresh to look again). apt runs with its own sources.list, lists and
    archive cache under ~/.cache/probekit/apt/: the system's apt setup is not touched.

    \b
    Examples:
      probes fetch-kernel 6.1            # newest bookworm 6.1 kernel
      probes fetch-kernel 7.2            # sid's 7.2 (split packages: base, binary, modules)
      probes fetch-kernel 6.12.95+deb12 --refresh
    """
    from probes.fetch import fetch_kernel
    click.echo(str(fetch_kernel(version, refresh=refresh, log=_log)))


@probes.command("kernel-profile")
@click.argument("package", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Where to write the profile JSON.")
@click.option("--btf-function", "functions", multiple=True, help="Record this function's BTF prototype (repeatable).")
@click.option("--btf-module", "modules", multiple=True, help="Record all BTF prototypes of this module (repeatable).")
def kernel_profile_cmd(package: Path, output: Path, functions: Tuple[str, ...], modules: Tuple[str, ...]) -> None:
    """Write a kernel profile (docs/kernel-profile.md) from a Debian kernel package.

    PACKAGE is a .deb, a directory of .deb files (one kernel, e.g. a 7.x kernel's split
    packages) or a directory of extracted packages. The profile holds what a package can
    tell (flagged `package.subset`): config, functions, tracepoints, BTF prototypes.

    \b
    Examples:
      probes kernel-profile ~/.cache/probekit/kernels/6.1.0-50 -o /tmp/6.1.json --btf-module nfs
      probes kernel-profile linux-image-5.10.0-32-amd64-unsigned_5.10.223-1_amd64.deb -o 5.10.json
    """
    from discover.profile import dump_profile
    from probes.kernelpkg import profile_from_package
    check_output(output, [package])
    data = profile_from_package([package], functions, modules)
    dump_profile(data, output)
    for note in data["package"]["notes"]:
        _log(f"note: {note}")
    _log(f"wrote {output} ({data['uname']['release']}, {len(data['filter_functions'])} functions)")


@probes.command("compat")
@click.argument("spec", type=click.Path(path_type=Path))
@click.option("--kernel", "kernels", multiple=True, required=True,
              help="A Debian kernel version (6.12), a .deb or directory, a profile JSON, or `live` (repeatable).")
@click.option("--reference", help="Kernel to compare signatures and tracepoint fields against "
                                  "(a --kernel value or its label; default: the spec's kernel if given, else the first).")
@click.option("--format", "fmt", type=click.Choice(["table", "md", "html", "json"]), default="table", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write here instead of stdout.")
@click.option("--lab-results", "lab_files", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
              help="JSON of lab runs (docs/compat.md) to mark cells verified in a VM (repeatable: one file "
                   "per lab kernel, as a CI run's kernel artefacts hold them).")
def compat_cmd(spec: Path, kernels: Tuple[str, ...], reference: Optional[str], fmt: str,
               output: Optional[Path], lab_files: Tuple[Path, ...]) -> None:
    """Which attach points of SPEC exist and still mean the same on each kernel.

    For every attach point and kernel: ok, absent, only compiler copies (.isra/.constprop/
    .part/.cold), not found (possibly inlined), not traceable, in which module, signature or
    tracepoint fields changed against the reference, duplicate static names. Per operation:
    the candidate the generated tool would pick there (probes.select and probes.generate run
    on the profile), or UNCOVERED; (!) = it will misbehave (an argument the spec reads is
    gone), (~) = it works without file names/offsets (no BTF there). A Debian package is
    read only for the spec's names (modules defining them); see docs/compat.md.

    \b
    Examples:
      probes compat probes/specs/nfs.toml --kernel 5.10 --kernel 6.1 --kernel 6.12 --kernel 7.2
      probes compat probes/specs/nfs.toml --kernel 6.1 --kernel /tmp/lab-6.1.json --reference 6.1 --format md
      probes compat probes/specs/nfs.toml --kernel 6.1 --kernel 7.3 --format html -o nfs-compat.html
      probes compat probes/specs/ext4.toml --kernel 5.10 --kernel 7.3 --lab-results kernel-5.10/lab-results-ext4.json --lab-results kernel-7.3/lab-results-ext4.json
    """
    from probes.compat import (build_report, load_kernels, render, short_label, spec_events, spec_functions,
                               spec_modules)
    from discover.spec import load_spec
    for value in kernels:
        if not value.strip():
            raise UserError("--kernel: empty value (a version such as 6.12, a .deb or directory, a profile, or live)")
    if output is not None:  # every file it reads: the spec, lab results, kernels given as files
        check_output(output, [spec, *lab_files, *kernels])
    spec_data = load_spec(spec)
    lab: Optional[Dict[str, Any]] = None
    origin: Dict[str, Path] = {}  # which file named each lab kernel
    for path in lab_files:  # before the slow part
        for given, per_op in _read_lab_results(path, spec_data["ops"]).items():
            if given in origin:
                raise UserError(f"--lab-results {path}: {given}: also in {origin[given]}")
            lab, origin[given] = {**(lab or {}), given: per_op}, path
    if lab:
        kernels = tuple(lab_kernel_for(value, lab) for value in kernels)
    loaded = load_kernels(kernels, spec_functions(spec_data), spec_modules(spec_data), log=_log,
                          events=spec_events(spec_data))
    labels = [k.label for _a, k in loaded]
    for arg, kernel in loaded:
        if labels.count(kernel.label) > 1:
            raise UserError(f"--kernel {arg}: kernel {kernel.label} given twice")
    ref = None
    wanted = reference or spec_data.get("kernel")
    if wanted:
        for arg, kernel in loaded:
            if wanted in (arg, kernel.label, kernel.profile.release):
                ref = kernel
        if ref is None and reference:
            raise UserError(f"--reference {reference}: not one of the --kernel values")
    if ref is None:
        ref = loaded[0][1]
    if lab:
        known = {short_label(name) for _a, k in loaded for name in (k.label, k.profile.release)}
        for given in lab:
            if short_label(given) not in known:
                raise UserError(f"{origin[given]}: {given}: not one of the --kernel values "
                                f"({', '.join(sorted(known))})")
    report = build_report(spec_data, [k for _a, k in loaded], ref, str(spec), lab)
    text = render(report, fmt)
    if output:
        write_file(output, text)
        _log(f"wrote {output}")
    else:
        sys.stdout.write(text)


def lab_kernel_for(value: str, lab: Dict[str, Any]) -> str:
    """A bare series (`--kernel 6.12`) means the lab's kernel of that series when the lab
    results name exactly one: the report is about the kernel the lab booted, not whichever
    6.12 build the package cache happens to hold."""
    from probes.compat import short_label
    if not re.fullmatch(r"\d+\.\d+", value):
        return value
    found = sorted({short_label(release) for release in lab
                    if re.match(rf"{re.escape(value)}[.-]", short_label(release))})
    return found[0] if len(found) == 1 else value


def _read_lab_results(path: Path, ops: Dict[str, Any]) -> Dict[str, Any]:
    """The --lab-results file, checked (shape, operation names) before any kernel is analysed."""
    from discover.schema import did_you_mean
    from probes.compat import load_lab_results
    data = load_lab_results(path)
    for kernel, per_op in data.items():
        for op in per_op:
            if op not in ops:
                raise UserError(f"{path}: {kernel}.{op}: not an operation of the spec{did_you_mean(op, ops)}")
    return data


def main() -> None:
    run_cli("probes", probes)

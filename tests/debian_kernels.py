"""Real Debian kernel packages for the package/compat tests, fetched once and cached.

Why a helper: the packages are 70-110 MB each; `probes.fetch` downloads them through the
private apt setup into ~/.cache/probekit/kernels/ (CI on the same machine reuses it, a
fresh machine downloads them once). Only two kernels are used by tests: 6.1 (the lab's
kernel, ABI 6.1.0-50, whose live profile is a fixture) and 6.12 from bookworm-backports.
"""
from __future__ import annotations

import functools
import warnings
from pathlib import Path
from typing import Any, Dict, Sequence

import pytest

from discover.errors import UserError
from probes.fetch import fetch_kernel, kernels_dir
from needs import missing

REPO = Path(__file__).resolve().parents[1]
LAB_61 = REPO / "tests" / "fixtures" / "6.1.0-50-amd64"
#: exact ABIs, so a new Debian point release does not change what the tests look at (one the
#: archive no longer serves is replaced by the newest of its series: kernel_dir)
ABI_61 = "6.1.0-50"
ABI_612 = "6.12.95+deb12"
NFS_FUNCTIONS = ("nfs_file_read", "nfs_file_write", "nfs_getattr", "nfs_read_folio", "nfs_write_begin",
                 "vfs_read", "nfs_initiate_commit")


#: what fetch_kernel's UserError starts with when the archive has no such kernel (not a network failure)
_NOT_SERVED = ("no Debian amd64 kernel", "no complete Debian amd64 kernel")


@functools.lru_cache(maxsize=None)
def kernel_dir(abi: str) -> Path:
    """The packages of `abi` (cached, else about 100 MB downloaded once). Debian drops old ABIs
    from the archive: then the newest kernel of the same series is used, with a warning saying
    so, rather than failing every package test on a fresh machine."""
    try:
        return _fetch(abi, abi)
    except UserError as error:
        if not str(error).startswith(_NOT_SERVED):
            raise
    series = ".".join(abi.split(".")[:2])
    found = _fetch(series, abi)
    warnings.warn(f"Debian kernel {abi} is no longer in the archive: these tests use {found.name}, "
                  f"the newest {series} kernel", stacklevel=2)
    return found


def _fetch(version: str, pinned: str) -> Path:
    """fetch_kernel, with a download that cannot happen saying what the test needs: a skip on a
    contributor's machine, a failure in CI (CI set), which must run every test. A kernel the
    archive does not serve is left to the caller (UserError)."""
    try:
        return fetch_kernel(version)
    except UserError as error:
        if str(error).startswith(_NOT_SERVED):
            raise
        why = (f"needs Debian kernel {pinned}'s packages, downloaded once (about 100 MB) into "
               f"{kernels_dir()}: {error}")
    missing(why)


@functools.lru_cache(maxsize=None)
def profile_61() -> Dict[str, Any]:
    """The 6.1.0-50 package analysed for real (not from the profile cache)."""
    from probes.kernelpkg import profile_from_package
    return profile_from_package([kernel_dir(ABI_61)], NFS_FUNCTIONS, ["nfs"])


def btf_dir(abi: str, modules: Sequence[str], into: Path) -> Path:
    """`abi`'s BTF (vmlinux's and these modules') laid out in `into` as /sys/kernel/btf is."""
    import re

    from probes.kernelpkg import Elf, _decompress_module, decompress_vmlinuz, iter_package_files
    wanted = re.compile(r"boot/vmlinuz-|/(" + "|".join(re.escape(m) for m in modules) + r")\.ko")
    for rel, data in iter_package_files(kernel_dir(abi), lambda path: bool(wanted.search(path))):
        if "vmlinuz" in rel:
            section = Elf(decompress_vmlinuz(data, rel), rel).section_bytes(".BTF")
            name = "vmlinux"
        else:
            section = Elf(_decompress_module(rel, data), rel).section_bytes(".BTF")
            name = rel.rsplit("/", 1)[1].split(".")[0]
        assert section is not None, rel
        (into / name).write_bytes(section)
    return into

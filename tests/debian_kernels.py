"""Real Debian kernel packages for the package/compat tests, fetched once and cached.

Why a helper: the packages are 70-110 MB each; `probes.fetch` downloads them through the
private apt setup into ~/.cache/probekit/kernels/ (CI on the same machine reuses it, a
fresh machine downloads them once). Only two kernels are used by tests: 6.1 (the lab's
kernel, ABI 6.1.0-50, whose live profile is a fixture) and 6.12 from bookworm-backports.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Dict

from probes.fetch import fetch_kernel

REPO = Path(__file__).resolve().parents[1]
LAB_61 = REPO / "tests" / "fixtures" / "6.1.0-50-amd64"
#: exact ABIs, so a new Debian point release does not change what the tests look at
ABI_61 = "6.1.0-50"
ABI_612 = "6.12.95+deb12"
NFS_FUNCTIONS = ("nfs_file_read", "nfs_file_write", "nfs_getattr", "nfs_read_folio", "nfs_write_begin",
                 "vfs_read", "nfs_initiate_commit")


@functools.lru_cache(maxsize=None)
def kernel_dir(abi: str) -> Path:
    return fetch_kernel(abi)


@functools.lru_cache(maxsize=None)
def profile_61() -> Dict[str, Any]:
    """The 6.1.0-50 package analysed for real (not from the profile cache)."""
    from probes.kernelpkg import profile_from_package
    return profile_from_package([kernel_dir(ABI_61)], NFS_FUNCTIONS, ["nfs"])

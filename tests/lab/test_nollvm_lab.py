"""Lab check of a client without LLVM, clang, bcc or kernel headers, on the matrix's `nollvm`
kernel (6.12: trixie's libbpf 1.5, fentry).

As its boot's last guest run (conftest's LAST_RUNS: nothing after it may need bcc), the guest
side (labs/checks/nollvm/guest.py) purges bcc, LLVM, clang and the kernel headers with apt-get,
then runs the installed nfsslower, nfsdist, nfstop, fsslower -t xfs and nfs-exporter on the
default --backend auto through the v3only, fs and exporter checks' own guest code;
labs/checks/nollvm/verdicts.py judges it with those checks' verdicts, and that each ran on core. The
guest's JSON is kept as nollvm.json in the kernel's artefact directory.
"""
from __future__ import annotations

from typing import Any, Callable, Dict

import pytest
from conftest import guest_run, guest_script, on_kernels, once_run, say

from labs.checks.nollvm.verdicts import NOLLVM_CHECKS
from labs.checks.shared import GUEST_SCRIPTS

pytestmark = [pytest.mark.lab, on_kernels("nollvm")]


@guest_run("nollvm", fixture="nollvm", last=True)
def run_nollvm(kernel_lab: Any) -> Dict[str, Any]:
    out = guest_script(kernel_lab, "nollvm", GUEST_SCRIPTS["nollvm"], timeout=1800)
    say(f"[nollvm lab] {kernel_lab.kernel}: parts {out['seconds']}")
    return out


@pytest.fixture
def nollvm(kernel_lab: Any) -> Dict[str, Any]:
    return once_run(kernel_lab, "nollvm")


@pytest.mark.parametrize("verify", NOLLVM_CHECKS, ids=lambda f: f.__name__[len("verify_"):])
def test_client_without_llvm(nollvm: Dict[str, Any], verify: Callable[[Dict[str, Any]], None]) -> None:
    verify(nollvm)

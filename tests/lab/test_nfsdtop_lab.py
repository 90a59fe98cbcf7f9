"""Lab test of nfsdtop on a real NFS server (knfsd): the single 6.12 guest serves /srv/nfs and
mounts it over 127.0.0.1 (NFSv3 and NFSv4.2), so its client is 127.0.0.1.

One guest run (labs/checks/nfsdtop/guest.py) runs `nfsdtop --json 2` around a known workload on
both mounts and two text runs; labs/checks/nfsdtop/verdicts.py judges it against the server's own
counters (/proc/net/rpc/nfsd) and the TCP peers of port 2049. The run's JSON is kept as
nfsdtop.json among the artefacts (tests/fixtures/.../nfsdtop comes from one).
"""
from __future__ import annotations

from typing import Any, Dict

import pytest
from conftest import guest_run, guest_script, on_kernels, once_run

from labs.checks.nfsdtop import verdicts as nc
from labs.checks.shared import GUEST_SCRIPTS

pytestmark = pytest.mark.lab


@guest_run("nfsdtop", fixture="nfsdtop_data")
def run_nfsdtop(kernel_lab: Any) -> Dict[str, Any]:
    return guest_script(kernel_lab, "nfsdtop", GUEST_SCRIPTS["nfsdtop"])


@pytest.fixture
def nfsdtop_data(kernel_lab: Any) -> Dict[str, Any]:
    out = once_run(kernel_lab, "nfsdtop")
    assert out["ok"], out.get("error")
    return out["data"]


@on_kernels("nfsdtop")
@pytest.mark.parametrize("verify", nc.RUN_CHECKS, ids=lambda f: f.__name__[len("verify_"):])
def test_nfsdtop(nfsdtop_data: Dict[str, Any], verify: Any) -> None:
    verify(nfsdtop_data)

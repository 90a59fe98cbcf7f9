"""Lab check of nfs-exporter with the real thing: Debian's Prometheus scrapes it and node_exporter.

In the shared per-kernel guest (tests/lab/conftest.py; on a pair, its client), the guest
side (labs/checks/exporter/guest.py) starts nfs-exporter, prometheus-node-exporter with
the mountstats collector and a Prometheus scraping both, all on 127.0.0.1, runs the known
workload on /mnt/nfs3 and then /mnt/nfs42, and reports what PromQL answers; the verdicts
are labs/checks/exporter/verdicts.py's (`labs test --lab-results` gives the same). In CI kernels 6.1
(bookworm: Prometheus 2.42, node_exporter 1.5.0, kprobes) and 7.2 (sid's, fentry); 7.3's
fleet check runs three exporters with a Prometheus of its own. 7.2 (and 7.3 in the full matrix)
runs the exporter with --cgroup-label (each
mount's workload in its own scope unit) and starts it on a v3-only client, so that when
nfsv4 loads it must trace it beside its running programs with no counter going back (core),
or attach again (bcc: a second compile); 6.1 runs it with default options. The scraped texts are kept as
metrics/probekit.prom and metrics/node.prom in the kernel's artefact directory.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Dict, Tuple

import pytest
from conftest import guest_run, on_kernels, once_run, say

from labs.checks.exporter import verdicts as ec
from labs.checks.shared import GUEST_SCRIPTS
from labs.vm.base import Lab

#: kernel -> the guest side's options: on 7.2 and 7.3 the exporter runs with the cgroup label and starts
#: before nfsv4 is loaded (it must trace it once loaded); elsewhere as installed, with every module there
EXPORTER_OPTIONS = {k: "--cgroup-label --late-nfsv4" for k in ("7.2", "7.3")}
pytestmark = [pytest.mark.lab, on_kernels("exporter")]


@guest_run("exporter", fixture="results")
def run_guest_check(kernel_lab: Any) -> Dict[str, Any]:
    lab: Lab = kernel_lab.lab
    share = getattr(lab, "guest_project_dir", "/opt/probekit")
    with kernel_lab.timed("exporter"):
        options = EXPORTER_OPTIONS.get(kernel_lab.kernel, "")
        res = lab.run(f"cd {share} && python3 {GUEST_SCRIPTS['exporter']} {options}", timeout=1200)
    assert res.exit_code == 0, f"exit {res.exit_code}: {res.stderr[-2000:]}"
    out: Dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    say(f"[exporter lab] {kernel_lab.kernel}: {kernel_lab.times['exporter']:.0f} s")
    ec.keep_results(out, kernel_lab.artifacts)
    return out


@pytest.fixture
def results(kernel_lab: Any) -> Dict[str, Any]:
    return once_run(kernel_lab, "exporter")


@pytest.mark.parametrize("check", ec.EXPORTER_CHECKS, ids=lambda c: c[1].__name__[len("verify_"):] + "-".join(("",) + c[2]))
def test_exporter(results: Dict[str, Any], check: Tuple[str, Callable[..., None], Tuple[str, ...]]) -> None:
    _name, verify, args = check
    verify(results, *args)

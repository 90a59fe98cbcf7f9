"""Verdicts on the lab check of a client without LLVM, clang, bcc or kernel headers
(labs/checks/nollvm/guest.py's JSON, one document of parts: purge, absent, v3only, fs, exporter).

Those packages went, and nothing of them is left for a program to find; every tool ran from
the installed package on core, which `--backend auto` chose; and each passed the verdicts its
own check gives it elsewhere: labs/checks/probes/verdicts.py's v3-only ones (nfsslower, nfsdist and nfstop
count the workload), labs/checks/fs/verdicts.py's (fsslower -t xfs counts it exactly and shows the
delay, nothing left attached) and labs/checks/exporter/verdicts.py's (the series move by the workload on
its mount, one probe_info per op, SIGTERM detaches everything).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

from prometheus_client.parser import text_string_to_metric_families

from labs.checks.exporter import verdicts as ec
from labs.checks.fs import verdicts as fc
from labs.checks.probes.verdicts import V3ONLY_CHECKS, data
from labs.checks.shared import attach_kinds

#: a package of each kind the purge must have removed: bcc's Python module, LLVM, clang, headers
MUST_GO = ("python3-bpfcc", "libllvm", "libclang", "linux-headers-")


def loader_info(text: str) -> Dict[str, str]:
    """probekit_bpf_loader_info's labels (backend, version) from a scrape of nfs-exporter."""
    found = [sample.labels for family in text_string_to_metric_families(text)
             for sample in family.samples if sample.name == "probekit_bpf_loader_info"]
    assert len(found) == 1, f"probekit_bpf_loader_info: {found}"
    return found[0]


def verify_bcc_llvm_clang_and_headers_are_gone(results: Dict[str, Any]) -> None:
    """apt-get purged bcc, LLVM, clang and the headers (one package of each kind at least) and
    left none, probekit still installed (its Depends hold without bcc); a user's Python cannot
    import bcc, ld.so's cache has no LLVM, clang or bcc library, the running kernel has no build
    tree, and none of their files are there."""
    purge = data(results, "purge")
    assert purge["rc"] == 0, f"apt-get purge exited {purge['rc']}: {purge['output']}"
    missing = [kind for kind in MUST_GO if not any(name.startswith(kind) for name in purge["removed"])]
    assert not missing, f"no package of {missing} removed: {purge['removed']}"
    assert purge["left"] == [], f"still there: {purge['left']}"
    assert purge["probekit"] == "ii", f"probekit's status after the purge: {purge['probekit']!r}"
    absent = data(results, "absent")
    imported = absent["import_bcc"]
    assert imported["rc"] != 0 and "No module named 'bcc'" in imported["output"], imported
    assert absent["ldconfig_entries"] > 0 and absent["ldconfig"] == [], absent["ldconfig"]
    assert not absent["build_tree"], "the running kernel's build tree (headers) is there"
    assert absent["files"] == [], absent["files"]


def verify_every_tool_ran_on_core(results: Dict[str, Any]) -> None:
    """nfsslower, nfsdist, nfstop and fsslower said `backend: core (auto: ...)` with -v;
    nfs-exporter's probekit_bpf_loader_info says core."""
    tools = {name: run["stderr"] for name, run in data(results, "v3only")["results"].items()}
    tools["fsslower -t xfs"] = data(results, "fs")["runs"]["xfs"]["stderr"]
    for name, stderr in tools.items():
        kinds = attach_kinds(stderr)
        assert kinds["backend"] == "core" and kinds["backend_why"].startswith("auto: "), (name, kinds)
    assert loader_info(data(results, "exporter")["texts"]["probekit"])["backend"] == "core"


def verify_nfs_tools_count_the_workload(results: Dict[str, Any]) -> None:
    """The v3-only run's verdicts: every command ran and counted the workload, nfstop its process."""
    for verify in V3ONLY_CHECKS:
        verify({"v3only": results["v3only"]})


def verify_fsslower_xfs_counts_the_workload(results: Dict[str, Any]) -> None:
    """The fs check's verdicts on its xfs run, and nothing left attached, mounted or mapped."""
    fs = data(results, "fs")
    for verify in fc.RUN_CHECKS:
        verify(fs["runs"]["xfs"], "xfs")
    fc.verify_nothing_left(fs, "xfs")


def verify_exporter_series_move_by_the_workload(results: Dict[str, Any]) -> None:
    """The exporter check's verdicts that need no Prometheus: its series moved by the workload
    on its mount only, no pid label and a probe_info per op, SIGTERM detached everything."""
    exporter = data(results, "exporter")
    ec.verify_series_move_by_the_workload_on_its_mount_only(exporter, "nfs3")
    ec.verify_no_pid_label_and_probe_info_names_every_op(exporter)
    ec.verify_sigterm_detaches_everything(exporter)


NOLLVM_CHECKS: Tuple[Callable[[Dict[str, Any]], None], ...] = (
    verify_bcc_llvm_clang_and_headers_are_gone, verify_every_tool_ran_on_core, verify_nfs_tools_count_the_workload,
    verify_fsslower_xfs_counts_the_workload, verify_exporter_series_move_by_the_workload)

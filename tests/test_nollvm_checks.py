"""The no-LLVM client check's verdicts (labs/checks/nollvm/verdicts.py) on a real 6.12 guest run, in which
apt-get purged bcc, LLVM, clang and the headers and every tool ran on core (README beside it)."""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Dict

import pytest

from labs.checks.nollvm.verdicts import (NOLLVM_CHECKS, loader_info, verify_bcc_llvm_clang_and_headers_are_gone,
                                         verify_every_tool_ran_on_core)

RUN = Path(__file__).parent / "fixtures" / "6.12.117+deb13-amd64" / "nollvm" / "guest-run.json.gz"


@pytest.fixture
def run() -> Dict[str, Any]:
    with gzip.open(RUN, "rt") as handle:
        out: Dict[str, Any] = json.load(handle)
    return out


@pytest.mark.parametrize("verify", NOLLVM_CHECKS, ids=lambda f: f.__name__[len("verify_"):])
def test_the_lab_run_passes(run: Dict[str, Any], verify: Any) -> None:
    verify(run)


def test_the_exporter_said_core_and_libbpfs_version(run: Dict[str, Any]) -> None:
    text = run["exporter"]["data"]["texts"]["probekit"]
    assert loader_info(text) == {"backend": "core", "version": "1.5"}


def test_a_package_left_or_bcc_importable_fails(run: Dict[str, Any]) -> None:
    purge, absent = run["purge"]["data"], run["absent"]["data"]
    purge["left"] = ["libllvm19"]
    with pytest.raises(AssertionError, match="libllvm19"):
        verify_bcc_llvm_clang_and_headers_are_gone(run)
    purge["left"] = []
    absent["import_bcc"] = {"rc": 0, "output": ""}
    with pytest.raises(AssertionError):
        verify_bcc_llvm_clang_and_headers_are_gone(run)


def test_a_kind_not_removed_fails(run: Dict[str, Any]) -> None:
    """A purge that removed no headers package (none asked for, say) is no proof of their absence."""
    purge = run["purge"]["data"]
    purge["removed"] = [name for name in purge["removed"] if not name.startswith("linux-headers-")]
    with pytest.raises(AssertionError, match="linux-headers-"):
        verify_bcc_llvm_clang_and_headers_are_gone(run)


def test_a_build_tree_or_an_llvm_library_left_fails(run: Dict[str, Any]) -> None:
    absent = run["absent"]["data"]
    absent["build_tree"] = True
    with pytest.raises(AssertionError, match="build tree"):
        verify_bcc_llvm_clang_and_headers_are_gone(run)
    absent["build_tree"] = False
    absent["ldconfig"] = ["libLLVM.so.19.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libLLVM.so.19.1"]
    with pytest.raises(AssertionError, match="libLLVM"):
        verify_bcc_llvm_clang_and_headers_are_gone(run)


def test_a_tool_on_bcc_fails(run: Dict[str, Any]) -> None:
    nfstop = run["v3only"]["data"]["results"]["nfstop"]
    real = nfstop["stderr"]
    assert "nfstop: backend: core (auto: " in real
    nfstop["stderr"] = real.replace("nfstop: backend: core (auto: ", "nfstop: backend: bcc (auto: ")
    with pytest.raises(AssertionError, match="nfstop"):
        verify_every_tool_ran_on_core(run)
    nfstop["stderr"] = real
    exporter = run["exporter"]["data"]["texts"]
    exporter["probekit"] = exporter["probekit"].replace('probekit_bpf_loader_info{backend="core"',
                                                        'probekit_bpf_loader_info{backend="bcc"')
    with pytest.raises(AssertionError):
        verify_every_tool_ran_on_core(run)

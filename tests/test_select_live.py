"""A live start's choice (probes.select.LiveFacts) asks the kernel per name: BTF for functions,
tracefs's events/ for tracepoints, and opens available_filter_functions only where BTF cannot
answer. The kernel's files here are real: this host's /sys/kernel/btf/vmlinux, and a tracefs
directory of the Debian 6.1.0-57 capture (its available_filter_functions and events/)."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

from probes.layout import KernelLayout
from probes.select import KernelFacts, LiveFacts, select, spec_modules

SHARED = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "debian-6.1.0-57-amd64" / "tracefs"
BTF_DIR = Path("/sys/kernel/btf")
needs_btf = pytest.mark.skipif(not (BTF_DIR / "vmlinux").exists(), reason="this kernel exposes no BTF")

#: paths of every file this process opens while `_watching` holds True (sys.addaudithook: the
#: interpreter's own record of each open(), which cannot be detached once added)
_OPENED: List[str] = []
_watching = [False]


def _audit(event: str, args: Any) -> None:
    if _watching[0] and event == "open" and isinstance(args[0], (str, Path)):
        _OPENED.append(str(args[0]))


sys.addaudithook(_audit)


def _opened_list(run: Any) -> Any:
    """run() while recording opens; (its result, whether available_filter_functions was opened)."""
    _OPENED.clear()
    _watching[0] = True
    try:
        result = run()
    finally:
        _watching[0] = False
    return result, any(path.endswith("available_filter_functions") for path in _OPENED)


@pytest.fixture
def tracefs(tmp_path: Path) -> Path:
    """A tracefs directory of real kernel files: the function list and the nfs events."""
    root = tmp_path / "tracing"
    (root / "events").mkdir(parents=True)
    shutil.copy(SHARED / "available_filter_functions.nfs.txt", root / "available_filter_functions")
    shutil.copy(SHARED / "available_events.nfs-nfs4-sunrpc.txt", root / "available_events")
    shutil.copytree(SHARED / "events" / "nfs", root / "events" / "nfs")
    return root


def _point(entry: str, module: str, exit_: str = "") -> Dict[str, Any]:
    return {"entry": entry, "exit": exit_ or entry, "module": module, "optional": False}


def _spec(*candidates: Dict[str, Any]) -> Dict[str, Any]:
    return {"ops": {"read": {"letter": "R", "candidates": list(candidates)}}}


def _cand(kind: str, *points: Dict[str, Any]) -> Dict[str, Any]:
    return {"kind": kind, "match": "keys" if kind == "tracepoint" else "stack", "attach": list(points)}


@needs_btf
def test_a_function_in_btf_is_chosen_without_the_function_list(tracefs: Path) -> None:
    facts = LiveFacts(tracefs, set(), "test", KernelLayout.live(BTF_DIR))
    spec = _spec(_cand("fentry", _point("no_such_function_anywhere", "vmlinux")),
                 _cand("fentry", _point("vfs_read", "vmlinux")))
    selection, listed = _opened_list(lambda: select(spec, facts, ["read"]))
    assert not listed
    (chosen,) = selection.chosen
    assert chosen.index == 1
    assert chosen.skipped == ["#1 fentry no_such_function_anywhere: no_such_function_anywhere: not in the BTF of vmlinux"]


@needs_btf
def test_a_module_not_loaded_is_said_so_without_the_function_list(tracefs: Path) -> None:
    facts = LiveFacts(tracefs, {"sunrpc"}, "test", KernelLayout.live(BTF_DIR))
    spec = _spec(_cand("fentry", _point("nfs_file_read", "nfs")), _cand("kprobe", _point("vfs_read", "vmlinux")))
    selection, listed = _opened_list(lambda: select(spec, facts, ["read"]))
    assert not listed
    assert selection.chosen[0].skipped == ["#1 fentry nfs_file_read: nfs_file_read: module nfs not loaded"]


@needs_btf
def test_a_loaded_module_without_btf_is_asked_of_the_function_list(tracefs: Path) -> None:
    """nfs loaded, its BTF not read (none here): available_filter_functions decides, as before."""
    facts = LiveFacts(tracefs, {"nfs"}, "test", KernelLayout.live(BTF_DIR))
    spec = _spec(_cand("fentry", _point("nfs_no_such_function", "nfs")), _cand("fentry", _point("nfs_file_read", "nfs")))
    selection, listed = _opened_list(lambda: select(spec, facts, ["read"]))
    assert listed
    assert selection.chosen[0].index == 1
    assert selection.chosen[0].skipped == [
        "#1 fentry nfs_no_such_function: nfs_no_such_function: not in available_filter_functions"]


def test_without_btf_the_choice_is_the_function_lists(tracefs: Path) -> None:
    """No BTF (Debian 11): the same choice as from the files read whole (KernelFacts.from_tracefs)."""
    live = LiveFacts(tracefs, {"nfs"}, "test", None)
    whole = KernelFacts.from_tracefs(tracefs, "nfs 1 0 - Live 0x0\n")
    spec = _spec(_cand("kprobe", _point("nfs_no_such_function", "nfs")), _cand("kprobe", _point("nfs_file_read", "nfs")),
                 _cand("tracepoint", _point("nfs:nfs_aop_readahead", "nfs", "nfs:nfs_aop_readahead_done")))
    assert select(spec, live, ["read"]) == select(spec, whole, ["read"])


def test_tracepoints_are_their_event_directories(tracefs: Path) -> None:
    facts = LiveFacts(tracefs, {"nfs"}, "test", None)
    spec = _spec(_cand("tracepoint", _point("nfs:nfs_no_such_event", "nfs", "nfs:nfs_aop_readahead_done")),
                 _cand("tracepoint", _point("nfs:nfs_aop_readahead", "nfs", "nfs:nfs_aop_readahead_done")))
    selection, listed = _opened_list(lambda: select(spec, facts, ["read"]))
    assert not listed and selection.chosen[0].index == 1
    whole = KernelFacts.from_tracefs(tracefs, "nfs 1 0 - Live 0x0\n")
    assert all(facts.has(event, "tracepoint") for event in whole.events if event.startswith("nfs:"))
    assert not facts.has("nfs", "tracepoint") and not facts.has("nfs:", "tracepoint")


def test_the_btf_read_at_the_start_is_of_the_specs_modules() -> None:
    from probes.runtime import load_tool_spec, DEFAULT_SPEC
    assert spec_modules(load_tool_spec(DEFAULT_SPEC)) == ["nfs", "nfsv3", "nfsv4", "sunrpc"]

"""Probe generation on real kernel data: spec -> choice per kernel -> C + decoder that agree.

Kernels: the 6.1.0-50 lab guest profile (tests/fixtures/6.1.0-50-amd64/profile.json.gz,
captured live, with nfsv4 loaded) and the shared 6.1.0-57 tracefs capture. The v3-only
kernel is the 6.1.0-50 profile with everything of module nfsv4 removed, which is what
tracefs lists after `modprobe -r nfsv4` (a module's functions and events go with it).
"""
from __future__ import annotations

import copy
import gzip
import json
import re
import struct
from pathlib import Path
from typing import Any, Dict

import pytest
from click.testing import CliRunner

from discover.errors import UserError
from discover.profile import KernelProfile, parse_filter_functions
from probes import commands, runtime
from probes.generate import (EVENT_FIELDS, MAX_LAT_NS, Tool, decode_event, event_c_struct, event_format,
                             generate)
from probes.layout import KernelLayout
from probes.select import KernelFacts, select
from probes.spec import OPS, load_spec

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "probes" / "specs" / "nfs.toml"
PROFILE = REPO / "tests" / "fixtures" / "6.1.0-50-amd64" / "profile.json.gz"
SHARED = REPO.parent / "shared" / "fixtures" / "debian-6.1.0-57-amd64" / "tracefs"
VMLINUX_BTF = Path("/sys/kernel/btf/vmlinux")
ALL_OPS = list(OPS)


@pytest.fixture(scope="module")
def spec() -> Dict[str, Any]:
    return load_spec(SPEC)


@pytest.fixture(scope="module")
def profile_data() -> Dict[str, Any]:
    return json.loads(gzip.decompress(PROFILE.read_bytes()))


def facts_without(data: Dict[str, Any], module: str, system: str) -> KernelFacts:
    """The profile as tracefs shows it once `module` (and its event system) is unloaded."""
    data = copy.deepcopy(data)
    data["filter_functions"] = [f for f in data["filter_functions"] if f[1] != module]
    data["events"].pop(system, None)
    data["modules"].pop(module, None)
    return KernelFacts.from_profile(KernelProfile(data))


def test_choice_on_the_lab_kernel(spec: Dict[str, Any], profile_data: Dict[str, Any]) -> None:
    facts = KernelFacts.from_profile(KernelProfile(profile_data))
    sel = select(spec, facts, ALL_OPS)
    assert not sel.uncovered
    chosen = {c.op: c for c in sel.chosen}
    assert [p["entry"] for p in chosen["read"].points] == ["nfs_file_read"]
    assert [p["entry"] for p in chosen["write"].points] == ["nfs_file_write"]
    # every open path: ->open of v2/3 and v4, and ->atomic_open (creates, first lookups)
    assert {p["entry"] for p in chosen["open"].points} == {"nfs_file_open", "nfs4_file_open", "nfs_atomic_open"}
    assert chosen["getattr"].points[0]["entry"] == "nfs:nfs_getattr_enter"
    assert chosen["commit"].candidate["match"] == "keys"


def test_shared_capture_chooses_like_the_lab_kernel(spec: Dict[str, Any], profile_data: Dict[str, Any]) -> None:
    """Another 6.1 build (6.1.0-57, tracefs files as captured) gets the same attach points."""
    shared = KernelFacts(
        {name for name, _module in
         parse_filter_functions((SHARED / "available_filter_functions.nfs.txt").read_text().splitlines())},
        (SHARED / "available_events.nfs-nfs4-sunrpc.txt").read_text().split(),
        KernelFacts.parse_modules((SHARED / "lsmod-nfs.txt").read_text()))
    lab = KernelFacts.from_profile(KernelProfile(profile_data))
    pick = lambda facts: [(c.op, c.index, [p["entry"] for p in c.points]) for c in select(spec, facts, ALL_OPS).chosen]
    assert pick(shared) == pick(lab)


def test_v3_only_kernel_keeps_every_operation(spec: Dict[str, Any], profile_data: Dict[str, Any]) -> None:
    facts = facts_without(profile_data, "nfsv4", "nfs4")
    assert "nfs4_file_open" not in facts.functions and "nfs_file_open" in facts.functions
    sel = select(spec, facts, ALL_OPS)
    assert not sel.uncovered
    opens = next(c for c in sel.chosen if c.op == "open")
    assert {p["entry"] for p in opens.points} == {"nfs_file_open", "nfs_atomic_open"}
    assert any("nfs4_file_open" in note and "nfsv4 not loaded" in note for note in opens.skipped)
    probe = generate(sel.chosen, Tool(events=True), None)
    assert "nfs4_file_open" not in {fn for fn, _, _ in probe.kprobes}


def test_no_nfs_module_covers_nothing(spec: Dict[str, Any], profile_data: Dict[str, Any]) -> None:
    data = copy.deepcopy(profile_data)
    data["filter_functions"] = [f for f in data["filter_functions"] if not (f[1] or "").startswith("nfs")]
    data["events"] = {k: v for k, v in data["events"].items() if not k.startswith("nfs")}
    for module in ("nfs", "nfsv3", "nfsv4"):
        data["modules"].pop(module, None)
    sel = select(spec, KernelFacts.from_profile(KernelProfile(data)), ALL_OPS)
    assert not sel.chosen and set(sel.uncovered) == set(ALL_OPS)
    assert "module nfs not loaded" in sel.uncovered["read"]


def test_missing_key_field_skips_the_async_candidate(spec: Dict[str, Any], profile_data: Dict[str, Any]) -> None:
    """A kernel whose nfs_commit_done lacks a key field falls back to the next candidate."""
    facts = KernelFacts.from_profile(KernelProfile(profile_data))
    facts.formats["nfs:nfs_commit_done"] = facts.formats["nfs:nfs_commit_done"] - {"fhandle"}
    commit = next(c for c in select(spec, facts, ["commit"]).chosen)
    assert commit.index > 0 and commit.candidate["match"] == "task"
    assert any("no field fhandle" in why for why in commit.skipped)


def test_c_and_python_agree(spec: Dict[str, Any], profile_data: Dict[str, Any]) -> None:
    sel = select(spec, KernelFacts.from_profile(KernelProfile(profile_data)), ALL_OPS)
    probe = generate(sel.chosen, Tool(events=True, dist=True, top=True, tgid=42, min_lat_ns=10**7), None)
    text = probe.c_text
    # op ids and letters: defined once, in the order the Python side decodes them
    for op_id, op in enumerate(probe.ops):
        assert f"#define OP_{op.upper()} {op_id}\n" in text
        assert probe.letters[op_id] == spec["ops"][op]["letter"]
    assert "#define TARGET_TGID 42\n" in text and "#define MIN_LAT_NS 10000000ULL\n" in text
    # the C struct's field sizes add up to what the decoder reads, in the same order
    body = re.search(r"struct event \{(.*?)\};", text, re.S).group(1)
    decls = re.findall(r"(u64|u32|char) (\w+)(?:\[(\d+)\])?;", body)
    assert [name for _, name, _ in decls] == [name for name, _, _ in EVENT_FIELDS]
    sizes = {"u64": 8, "u32": 4, "char": 1}
    assert sum(sizes[t] * int(n or 1) for t, _, n in decls) == event_format().size
    assert event_c_struct() in text
    # a handler per attach point; kprobes attached by name, tracepoints declared
    for fn, end, handler in probe.kprobes:
        assert f"int {handler}(struct pt_regs *ctx)" in text
    for point in probe.points:
        if point.kind == "tracepoint":
            for event in (point.entry, point.exit):
                assert "TRACEPOINT_PROBE(%s, %s)" % tuple(event.split(":")) in text
    # structs handed to maps or perf are zeroed first (verifier: uninitialised padding)
    assert text.count("__builtin_memset(&k, 0, sizeof(k));") >= 2
    assert "__builtin_memset(&e, 0, sizeof(e));" in text
    # nothing includes the big kernel headers
    assert re.findall(r"#include <([^>]+)>", text) == ["uapi/linux/ptrace.h"]


def test_nested_operations_are_keyed_per_attach_point(spec: Dict[str, Any], profile_data: Dict[str, Any]) -> None:
    """fsync runs inside an O_SYNC write on the same thread: distinct start keys."""
    sel = select(spec, KernelFacts.from_profile(KernelProfile(profile_data)), ALL_OPS)
    probe = generate(sel.chosen, Tool(dist=True), None)
    ids = [p.id for p in probe.points]
    assert len(set(ids)) == len(ids)
    write = next(p for p in probe.points if p.op == "write")
    fsync = next(p for p in probe.points if p.op == "fsync")
    assert f"task_start({write.id}, &v);" in probe.c_text and f"task_start({fsync.id}, &v);" in probe.c_text
    assert "u32 point;" in probe.c_text.split("struct start_key {")[1].split("};")[0]


def test_event_decoding() -> None:
    values = {"end_ns": 5, "lat_ns": 12_345_678, "bytes": 4096, "offset": 1 << 20, "fileid": 40348,
              "pid": 595, "op": 1, "comm": b"dd", "name": b"write.bin"}
    raw = event_format().pack(*[values[name] for name, _, _ in EVENT_FIELDS])
    event = decode_event(raw)
    assert event["comm"] == "dd" and event["name"] == "write.bin" and event["lat_ns"] == 12_345_678


def test_wrapped_delta_is_never_printed() -> None:
    """bcc printed getattr latencies of ~585 years: a u64 end - start with start > end."""
    wrapped = (1000 - 2000) % (1 << 64)
    assert wrapped / 1e9 / 86400 / 365.25 > 584
    assert runtime.sane_latency_ns(wrapped) is None
    assert runtime.sane_latency_ns(-1) is None
    assert runtime.sane_latency_ns(MAX_LAT_NS + 1) is None
    assert runtime.sane_latency_ns(18_230_000) == 18_230_000
    template = (REPO / "bpf" / "probe.bpf.c").read_text()
    # the kernel side checks before recording, in both the task and the async path
    for fn in ("task_end", "async_end"):
        body = template.split(f"static __always_inline void {fn}(")[1].split("\n}\n")[0]
        assert body.index("sane_delta(") < body.index("record(")


def test_ops_option() -> None:
    assert runtime.parse_ops("R,w,open") == ["read", "write", "open"]
    assert runtime.parse_ops(None) == ALL_OPS
    with pytest.raises(UserError, match="unknown operation 'X'"):
        runtime.parse_ops("X")


def test_missing_bcc_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "bcc", None)
    with pytest.raises(UserError, match="python3-bpfcc"):
        runtime.import_bpf()


@pytest.mark.parametrize("command", [commands.nfsslower, commands.nfsdist, commands.nfstop])
def test_help_ends_with_examples(command: Any) -> None:
    out = CliRunner().invoke(command, ["--help"]).output
    tail = out[out.index("Examples:"):]
    assert out.rstrip().endswith(tail.rstrip()) and len(tail.splitlines()) >= 4
    if command is not commands.nfsdist:
        assert "with -p PID only the commits its own fsync starts" in " ".join(out.split())


@pytest.mark.skipif(not VMLINUX_BTF.exists(), reason="this kernel exposes no /sys/kernel/btf/vmlinux")
def test_layout_from_real_btf() -> None:
    layout = KernelLayout.live(VMLINUX_BTF.parent)
    assert layout is not None
    offsets = layout.name_offsets()
    assert set(offsets) == {"OFF_FILE_PATH_DENTRY", "OFF_DENTRY_NAME"}
    # vfs_read(struct file *file, ...): the file is parameter 0, no dereference
    src = layout.resolve("vfs_read", "file")
    assert src is not None and src.param == 0 and src.derefs == () and src.struct_name == "file"
    # generic_file_read_iter(struct kiocb *iocb, ...): ki_filp is kiocb's first member
    filp = layout.resolve("generic_file_read_iter", "iocb->ki_filp")
    pos = layout.resolve("generic_file_read_iter", "iocb->ki_pos")
    assert filp is not None and pos is not None
    assert filp.derefs == (0,) and filp.struct_name == "file" and pos.derefs[0] > 0
    assert layout.infer_args("generic_file_read_iter") == {"file": "iocb->ki_filp", "offset": "iocb->ki_pos"}
    assert layout.resolve("vfs_read", "nosuch") is None

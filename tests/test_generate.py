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
import subprocess
from pathlib import Path
from typing import Any, Dict

import pytest

from discover.errors import UserError
from discover.profile import KernelProfile, parse_filter_functions
from probes import bcc_backend, commands, runtime
from generated_c import defines, formats_of
from probes.generate import generate
from probes.model import (EVENT_FIELDS, MAX_LAT_NS, PTR_KINDS, Tool, decode_event, event_c_struct,
                          event_format)
from probes.layout import KernelLayout
from probes.select import KernelFacts, filter_function_names, select
from discover.spec import OPS, load_spec, parse_ops

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


def test_filter_function_names_are_the_lines_first_fields() -> None:
    """The tools' quick read of available_filter_functions keeps every line's name, with and
    without its `[module]`, and nothing else (a real capture: nfs, nfsv4, sunrpc functions)."""
    text = (SHARED / "available_filter_functions.nfs.txt").read_text()
    names = filter_function_names(text)
    assert names == {name for name, _module in parse_filter_functions(text.splitlines())}
    assert {"nfs_file_read", "kernfs_put.part.0"} <= names
    assert not {name for name in names if name.startswith("[")}


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
    probe = generate(sel.chosen, Tool(events=True), None, formats_of(profile_data))
    assert "nfs4_file_open" not in {fn for _, fn, _ in probe.attach}


def test_no_nfs_module_covers_nothing(spec: Dict[str, Any], profile_data: Dict[str, Any]) -> None:
    data = copy.deepcopy(profile_data)
    data["filter_functions"] = [f for f in data["filter_functions"] if not (f[1] or "").startswith("nfs")]
    data["events"] = {k: v for k, v in data["events"].items() if not k.startswith("nfs")}
    for module in ("nfs", "nfsv3", "nfsv4"):
        data["modules"].pop(module, None)
    sel = select(spec, KernelFacts.from_profile(KernelProfile(data)), ALL_OPS)
    # the RPC layer is sunrpc's (still loaded): every NFS operation is uncovered, RPCs are not
    assert [c.op for c in sel.chosen] == ["rpc"] and set(sel.uncovered) == set(ALL_OPS) - {"rpc"}
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
    probe = generate(sel.chosen, Tool(events=True, dist=True, top=True, tgid=42, min_lat_ns=10**7), None,
                     formats_of(profile_data))
    text = probe.c_text
    values = defines(text)
    # op ids and letters: each point counts as its op's index in the order Python decodes them
    for point in probe.points:
        assert values[f"P_{point.id}_op"] == probe.ops.index(point.op)
        assert probe.letters[probe.ops.index(point.op)] == spec["ops"][point.op]["letter"]
    assert values["CFG_target_tgid"] == 42 and values["CFG_min_lat_ns"] == 10**7
    # the C struct's field sizes add up to what the decoder reads, in the same order
    body = re.search(r"struct event \{(.*?)\};", text, re.S).group(1)
    decls = re.findall(r"(u64|u32|char) (\w+)(?:\[(\d+)\])?;", body)
    assert [name for _, name, _ in decls] == [name for name, _, _ in EVENT_FIELDS]
    sizes = {"u64": 8, "u32": 4, "char": 1}
    assert sum(sizes[t] * int(n or 1) for t, _, n in decls) == event_format().size
    assert event_c_struct() in text
    # a program per attach point end; the loader attaches kprobes and tracepoints by name
    for kind, target, program in probe.attach:
        ctx = {"kprobe": "struct pt_regs *ctx", "kretprobe": "struct pt_regs *ctx", "tracepoint": "void *ctx"}[kind]
        assert f'PROGRAM({program}, "' in text and f"{ctx})\n{{" in text.split(f"PROGRAM({program},")[1][:200]
    for point in probe.points:
        if point.kind == "tracepoint":
            for event in (point.entry, point.exit):
                assert ("tracepoint", event, "tp_" + event.replace(":", "__")) in probe.attach
    # structs handed to maps or buffers are zeroed first (verifier: uninitialised padding)
    assert "__builtin_memset(e, 0, sizeof(*e));" in text and "struct async_key k_ = {.point" in text
    # nothing includes the big kernel headers
    assert re.findall(r"#include <([^>]+)>", text) == ["uapi/linux/ptrace.h"]


def test_event_buffer_is_a_ring_buffer(spec: Dict[str, Any], profile_data: Dict[str, Any]) -> None:
    """The probe's one event buffer is a BPF ring buffer (kernel >= 5.8, bcc with
    ring_buffer_consume): a kernel or bcc without one is one line, not a silent fallback."""
    class NewBcc:
        def ring_buffer_consume(self) -> None: ...

    class OldBcc:
        pass

    assert bcc_backend.ringbuf_support("6.1.0-50-amd64", NewBcc)[0]
    assert bcc_backend.ringbuf_support("5.10.0-32-amd64", NewBcc)[0]
    with pytest.raises(UserError, match="4.19.0-27-amd64 has no BPF ring buffer"):
        bcc_backend.ringbuf_support("4.19.0-27-amd64", NewBcc)
    with pytest.raises(UserError, match="no BPF ring buffer support"):
        bcc_backend.ringbuf_support("6.1.0-50-amd64", OldBcc)
    sel = select(spec, KernelFacts.from_profile(KernelProfile(profile_data)), ALL_OPS)
    formats = formats_of(profile_data)
    ring = generate(sel.chosen, Tool(events=True), None, formats, ringbuf=True)
    assert ring.ringbuf and defines(ring.c_text)["SIZE_events"] == 256 * 4096
    # the histogram tools print no events: the buffer is one page
    dist = generate(sel.chosen, Tool(dist=True), None, formats, ringbuf=True)
    assert not dist.ringbuf and defines(dist.c_text)["SIZE_events"] == 4096
    # records are submitted without a wakeup (user space reads on a timer) and a full
    # buffer is counted, not silently lost
    source = (REPO / "bpf" / "probe.bpf.c").read_text()
    assert "MAP_RINGBUF_SUBMIT(events, e, BPF_RB_NO_WAKEUP);" in source and "count(COUNTER_LOST_EVENTS);" in source
    assert "events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);" in ring.c_text and "MAP_LOOKUP(" not in ring.c_text


def test_start_time_store_choice(spec: Dict[str, Any], profile_data: Dict[str, Any]) -> None:
    """Task local storage where kernel (>= 5.11), bcc (task storage maps) and BTF allow, else the hash."""
    new_bcc = type("table", (), {"BPF_MAP_TYPE_TASK_STORAGE": 29})
    old_bcc = type("table", (), {})
    assert bcc_backend.task_storage_support("6.1.0-50-amd64", new_bcc, True)[0]
    for release, table, btf, reason in (("5.10.0-32-amd64", new_bcc, True, "5.11"),
                                        ("6.1.0-50-amd64", old_bcc, True, "bcc"),
                                        ("6.1.0-50-amd64", new_bcc, False, "BTF")):
        usable, why = bcc_backend.task_storage_support(release, table, btf)
        assert not usable and "hash map" in why and reason in why
    sel = select(spec, KernelFacts.from_profile(KernelProfile(profile_data)), ALL_OPS)
    formats = formats_of(profile_data)
    stored = generate(sel.chosen, Tool(dist=True), None, formats, task_storage=True)
    hashed = generate(sel.chosen, Tool(dist=True), None, formats)
    assert stored.task_storage and defines(stored.c_text)["CFG_task_storage"] == 1
    assert defines(stored.c_text)["SIZE_starts"] == 1  # the hash is not used: one entry
    assert not hashed.task_storage and defines(hashed.c_text)["CFG_task_storage"] == 0
    template = (REPO / "bpf" / "probe.bpf.c").read_text()
    # one slot per attach point (nesting still works) and an end without a start is skipped
    assert "struct start_val at[NSLOTS];" in template and defines(stored.c_text)["NSLOTS"] == len(stored.points)
    end = template.split("static __always_inline void task_end(")[1].split("\n}\n")[0]
    assert "if (found->ts == 0)\n                return;" in end and "found->ts = 0;" in end
    # a thread's outermost start may sit in its in-flight slot instead: taken from there first
    assert end.index("held = inflight_end(id, p, &s);") < end.index("if (!held) {")


def test_nested_operations_are_keyed_per_attach_point(spec: Dict[str, Any], profile_data: Dict[str, Any]) -> None:
    """fsync runs inside an O_SYNC write on the same thread: distinct start keys and slots."""
    sel = select(spec, KernelFacts.from_profile(KernelProfile(profile_data)), ALL_OPS)
    probe = generate(sel.chosen, Tool(dist=True), None, formats_of(profile_data))
    ids = [p.id for p in probe.points]
    assert len(set(ids)) == len(ids)
    values = defines(probe.c_text)
    write = next(p for p in probe.points if p.op == "write")
    fsync = next(p for p in probe.points if p.op == "fsync")
    for point in (write, fsync):
        assert values[f"P_{point.id}_id"] == values[f"P_{point.id}_slot"] == point.id
    template = (REPO / "bpf" / "probe.bpf.c").read_text()
    assert "u32 point;" in template.split("struct start_key {")[1].split("};")[0]


def test_a_points_settings_are_chosen_by_its_number(spec: Dict[str, Any], profile_data: Dict[str, Any],
                                                     tmp_path: Path) -> None:
    """The probe's functions take a point's number and read its settings where they use them
    (P(p, name)): bcc's text chooses P_<p>_<name> by that number, which the host's C compiler
    evaluates here for every chosen point and setting."""
    sel = select(spec, KernelFacts.from_profile(KernelProfile(profile_data)), ALL_OPS)
    probe = generate(sel.chosen, Tool(dist=True, events=True), None, formats_of(profile_data))
    values = defines(probe.c_text)
    wanted = {(point.id, name[len(f"P_{point.id}_"):]): value for point in probe.points
              for name, value in values.items() if name.startswith(f"P_{point.id}_")}
    lines = [line for line in probe.c_text.splitlines() if re.match(r"#define P_", line)]
    layer = next(line for line in (REPO / "bpf" / "bcc.h").read_text().splitlines() if line.startswith("#define P("))
    prints = "".join(f'    printf("%u %s %llu\\n", {p}u, "{name}", (unsigned long long)P({p}, {name}));\n'
                     for p, name in wanted)
    source = tmp_path / "settings.c"
    source.write_text("#include <stdio.h>\n" + "\n".join(lines + [layer]) + f"\nint main(void)\n{{\n{prints}}}\n")
    subprocess.run(["clang", "-O2", "-o", str(tmp_path / "settings"), str(source)], check=True)
    out = subprocess.run([str(tmp_path / "settings")], capture_output=True, text=True, check=True).stdout
    chosen = {(int(p), name): int(value) for p, name, value in (line.split() for line in out.splitlines())}
    assert len(probe.points) > 5 and len(wanted) > 100
    assert chosen == wanted


def test_event_decoding() -> None:
    values = {"end_ns": 5, "lat_ns": 12_345_678, "bytes": 4096, "offset": 1 << 20, "fileid": 40348,
              "dev": (0 << 20) | 57, "cgroup": 3218, "pid": 595, "op": 1, "comm": b"dd", "name": b"write.bin"}
    raw = event_format().pack(*[values[name] for name, _, _ in EVENT_FIELDS])
    event = decode_event(raw)
    assert event["comm"] == "dd" and event["name"] == "write.bin" and event["lat_ns"] == 12_345_678
    assert event["dev"] == 57 and event["cgroup"] == 3218


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
    """One vocabulary: names, letters (any case) or `all`; the default is bcc's set plus F and C."""
    assert parse_ops("R,w,open") == ["read", "write", "open"]
    assert parse_ops(None) == ["read", "write", "open", "getattr", "fsync", "commit"]
    assert parse_ops("all") == ALL_OPS and parse_ops("P,lookup") == ["lookup", "rpc"]
    for bad in ("Z", "reed", ","):
        with pytest.raises(UserError, match="unknown operation|empty"):
            parse_ops(bad)


def test_missing_bcc_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "bcc", None)
    with pytest.raises(UserError, match="python3-bpfcc"):
        bcc_backend.import_bpf()


@pytest.mark.parametrize("command", [commands.nfsslower_parser, commands.nfsdist_parser, commands.nfstop_parser])
def test_help_ends_with_examples(command: Any) -> None:
    out = command().format_help()
    tail = out[out.index("Examples:"):]
    assert out.rstrip().endswith(tail.rstrip()) and len(tail.splitlines()) >= 4
    if command is not commands.nfsdist_parser:
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


def test_filters_and_identity_in_the_generated_c(spec: Dict[str, Any], profile_data: Dict[str, Any]) -> None:
    """--mount-point finds each operation's mount at its start (kprobes: through the file or
    dentry, host BTF offsets; tracepoints: their dev field) and drops the others there;
    --cgroup asks the cgroup filter; without them no start pays for either (the settings are
    constants), and a printed event still carries its mount and cgroup."""
    sel = select(spec, KernelFacts.from_profile(KernelProfile(profile_data)), ALL_OPS)
    layout = KernelLayout.live(VMLINUX_BTF.parent)
    formats = formats_of(profile_data)
    plain = defines(generate(sel.chosen, Tool(events=True), layout, formats).c_text)
    filtered = defines(generate(sel.chosen, Tool(events=True, mount_dev=57, cgroup_filter=True), layout, formats).c_text)
    assert plain["CFG_mount_dev"] == 0 and plain["CFG_cgroup_filter"] == 0 and plain["CFG_dev_at_entry"] == 0
    assert filtered["CFG_mount_dev"] == 57 and filtered["CFG_cgroup_filter"] == 1 and filtered["CFG_dev_at_entry"] == 1
    assert plain["OFF_SB_DEV"] >= 0 and plain["OFF_FILE_INODE"] >= 0
    # a kprobe on a vmlinux function (the host's BTF has no nfs module): vfs_read(struct file *file, ...)
    probe = generate([_vfs_read_choice()], Tool(events=True, mount_dev=57), layout, formats)
    read = defines(probe.c_text)
    assert read["P_0_ptr_kind"] == PTR_KINDS["file"] and read["P_0_a0_param"] == 0 and read["P_0_a0_n"] == 0
    source = (REPO / "bpf" / "probe.bpf.c").read_text()
    assert "if (CFG(dev_at_entry) && v_.ptr)" in source and "v_.dev = TPF(p, dev);" in source
    assert "e->dev = s->dev ? s->dev : (s->ptr ? dev_of(s->ptr, P(p, ptr_kind)) : 0);" in source
    assert "e->cgroup = cgroup;" in source
    assert Tool(top=True, per_mount=True).dev_at_entry and Tool(mount_dev=57).dev_at_entry
    assert not Tool(events=True, cgroup_filter=True).dev_at_entry


def test_cgroup_keys_only_for_the_exporters_label_and_bounded(spec: Dict[str, Any], profile_data: Dict[str, Any]) -> None:
    """--cgroup-label keys the histograms by cgroup for a bounded number of cgroups (the
    admission table's size), in maps allocated as used; every other tool's keys carry cgroup
    0; and a cgroup key without the mount key is refused (the exporter always has both)."""
    sel = select(spec, KernelFacts.from_profile(KernelProfile(profile_data)), ALL_OPS)
    nops = len(sel.chosen)
    formats = formats_of(profile_data)
    plain = defines(generate(sel.chosen, Tool(dist=True, per_mount=True), None, formats).c_text)
    keyed = defines(generate(sel.chosen, Tool(dist=True, per_mount=True, cgroup_limit=64), None, formats).c_text)
    assert plain["CFG_want_cgroup_key"] == 0 and plain["SIZE_dist"] == nops * 64 * 64
    assert keyed["CFG_want_cgroup_key"] == 1 and keyed["SIZE_cgroup_ids"] == 64
    assert keyed["SIZE_dist"] == nops * 40 * 4 * 65 and keyed["SIZE_op_totals"] == nops * 64 * 65
    with pytest.raises(ValueError, match="per_mount"):
        generate(sel.chosen, Tool(dist=True, cgroup_limit=64), None, formats)


def _vfs_read_choice(points: int = 1) -> Any:
    """A fentry candidate on vmlinux's vfs_read (the host's BTF has no NFS module)."""
    from probes.select import Chosen
    attach = {"entry": "vfs_read", "exit": "vfs_read", "args": {"file": "file", "bytes": "retval"}}
    return Chosen("read", "R", 0, {"kind": "fentry", "match": "task"}, [dict(attach) for _ in range(points)], [])


def test_fentry_programs_read_the_trampolines_arguments() -> None:
    """A fentry point is a kfunc__MODULE__FUNCTION/kretfunc__ pair that bcc attaches itself,
    reading parameters from the trampoline's array and the return value after them."""
    layout = KernelLayout.live(VMLINUX_BTF.parent)
    assert layout is not None and runtime.fentry_can_attach("vfs_read", layout) is None
    params = layout.params("vfs_read")
    assert params is not None and [name for name, _ in params][0] == "file"
    probe = generate([_vfs_read_choice()], Tool(events=True), layout, lambda event: None, fentry=["vfs_read"])
    assert [p.kind for p in probe.points] == ["fentry"] and probe.attach == []
    assert 'PROGRAM(kfunc__vmlinux__vfs_read, "fentry/vfs_read", unsigned long long *ctx)' in probe.c_text
    assert 'PROGRAM(kretfunc__vmlinux__vfs_read, "fexit/vfs_read", unsigned long long *ctx)' in probe.c_text
    assert "TIMED_ENTRY(0, fentry_arg);" in probe.c_text and "s64 ret = fexit_ret(ctx, 0);" in probe.c_text
    assert defines(probe.c_text)["P_0_nargs"] == len(params)
    assert probe.programs == {"kfunc__vmlinux__vfs_read": ("read",), "kretfunc__vmlinux__vfs_read": ("read",)}
    # the same candidate without the check's consent: a kprobe pair on the same function
    kprobe = generate([_vfs_read_choice()], Tool(events=True), layout, lambda event: None)
    assert [p.kind for p in kprobe.points] == ["kprobe"]
    assert kprobe.attach == [("kprobe", "vfs_read", "p0_kprobe"), ("kretprobe", "vfs_read", "p0_kretprobe")]
    assert "TIMED_ENTRY(0, kprobe_arg);" in kprobe.c_text and "s64 ret = kprobe_ret(ctx);" in kprobe.c_text


def test_a_second_fentry_point_on_one_function_is_a_kprobe_pair() -> None:
    """bcc names a fentry program after its function: one entry and one exit program each."""
    layout = KernelLayout.live(VMLINUX_BTF.parent)
    probe = generate([_vfs_read_choice(points=2)], Tool(dist=True), layout, lambda event: None, fentry=["vfs_read"])
    assert [p.kind for p in probe.points] == ["fentry", "kprobe"]
    assert probe.c_text.count("PROGRAM(kfunc__vmlinux__vfs_read,") == 1


def test_fentry_can_attach_names_what_is_missing() -> None:
    layout = KernelLayout.live(VMLINUX_BTF.parent)
    assert runtime.fentry_can_attach("vfs_read", None) == "no kernel BTF"
    assert "no BTF prototype" in (runtime.fentry_can_attach("nfs_file_read", layout) or "")
    assert layout is not None and layout.btf_module_of("vfs_read") == "vmlinux"
    assert layout.btf_module_of("nfs_file_read") is None


def test_rpcs_beneath_the_default_ops_are_tracked_in_flight_only(spec: Dict[str, Any],
                                                                  profile_data: Dict[str, Any]) -> None:
    """The default ops with the RPC layer watched (Session with in-flight tracking): RPC starts
    go to the in-flight view, their ends forget them; nothing of an RPC is recorded, while the
    asked ops' async ends (commit) still record."""
    facts = KernelFacts.from_profile(KernelProfile(profile_data))
    formats = formats_of(profile_data)
    asked = select(spec, facts, list(commands.DEFAULT_OPS))
    watched = [c._replace(watch=True) for c in select(spec, facts, ["rpc"]).chosen]
    probe = generate(asked.chosen + watched, Tool(events=True, inflight=True), None, formats)
    assert probe.watched == ("rpc",) and probe.ops[-1] == "rpc" and probe.letters[-1] == "P"
    values = defines(probe.c_text)
    rpc = next(p for p in probe.points if p.op == "rpc")
    commit = next(p for p in probe.points if p.op == "commit" and p.match == "keys")
    assert values[f"P_{rpc.id}_watch"] == 1 and values[f"P_{rpc.id}_keyed"] == 1
    assert values[f"P_{commit.id}_watch"] == 0 and values[f"P_{commit.id}_keyed"] == 1
    source = (REPO / "bpf" / "probe.bpf.c").read_text()
    end = source.split("static __always_inline void async_end(")[1].split("\n}\n")[0]
    assert end.index("if (P(p, watch)) {") < end.index("record(")
    # asked for, the RPC layer is timed as before
    timed = generate(select(spec, facts, ["read", "rpc"]).chosen, Tool(events=True, inflight=True), None, formats)
    assert timed.watched == () and not any(v for k, v in defines(timed.c_text).items() if k.endswith("_watch"))


def test_only_asynchronous_points_can_be_watched(spec: Dict[str, Any], profile_data: Dict[str, Any]) -> None:
    facts = KernelFacts.from_profile(KernelProfile(profile_data))
    read = [c._replace(watch=True) for c in select(spec, facts, ["read"]).chosen]
    with pytest.raises(ValueError, match="only asynchronous"):
        generate(read, Tool(inflight=True), None, formats_of(profile_data))


def test_only_a_clients_asynchronous_rpc_layer_is_watched_beneath_the_asked_ops(
        spec: Dict[str, Any], profile_data: Dict[str, Any]) -> None:
    """Session._watch_beneath: the NFS client's RPCs (sunrpc, keys-matched) join the default
    ops in flight only; the NFS server's `rpc` (nfsd.toml: nfsd_dispatch, on the request's own
    thread) is what a server tool asks for, not a layer beneath: it is left out, not failed on."""
    from types import SimpleNamespace

    facts = KernelFacts.from_profile(KernelProfile(profile_data))
    ops = list(commands.DEFAULT_OPS)
    host = SimpleNamespace(selection=select(spec, facts, ops), verbose=False)
    watched = runtime.Session._watch_beneath(host, spec, facts, ops)
    assert [(c.op, c.watch) for c in watched.chosen if c.watch] == [("rpc", True)]
    nfsd = load_spec(REPO / "probes" / "specs" / "nfsd.toml")
    server = KernelFacts({"nfsd_dispatch", "nfsd3_proc_read", "nfsd4_read"}, {"sunrpc:svc_process", "sunrpc:svc_send"},
                         {"nfsd", "sunrpc"})
    assert select(nfsd, server, ["rpc"]).chosen[0].candidate["match"] == "task"
    host = SimpleNamespace(selection=select(nfsd, server, ["read"]), verbose=False)
    assert not any(c.watch for c in runtime.Session._watch_beneath(host, nfsd, server, ["read"]).chosen)

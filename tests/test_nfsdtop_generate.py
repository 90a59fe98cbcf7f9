"""nfsdtop's probe generated from nfsd.toml on a real Debian 6.12 kernel's BTF (vmlinux, nfsd,
sunrpc, read from the package): the client's address is read at svc_rqst.rq_addr (a struct
held in the request, so its address, not a pointer read through), the procedure's name through
rq_procinfo->pc_name, the program and version beside them; what cannot be read is refused in
one line, never generated blind."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from debian_kernels import ABI_612, btf_dir
from discover.errors import UserError
from discover.spec import load_spec
from generated_c import defines
from probes.generate import generate
from probes.model import Tool
from probes.layout import KernelLayout
from probes.select import KernelFacts, select, select_context

REPO = Path(__file__).resolve().parents[1]
SPEC = load_spec(REPO / "probes" / "specs" / "nfsd.toml")
#: the points nfsdtop's ops choose on 6.12 (as the lab's --verbose shows): nfsd_dispatch, the tracepoints
FACTS = KernelFacts({"nfsd_dispatch", "fh_verify"}, {"nfsd:nfsd_read_start", "nfsd:nfsd_read_done", "nfsd:nfsd_write_start",
                                        "nfsd:nfsd_write_done"}, {"nfsd", "sunrpc"})


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> KernelLayout:
    """The 6.12 package's BTF laid out as /sys/kernel/btf is."""
    btf = btf_dir(ABI_612, ("nfsd", "sunrpc"), tmp_path_factory.mktemp("btf"))
    found = KernelLayout.live(btf, ("nfsd", "sunrpc"))
    assert found is not None and found.btf_module_of("nfsd_dispatch") == "nfsd"
    return found


def offsets(layout: KernelLayout) -> Dict[str, int]:
    rqstp = layout.params("nfsd_dispatch")
    assert rqstp is not None and rqstp[0][0] == "rqstp"
    out = {}
    for field in ("rq_addr", "rq_prog", "rq_vers", "rq_procinfo"):
        source = layout.resolve("nfsd_dispatch", f"rqstp->{field}")
        assert source is not None
        out[field] = source.derefs[0]
    name = layout.resolve("nfsd_dispatch", "rqstp->rq_procinfo->pc_name")
    assert name is not None
    out["pc_name"] = name.derefs[1]
    return out


def sources(values: Dict[str, int], point: int) -> List[Tuple[int, int, int, Tuple[int, ...]]]:
    """(parameter, pointer reads, address-of-last, offsets) of a point's argument sources."""
    out = []
    for i in range(4):
        n = values[f"P_{point}_a{i}_n"]
        out.append((values[f"P_{point}_a{i}_param"], n, values[f"P_{point}_a{i}_addr"],
                    tuple(values[f"P_{point}_a{i}_off{j}"] for j in range(n))))
    return out


def no_formats(event: str) -> None:
    return None


def test_fentry_entry_reads_the_clients_sockaddr_in_the_request(layout: KernelLayout) -> None:
    assert layout.embedded_struct("nfsd_dispatch", "rqstp->rq_addr") == "__kernel_sockaddr_storage"
    off = offsets(layout)
    chosen = select(SPEC, FACTS, ["rpc", "read", "write"]).chosen
    probe = generate(chosen, Tool(server=True), layout, no_formats, fentry=["nfsd_dispatch"])
    values = defines(probe.c_text)
    # the client's sockaddr and the request's program and version: addresses of members of
    # rqstp (parameter 0); the procedure's name: read through rq_procinfo
    assert sources(values, 0) == [(0, 1, 1, (off["rq_addr"],)), (0, 2, 0, (off["rq_procinfo"], off["pc_name"])),
                                  (0, 1, 1, (off["rq_prog"],)), (0, 1, 1, (off["rq_vers"],))]
    assert 'PROGRAM(kfunc__nfsd__nfsd_dispatch, "fentry/nfsd_dispatch", unsigned long long *ctx)' in probe.c_text
    assert "REQUEST_ENTRY(0, fentry_arg);" in probe.c_text and "REQUEST_EXIT(0);" in probe.c_text
    assert values["CFG_want_server"] == 1 and values["CFG_want_top"] == 0
    # reads and writes add their bytes to the request: their ends carry the tracepoints' len
    assert values["CFG_op_read"] == 1 and values["CFG_op_write"] == 2
    assert values["P_1_t_exit_bytes_size"] == 0  # no formats given: the field reads as absent
    assert [kind for kind, _, _ in probe.attach] == ["tracepoint"] * 4


def test_kprobe_entry_reads_the_same_through_the_first_register(layout: KernelLayout) -> None:
    off = offsets(layout)
    probe = generate(select(SPEC, FACTS, ["rpc"]).chosen, Tool(server=True), layout, no_formats)
    assert sources(defines(probe.c_text), 0)[0] == (0, 1, 1, (off["rq_addr"],))
    assert "REQUEST_ENTRY(0, kprobe_arg);" in probe.c_text
    assert probe.attach == [("kprobe", "nfsd_dispatch", "p0_kprobe"), ("kretprobe", "nfsd_dispatch", "p0_kretprobe")]


def test_a_client_that_is_no_sockaddr_is_refused(layout: KernelLayout) -> None:
    chosen = select(SPEC, FACTS, ["rpc"]).chosen
    point = dict(chosen[0].points[0], args={"client": "rqstp->rq_procinfo", "name": "rqstp->rq_procinfo->pc_name"})
    with pytest.raises(UserError, match=r"cannot read the client's address at nfsd_dispatch .*'rqstp->rq_procinfo'"):
        generate([chosen[0]._replace(points=[point])], Tool(server=True), layout, no_formats)


def test_without_btf_or_without_requests_nothing_is_generated(layout: KernelLayout) -> None:
    chosen = select(SPEC, FACTS, ["rpc", "read"]).chosen
    with pytest.raises(UserError, match=r"need the kernel's BTF"):
        generate(chosen, Tool(server=True), None, no_formats)
    with pytest.raises(UserError, match=r"need the spec's rpc operation"):
        generate(chosen[1:], Tool(server=True), layout, no_formats)
    tracepoint = select(SPEC, KernelFacts((), {"sunrpc:svc_process", "sunrpc:svc_send"}, {"sunrpc"}), ["rpc"]).chosen
    assert tracepoint[0].candidate["kind"] == "tracepoint"
    with pytest.raises(UserError, match=r"need a function for rpc at sunrpc:svc_process"):
        generate(tracepoint, Tool(server=True), layout, no_formats)


def export_offsets(layout: KernelLayout) -> list:
    """fh_verify's svc_fh.fh_export, svc_export.ex_path.dentry, dentry.d_inode, inode.i_ino,
    dentry.d_sb, super_block.s_dev, each member looked up on its own in the 6.12 BTF."""
    fhp = layout.params("fh_verify")
    assert fhp is not None and fhp[1][0] == "fhp"
    blob = layout.modules["nfsd"]
    ids = blob.struct_ids(("svc_fh", "svc_export"))
    vmlinux = layout.vmlinux.struct_ids(("dentry", "inode", "super_block"))
    return [layout.member_path(blob, ids["svc_fh"], ["fh_export"])[0],
            layout.member_path(blob, ids["svc_export"], ["ex_path", "dentry"])[0],
            layout.member_path(layout.vmlinux, vmlinux["dentry"], ["d_inode"])[0],
            layout.member_path(layout.vmlinux, vmlinux["inode"], ["i_ino"])[0],
            layout.member_path(layout.vmlinux, vmlinux["dentry"], ["d_sb"])[0],
            layout.member_path(layout.vmlinux, vmlinux["super_block"], ["s_dev"])[0]]


def test_the_export_is_read_where_fh_verify_returns(layout: KernelLayout) -> None:
    """The rpc op's context point (fh_verify): its entry keeps the handle for the thread's
    request, its return reads the handle's export root's inode and dev; it counts no operation."""
    context = select_context(SPEC, FACTS, "rpc")
    assert context is not None and context.candidate["kind"] == "fentry" and context.points[0]["entry"] == "fh_verify"
    chosen = select(SPEC, FACTS, ["rpc", "read", "write"]).chosen + [context]
    probe = generate(chosen, Tool(server=True), layout, no_formats, fentry=["nfsd_dispatch", "fh_verify"])
    assert probe.ops == ["rpc", "read", "write"]
    fh_export, dentry, d_inode, i_ino, d_sb, s_dev = export_offsets(layout)
    assert sources(defines(probe.c_text), 3) == [(1, 0, 0, ()), (1, 1, 0, (fh_export,)),
                                                 (1, 3, 0, (dentry, d_inode, i_ino)), (1, 3, 0, (dentry, d_sb, s_dev))]
    assert "CONTEXT_ENTRY(3, fentry_arg);" in probe.c_text and "CONTEXT_EXIT(3);" in probe.c_text
    assert probe.programs["kfunc__nfsd__fh_verify"] == () == probe.programs["kretfunc__nfsd__fh_verify"]
    kprobed = generate(chosen, Tool(server=True), layout, no_formats)
    assert "CONTEXT_ENTRY(3, kprobe_arg);" in kprobed.c_text
    assert ("kretprobe", "fh_verify", "p3_kretprobe") in kprobed.attach


def test_an_export_that_is_no_svc_export_is_refused(layout: KernelLayout) -> None:
    context = select_context(SPEC, FACTS, "rpc")
    assert context is not None
    point = dict(context.points[0], args={"export": "fhp->fh_dentry"})
    with pytest.raises(UserError, match=r"cannot read the export at fh_verify .*'fhp->fh_dentry'"):
        generate(select(SPEC, FACTS, ["rpc"]).chosen + [context._replace(points=[point])], Tool(server=True), layout,
                 no_formats)
    with pytest.raises(ValueError, match="Tool.server only"):
        generate(select(SPEC, FACTS, ["rpc"]).chosen + [context], Tool(dist=True), layout, no_formats)
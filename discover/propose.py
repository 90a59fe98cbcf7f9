"""Rank attach points per filesystem operation, with the reasons, into a probe spec.

Why: choosing where to time an operation is a trade-off between stability (tracepoints
survive kernel upgrades), coverage (buffered, O_DIRECT, mmap, async work in kworkers) and
what falls inside the timed window. This module makes that call from one kernel profile
(and call graphs when given), and says why, so a reviewer can check it and the probe
generator can fall back candidate by candidate on another kernel.

Order per operation: a tracepoint pair at the filesystem layer that covers the whole
operation; the filesystem's own entry below VFS (fentry/fexit when BTF allows, then
kprobe/kretprobe), all version variants together (nfs_file_open + nfs4_file_open +
nfs_atomic_open); then partial or deeper points.
"""
from __future__ import annotations

import gzip
import json
import re
import zlib
from pathlib import Path
from typing import Any, Dict, FrozenSet, Iterable, List, NamedTuple, Optional, Sequence, Set, Tuple

from discover.errors import UserError
from discover.events import EventPair, find_pairs
from discover.profile import KernelProfile
from discover.schema import node_link_parts
from discover.spec import SCHEMA, SPEC_OPS, VERSION, add_pointer_roles


class OpKnowledge(NamedTuple):
    """What is known about one operation, independent of the kernel."""

    #: VFS functions the operation enters the filesystem from (call-graph roots)
    vfs: Tuple[str, ...]
    #: regexes for the filesystem's own entry functions below VFS ({p} = fs prefix)
    entries: Tuple[str, ...]
    #: regexes for deeper alternatives inside the filesystem
    deeper: Tuple[str, ...]
    #: tracepoint pair operation names that bracket the whole operation at the fs layer
    tp_full: Tuple[str, ...]
    #: pairs that bracket part of it or a deeper step
    tp_partial: Tuple[str, ...]
    coverage: str
    window: str
    #: coverage of the entry-function candidates when it differs from the tracepoint pair's
    func_coverage: str = ""
    #: pairs in a layer beneath the filesystem, named outright because their names do not
    #: pair by suffix: (system, start event, end event, fields that match start and end;
    #: none: both fire in the same task)
    tp_beneath: Tuple[Tuple[str, str, str, Tuple[str, ...]], ...] = ()
    #: the VFS functions that call the filesystem's method for this operation through its
    #: function pointer (f_op->read_iter, i_op->getattr, ...): in a call graph, whatever
    #: function of the filesystem they call is its entry, whatever its name (xfs_vn_getattr)
    method_callers: Tuple[str, ...] = ()
    #: functions called inside the operation, on its task, whose arguments name what the
    #: entry does not know yet (the export a file handle resolves to): the spec's `context`
    context: Tuple[str, ...] = ()
    #: why a same-task pair beneath the filesystem ranks below its own entry (a layer
    #: shared with other users, an end that some calls never reach)
    beneath_note: str = ""
    #: one event at the end of each step of a request, on its task, naming the step
    #: (nfsd:nfsd_compound_status after each NFSv4 operation): (system, event, the function it
    #: fires in); a step runs from the previous step's end, where no function of its own can be
    #: attached (the operations are called through a table, one function each)
    tp_each: Tuple[Tuple[str, str, str], ...] = ()


def _metadata(vfs: Tuple[str, ...], entry: str, what: str, window: str, deeper: Tuple[str, ...] = (),
              tp: Tuple[str, ...] = ()) -> OpKnowledge:
    """A namespace or attribute operation: one inode_operations entry, and (where the
    filesystem traces it) an enter/exit pair of the same name around it."""
    return OpKnowledge(vfs, (rf"{{p}}_{entry}",), deeper, tp or (entry,), (), what, window)


KNOWLEDGE: Dict[str, OpKnowledge] = {
    "read": OpKnowledge(
        ("vfs_read", "new_sync_read", "vfs_iter_read"),
        (r"{p}_file_read", r"{p}_file_read_iter"),
        (r"{p}_file_direct_read", r"{p}_readahead", r"{p}_read_folio", r"{p}_readpage"),
        (), ("read", "aop_readahead", "aop_readpage"),
        "buffered and O_DIRECT read(2)/preadv(2) (->read_iter); not mmap page faults "
        "(filemap_fault -> readahead), not splice",
        "page-cache copy, readahead, and waiting for the data when the cache misses (device reads; READ RPCs on NFS)",
        method_callers=("vfs_read", "new_sync_read", "vfs_iter_read", "vfs_iocb_iter_read")),
    "write": OpKnowledge(
        ("vfs_write", "new_sync_write", "vfs_iter_write"),
        (r"{p}_file_write", r"{p}_file_write_iter"),
        (r"{p}_file_direct_write", r"{p}_write_begin", r"{p}_write_end", r"{p}_updatepage"),
        (), ("write", "writeback_page"),
        "buffered and O_DIRECT write(2)/pwritev(2) (->write_iter); not mmap stores; "
        "writeback of dirty pages runs later in kworkers (flush) and is not in this window",
        "copy into the page cache, block allocation (plus the sync of O_SYNC/O_DSYNC writes: "
        "device writes and a journal commit, or WRITE+COMMIT RPCs on NFS)",
        method_callers=("vfs_write", "new_sync_write", "vfs_iter_write", "vfs_iocb_iter_write")),
    "open": OpKnowledge(
        ("do_filp_open", "path_openat", "do_dentry_open", "vfs_open"),
        (r"{p}_file_open", r"{p}_atomic_open"),
        (r"{p}_do_open", r"_{p}_do_open", r"{p}_open_context"),
        (), ("atomic_open",),
        "->open of every open(2) that reaches the filesystem (nfs_file_open v2/v3, nfs4_file_open v4) AND, "
        "where the filesystem has one, ->atomic_open for opens that create or first look up the name "
        "(NFSv4 OPEN)",
        "the filesystem's open checks and state (OPEN/ACCESS/GETATTR RPCs as needed on NFS)",
        method_callers=("do_dentry_open",)),
    "getattr": OpKnowledge(
        ("vfs_getattr", "vfs_getattr_nosec", "vfs_statx"),
        (r"{p}_getattr", r"{p}_file_getattr"),
        (r"__{p}_revalidate_inode", r"{p}_proc_getattr", r"_{p}_proc_getattr"),
        ("getattr",), ("revalidate_inode",),
        "stat(2)/statx(2)/fstat(2) (->getattr); on NFS cached attributes return without an RPC",
        "reading the inode's attributes (on NFS: attribute cache check, flush of dirty data for mtime, "
        "GETATTR RPC when stale)",
        method_callers=("vfs_getattr_nosec",)),
    "fsync": OpKnowledge(
        ("vfs_fsync_range", "do_fsync"),
        (r"{p}_file_fsync", r"{p}_fsync", r"{p}_sync_file"),
        (r"{p}_commit_inode", r"__{p}_commit_inode", r"file_write_and_wait_range"),
        ("fsync",), ("writeback_inode",),
        "fsync(2)/fdatasync(2) and the implicit sync of O_SYNC/O_DSYNC writes",
        "writing back dirty pages and waiting for them, then the journal or log commit and cache flush "
        "(on NFS: WRITE RPCs, then COMMIT)",
        method_callers=("vfs_fsync_range",)),
    "commit": OpKnowledge(
        (),
        (r"{p}_commit_inode", r"__{p}_commit_inode"),
        (r"{p}_initiate_commit", r"{p}_commit_done"),
        ("commit",), (),
        "COMMIT RPCs from every path: fsync, close, O_SYNC and writeback in kworkers "
        "(the completion runs in an rpciod kworker, not in the caller)",
        "from sending the COMMIT RPC to its completion callback (server stable-storage time)",
        "synchronous commits only (fsync, O_SYNC, close with FLUSH_SYNC): a commit started by "
        "writeback in a kworker returns before the COMMIT completes"),
    "lookup": _metadata(("lookup_open", "__lookup_slow", "lookup_one_len"), "lookup",
                        "->lookup of a name not in the dentry cache (open, stat, unlink... of a new name); "
                        "not the revalidation of a cached dentry (d_revalidate)",
                        "LOOKUP RPC (GETATTR with it on NFSv4)", deeper=(r"{p}_lookup_revalidate",)),
    "create": _metadata(("lookup_open", "vfs_create"), "create",
                        "->create: open(O_CREAT)/creat(2) of a new file where the filesystem has no "
                        "->atomic_open for it (NFSv2/v3); NFSv4 creates go through ->atomic_open (open)",
                        "CREATE RPC and the attributes of the new file"),
    "unlink": _metadata(("vfs_unlink", "do_unlinkat"), "unlink", "unlink(2)/unlinkat(2) of a file (->unlink)",
                        "REMOVE RPC (or a silly-rename of a file still open)"),
    "rename": _metadata(("vfs_rename", "do_renameat2"), "rename", "rename(2)/renameat2(2) (->rename)",
                        "RENAME RPC"),
    "mkdir": _metadata(("vfs_mkdir", "do_mkdirat"), "mkdir", "mkdir(2) (->mkdir)", "MKDIR RPC"),
    "rmdir": _metadata(("vfs_rmdir", "do_rmdir"), "rmdir", "rmdir(2) (->rmdir)", "RMDIR RPC"),
    "setattr": _metadata(("notify_change",), "setattr",
                         "chmod/chown/utimes/truncate (->setattr, via notify_change)",
                         "flush of dirty data for a size change, SETATTR RPC"),
    "readdir": OpKnowledge(("iterate_dir",), (r"{p}_readdir",), (r"{p}_readdir_xdr_to_array",), (), (),
                           "getdents64(2) (->iterate_shared): one call per buffer the reader asks for",
                           "directory cache fill: READDIR/READDIRPLUS RPCs when the cache is cold"),
    "access": _metadata(("inode_permission",), "permission",
                        "permission checks on the path walk and open (->permission); cached answers return "
                        "without an RPC", "ACCESS RPC on a cache miss", deeper=(r"{p}_do_access",), tp=("access",)),
    "link": _metadata(("vfs_link", "do_linkat"), "link", "link(2)/linkat(2) (->link)", "LINK RPC"),
    "symlink": _metadata(("vfs_symlink", "do_symlinkat"), "symlink", "symlink(2) (->symlink)", "SYMLINK RPC"),
    "rpc": OpKnowledge(
        (), (), (), (), (),
        "every RPC of the filesystem's client (sunrpc): the calls behind every operation above, "
        "including those kworkers and rpciod start on a process's behalf (writeback WRITE, COMMIT, "
        "read-ahead READ, lease RENEW)",
        "from the RPC's first transmit request to the end of its task (retransmissions, "
        "reconnects and a server that does not answer all fall inside)",
        tp_beneath=(("sunrpc", "rpc_request", "rpc_task_end", ("task_id", "client_id")),)),
}

#: attach points the established tools use (facts: bcc tools/nfsslower.py, tools/nfsdist.py
#: attach kprobe+kretprobe; libbpf-tools fsslower/fsdist -t nfs use fentry/fexit with a
#: kprobe fallback)
ESTABLISHED: Dict[str, Dict[str, Tuple[str, ...]]] = {
    "nfs": {
        "read": ("nfs_file_read",), "write": ("nfs_file_write",),
        "open": ("nfs_file_open", "nfs4_file_open"), "getattr": ("nfs_getattr",),
        "fsync": ("nfs_file_fsync",),
    },
}
#: functions whose names look like entries but are called by another entry (facts from the
#: 6.1 call graphs: nfs_atomic_open calls the v4 rpc_ops->open_context nfs4_atomic_open)
NESTED: Dict[str, Dict[str, str]] = {"nfs": {"nfs4_atomic_open": "nfs_atomic_open"}}
ESTABLISHED_BY = "bcc nfsslower/nfsdist (kprobes) and libbpf-tools fsslower/fsdist (fentry)"

#: the NFS server (knfsd): its procedures and COMPOUND operations through its dispatcher
NFSD_DISPATCH = ("nfsd_dispatch", "nfsd4_proc_compound")


def _nfsd(v3: Tuple[str, ...], v4: Tuple[str, ...], what: str, window: str, tp: Tuple[str, ...] = (),
          deeper: Tuple[str, ...] = ()) -> OpKnowledge:
    """One kind of NFS request on the server: the NFSv3 procedures (nfsd3_proc_*) and the
    NFSv4 operations (nfsd4_*) that do it, which nfsd_dispatch and nfsd4_proc_compound call
    through their procedure and operation tables."""
    return OpKnowledge((), tuple(rf"nfsd3_proc_{n}" for n in v3) + tuple(rf"nfsd4_{n}" for n in v4), deeper,
                       tp, (), what, window, method_callers=NFSD_DISPATCH)


NFSD_KNOWLEDGE: Dict[str, OpKnowledge] = {
    "v4op": OpKnowledge(
        (), (), (), (), (),
        "every NFSv4 operation of a COMPOUND that nfsd runs (SEQUENCE, PUTFH, OPEN, READ, READ_PLUS, WRITE, "
        "CLOSE, REMOVE, GETATTR...); not those after the first that fails, which nfsd does not run",
        "from the previous operation's end (the first: from the request's dispatch, its decoding included) "
        "to this one's end, its reply encoded",
        tp_each=(("nfsd", "nfsd_compound_status", "nfsd4_proc_compound"),)),
    "rpc": OpKnowledge(
        (), (r"nfsd_dispatch",), (r"nfsd4_proc_compound",), (), (),
        "every request of the NFS service from receipt to reply: NFSv3 procedures and NFSv4 COMPOUNDs "
        "whole (the COMPOUND's operations, and for READ and READDIR the data read while the reply is "
        "encoded, are inside)",
        "decoding the arguments, the procedure or every operation of the COMPOUND, encoding the reply",
        func_coverage="every request of the NFS service (NFSv3 procedures, NFSv4 COMPOUNDs, NFSACL): "
                      "from the decoded call to the encoded reply",
        tp_beneath=(("sunrpc", "svc_process", "svc_send", ()),),
        context=("fh_verify",),
        beneath_note="svc_process and svc_send fire for every RPC service of the host (nfsd, nfsacl, lockd, "
                     "the NFSv4 callback; the `service` field of svc_process names it), and a request the "
                     "server drops (a duplicate in progress, a deferred call: svc_drop) never fires svc_send, "
                     "so it would look in progress until its thread's next request: ranked below nfsd's "
                     "own entry, whose return ends every request"),
    "read": _nfsd(("read",), ("read",), "READ (NFSv3 procedure; NFSv4 READ, and NFSv4.2 READ_PLUS, "
                                        "which nfsd4_read does too)",
                  "reading the file: page cache or the exported filesystem's device", tp=("read",),
                  deeper=(r"nfsd_read", r"nfsd_splice_read", r"nfsd_iter_read")),
    "write": _nfsd(("write",), ("write",), "WRITE (NFSv3 procedure, NFSv4 operation)",
                   "writing the file (and for stable writes its sync to the exported filesystem)",
                   tp=("write",), deeper=(r"nfsd_write", r"nfsd_vfs_write")),
    "commit": _nfsd(("commit",), ("commit",), "COMMIT (NFSv3 procedure, NFSv4 operation)",
                    "syncing the file's unstable writes to the exported filesystem", tp=("commit",),
                    deeper=(r"nfsd_commit",)),
    "getattr": _nfsd(("getattr",), ("getattr",), "GETATTR (NFSv3 procedure, NFSv4 operation)",
                     "reading the attributes (NFSv4: their encoding is in the reply, after the operation)"),
    "lookup": _nfsd(("lookup",), ("lookup",), "LOOKUP (NFSv3 procedure, NFSv4 operation)",
                    "the name's lookup in the exported directory"),
    "open": _nfsd((), ("open",), "NFSv4 OPEN (NFSv3 has none): opens, and creates of regular files",
                  "state and share checks, lookup or create, and the open of the file"),
    "create": _nfsd(("create", "mknod"), ("create",),
                    "NFSv3 CREATE and MKNOD; NFSv4 CREATE (directories, symlinks, special files: NFSv4 "
                    "creates regular files with OPEN)", "the create in the exported filesystem"),
    "unlink": _nfsd(("remove",), ("remove",), "NFSv3 REMOVE; NFSv4 REMOVE (files and directories)",
                    "the unlink in the exported filesystem"),
    "rename": _nfsd(("rename",), ("rename",), "RENAME (NFSv3 procedure, NFSv4 operation)",
                    "the rename in the exported filesystem"),
    "mkdir": _nfsd(("mkdir",), (), "NFSv3 MKDIR (NFSv4 makes directories with CREATE)",
                   "the mkdir in the exported filesystem"),
    "rmdir": _nfsd(("rmdir",), (), "NFSv3 RMDIR (NFSv4 removes directories with REMOVE)",
                   "the rmdir in the exported filesystem"),
    "setattr": _nfsd(("setattr",), ("setattr",), "SETATTR (NFSv3 procedure, NFSv4 operation)",
                     "the attribute change, truncation included"),
    "readdir": _nfsd(("readdir", "readdirplus"), ("readdir",),
                     "NFSv3 READDIR and READDIRPLUS; NFSv4 READDIR, whose entries are read while the "
                     "reply is encoded, after the operation returns",
                     "reading the directory (NFSv4: checks only, the entries come with the reply)"),
    "access": _nfsd(("access",), ("access",), "ACCESS (NFSv3 procedure, NFSv4 operation)",
                    "the permission checks"),
    "link": _nfsd(("link",), ("link",), "LINK (NFSv3 procedure, NFSv4 operation)",
                  "the link in the exported filesystem"),
    "symlink": _nfsd(("symlink",), (), "NFSv3 SYMLINK (NFSv4 makes symlinks with CREATE)",
                     "the symlink in the exported filesystem"),
}
#: int returns that are no errno: nfsd_dispatch's 1 = send the reply, 0 = drop it
NOT_ERRNO = {"nfsd_dispatch"}
#: what each filesystem's operations are, where it is not the client-side VFS table
KNOWLEDGE_BY_FS: Dict[str, Dict[str, OpKnowledge]] = {"nfsd": NFSD_KNOWLEDGE}


class Candidate(NamedTuple):
    kind: str  # tracepoint | fentry | kprobe
    attach: List[Dict[str, Any]]
    match: str  # task | keys
    keys: List[str]
    module: str
    layer: str  # fs-entry | fs-partial | deeper
    stability: str
    coverage: str
    traceability: str
    window: str
    evidence: str
    reasons: List[str]
    usable: bool

    def spec(self) -> Dict[str, Any]:
        """The candidate as the probe spec stores it."""
        out: Dict[str, Any] = {"kind": self.kind, "match": self.match}
        if self.keys:
            out["keys"] = self.keys
        out.update(module=self.module, stability=self.stability, coverage=self.coverage,
                   traceability=self.traceability, window=self.window, evidence=self.evidence,
                   reasons=self.reasons, attach=self.attach)
        return out


OUTSIDE = "<outside the traced calls>"
CUT = "<a call cut at the start of the trace>"


class CallGraphs:
    """Call graphs as evidence: node-link JSON from `discover callgraph --format json`, or
    raw function_graph traces (`*.trace`, `*.trace.gz`) captured with events enabled."""

    def __init__(self) -> None:
        self.edges: Dict[str, Dict[str, float]] = {}  # caller -> {callee: total time}
        self.modules: Dict[str, Optional[str]] = {}
        self.callers: Dict[str, Set[str]] = {}
        #: event -> {(function or OUTSIDE, depth): times seen}
        self.event_sites: Dict[str, Dict[Tuple[str, int], int]] = {}
        #: (caller, callee) -> the module sets seen above the caller on the paths where it
        #: made that call (traces only: a path tree; a node-link graph has no paths)
        self.call_contexts: Dict[Tuple[str, str], Set[FrozenSet[str]]] = {}
        self.files: List[str] = []

    @staticmethod
    def graph_files(directory: Path) -> List[Path]:
        """The files of a --callgraphs directory that are read (call graphs JSON, traces)."""
        if not directory.is_dir():
            return []
        return sorted(p for p in directory.iterdir() if p.name.endswith((".json", ".trace", ".trace.gz")))

    @classmethod
    def load_dir(cls, directory: Path) -> "CallGraphs":
        graphs = cls()
        if not directory.is_dir():
            raise UserError(f"{directory}: no such call-graph directory")
        files = cls.graph_files(directory)
        if not files:
            raise UserError(f"{directory}: no call graphs (*.json from `discover callgraph --format json`, "
                            f"or function_graph *.trace files)")
        for path in files:
            if path.name.endswith(".json"):
                graphs.add_json(path)
            else:
                graphs.add_trace(path)
        return graphs

    def _site(self, event: str, function: Optional[str], depth: int, count: int = 1) -> None:
        sites = self.event_sites.setdefault(event.split(":")[-1], {})
        if function == "?":  # the parser's placeholder for a call whose entry was cut off
            function = CUT
        key = (function or OUTSIDE, depth if function and function != CUT else -1)
        sites[key] = sites.get(key, 0) + count

    def _add_graph(self, nodes: Iterable[Dict[str, Any]], links: Iterable[Dict[str, Any]],
                   with_events: bool) -> None:
        for node in nodes:
            name, module = _split_module(str(node.get("id")))
            self.modules.setdefault(name, node.get("module") or module)
            if with_events:
                for event, count in (node.get("events") or {}).items():
                    self._site(event, name, int(node.get("min_depth", -1)), int(count))
        for link in links:
            src = _split_module(str(link.get("source")))[0]
            dst = _split_module(str(link.get("target")))[0]
            weight = float(link.get("total_us", link.get("calls", 1)) or 0)
            self.edges.setdefault(src, {})[dst] = self.edges.get(src, {}).get(dst, 0.0) + weight
            self.callers.setdefault(dst, set()).add(src)

    def add_json(self, path: Path) -> None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as exc:
            raise UserError(f"{path}: not a call graph JSON file ({exc.__class__.__name__})") from None
        nodes, links = node_link_parts(data, str(path))
        self.files.append(path.name)
        self._add_graph(nodes, links, with_events=True)

    def add_trace(self, path: Path) -> None:
        """A function_graph trace: the parser places each event in the call it fired in."""
        from discover.callgraph import to_digraph, to_node_link
        from discover.funcgraph import FuncgraphParser

        parser = FuncgraphParser(on_event=lambda ev: self._site(ev.name, ev.function, ev.depth))
        opener = gzip.open if path.name.endswith(".gz") else open
        try:
            with opener(path, "rt", encoding="utf-8", errors="replace") as fh:  # type: ignore[operator]
                parser.feed(fh)
        except (OSError, EOFError, zlib.error) as exc:
            raise UserError(f"{path}: cannot read trace: {exc}") from None
        tree = parser.finish()
        if tree.is_empty():
            raise UserError(f"{path}: no function_graph calls in this trace")
        self.files.append(path.name)
        stack = [(node, frozenset()) for node in tree.root.children.values()]
        while stack:  # each path once: which modules lie above each call
            node, above = stack.pop()
            below = above | {node.module} if node.module else above
            for child in node.children.values():
                self.call_contexts.setdefault((node.name, child.name), set()).add(above)
                stack.append((child, below))
        data = to_node_link(to_digraph(tree.root))
        self._add_graph(data["nodes"], data["links"], with_events=False)

    def sites(self, event: str) -> Dict[Tuple[str, int], int]:
        return dict(self.event_sites.get(event, {}))

    def outermost(self, modules: Set[str]) -> List[str]:
        """Functions of `modules` not called from another function of `modules`: the fs entries."""
        inside = [n for n, m in self.modules.items() if m in modules]
        return sorted(n for n in inside if not any(self.modules.get(c) in modules for c in self.callers.get(n, ())))

    def callees(self, function: str, modules: Set[str]) -> List[str]:
        """Direct callees in `modules`, heaviest first."""
        out = self.edges.get(function, {})
        return [n for n, _ in sorted(out.items(), key=lambda kv: -kv[1]) if self.modules.get(n) in modules]

    def calls(self, caller: str, callee: str) -> bool:
        return callee in self.edges.get(caller, {})

    def calls_outside(self, caller: str, callee: str, modules: Set[str]) -> bool:
        """Whether caller called callee on a path with no function of `modules` above it (a
        trace's paths; a node-link graph, without paths, says only that it called it)."""
        contexts = self.call_contexts.get((caller, callee))
        if contexts is None:
            return self.calls(caller, callee)
        return any(not (above & modules) for above in contexts)


def _split_module(name: str) -> Tuple[str, Optional[str]]:
    match = re.match(r"^(\S+)\s+\[(\S+)\]$", name.strip())
    return (match.group(1), match.group(2)) if match else (name.strip(), None)


# ---------------------------------------------------------------------------------------
def fs_modules(profile: KernelProfile, fs: str) -> List[str]:
    """The client modules of a filesystem: `nfs` and its version modules `nfsv3`, `nfsv4`."""
    pattern = re.compile(rf"^{re.escape(fs)}(v\d+)?$")
    loaded = [m for m in profile.modules if pattern.match(m)]
    if not profile.modules and profile.unavailable("modules"):
        # no module list in the profile: fall back to the modules traceable functions live in
        seen = {m for name in profile.functions_matching(f"{fs}*") for m in profile.function_modules(name)}
        loaded = sorted(m for m in seen if m and pattern.match(m))
    return sorted(loaded)


def check_filesystem(profile: KernelProfile, fs: str) -> List[str]:
    modules = fs_modules(profile, fs)
    prefix = rf"_*{re.escape(fs)}\d*"
    entry_res = [re.compile("^" + p.replace("{p}", prefix) + "$")
                 for know in KNOWLEDGE_BY_FS.get(fs, KNOWLEDGE).values() for p in know.entries]
    builtin = [n for n in profile.functions_in(None) if any(r.match(n) for r in entry_res)]
    if fs in modules or builtin:
        return modules
    if fs not in KNOWN_FILESYSTEMS and not profile.functions_matching(f"{fs}_*"):
        raise UserError(f"unknown filesystem {fs!r}: no {fs}_* functions and no module {fs} on "
                        f"{profile.release} (known: {', '.join(sorted(KNOWN_FILESYSTEMS))})")
    raise UserError(f"filesystem module {fs} is not loaded on {profile.release} "
                    f"(`modprobe {fs}` or mount one, then retry)")


KNOWN_FILESYSTEMS = {"nfs", "ext4", "xfs", "btrfs", "f2fs", "cifs", "fuse", "ceph", "zfs"}


def check_fs_name(fs: str) -> None:
    """FS must be a filesystem type's name before it is made into patterns and advice:
    an empty one otherwise reads as "module  is not loaded (`modprobe `...)"."""
    if not re.fullmatch(r"[A-Za-z0-9_]+", fs):
        raise UserError(f"FS {fs!r}: not a filesystem type name (letters, digits, _; as /proc/filesystems "
                        f"lists them: {', '.join(sorted(KNOWN_FILESYSTEMS))})")


class Proposer:
    """Ranks candidates for the operations of one filesystem on one kernel profile."""

    def __init__(self, profile: KernelProfile, fs: str, graphs: Optional[CallGraphs] = None) -> None:
        self.profile = profile
        self.fs = fs
        self.graphs = graphs
        self.modules = check_filesystem(profile, fs)
        self.module_set: Set[Optional[str]] = set(self.modules) or {None}
        self.prefix = rf"_*{re.escape(fs)}\d*"
        self.pairs: Dict[str, List[EventPair]] = {}
        for system in profile.event_systems():
            if system == fs or re.match(rf"^{re.escape(fs)}\d+$", system):
                self.pairs[system] = find_pairs(system, profile.events[system])
        self.established = ESTABLISHED.get(fs, {})
        self.knowledge = KNOWLEDGE_BY_FS.get(fs, KNOWLEDGE)

    # helpers ---------------------------------------------------------------------------
    def _functions(self, patterns: Sequence[str]) -> List[str]:
        """Traceable functions of the filesystem's modules whose name matches a pattern."""
        regexes = [re.compile("^" + p.replace("{p}", self.prefix) + "$") for p in patterns]
        names: List[str] = []
        for module in self.module_set:
            for name in self.profile.functions_in(module):
                if any(r.match(name) for r in regexes) and name not in names:
                    names.append(name)
        for regex in regexes:  # clone-only functions (.isra/.constprop) by their base name
            for module in self.module_set:
                for name in self.profile.functions_in(module):
                    base = name.split(".")[0]
                    if "." in name and regex.match(base) and base not in names and name not in names:
                        names.append(name)
        return sorted(names)

    def _module_of(self, function: str) -> str:
        mods = self.profile.function_modules(function)
        return next((m for m in sorted(mods, key=str) if m), "vmlinux")

    def _can_fentry(self, function: str) -> Tuple[bool, str]:
        prof = self.profile
        if prof.machine not in ("x86_64", "aarch64", "?"):
            return False, f"fentry trampolines not on {prof.machine}"
        if prof.has_config:
            for option in ("CONFIG_DEBUG_INFO_BTF", "CONFIG_DYNAMIC_FTRACE_WITH_DIRECT_CALLS",
                           "CONFIG_BPF_JIT"):
                if prof.config(option) != "y":
                    return False, f"{option} is not set"
            if self._module_of(function) != "vmlinux" and prof.config("CONFIG_DEBUG_INFO_BTF_MODULES") != "y":
                return False, "CONFIG_DEBUG_INFO_BTF_MODULES is not set"
        if prof.btf_function(function) is None:
            why = prof.unavailable("btf") or "no BTF prototype recorded in the profile"
            return False, f"no BTF for {function}: {why}"
        return True, "BTF prototype present"

    def _kprobe_problems(self, function: str) -> List[str]:
        problems = []
        if self.profile.has_config and self.profile.config("CONFIG_KPROBES") != "y":
            problems.append("CONFIG_KPROBES is not set")
        if self.profile.blacklisted(function):
            problems.append("in the kprobe blacklist")
        return problems

    def _stability(self, function: str, op: str) -> str:
        sym = self.profile.symbol_type(function)
        parts = []
        if function in self.established.get(op, ()):
            parts.append(f"used by {ESTABLISHED_BY}: a long-lived file_operations name")
        if self._module_of(function) != "vmlinux":
            pass  # kallsyms marks module symbols lowercase whether static or not: no signal
        elif sym == "T":
            parts.append("global symbol")
        elif sym == "t":
            parts.append("static (file-local) symbol: may be renamed or inlined by a later kernel")
        if "." in function:
            parts.append("compiler copy: the name suffix changes between builds")
        return "; ".join(parts) or "kernel-internal function: may change between kernels"

    def _traceability(self, function: str) -> Tuple[bool, str]:
        prof = self.profile
        notes = []
        ok = prof.traceable(function)
        notes.append("in available_filter_functions" if ok else "NOT in available_filter_functions "
                     "(inlined, notrace, or its module is not loaded)")
        if prof.has_blacklist:
            if prof.blacklisted(function):
                ok = False
                notes.append("kprobe-blacklisted")
            else:
                notes.append("not kprobe-blacklisted")
        else:
            notes.append("kprobe blacklist unknown (" + (prof.unavailable("kprobe_blacklist") or "not captured") + ")")
        clones = [c for c in prof.clones(function.split(".")[0]) if c != function]
        if clones:
            notes.append("compiler copies also exist: " + ", ".join(clones[:3]))
        return ok, "; ".join(notes)

    def _arg_roles(self, function: str, op: str, at_return: bool = False) -> Dict[str, str]:
        """Which argument gives the file/dentry/offset/bytes, from the BTF prototype. An
        operation's arguments are read when it starts, when a file handle is not yet
        resolved to its export: only a context point, read when it returns, gives that."""
        btf = self.profile.btf_function(function)
        if btf is None or "." in function:
            return {}
        roles: Dict[str, str] = {}
        for name, ctype in btf["params"]:
            bare = ctype.replace("const ", "").strip()
            if bare.startswith("struct ") and bare.endswith(" *") and bare.count("*") == 1:
                add_pointer_roles(roles, name, bare[len("struct "):-2].strip())
            elif bare == "loff_t" and name in ("pos", "offset", "start"):
                roles.setdefault("offset", name)
        if not at_return:
            roles.pop("export", None)
        ret = btf["return"]
        if op in ("read", "write") and ret in ("ssize_t", "long int", "long"):
            roles["bytes"] = "retval"
        elif ret == "int" and function not in NOT_ERRNO:
            roles["error"] = "retval"
        return roles

    def _evidence(self, pair: EventPair, op: str) -> Tuple[str, List[str]]:
        """Where the pair fired in the call graphs, and what that says about the choice."""
        if self.graphs is None:
            return (f"no call graph given: that {pair.start}/{pair.end} bracket the operation is inferred "
                    f"from their names; capture function_graph with the {pair.system} events enabled "
                    f"and pass it with --callgraphs to check"), []
        start, end = self.graphs.sites(pair.start), self.graphs.sites(pair.end)
        if not start and not end:
            return f"{pair.start}/{pair.end} did not fire in the given captures", []

        def spell(event: str, sites: Dict[Tuple[str, int], int]) -> str:
            return f"{event} fired " + ", ".join(
                f"{n}x in {fn}" + (f" (depth {d})" if d >= 0 else "")
                for (fn, d), n in sorted(sites.items(), key=lambda kv: -kv[1]))

        evidence = "; ".join(spell(e, s) for e, s in ((pair.start, start), (pair.end, end)) if s)
        notes: List[str] = []
        inside = {fn for fn, _ in start} & {fn for fn, _ in end}
        entries = set(self._entry_functions(op, self.knowledge[op])[0])
        bracketed = sorted(inside & entries)
        if bracketed and pair.kind == "sync":
            used = [fn for fn in bracketed if fn in self.established.get(op, ())]
            notes.append(f"start and end fire inside {', '.join(bracketed)} itself: the pair times the same "
                         f"call as a kprobe there, without depending on a function name")
            if used:
                notes.append(f"preferred over the kprobe on {', '.join(used)} that {ESTABLISHED_BY} use: "
                             f"same window (evidence above), stable tracepoint ABI, no kprobe overhead")
        if pair.kind == "async" and OUTSIDE in {fn for fn, _ in end}:
            notes.append(f"{pair.end} fires outside the traced calls (RPC completion in another task): "
                         f"start and end must be matched on {', '.join(pair.keys)}, not on the thread")
        return evidence, notes

    # candidates -----------------------------------------------------------------------
    def _tracepoint(self, pair: EventPair, op: str, layer: str, know: OpKnowledge) -> Candidate:
        fields = {f["name"] for f in (self.profile.event(pair.system, pair.start) or {}).get("fields") or []}
        exit_fields = {f["name"] for f in (self.profile.event(pair.system, pair.end) or {}).get("fields") or []}
        args: Dict[str, str] = {}
        for role, names in (("fileid", ("fileid", "ino")), ("dev", ("dev",)), ("offset", ("offset",)),
                            ("bytes", ("count",)), ("name", ("name", "procname", "procedure")),
                            ("client", ("addr",))):
            found = next((n for n in names if n in fields), None)  # the first name a format has
            if found:
                args[role] = found
        if "res_count" in exit_fields:
            args["bytes"] = "exit.res_count"
        elif "len" in exit_fields and "len" in fields and "offset" in fields:  # nfsd_read_start/_done: asked, done
            args["bytes"] = "exit.len"
        error = next((n for n in ("error", "ret") if n in exit_fields), None)
        if error:
            args["error"] = f"exit.{error}"
        exit_name = next((n for n in ("name", "old_name") if n in exit_fields), None)
        if pair.kind == "sync" and exit_name:
            args["name"] = f"exit.{exit_name}"  # read at the end, only for the operations printed
        evidence, notes = self._evidence(pair, op)
        async_note = ("async: the end fires in another task (RPC completion in rpciod/kworker); "
                      f"match on {', '.join(pair.keys)}") if pair.kind == "async" else "same task: match on tid"
        reasons = [f"tracepoint pair {pair.system}:{pair.start} / {pair.system}:{pair.end}", async_note] + notes
        if layer != "fs-entry":
            reasons.append("brackets only part of the operation or a deeper step: see coverage")
        module = self.fs if pair.system.startswith(self.fs) else pair.system
        return Candidate(
            "tracepoint",
            [{"entry": f"{pair.system}:{pair.start}", "exit": f"{pair.system}:{pair.end}",
              "entry_kind": "tracepoint", "exit_kind": "tracepoint", "module": module,
              "optional": False, "args": args}],
            "keys" if pair.kind == "async" else "task", list(pair.keys) if pair.kind == "async" else [],
            module, layer, "stable: tracepoint (name and fields are kernel ABI in practice)",
            know.coverage if layer == "fs-entry" else _partial_coverage(pair, op),
            "event present in available_events", know.window if layer == "fs-entry" else
            f"between {pair.start} and {pair.end}", evidence, reasons, True)

    def _each_tracepoint(self, system: str, event: str, caller: str, know: OpKnowledge) -> Candidate:
        """A tracepoint at the end of each step of a request (OpKnowledge.tp_each): one event
        both ends the step and, on the same task, starts the next."""
        fields = {f["name"] for f in (self.profile.event(system, event) or {}).get("fields") or []}
        sites = self.graphs.sites(event) if self.graphs is not None else {}
        if self.graphs is None:
            evidence = (f"no call graph given: that {event} fires after each step in {caller} is inferred from "
                        f"its name; capture function_graph with the {system} events enabled to check")
        elif not sites:
            evidence = f"{event} did not fire in the given captures"
        else:
            evidence = f"{event} fired " + ", ".join(
                f"{n}x in {fn}" + (f" (depth {d})" if d >= 0 else "")
                for (fn, d), n in sorted(sites.items(), key=lambda kv: -kv[1]))
        reasons = [f"one tracepoint at each step's end, {system}:{event} in {caller}: the steps' own functions are "
                   "called through a table, one function each, and the event names the step",
                   "same task: the step runs from the previous step's end on the request's thread"]
        return Candidate(
            "tracepoint",
            [{"entry": f"{system}:{event}", "exit": f"{system}:{event}", "entry_kind": "tracepoint",
              "exit_kind": "tracepoint", "module": self.fs if system.startswith(self.fs) else system,
              "optional": False, "args": {"name": "name"} if "name" in fields else {}}],
            "task", [], self.fs if system.startswith(self.fs) else system, "fs-entry",
            "stable: tracepoint (name and fields are kernel ABI in practice)", know.coverage,
            "event present in available_events", know.window, evidence, reasons, "name" in fields)

    def _functions_candidate(self, kind: str, functions: List[str], op: str, layer: str,
                             know: OpKnowledge, evidence: str) -> Candidate:
        attach = []
        reasons: List[str] = []
        notes = []
        usable_any = False
        for fn in functions:
            module = self._module_of(fn)
            loaded = module == "vmlinux" or self.profile.module_loaded(module) or not self.profile.modules
            ok, trace_note = self._traceability(fn)
            problems = self._kprobe_problems(fn) if kind == "kprobe" else []
            if kind == "fentry":
                can, why = self._can_fentry(fn)
                if not can:
                    problems.append(why)
            usable = ok and loaded and not problems
            usable_any = usable_any or usable
            notes.append(f"{fn} [{module}]: {trace_note}")
            if problems:
                reasons.append(f"{fn}: " + "; ".join(problems))
            if not loaded:
                reasons.append(f"{fn}: module {module} not loaded")
            if "." in fn:
                reasons.append(f"{fn}: only a compiler copy is traceable; GCC may have dropped or "
                               f"reordered its arguments (isra), so argument roles are not derived")
            if usable:
                ends = {"fentry": ("fentry", "fexit"), "kprobe": ("kprobe", "kretprobe")}[kind]
                attach.append({"entry": fn, "exit": fn, "entry_kind": ends[0], "exit_kind": ends[1],
                               "module": module, "optional": len(functions) > 1,
                               "args": self._arg_roles(fn, op, at_return=layer == "context")})
        if len(functions) > 1:
            reasons.append("attach all of them: each covers one path/version (" + ", ".join(functions) + ")")
        established = [fn for fn in functions if fn in self.established.get(op, ())]
        if established:
            reasons.append(f"same attach point as {ESTABLISHED_BY}: " + ", ".join(established))
            for fn in functions:
                if fn not in established and fn.endswith("_atomic_open"):
                    seen = self.graphs is not None and fn in self.graphs.outermost(set(self.modules))
                    reasons.append(f"{fn} added to what those tools attach: NFSv4 opens that create or first look up "
                                   f"a name take ->atomic_open and skip ->open (nfs4_file_open), so they would be missed"
                                   + (" (it is an outermost nfs call in the given captures)" if seen else ""))
        if kind == "fentry":
            reasons.append("fentry/fexit: typed BTF arguments, lower overhead than kprobes")
        modules = sorted({self._module_of(fn) for fn in functions})
        return Candidate(
            kind, attach, "task", [], ",".join(modules), layer,
            "; ".join(sorted({self._stability(fn, op) for fn in functions})),
            (know.func_coverage or know.coverage) if layer in ("fs-entry", "context")
            else f"deeper step of {op}: part of the operation only",
            " | ".join(notes), know.window if layer in ("fs-entry", "context") else
            "inside the filesystem, below its entry: excludes work done before/after this call",
            evidence, reasons, usable_any and bool(attach))

    def _entry_functions(self, op: str, know: OpKnowledge) -> Tuple[List[str], str]:
        """Entry functions below VFS; a function called by another entry is not an entry."""
        nested = NESTED.get(self.fs, {})
        # names that fit, and what the call graph shows VFS calling as the method (xfs_vn_getattr)
        via_vfs = self._called_by_vfs(know) if self.graphs is not None else []
        found = self._functions(know.entries)
        found += [fn for fn in via_vfs if fn not in found]
        by_name = [fn for fn in found
                   if nested.get(fn) not in found
                   and not (fn.startswith("__") and fn[2:] in found)
                   and not (self.graphs and any(self.graphs.calls(other, fn) for other in found))]
        if self.graphs is None:
            return by_name, ("no call graph given: entry functions found by name in "
                             "available_filter_functions of " + ", ".join(self.modules or ["vmlinux"]))
        outer = set(self.graphs.outermost(set(self.modules)))
        seen = [fn for fn in by_name if fn in outer or fn in via_vfs]
        callers = [c for c in know.method_callers if any(self.graphs.calls(c, fn) for fn in seen)]
        if seen and know.method_callers == NFSD_DISPATCH:
            return by_name, (f"{self.fs} function(s) the call graphs show " + "/".join(callers or know.method_callers)
                             + " calling for this request: " + ", ".join(seen)
                             + ("" if len(seen) == len(by_name) else
                                "; the others found by name (their path was not exercised)"))
        if seen:
            return by_name, ("outermost " + self.fs + " function(s) in the call graphs: " + ", ".join(seen)
                             + (" (called by " + "/".join(callers) + ", where VFS calls the operation's method)"
                                if callers else "")
                             + ("" if len(seen) == len(by_name) else
                                "; the others found by name (their path was not exercised)"))
        return by_name, "not reached in the given call graphs: found by name only"

    def _beneath(self, system: str) -> bool:
        """Whether the module of an event system is one the filesystem's modules use (sunrpc
        under nfs, not under xfs); without a module list, whether it is loaded at all."""
        module = self.profile.modules.get(system)
        if module is None:
            return not self.profile.modules
        return bool(set(module.get("used_by") or []) & set(self.modules))

    def _brackets(self, pair: EventPair, entries: List[str]) -> bool:
        """Whether the call graphs show a same-task pair firing, start and end, in every entry
        function of the operation and nowhere else inside the traced calls (ext4_sync_file_enter
        and _exit in ext4_sync_file): it then brackets the whole operation, whatever its name.
        A pair seen in one entry of several (nfs_atomic_open_enter) brackets only that path."""
        if self.graphs is None or pair.kind != "sync" or not entries:
            return False
        def seen_in(event: str) -> Set[str]:  # where it fired inside the traced calls
            return {fn for fn, _ in self.graphs.sites(event) if fn not in (OUTSIDE, CUT)} if self.graphs else set()
        start, end = seen_in(pair.start), seen_in(pair.end)
        return start == set(entries) and end == set(entries)

    def _called_by_vfs(self, know: OpKnowledge) -> List[str]:
        """Traceable functions of the filesystem the call graphs show VFS calling as this
        operation's method (the entry, whatever the filesystem named it), on a path where no
        function of the filesystem was already running: an nfs helper that nfs_atomic_open
        hands to finish_open reaches do_dentry_open too, but from inside nfs."""
        assert self.graphs is not None
        modules = set(self.modules)
        named = set(self._functions(know.entries))
        found = []
        for caller in know.method_callers:
            # the filesystem's own dispatcher (nfsd_dispatch) calls every procedure: of its
            # callees, those named for this operation; VFS calls only this operation's method
            own = self.graphs.modules.get(caller) in modules
            found += [fn for fn in self.graphs.callees(caller, modules)
                      if self.profile.traceable(fn) and fn not in found
                      and (fn in named if own else self.graphs.calls_outside(caller, fn, modules))]
        return found

    def context(self, op: str) -> List[Candidate]:
        """Points inside the operation whose arguments name what its entry does not know yet
        (fh_verify: the export a request's file handle resolves to), fentry then kprobe."""
        know = self.knowledge.get(op)
        functions = [fn for fn in (know.context if know else ()) if self.profile.traceable(fn)]
        if not functions:
            return []
        callers = sorted({c for fn in functions for c in (self.graphs.callers.get(fn, ()) if self.graphs else ())})
        evidence = ("called, in the call graphs, by " + ", ".join(callers) if callers else
                    "not reached in the given call graphs: found by name only")
        context = know._replace(func_coverage=f"{', '.join(functions)} runs inside the request, on its "
                                              f"task; its arguments are read when it returns",
                                window="none: it only names, it does not time")
        return [self._functions_candidate(kind, functions, op, "context", context, evidence)
                for kind in ("fentry", "kprobe")]

    def candidates(self, op: str) -> List[Candidate]:
        if op not in self.knowledge:  # a server has no fsync, a client no procedure table
            return []
        know = self.knowledge[op]
        out: List[Candidate] = [self._each_tracepoint(system, event, caller, know)
                                for system, event, caller in know.tp_each if self.profile.event(system, event)]
        all_pairs = [p for pairs in self.pairs.values() for p in pairs]
        entries, evidence = self._entry_functions(op, know)
        full = [p for p in all_pairs if p.operation in know.tp_full or self._brackets(p, entries)]
        for pair in full:
            out.append(self._tracepoint(pair, op, "fs-entry", know))
        beneath = [EventPair(system, start, end, "async" if keys else "sync", keys)
                   for system, start, end, keys in know.tp_beneath
                   if self._beneath(system) and self.profile.event(system, start) and self.profile.event(system, end)]
        for pair in beneath:  # async: the end in another task, which no entry function sees
            if pair.kind == "async" or not entries:
                out.append(self._tracepoint(pair, op, "fs-entry", know))
        if entries:
            for kind in ("fentry", "kprobe"):
                out.append(self._functions_candidate(kind, entries, op, "fs-entry", know, evidence))
            for pair in beneath:
                if pair.kind == "sync":
                    cand = self._tracepoint(pair, op, "fs-entry", know)
                    out.append(cand._replace(reasons=cand.reasons + [know.beneath_note]))
        for pair in all_pairs:
            if pair.operation in know.tp_partial and pair not in full:
                out.append(self._tracepoint(pair, op, "fs-partial", know))
        deeper = [fn for fn in self._functions(know.deeper + know.entries) if fn not in entries]
        if self.graphs is not None:
            for fn in entries:
                for callee in self.graphs.callees(fn, set(self.modules))[:3]:
                    if callee not in deeper and callee not in entries and self.profile.traceable(callee):
                        deeper.append(callee)
        for fn in deeper:
            ev = ("heaviest callee of " + "/".join(f for f in entries if self.graphs and self.graphs.calls(f, fn))
                  if self.graphs and any(self.graphs.calls(f, fn) for f in entries) else "found by name")
            out.append(self._functions_candidate("kprobe", [fn], op, "deeper", know, ev))
        return out

    def coverage_notes(self, op: str) -> List[str]:
        """Facts from the call graphs about paths the entry point covers (O_DIRECT etc.)."""
        notes = []
        if self.graphs is None:
            return notes
        for caller, callee, what in (("nfs_file_read", "nfs_file_direct_read", "O_DIRECT reads"),
                                     ("nfs_file_write", "nfs_file_direct_write", "O_DIRECT writes")):
            if op in caller and self.graphs.calls(caller, callee):
                notes.append(f"{what} seen inside {caller} (calls {callee})")
        return notes

    def propose(self, ops: Sequence[str]) -> Dict[str, List[Candidate]]:
        return {op: self.candidates(op) for op in ops}


def _partial_coverage(pair: EventPair, op: str) -> str:
    if pair.operation == "atomic_open":
        return ("only opens that create or first look up the name (->atomic_open, NFSv4); "
                "misses opens of cached dentries (->open) and all NFSv2/v3 opens")
    if pair.kind == "async":
        return (f"one RPC per {pair.operation} request: misses page-cache hits, counts each RPC of a "
                f"large I/O separately, the end runs in an RPC completion task")
    return f"{pair.operation}: a page-cache/inode step below the {op} syscall, not the whole operation"


def build_spec(proposer: Proposer, proposals: Dict[str, List[Candidate]],
               every: bool = False) -> Tuple[Dict[str, Any], List[str]]:
    """The probe spec (ordered fallback list per op, usable candidates only), and the ops left
    out. `every`: the ops were not named, so one the filesystem has no point for is left out
    (a local filesystem has no COMMIT or RPC) rather than refused."""
    prof = proposer.profile
    spec: Dict[str, Any] = {
        "schema": SCHEMA, "version": VERSION, "filesystem": proposer.fs,
        "kernel": prof.release, "modules": proposer.modules, "generated_by": "discover propose",
    }
    if proposer.graphs is not None:
        spec["callgraphs"] = proposer.graphs.files
    ops: Dict[str, Any] = {}
    left_out: List[str] = []
    for op, cands in proposals.items():
        usable = [c.spec() for c in cands if c.usable]
        if not usable and every:
            left_out.append(op)
            continue
        if not usable:
            raise UserError(f"no usable attach point for {op} on {prof.release}: "
                            + "; ".join(r for c in cands for r in c.reasons[:1]) if cands else
                            f"no usable attach point for {op} on {prof.release} (no candidates found)")
        ops[op] = {"letter": SPEC_OPS[op], "candidates": usable}
        context = [c.spec() for c in proposer.context(op) if c.usable]
        if context:
            ops[op]["context"] = context
    if not ops:
        raise UserError(f"no usable attach point for any operation of {proposer.fs} on {prof.release}")
    spec["ops"] = ops
    return spec, left_out

"""The front end shared by the latency tools (nfs* and fs*): choose, generate, load, read, detach.

Why one place: every tool must pick attach points the same way on the running kernel
(first spec candidate present, --verbose says which, warn for an uncovered operation,
fail in one line when nothing is covered), must read the probe's maps into the same
records, and must detach cleanly on Ctrl-C, SIGTERM and SIGHUP. Loading and raw map access
are a probes.backend.Backend's (probes.core_backend with libbpf, or probes.bcc_backend),
imported only when a tool starts, so the package (and its tests) work on hosts without bcc,
libbpf or kprobes.
"""
from __future__ import annotations

import os
import re
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from discover.errors import UserError
from probes.backend import MISSES_MIN_KERNEL, Attachment, Backend, Rejected, major_minor
from probes.backend_choice import Choice, choose
from probes.objects import compiled_spec_path
from probes.model import COUNTERS, INFLIGHT_SLOTS, MAX_LAT_NS, Probe, Tool, decode_event
from probes.exports import ExportNames
from probes.inflight import InFlight
from probes.layout import KernelLayout
from probes.select import Chosen, KernelFacts, Selection, late_points, select, select_context, spec_modules
from discover.spec import INFLIGHT_ALWAYS, load_spec, spec_title
from discover.version import probekit_version

TYPE_CHECKING = False  # typing's constant without typing (discover/records.py)
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

    #: an NFS server request's identity (Tool.server): client address as printed, RPC program,
    #: version, procedure name, export path ("" when it verified no file handle)
    ServerKey = Tuple[str, int, int, str, str]
    #: (op, one of MISS_CAUSES, the function or event it happened at; "" for start_not_stored)
    MissKey = Tuple[str, str, str]

#: the specs `-t FS` names (FS.toml); nfsslower, nfsdist, nfstop and nfs-exporter use nfs.toml
SPECS_DIR = Path(__file__).resolve().parent / "specs"
DEFAULT_SPEC = SPECS_DIR / "nfs.toml"
BTF_DIR = Path("/sys/kernel/btf")
#: how often the tools look at operations in flight and at modules loaded since the start
TICK_S = 1.0
#: arguments an x86-64 BPF trampoline passes in registers (more need Linux 6.3)
FENTRY_MAX_ARGS = 6
_NOT_LOADED = re.compile(r"module (\S+) not loaded")


def client_address(family: int, raw: bytes) -> str:
    """The client as users read it: dotted IPv4, compressed IPv6, an IPv4-mapped IPv6 address
    as its IPv4 (a dual-stack socket's IPv4 client), `?` when the probe could not read it.
    socket and ipaddress are imported here: only a server's tools name clients, and every tool
    paid for their import at start (1.3-1.5 ms each natively on Python 3.13, some 20 times that
    under emulation)."""
    import ipaddress
    import socket

    if family == socket.AF_INET:
        return str(ipaddress.IPv4Address(bytes(raw[:4])))
    if family == socket.AF_INET6:
        address = ipaddress.IPv6Address(bytes(raw[:16]))
        return str(address.ipv4_mapped or address)
    return "?"


def server_key(key: Any, export_name: Callable[[int, int], str]) -> ServerKey:
    """A struct server_key read from the probe's maps; `export_name` names its export's
    (dev, inode) (probes.exports.ExportNames.name)."""
    return (client_address(int(key.family), bytes(key.addr)), int(key.prog), int(key.vers),
            bytes(key.proc).split(b"\0", 1)[0].decode("ascii", "replace"), export_name(int(key.exp_dev),
                                                                                       int(key.exp_ino)))


def sane_latency_ns(value: int) -> Optional[int]:
    """A latency the tools may print: None for anything negative-looking or absurd.

    The kernel side already drops such deltas; this guards the user side too, since a
    u64 that wrapped (end before start) reads as ~585 years.
    """
    if value < 0 or value > MAX_LAT_NS:
        return None
    return value


def fentry_can_attach(function: str, layout: Optional[KernelLayout]) -> Optional[str]:
    """Why `function` cannot take fentry/fexit programs here; None when it can."""
    if layout is None:
        return "no kernel BTF"
    params = layout.params(function)
    if params is None:
        return "no BTF prototype (its module's BTF missing?)"
    if len(params) > FENTRY_MAX_ARGS:
        return f"{len(params)} arguments, a trampoline passes {FENTRY_MAX_ARGS}"
    return None


def fdinfo_counts(fd: int, names: Sequence[str]) -> Dict[str, int]:
    """The named integer fields of one of this process's BPF fds (/proc/self/fdinfo); absent ones left out."""
    out: Dict[str, int] = {}
    try:
        for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in names:
                out[key] = int(value)
    except (OSError, ValueError):
        pass
    return out


class RealtimeReads:
    """Map reads at real-time priority (SCHED_FIFO 1), where the process may.

    Why: while a task is inside a BPF map access from user space, the kernel holds that CPU's
    BPF guard (bpf_prog_active) with migration, not preemption, disabled, and skips every
    kprobe and tracepoint program that fires on that CPU meanwhile. On a preemptible kernel
    (Debian's 7.x run PREEMPT_LAZY) an NFS client task woken there preempts the reader and
    runs its operations untraced: on a 7.3 guest one read and one open of 150 rounds went
    missing from nfsdist and nfstop alike. A SCHED_FIFO reader is not preempted by such tasks.
    The slower tools read their events this way too: at normal priority, on one CPU shared
    with the writers it traced, nfsslower fell so far behind that the ring buffer dropped 204
    events. Reentrant; the thread's own policy is put back after the outermost read."""

    def __init__(self) -> None:
        self.depth = 0
        self.allowed: Optional[bool] = None  # unknown until the first read
        self._saved: Optional[Tuple[int, Any]] = None

    def describe(self) -> str:
        if self.allowed is False:
            return ("map reads: normal priority (SCHED_FIFO refused: no CAP_SYS_NICE); on a preemptible kernel "
                    "an operation that preempts a read goes untraced, counted as missed")
        return "map reads: real-time priority (SCHED_FIFO 1), so that no task the filesystem wakes preempts them in the kernel"

    @contextmanager
    def __call__(self) -> Iterator[None]:
        self.depth += 1
        try:
            if self.depth == 1 and self.allowed is not False:
                saved = (os.sched_getscheduler(0), os.sched_getparam(0))
                try:
                    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
                    self._saved, self.allowed = saved, True
                except OSError:
                    self.allowed = False
            yield
        finally:
            self.depth -= 1
            if self.depth == 0 and self._saved is not None:
                policy, param = self._saved
                self._saved = None
                os.sched_setscheduler(0, policy, param)


def describe(selection: Selection) -> List[str]:
    lines = []
    for c in selection.chosen:
        points = ", ".join(p["entry"] if p["entry"] == p["exit"] else f"{p['entry']} -> {p['exit']}"
                           for p in c.points)
        lines.append(f"{c.op} ({c.letter}): candidate {c.index + 1} {c.candidate['kind']}/"
                     f"{c.candidate['match']}: {points}" + (" (in flight only)" if c.watch else "")
                     + (" (names the export)" if c.context else ""))
        lines += [f"    skipped {why}" for why in c.skipped]
    return lines


class NothingToTrace(UserError):
    """No asked operation can be traced now; `modules`: the absent modules that would change that."""

    def __init__(self, message: str, modules: Sequence[str]) -> None:
        super().__init__(message)
        self.modules = list(modules)


def modules_present(modules: Sequence[str], root: Path = Path("/sys/module")) -> bool:
    """Whether one of `modules` has loaded (a directory under /sys/module appears): what the
    exporter, started before a filesystem's first mount, looks at every second to try again."""
    return any((root / module).exists() for module in modules)


def module_live(module: str, root: Path = Path("/sys/module")) -> bool:
    """Whether `module` is loaded and done initialising: before, the kernel refuses to attach
    a trampoline to its functions (its BTF is not yet marked live)."""
    try:
        return (root / module / "initstate").read_text().strip() == "live"
    except FileNotFoundError:
        return (root / module).is_dir()  # loaded, built in: no initstate
    except OSError:
        return False


def load_tool_spec(path: Path) -> Dict[str, Any]:
    """A tool's spec: the package's parsed copy (probes.build_core) while it matches the file."""
    return load_spec(path, compiled_spec_path(path))


def open_backend(choice: Choice, spec: Dict[str, Any]) -> Backend:
    """The loader probes.backend_choice chose: core (libbpf with the spec's prebuilt object) or
    bcc. Imported here, once a tool starts, so that neither is needed to import the tools."""
    if choice.name == "core":
        from probes.core_backend import CoreBackend
        assert choice.lib is not None and choice.object_path is not None
        return CoreBackend(spec, choice.object_path, choice.lib)
    from probes.bcc_backend import BccBackend
    return BccBackend(spec)



#: why an operation went uncounted (the exporter's `cause` label: a bounded set): the kernel
#: skipped a run of its program, a kprobe or a kretprobe of it missed (the kernel's counts),
#: or the probe could not store its start (the probe's own count)
MISS_CAUSES = ("recursion", "kprobe", "kretprobe", "start_not_stored")


def missed_by_op(causes: Dict[MissKey, int]) -> Dict[str, int]:
    """Per-cause counts summed per op."""
    out: Dict[str, int] = {}
    for (op, _cause, _where), n in causes.items():
        out[op] = out.get(op, 0) + n
    return out


def missed_json(causes: Dict[MissKey, int]) -> List[Dict[str, Any]]:
    """Per-cause counts as a tool's JSON interval carries them ("missed_by")."""
    return [{"op": op, "cause": cause, "at": where, "count": n} for (op, cause, where), n in sorted(causes.items())]


#: how describe_missed words each kernel cause (the probe's own, start_not_stored: "starts not stored")
MISS_WORDS = {"recursion": "runs skipped", "kprobe": "kprobe misses", "kretprobe": "kretprobe misses"}


def describe_missed(causes: Dict[MissKey, int]) -> str:
    """Per op, how many went uncounted and which counter says so, e.g. `3 write (kernel: 3
    kretprobe misses at ext4_file_write_iter)`."""
    parts = []
    for op, total in missed_by_op(causes).items():
        why = [f"kernel: {n} {MISS_WORDS[cause]} at {where}" if cause in MISS_WORDS else f"probe: {n} starts not stored"
               for (o, cause, where), n in sorted(causes.items()) if o == op]
        parts.append(f"{total} {op} ({'; '.join(why)})")
    return ", ".join(parts)


def read_described(text: str) -> Dict[MissKey, int]:
    """describe_missed read back from a tool's "not counted" warning (what a bench or check has
    of a run is its stderr); text after the list, such as the docs reference, is ignored."""
    words = {word: cause for cause, word in MISS_WORDS.items()}
    out: Dict[MissKey, int] = {}
    for _total, op, why in re.findall(r"(\d+) (\w+) \(([^)]*)\)", text.split("not counted:", 1)[-1]):
        for part in why.split("; "):
            count, _, rest = part.partition(": ")[2].partition(" ")
            word, _, where = rest.partition(" at ")
            key = (op, words[word], where) if word in words else (op, "start_not_stored", "")
            out[key] = out.get(key, 0) + int(count)
    return out


def unvouched(attachments: Sequence[Attachment], kernel_counts_misses: bool) -> List[str]:
    """What the kernel may skip here without a count the tool can read: before 6.7 the runs of
    kprobe and tracepoint programs it skips under the BPF guard (no recursion_misses for
    them), and a kprobe or kretprobe whose own missed count neither kernel nor loader shows.
    Each as the tool says it; [] when every skip is counted."""
    out: List[str] = []
    kinds = sorted({a.kind for a in attachments if a.kind in ("kprobe", "kretprobe", "tracepoint")})
    if kinds and not kernel_counts_misses:
        out.append(f"the runs of {', '.join(kinds)} programs it skips (counted from Linux 6.7)")
    silent = sorted({f"{a.kind} {a.target}" for a in attachments
                     if a.kind in ("kprobe", "kretprobe") and a.missed is None})
    if silent:
        out.append(f"what these miss: {', '.join(silent)}")
    return out


class Session:
    """One attached probe. Use as a context manager: leaving it always detaches."""

    def __init__(self, prog: str, tool: Tool, ops: Sequence[str], spec: Union[str, Dict[str, Any], None],
                 verbose: bool, cgroup_dir: Optional[str] = None, fentry: bool = True,
                 backend: str = "auto") -> None:
        self.prog = prog
        #: --cgroup's directory (probes.cgroups.filter_dir): its fd goes into cgroup_filter[0]
        self.cgroup_dir = cgroup_dir
        tool = tool._replace(cgroup_filter=cgroup_dir is not None)
        self.verbose = verbose
        self.tool = tool
        if not isinstance(spec, dict):  # a path (None: nfs.toml); a tool that checked its -t passes the spec read
            spec = load_tool_spec(Path(spec) if spec else DEFAULT_SPEC)
        #: how banners and messages name the filesystem (`NFS`, `ext4`)
        self.title = spec_title(spec)
        #: chosen from again when a module loads later (_check_late_modules)
        self.spec = spec
        facts = KernelFacts.live(BTF_DIR, spec_modules(spec))
        self.selection = select(spec, facts, ops)
        if self.selection.chosen or verbose:  # when nothing can be traced, one line says so (the why: -v)
            for op, why in self.selection.uncovered.items():
                self.warn(f"warning: cannot trace {op} on {facts.release}: {why}")
        if tool.inflight and self.selection.chosen:
            self.selection = self._watch_beneath(spec, facts, ops)
        if tool.server and "rpc" in {c.op for c in self.selection.chosen}:
            context = select_context(spec, facts, "rpc")
            if context is None:
                self.warn(f"warning: no attach point of the spec names a request's export on {facts.release}: "
                          "every request counts under no export")
            else:
                self.selection = self.selection._replace(chosen=self.selection.chosen + [context])
        #: modules whose absence left an operation or attach point out, said again if they load
        self._absent_modules = {m for why in self.selection.uncovered.values() for m in _NOT_LOADED.findall(why)}
        if not self.selection.chosen:
            raise NothingToTrace(f"none of {', '.join(ops)} can be traced on {facts.release} "
                                 f"({self.title} modules loaded? see --verbose)", sorted(self._absent_modules))
        if verbose:
            self.warn(f"probekit {probekit_version()} on {facts.release}")
            for line in describe(self.selection):
                self.warn(line)
        layout = facts.layout
        if layout is None:
            self.warn("warning: no kernel BTF: file names and offsets are not shown")
        formats = facts.live_fields
        choice = choose(backend, spec, facts.release, self.selection.btf_modules(), BTF_DIR)
        if verbose:
            self.warn(f"backend: {choice.why}")
        self.backend = open_backend(choice, spec)
        ringbuf = False
        if tool.events:
            ringbuf, why = self.backend.ringbuf_support(facts.release)
            if verbose:
                self.warn(why)
        task_storage, why = self.backend.task_storage_support(facts.release, layout is not None)
        if verbose:
            self.warn(why)
        version = major_minor(facts.release)
        self.release = facts.release
        #: whether this kernel counts the runs it skips of kprobe and tracepoint programs (6.7)
        self.kernel_counts_misses = version is not None and version >= MISSES_MIN_KERNEL
        self.reading = RealtimeReads()
        fentry_ok, why = self.backend.fentry_support()
        if verbose and fentry:
            self.warn(why)
        #: whether fentry/fexit programs may time functions (a later module's too)
        self.fentry = fentry and fentry_ok
        fentry_functions = self._fentry_functions(layout, self.selection.chosen) if self.fentry else []
        if verbose and not fentry:
            self.warn("attach: kprobes (--kprobes)")
        #: generated again without fentry or task storage if this bcc or kernel rejects it (see __enter__)
        self._generate = lambda use_task_storage, use_fentry: self.backend.generate(
            self.selection.chosen, tool, layout, formats, ringbuf, use_task_storage,
            fentry_functions if use_fentry else ())
        self.probe: Probe = self._generate(task_storage, True)
        if layout is not None:  # its look-ups are done (a fallback's _generate parses it again)
            layout.release()
        if tool.dev_at_entry and self.probe.mountless:
            what = "are left out by --mount-point" if tool.mount_dev else "count under no mount"
            self.warn(f"warning: {', '.join(self.probe.mountless)}: the mount is not known on {facts.release} "
                      f"(no file, dentry or dev at the attach point; module BTF missing?): they {what}")
        #: whether the backend holds a loaded probe (the exporter reads nothing before or after)
        self.attached = False
        self.unvouched: List[str] = []
        #: per loaded program: its attachment, fd and the ops it times; built after each attach
        #: (_read_attachments), so that missed_causes() only reads counts
        self._attachments: List[Tuple[Attachment, Optional[int], Tuple[str, ...]]] = []
        self._lost_seen = 0
        self._inflight_lost_seen = 0
        self._absent_modules |= {m for c in self.selection.chosen for why in c.skipped for m in _NOT_LOADED.findall(why)}
        self._ticks: List[Callable[[], None]] = [self._check_late_modules, self._check_missed]
        #: modules absent at the start that have loaded since and that this run could not
        #: trace beside its programs, and what the warning then says it does about them (the
        #: exporter attaches again; a terminal tool cannot)
        self.late_modules: List[str] = []
        self.late_action = f"restart {prog} to trace it"
        #: missed() as last seen, per reader of it (the stderr warning, a tool's interval records)
        self._missed_base: Dict[str, Dict[str, int]] = {}
        self._batch: List[Dict[str, Any]] = []
        self._on_batch: Optional[Callable[[List[Dict[str, Any]]], None]] = None
        self._next_tick = 0.0
        self._old_handlers: Dict[int, Any] = {}
        #: set by SIGINT/SIGTERM/SIGHUP; a flag, not an exception, because a signal can
        #: arrive while the backend runs a Python callback, where an exception would be lost
        self.stopped = False
        #: which signal set `stopped` (a long-running caller reports it through the boundary)
        self.stop_signal: Optional[int] = None
        #: last cumulative values read from the dist/top maps (see dist() and top())
        self._dist_base: Dict[Tuple[int, int, int, int], int] = {}
        self._totals_base: Dict[Tuple[int, int, int], Tuple[int, int]] = {}
        self._top_base: Dict[tuple, tuple] = {}
        self._server_base: Dict[tuple, tuple] = {}
        #: the export paths a server's requests are named by (Tool.server)
        self.exports = ExportNames()

    def _watch_beneath(self, spec: Dict[str, Any], facts: KernelFacts, ops: Sequence[str]) -> Selection:
        """The selection with spec.INFLIGHT_ALWAYS's ops --ops left out tracked in flight only:
        an operation stuck outside what was asked (a create, with the default ops) is still
        seen, as the RPC it waits in. Only an asynchronous layer (a client's RPCs, ended by
        another task) is; a server's requests (nfsd.toml's rpc, timed on its own thread) are
        not beneath anything. Where the kernel lacks them, --verbose says so."""
        beneath = [op for op in INFLIGHT_ALWAYS if op in spec["ops"] and op not in ops]
        extra = select(spec, facts, beneath)
        watched = [c._replace(watch=True) for c in extra.chosen if c.candidate["match"] == "keys"]
        if self.verbose:
            for op, why in extra.uncovered.items():
                self.warn(f"{op}: not tracked in flight on {facts.release}: {why}")
        return Selection(self.selection.chosen + watched, self.selection.uncovered)

    @property
    def ops(self) -> List[str]:
        """The operations asked and traced: those whose completions are printed and counted."""
        return [op for op in self.probe.ops if op not in self.probe.watched]

    def _fentry_functions(self, layout: Optional[KernelLayout], chosen_list: Sequence[Chosen]) -> List[str]:
        """The fentry candidates' functions that pass fentry_can_attach; --verbose says
        which fall back to kprobes and why."""
        out: List[str] = []
        for chosen in chosen_list:
            if chosen.candidate["kind"] != "fentry":
                continue
            for function in sorted({p[end] for p in chosen.points for end in ("entry", "exit")}):
                blocker = fentry_can_attach(function, layout)
                if blocker is None:
                    out.append(function)
                if self.verbose:
                    self.warn(f"{chosen.op}: {function}: " + ("fentry/fexit" if blocker is None else f"kprobes ({blocker})"))
        return out

    def _stop(self, signum: int, _frame: Any) -> None:
        self.stopped = True
        self.stop_signal = signum

    def warn(self, message: str) -> None:
        print(f"{self.prog}: {message}", file=sys.stderr, flush=True)

    def __enter__(self) -> "Session":
        # Signals keep their default action while the backend loads (nothing is attached yet,
        # so dying then leaves nothing behind); from the first attach on they only set
        # the stop flag, so that the loop ends and everything is detached.
        try:
            while not self.attached:
                try:
                    self.backend.load(self.probe)
                    self.attached = True
                except Rejected as exc:
                    why = str(exc)
                    fentry = any(p.kind == "fentry" for p in self.probe.points)
                    if fentry and exc.feature == "fentry":
                        self.warn(f"warning: fentry/fexit rejected ({why}): kprobes instead")
                        self.fentry = False
                        self.probe = self._generate(self.probe.task_storage, False)
                    elif self.probe.task_storage:
                        self.warn(f"warning: task local storage rejected ({why}): start times go to a hash map")
                        self.probe = self._generate(False, fentry)
                    else:
                        raise UserError(f"cannot load the generated probe: {why}") from None
            if self.verbose:
                for line in self.backend.load_notes():
                    self.warn(line)
            if self.cgroup_dir is not None:  # until it is set, the filter lets nothing in
                fd = os.open(self.cgroup_dir, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    self.backend.set_cgroup_filter(fd)
                finally:
                    os.close(fd)
            with self.reading():  # learn now whether reads may run real-time, for --verbose
                pass
            if self.verbose:
                self.warn(self.reading.describe())
            for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
                self._old_handlers[sig] = signal.signal(sig, self._stop)
            self._attach()
            self._read_attachments()
            #: what the kernel skips without a count this process can read ([] : every skip is counted)
            self.unvouched = unvouched([a for a, _fd, _ops in self._attachments], self.kernel_counts_misses)
            if self.unvouched:
                self.warn(f"warning: counts may be short without a word on {self.release}: the kernel keeps no "
                          f"count this tool can read of {'; '.join(self.unvouched)} (docs/troubleshooting.md, "
                          "'not counted')")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _attach(self) -> None:
        """Attach the loaded probe; where a trampoline is refused (a function the kernel's BTF
        lists, which select took as present, but ftrace cannot patch), kprobes instead."""
        try:
            self.backend.attach(self.probe)
        except Rejected as exc:
            if exc.feature != "fentry" or not any(p.kind == "fentry" for p in self.probe.points):
                raise UserError(str(exc)) from None
            self.warn(f"warning: fentry/fexit not attached ({exc}): kprobes instead")
            self.fentry = False
            self.backend.close()  # the links attached before the refusal, and the first programs
            self.probe = self._generate(self.probe.task_storage, False)
            self.backend.load(self.probe)
            self.backend.attach(self.probe)

    def _read_attachments(self) -> None:
        """What missed_causes() reads the counts of, once per attach: each program's attachment
        (the kernel's missed count as of now), its fd (for recursion_misses) and its ops."""
        fds = self.backend.program_fds()
        self._attachments = [(a, fds.get(a.program), tuple(self.probe.programs.get(a.program, ())))
                             for a in self.backend.attachments(self.release)]

    def __exit__(self, *_exc: Any) -> None:
        if self.attached:
            self.backend.close()
            self.attached = False
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)

    # reading ----------------------------------------------------------------
    def on_events(self, callback: Callable[[List[Dict[str, Any]]], None]) -> None:
        """`callback(events)` after each read of the buffer, with what that read brought, in
        order: a line can then be named from a later line of the same read (an fsync nested
        in a write ends first, and only the write knows the file)."""
        self._on_batch = callback

        def handle(raw: bytes) -> None:
            event = decode_event(raw)
            if sane_latency_ns(event["lat_ns"]) is not None:
                self._batch.append(event)
        self.backend.open_events(self.probe.ringbuf, handle, self._lost)

    def _lost(self, count: int) -> None:
        self.warn(f"warning: {count} events lost (buffer full: the reader fell behind)")

    def on_tick(self, callback: Callable[[], None]) -> None:
        """Call `callback` about every TICK_S while the tool waits or polls."""
        self._ticks.append(callback)

    def _tick(self) -> None:
        now = time.monotonic()
        if now >= self._next_tick:
            self._next_tick = now + TICK_S
            for callback in self._ticks:
                callback()

    def _check_late_modules(self) -> None:
        """When a module that was absent at the start has loaded, attach what it brings to the
        running candidates beside the running programs (same maps: no count restarts) and
        say so in one line; where the loader cannot (bcc), or the module would change the
        choice itself (an op uncovered at the start), say once what this run misses: a
        terminal tool says to restart, the exporter reads `late_modules` and attaches again."""
        for module in sorted(self._absent_modules):
            if not module_live(module):
                continue
            self._absent_modules.discard(module)
            facts = KernelFacts.live()
            traced = self._trace_late(facts)
            if traced:
                self.warn(f"module {module} loaded after the start: now traced: {'; '.join(traced)}")
            newly = select(self.spec, facts, list(self.selection.uncovered)).chosen
            if newly or not traced:
                self.late_modules.append(module)
                what = (f"{', '.join(c.op for c in newly)} can be traced now but not by this run" if newly else
                        "what it provides is not traced by this run (see --verbose at the start)")
                self.warn(f"warning: module {module} loaded after the start: {what}; {self.late_action}")

    def _trace_late(self, facts: KernelFacts) -> List[str]:
        """Attach the running candidates' points present now and absent at the start, where
        the backend can; what is traced now, as --verbose lists choices (empty: nothing)."""
        added = [c._replace(points=points, skipped=[]) for c in self.selection.chosen
                 for points in [late_points(c, facts)] if points]
        if not added:
            return []
        modules = sorted(set(self.selection.btf_modules()) | set(Selection(added, {}).btf_modules()))
        layout = KernelLayout.live(BTF_DIR, tuple(modules))
        fentry = self._fentry_functions(layout, added) if self.fentry else []
        try:
            probe = self.backend.extend(self.probe, added, layout, fentry)
        except Rejected as exc:
            self.warn(f"warning: cannot attach {', '.join(p['entry'] for c in added for p in c.points)}: {exc}")
            return []
        if probe is None:
            return []
        self.probe = probe
        self._read_attachments()
        by_op = {c.op: c for c in added}
        self.selection = Selection([c._replace(points=c.points + by_op[c.op].points) if c.op in by_op else c
                                    for c in self.selection.chosen], self.selection.uncovered)
        return describe(Selection(added, {}))

    def missed_since(self, reader: str) -> Dict[str, int]:
        """The ops missed since this reader's last call, and how many (only those that grew)."""
        return missed_by_op(self.missed_causes_since(reader))

    def missed_causes_since(self, reader: str) -> Dict[MissKey, int]:
        """missed_causes() grown since this reader's last call (only what grew)."""
        now = self.missed_causes()
        base = self._missed_base.get(reader, {})
        self._missed_base[reader] = now
        return {key: n - base.get(key, 0) for key, n in now.items() if n > base.get(key, 0)}

    def _check_missed(self) -> None:
        """Say on stderr, as it happens, that operations went uncounted (bcc's tools lose them
        silently), each with the counter that says so."""
        new = self.missed_causes_since("warning")
        if new:
            self.warn("warning: not counted: " + describe_missed(new) + " (docs/probes.md, 'Missed operations')")

    def poll_until_stopped(self, seconds: Optional[float] = None) -> None:
        """Read events until a stop signal (or `seconds`, fsslower's -d, have passed)."""
        end = None if seconds is None else time.monotonic() + seconds
        while not self.stopped and (end is None or time.monotonic() < end):
            self._tick()
            # read and shown at real-time priority too: a reader with only its fair share of
            # one CPU falls behind the tasks it traces, and the full buffer drops their events
            # (bench/README.md, "bench_load.py")
            with self.reading():
                self.backend.poll_events(self.probe.ringbuf)
                if self.probe.ringbuf:
                    lost = self.counter("lost_events")
                    if lost > self._lost_seen:
                        self._lost(lost - self._lost_seen)
                        self._lost_seen = lost
                batch, self._batch = self._batch, []
                if batch and self._on_batch is not None:
                    self._on_batch(batch)

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds` in short steps; False as soon as a stop signal came."""
        deadline = time.monotonic() + seconds
        while not self.stopped:
            self._tick()
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            time.sleep(min(left, 0.2))
        return False

    def op_name(self, op_id: int) -> str:
        return self.probe.ops[op_id]

    def letter(self, op_id: int) -> str:
        return self.probe.letters[op_id]

    def counter(self, name: str) -> int:
        """One of the probe's counters (model.COUNTERS: anomalies, inflight_lost, lost_events)."""
        with self.reading():
            return int(self.backend.map("counters").at(COUNTERS.index(name)).value)

    def anomalies(self) -> int:
        return self.counter("anomalies")

    def program_stats(self) -> Dict[str, Tuple[int, int]]:
        """Per loaded BPF program: (run time in ns, run count), from its /proc fdinfo.

        The kernel counts these only while kernel.bpf_stats_enabled is 1 (5.1+); programs
        without the fields (older kernels) are left out."""
        out: Dict[str, Tuple[int, int]] = {}
        for name, fd in self.backend.program_fds().items():
            fields = fdinfo_counts(fd, ("run_time_ns", "run_cnt"))
            if len(fields) == 2:
                out[name] = (fields["run_time_ns"], fields["run_cnt"])
        return out

    def missed(self) -> Dict[str, int]:
        """Per op since the start, an upper bound of the operations not counted (missed_causes()
        summed). Each op appears, 0 when nothing was missed."""
        out = {op: 0 for op in self.ops}
        out.update(missed_by_op(self.missed_causes()))
        return out

    def missed_per_cause(self) -> Dict[Tuple[str, str], int]:
        """missed_causes() per (op, cause), every op and cause present (0 when none): the
        exporter's series, one per op and MISS_CAUSES entry."""
        out = {(op, cause): 0 for op in self.ops for cause in MISS_CAUSES}
        for (op, cause, _where), n in self.missed_causes().items():
            out[(op, cause)] += n
        return out

    def missed_causes(self) -> Dict[MissKey, int]:
        """Since the start, per (op, cause, where), the operations not counted, at most (one
        skipped start or end loses one operation, a skipped pair one too): MISS_CAUSES'
        "recursion", runs of its programs the kernel skipped (a program's recursion_misses, as
        bpf_prog_info and /proc fdinfo show it: the CPU's BPF guard was held by another program,
        or by a task preempted inside a BPF map access; counted for fentry/fexit from 5.12, which
        before skipped nothing, for kprobe and tracepoint programs from MISSES_MIN_KERNEL);
        "kprobe" and "kretprobe", the kernel's missed count of a kprobe of it (a
        kretprobe's exhausted instances too), both with the function or event attached
        (`where`); "start_not_stored", the starts and ends the start store refused. Only
        nonzero counts."""
        out: Dict[MissKey, int] = {}

        def add(op: str, cause: str, where: str, n: int) -> None:
            if n and op in self.ops:  # an op tracked in flight only counts nothing to miss
                out[(op, cause, where)] = out.get((op, cause, where), 0) + n

        counts = self.backend.missed_counts([a for a, _fd, _ops in self._attachments], self.release)
        for (attachment, fd, ops), kernel_missed in zip(self._attachments, counts):
            skipped = fdinfo_counts(fd, ("recursion_misses",)).get("recursion_misses", 0) if fd is not None else 0
            for op in ops:
                add(op, "recursion", attachment.target, skipped)
                if kernel_missed is not None:
                    add(op, attachment.kind, attachment.target, kernel_missed)
        untimed = COUNTERS.index("untimed")
        with self.reading():
            values = self.backend.map("counters").all_values(untimed + len(self.probe.ops))
        for op_id, value in enumerate(values[untimed:]):
            add(self.op_name(op_id), "start_not_stored", "", int(value.value))
        return out

    def in_flight(self) -> List[InFlight]:
        """Operations started and not ended: each thread's outermost operation (the probe's
        slots) and every asynchronous start (RPCs, async tracepoint pairs)."""
        out: List[InFlight] = []
        with self.reading():
            values = self.backend.map("inflight").all_values(INFLIGHT_SLOTS)
            starts = (self.backend.map("async_starts").items() if any(p.match == "keys" for p in self.probe.points)
                      else [])
        for value in values:
            if value.s.ts:
                out.append(InFlight(int(value.tid), 0, self.op_name(int(value.op)), int(value.s.ts), "", "",
                                    dev=int(value.s.dev)))
        if starts:
            for key, value in starts:
                if int(key.point) >= len(self.probe.points):
                    continue  # a point attached a moment ago (late module), not in self.probe yet
                point = self.probe.points[int(key.point)]
                client = point.keys.index("client_id") if "client_id" in point.keys else -1
                out.append(InFlight(int(value.tid), int(value.pid), point.op, int(value.s.ts),
                                    bytes(value.comm).split(b"\0", 1)[0].decode("utf-8", "replace"),
                                    bytes(value.name).split(b"\0", 1)[0].decode("utf-8", "replace"),
                                    int(key.k[client]) if client >= 0 else None))
        lost = self.counter("inflight_lost")
        if lost > self._inflight_lost_seen:
            self.warn(f"warning: {lost - self._inflight_lost_seen} operations not tracked in flight "
                      f"(their thread's slot was taken: {INFLIGHT_SLOTS} slots)")
            self._inflight_lost_seen = lost
        return out

    def forget_dev(self, dev: int) -> None:
        """Drop one superblock's per-mount counts (Tool.per_mount): its mount is gone, or the
        kernel gave its dev to another mount."""
        self._forget("dev", dev, 1)

    def admitted_cgroups(self) -> List[int]:
        """The cgroup ids that have series of their own (Tool.cgroup_limit)."""
        with self.reading():
            return [int(key.value) for key in self.backend.map("cgroup_ids").keys()]

    def forget_cgroup(self, cgroup: int) -> None:
        """Drop one cgroup's counts and free its place among the admitted (it is gone)."""
        self._forget("cgroup", cgroup, 2)
        with self.reading():
            table = self.backend.map("cgroup_ids")
            table.delete(table.key(cgroup))  # nothing happens if never admitted, or deleted already

    def _forget(self, field: str, value: int, index: int) -> None:
        for table in ("dist", "op_totals"):
            with self.reading():
                counts = self.backend.map(table)
                stale = [key for key in counts.keys() if int(getattr(key, field)) == value]
                for key in stale:  # after the walk: deleting while walking a BPF hash restarts it
                    counts.delete(key)
        self._dist_base = {k: v for k, v in self._dist_base.items() if k[index] != value}
        self._totals_base = {k: v for k, v in self._totals_base.items() if k[index] != value}

    def dist(self, clear: bool) -> Dict[str, Dict[str, Any]]:
        """Per op since the last clear: {'slots': {slot: count}, 'count': n, 'bytes': total,
        'lat_ns': sum of latencies (with Tool.lat_sum, else 0)}, and with Tool.per_mount 'mounts': {dev: the same, for
        that superblock's operations} (dev 0: an operation without a file, e.g. an RPC), with
        Tool.cgroup_limit also 'series': {(dev, cgroup id): the same} (cgroup 0: the overflow).

        The maps stay cumulative: clearing them from user space drops every event that lands
        between the read and the clear. `clear` moves the baseline instead; with it never
        set, every call returns the totals since the start (what a Prometheus counter wants).
        """
        def empty() -> Dict[str, Any]:
            return {"slots": {}, "count": 0, "bytes": 0, "lat_ns": 0}

        out: Dict[str, Dict[str, Any]] = {op: empty() for op in self.ops}
        for entry in out.values():
            if self.tool.per_mount:
                entry["mounts"] = {}
            if self.tool.cgroup_limit:
                entry["series"] = {}
        with self.reading():
            dist_items, total_items = self.backend.map("dist").items(), self.backend.map("op_totals").items()
        slots = {(int(key.op), int(key.dev), int(key.cgroup), int(key.slot)): int(value.value)
                 for key, value in dist_items}
        totals = {(int(key.op), int(key.dev), int(key.cgroup)): (int(value.bytes), int(value.lat_ns))
                  for key, value in total_items}

        def add(op_id: int, dev: int, cgroup: int, field: str, delta: int, slot: Optional[int] = None) -> None:
            targets = [out[self.op_name(op_id)]]
            if self.tool.per_mount:
                targets.append(targets[0]["mounts"].setdefault(dev, empty()))
            if self.tool.cgroup_limit:
                targets.append(targets[0]["series"].setdefault((dev, cgroup), empty()))
            for entry in targets:
                entry[field] += delta
                if slot is not None:
                    entry["slots"][slot] = entry["slots"].get(slot, 0) + delta

        for (op_id, dev, cgroup, slot), value in slots.items():
            delta = value - self._dist_base.get((op_id, dev, cgroup, slot), 0)
            if delta:
                add(op_id, dev, cgroup, "count", delta, slot)
        for (op_id, dev, cgroup), (nbytes, lat_ns) in totals.items():
            base = self._totals_base.get((op_id, dev, cgroup), (0, 0))
            add(op_id, dev, cgroup, "bytes", nbytes - base[0])
            add(op_id, dev, cgroup, "lat_ns", lat_ns - base[1])
        if clear:
            self._dist_base, self._totals_base = slots, totals
        return out

    def requests(self, since_last: bool = True) -> Dict[ServerKey, Dict[str, Any]]:
        """Tool.server: per (client, program, version, procedure, export), the requests
        completed since the previous call (`since_last`: nfsdtop's interval, a difference of the
        cumulative maps, as in top()) or since the start (the exporter's counters): count, lat_ns
        (their service times' sum), read_bytes, write_bytes, slots (log2 usec)."""
        with self.reading():
            stat_items = self.backend.map("server_stats").items()
            hist_items = self.backend.map("server_hist").items()
        base = self._server_base if since_last else {}
        now: Dict[tuple, tuple] = {}
        out: Dict[ServerKey, Dict[str, Any]] = {}
        names: Dict[bytes, ServerKey] = {}

        def named(key: Any) -> ServerKey:
            """server_key() once per key in this call: its histogram's entries repeat it, one per
            slot, and naming a key (the client's address, the export) cost more than the rest of
            an entry's reading (bench/README.md, bench_server_scale.py)."""
            raw = bytes(key)
            where = names.get(raw)
            if where is None:
                where = names[raw] = server_key(key, self.exports.name)
            return where

        for key, value in stat_items:
            where = named(key)
            totals = (int(value.count), int(value.lat_ns), int(value.rd_bytes), int(value.wr_bytes))
            now[where] = totals
            count, lat_ns, rd, wr = (a - b for a, b in zip(totals, base.get(where, (0, 0, 0, 0))))
            if count > 0:
                out[where] = {"count": count, "lat_ns": lat_ns, "read_bytes": rd, "write_bytes": wr, "slots": {}}
        for key, value in hist_items:
            where = named(key.k)
            slot = (where, int(key.slot))
            now[slot] = (int(value.value),)
            delta = int(value.value) - base.get(slot, (0,))[0]
            if delta and where in out:
                out[where]["slots"][int(key.slot)] = delta
        if since_last:
            self._server_base = now
        return out

    def requests_in_progress(self) -> List[Tuple[ServerKey, int]]:
        """Tool.server: (client, program, version, procedure) and start time (monotonic ns) of
        each request an nfsd thread is serving now."""
        with self.reading():
            values = self.backend.map("requests").items()
        return [(server_key(value.k, self.exports.name), int(value.ts)) for _key, value in values]

    def top(self) -> Dict[Tuple[int, int], Dict[str, Dict[str, Any]]]:
        """Per (tgid, dev), per op since the previous call: count, lat_ns, bytes, comm, cgroup
        (its v2 id), slots (usec log2). dev is the mount with Tool.per_mount, else 0.

        As in dist(), the maps stay cumulative and an interval is a difference. Only entries
        of processes that have exited are deleted (no task updates them any more; an async
        commit ending later recreates its entry), so the maps do not fill up.
        """
        out: Dict[Tuple[int, int], Dict[str, Dict[str, Any]]] = {}
        stats, hist = self.backend.map("top_stats"), self.backend.map("top_hist")
        now: Dict[tuple, tuple] = {}
        gone: List[Tuple[Any, Any]] = []
        alive: Dict[int, bool] = {}

        def keep(table: Any, key: Any, where: tuple, totals: tuple) -> None:
            """Remember a live process's totals as the next baseline; drop an exited one's."""
            if where[0] not in alive:
                alive[where[0]] = Path(f"/proc/{where[0]}").exists()
            if alive[where[0]]:
                now[where] = totals
            else:
                gone.append((table, key))

        with self.reading():
            stat_items, hist_items = stats.items(), hist.items()
        for key, value in stat_items:
            where = (int(key.tgid), int(key.op), int(key.dev))
            totals = (int(value.count), int(value.lat_ns), int(value.bytes))
            count, lat_ns, nbytes = (a - b for a, b in zip(totals, self._top_base.get(where, (0, 0, 0))))
            if count > 0:
                out.setdefault((where[0], where[2]), {})[self.op_name(where[1])] = {
                    "count": count, "lat_ns": lat_ns, "bytes": nbytes, "cgroup": int(value.cgroup),
                    "comm": bytes(value.comm).split(b"\0", 1)[0].decode("utf-8", "replace"), "slots": {}}
            keep(stats, key, where, totals)
        for key, value in hist_items:
            where = (int(key.tgid), int(key.op), int(key.dev), int(key.slot))
            delta = int(value.value) - self._top_base.get(where, (0,))[0]
            entry = out.get((where[0], where[2]), {}).get(self.op_name(where[1]))
            if delta and entry is not None:
                entry["slots"][where[3]] = delta
            keep(hist, key, where, (int(value.value),))
        with self.reading():
            for table, key in gone:  # after reading: deleting while iterating a BPF hash restarts it
                table.delete(key)
        self._top_base = now
        return out

"""The bcc peer of probes.backend.Backend: compiles the generated C at start-up and attaches it.

Why bcc stays: it runs where no prebuilt object can (no kernel BTF, Debian 11's libbpf 0.3)
and it is the reference the lab compares another loader against. bcc is imported only when a
tool starts, so the package (and its tests) work on hosts without bcc or kprobes.
"""
from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Collection, Dict, List, Optional, Sequence, Tuple

from discover.errors import UserError
from discover.tracefs import TRACEFS_DIRS
from probes.backend import RINGBUF_READ_MS, Attachment, Rejected, major_minor
from probes.generate import generate
from probes.layout import KernelLayout
from probes.model import Probe, Tool, spec_nkeys
from probes.select import Chosen

if TYPE_CHECKING:
    from probes.model import Formats

#: BPF ring buffers exist from Linux 5.8 (bcc's support from 0.16)
RINGBUF_MIN_KERNEL = (5, 8)
#: task local storage usable from tracing programs (and bpf_get_current_task_btf) from 5.11
TASK_STORAGE_MIN_KERNEL = (5, 11)
#: bcc finds a module function's BTF for a fentry program from 0.28 (MODULE_KFUNC_PROBE's
#: kfunc__MODULE__FUNCTION names); before, only vmlinux's, where no NFS function is
FENTRY_MIN_BCC = (0, 28)
#: instances of each kretprobe: callers inside its function at once beyond this go untimed.
#: Why set it: bcc then makes the kretprobe in tracefs, where kprobe_profile shows the
#: kernel's missed count on every kernel (a perf-PMU kretprobe's count is nowhere before a
#: BPF link's, 6.7, and bcc makes no link); and the kernel's own default is 10, or one per
#: CPU on a kernel without preemption (Debian 11's: one on a one-CPU machine)
KRETPROBE_MAXACTIVE = 64


def import_bpf() -> Any:
    try:
        from bcc import BPF  # type: ignore[import-not-found]
    except ImportError:
        raise UserError("bcc's Python module is missing: apt-get install python3-bpfcc") from None
    return BPF


def bcc_version() -> str:
    """The imported bcc's version, "unknown" where it does not say."""
    return getattr(sys.modules.get("bcc"), "__version__", "unknown")


def ringbuf_support(release: str, bpf_class: Any) -> Tuple[bool, str]:
    """That slow events can go through a BPF ring buffer here (the probe's only buffer), and how
    (for --verbose); UserError where kernel or bcc has none (Linux 5.8, bcc 0.16: every kernel
    probekit supports has one). Why it: a record is submitted without a wakeup and read on a
    timer, where the perf buffer woke the reader from inside the program (in the lab 30-40 us
    of a 46-59 us getattr exit)."""
    version = major_minor(release)
    if version is None or version < RINGBUF_MIN_KERNEL:
        raise UserError(f"kernel {release} has no BPF ring buffer (Linux 5.8): probekit's tools need one")
    if not hasattr(bpf_class, "ring_buffer_consume"):
        raise UserError(f"bcc {bcc_version()} has no BPF ring buffer support (0.16): probekit's tools need it")
    return True, f"events: BPF ring buffer, submitted without wakeups, read every {RINGBUF_READ_MS} ms"


def task_storage_support(release: str, bcc_table: Any, have_btf: bool) -> Tuple[bool, str]:
    """Whether start times can live in task local storage here, and why (for --verbose).

    Why prefer it: a hash map keyed by thread costs a hashed lookup, a bucket lock and a
    free-list push per operation end; task storage is found through the current task. In
    the lab that cut the BPF time per event by a quarter to a half (under emulation the
    hash helpers' cold code and data are what the first program after a sleep pays for).
    """
    version = major_minor(release)
    if version is None or version < TASK_STORAGE_MIN_KERNEL:
        return False, f"start times: hash map (kernel {release} has no task storage for tracing, needs 5.11)"
    if not have_btf:
        return False, "start times: hash map (task storage needs the kernel's BTF)"
    if not hasattr(bcc_table, "BPF_MAP_TYPE_TASK_STORAGE"):
        return False, "start times: hash map (this bcc has no task storage, needs 0.24)"
    return True, "start times: task local storage"


def fentry_support(bpf_class: Any, version_text: str) -> Tuple[bool, str]:
    """Whether fentry/fexit programs can replace kprobe pairs here, and why (for --verbose).

    Why prefer them: a BPF trampoline calls the program directly, where a kprobe goes
    through an int3 or ftrace handler and a kretprobe swaps the return address; the
    kernel's selftests put a fentry+fexit pair near a third of a kprobe+kretprobe's cost.
    """
    if not bpf_class.support_kfunc():
        return False, ("attach: kprobes (no BPF trampolines: bcc's support_kfunc wants x86-64, "
                       "kernel BTF and bpf_trampoline_link_prog)")
    version = major_minor(version_text)
    if version is None or version < FENTRY_MIN_BCC:
        return False, (f"attach: kprobes (bcc {version_text} finds no module function's BTF for fentry: "
                       f"needs {'.'.join(map(str, FENTRY_MIN_BCC))})")
    return True, "attach: fentry/fexit for functions with a BTF prototype, kprobes for the others"


def load_detaching_on_failure(bpf_class: Any, text: str) -> Any:
    """bcc.BPF(text=...), with what bcc attached while constructing detached if it fails.

    bcc attaches tracepoint and fentry programs inside its constructor; when a later one
    fails to load or attach, the exception leaves the earlier ones attached until the
    process exits, beside the probe a fallback then compiles."""
    made: List[Any] = []

    class Tracked(bpf_class):  # type: ignore[misc,valid-type]
        def __init__(self, **kwargs: Any) -> None:
            made.append(self)
            super().__init__(**kwargs)

    try:
        return Tracked(text=text)
    except BaseException:
        for bpf in made:
            if hasattr(bpf, "tracefile"):  # got as far as its tables of attached programs
                bpf.cleanup()
        raise


def kprobe_profile(text: str) -> Dict[str, Tuple[int, int]]:
    """tracefs' kprobe_profile: event name -> (hits, missed); a kretprobe's missed counts its
    exhausted instances too."""
    out: Dict[str, Tuple[int, int]] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[1].isdigit() and fields[2].isdigit():
            out[fields[0]] = (int(fields[1]), int(fields[2]))
    return out


def read_kprobe_profile() -> Dict[str, Tuple[int, int]]:
    """kprobe_profile of the mounted tracefs; empty where none is mounted or readable."""
    for directory in TRACEFS_DIRS:
        try:
            return kprobe_profile((Path(directory) / "kprobe_profile").read_text())
        except OSError:
            continue
    return {}


def bcc_event_name(kind: str, function: str, pid: int) -> str:
    """The tracefs event bcc makes for a kprobe (p_) or kretprobe (r_) it creates there."""
    return f"{'r' if kind == 'kretprobe' else 'p'}_{function.replace('+', '_').replace('.', '_')}_bcc_{pid}"


def profile_missed(profile: Dict[str, Tuple[int, int]], kind: str, target: str, pid: int) -> Optional[int]:
    """The missed count kprobe_profile shows of process `pid`'s kprobe or kretprobe at `target`;
    None for other kinds and for a kprobe bcc made through the perf PMU (not in tracefs)."""
    if kind not in ("kprobe", "kretprobe"):
        return None
    return profile.get(bcc_event_name(kind, target, pid), (0, None))[1]


def bcc_program_attachment(program: str) -> Optional[Attachment]:
    """A program bcc attached itself while loading: its kfunc__[MODULE__]FUNCTION (fentry) or
    kretfunc__ (fexit) name says where; None for any other name."""
    for prefix, kind in (("kfunc__", "fentry"), ("kretfunc__", "fexit")):
        if program.startswith(prefix):
            return Attachment(program, kind, program[len(prefix):].split("__")[-1])
    return None


class BccMap:
    """probes.backend.MapView over one bcc table."""

    def __init__(self, table: Any) -> None:
        self.table = table

    def items(self) -> List[Tuple[Any, Any]]:
        return list(self.table.items())

    def keys(self) -> List[Any]:
        return list(self.table.keys())

    def delete(self, key: Any) -> None:
        try:
            del self.table[key]
        except KeyError:  # gone already
            pass

    def at(self, index: int) -> Any:
        return self.table[ctypes.c_int(index)]

    def all_values(self, count: int) -> List[Any]:
        try:  # one system call for the whole array where bcc and the kernel can (5.6+)
            batch = [v for _k, v in self.table.items_lookup_batch()][:count]
        except Exception:  # older bcc or kernel: one lookup per slot
            return [self.at(i) for i in range(count)]
        # a batch of scalars comes back as ints (ctypes array items): give the map's value type, as at() does
        return [self.table.Leaf(v) if isinstance(v, int) else v for v in batch]

    def key(self, value: int) -> Any:
        return self.table.Key(value)


class BccBackend:
    """probes.backend.Backend with bcc: the generated C is compiled here, at start-up."""

    name = "bcc"

    def __init__(self, spec: Dict[str, Any]) -> None:
        #: the width of the keyed points' keys: the spec's, as in the CO-RE object
        self.nkeys = spec_nkeys(spec)
        self.bpf_class = import_bpf()
        self.version = bcc_version()
        self.bpf: Any = None
        #: (kind, target, program) as attach() attached them
        self._attached: List[Tuple[str, str, str]] = []

    def ringbuf_support(self, release: str) -> Tuple[bool, str]:
        return ringbuf_support(release, self.bpf_class)

    def task_storage_support(self, release: str, have_btf: bool) -> Tuple[bool, str]:
        return task_storage_support(release, sys.modules.get("bcc.table"), have_btf)

    def fentry_support(self) -> Tuple[bool, str]:
        return fentry_support(self.bpf_class, getattr(sys.modules.get("bcc"), "__version__", "?"))

    def generate(self, chosen: Sequence[Chosen], tool: Tool, layout: Optional[KernelLayout], formats: Formats,
                 ringbuf: bool, task_storage: bool, fentry: Collection[str]) -> Probe:
        return generate(chosen, tool, layout, formats, ringbuf=ringbuf, task_storage=task_storage, fentry=fentry,
                        nkeys=self.nkeys)

    def load_notes(self) -> List[str]:
        return []

    def load(self, probe: Probe) -> None:
        try:
            self.bpf = load_detaching_on_failure(self.bpf_class, probe.c_text)
        except Exception as exc:  # bcc raises bare Exception on compile/load failure
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            # bcc names its trampoline programs kfunc__/kretfunc__ and says so when one fails
            raise Rejected(why, "fentry" if "kfunc" in why or "kernel func" in why else None) from None

    def attach(self, probe: Probe) -> None:
        for kind, target, program in probe.attach:
            try:
                if kind == "kprobe":
                    self.bpf.attach_kprobe(event=target, fn_name=program)
                elif kind == "kretprobe":
                    self.bpf.attach_kretprobe(event=target, fn_name=program, maxactive=KRETPROBE_MAXACTIVE)
                else:
                    self.bpf.attach_tracepoint(tp=target, fn_name=program)
            except Exception as exc:
                raise UserError(f"cannot attach to {target}: {str(exc).splitlines()[0]}") from None
            self._attached.append((kind, target, program))

    def attachments(self, release: str) -> List[Attachment]:
        """attach()'s kprobes, kretprobes and tracepoints, and the trampolines bcc attached
        while loading. A kprobe's missed count is kprobe_profile's where bcc made it in tracefs
        (every kretprobe: KRETPROBE_MAXACTIVE); bcc makes its kprobes through the perf PMU,
        whose count no interface shows without a BPF link."""
        profile = read_kprobe_profile() if any(k == "kretprobe" for k, _t, _p in self._attached) else {}
        out = [Attachment(program, kind, target, profile_missed(profile, kind, target, os.getpid()))
               for kind, target, program in self._attached]
        attached = {program for _k, _t, program in self._attached}
        for name in self.program_fds():
            found = bcc_program_attachment(name) if name not in attached else None
            if found is not None:
                out.append(found)
        return out

    def missed_counts(self, attachments: Sequence[Attachment], release: str) -> List[Optional[int]]:
        profile = read_kprobe_profile() if any(a.missed is not None for a in attachments) else {}
        return [profile_missed(profile, a.kind, a.target, os.getpid()) if a.missed is not None else None
                for a in attachments]

    def extend(self, probe: Probe, added: Sequence[Chosen], layout: Optional[KernelLayout],
               fentry: Collection[str]) -> Optional[Probe]:
        """None: bcc compiled one program for the points present at the start, and a
        second compile would have maps of its own (the tools say to restart)."""
        return None

    def set_cgroup_filter(self, fd: int) -> None:
        self.bpf["cgroup_filter"][0] = fd  # bcc's CgroupArray takes an fd (or a path)

    def map(self, name: str) -> BccMap:
        return BccMap(self.bpf[name])

    def program_fds(self) -> Dict[str, int]:
        return {(name.decode() if isinstance(name, bytes) else str(name)): func.fd
                for name, func in self.bpf.funcs.items()}

    def open_events(self, ringbuf: bool, handle: Callable[[bytes], None], lost: Callable[[int], None]) -> None:
        self.bpf["events"].open_ring_buffer(lambda _ctx, data, size: handle(ctypes.string_at(data, size)))

    def poll_events(self, ringbuf: bool) -> None:
        # sleeps the interval (records come without wakeups), then reads them all
        self.bpf.ring_buffer_poll(timeout=RINGBUF_READ_MS)
        self.bpf.ring_buffer_consume()

    def close(self) -> None:
        if self.bpf is not None:
            self.bpf.cleanup()
            self.bpf = None
        self._attached = []

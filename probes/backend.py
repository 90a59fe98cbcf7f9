"""What the latency tools need from a BPF loader, whichever one runs (bcc or libbpf).

Why an interface: runtime.Session chooses attach points, generates the probe and reads its
maps into dist, top, in-flight and missed records; only loading, attaching and raw map and
buffer access differ between a loader that compiles at start-up (bcc) and one that loads a
prebuilt object (libbpf). Session talks to a Backend only, so the tools cannot tell which ran.
Keys and values are ctypes objects whose fields are the C structs' (`key.op`, `value.value`).
"""
from __future__ import annotations

import re

from probes.layout import KernelLayout
from probes.model import Probe, Tool
from probes.select import Chosen

TYPE_CHECKING = False  # typing's constant without typing (discover/records.py)
if TYPE_CHECKING:
    from typing import Any, Callable, Collection, Dict, List, NamedTuple, Optional, Protocol, Sequence, Tuple
    from probes.model import Formats
else:
    from discover.records import NamedTuple
    Protocol = object  # the protocols below are type checkers' alone

#: user space reads the ring buffer this often: events are submitted without a wakeup, so
#: this bounds how late a line is printed
RINGBUF_READ_MS = 100
#: the kernel counts what it skips of kprobe and tracepoint programs (their recursion_misses,
#: a kprobe link's missed) from 6.7
MISSES_MIN_KERNEL = (6, 7)


def major_minor(release: str) -> Optional[Tuple[int, int]]:
    """(major, minor) of a kernel release or a loader's version string."""
    match = re.match(r"(\d+)\.(\d+)", release)
    return (int(match.group(1)), int(match.group(2))) if match else None


class Rejected(Exception):
    """The kernel or loader refused the probe as generated; str(): the first line of why.
    `feature`: what the loader saw refused, where it can tell ("fentry": a trampoline program),
    so that Session generates the probe again without it (without task storage otherwise)."""

    def __init__(self, message: str, feature: Optional[str] = None) -> None:
        super().__init__(message)
        self.feature = feature


class Attachment(NamedTuple):
    """How one loaded program is attached, and what the kernel counts of the runs it never
    started there. Why: a kprobe the kernel skips (another kprobe running on that CPU) or a
    kretprobe whose instances ran out (maxactive callers inside the function at once) loses an
    operation that no BPF program sees; only the kernel's own count says so."""

    program: str
    kind: str        # kprobe | kretprobe | tracepoint | fentry | fexit
    target: str      # the function, or SYSTEM:EVENT
    #: the kernel's missed count of this kprobe or kretprobe (a kretprobe's includes its
    #: exhausted instances); None where neither kernel nor loader exposes it, and for the
    #: other kinds (their skipped runs are the program's recursion_misses)
    missed: Optional[int] = None


class MapView(Protocol):
    """One BPF map of the loaded probe, read from user space."""

    def items(self) -> List[Tuple[Any, Any]]:
        """Every (key, value), read before the caller deletes any (deleting while walking a
        BPF hash restarts the walk)."""

    def keys(self) -> List[Any]: ...

    def delete(self, key: Any) -> None:
        """Remove one key; nothing happens when it is absent already."""

    def at(self, index: int) -> Any:
        """An array map's element."""

    def all_values(self, count: int) -> List[Any]:
        """An array map's first `count` elements in index order, in one system call where the
        loader and kernel can (5.6+)."""

    def key(self, value: int) -> Any:
        """A key of this map made from an integer (a scalar-keyed hash)."""


class Backend(Protocol):
    """A BPF loader as Session uses it; `name` and `version` are what --verbose and the
    exporter's build info say."""

    name: str
    version: str

    def ringbuf_support(self, release: str) -> Tuple[bool, str]: ...

    def task_storage_support(self, release: str, have_btf: bool) -> Tuple[bool, str]: ...

    def fentry_support(self) -> Tuple[bool, str]: ...

    def generate(self, chosen: Sequence[Chosen], tool: Tool, layout: Optional[KernelLayout], formats: Formats,
                 ringbuf: bool, task_storage: bool, fentry: Collection[str]) -> Probe:
        """The probe for these choices as this loader runs it (probes.generate.generate's
        arguments): its ops, letters and points are what Session's readers decode by."""

    def load(self, probe: Probe) -> None:
        """Load the probe (attaching what the loader attaches while loading); Rejected when
        the kernel or loader refuses it, with nothing left attached."""

    def load_notes(self) -> List[str]:
        """What --verbose says of how the last load() went (core: how fentry targets were given)."""

    def attach(self, probe: Probe) -> None:
        """Attach the programs load() left unattached; UserError naming the function that failed."""

    def extend(self, probe: Probe, added: Sequence[Chosen], layout: Optional[KernelLayout],
               fentry: Collection[str]) -> Optional[Probe]:
        """Load and attach the points of `added` (candidates the probe runs, with points of a
        module loaded since) beside the running programs, writing the same maps, and return
        the probe with them; None when this loader cannot (the caller says to restart);
        Rejected when the kernel refuses them, with nothing of them left attached."""

    def set_cgroup_filter(self, fd: int) -> None:
        """Put --cgroup's directory fd into cgroup_filter[0]."""

    def map(self, name: str) -> MapView: ...

    def program_fds(self) -> Dict[str, int]:
        """Each loaded program's name and fd (for /proc/self/fdinfo counters)."""

    def attachments(self, release: str) -> List[Attachment]:
        """Every loaded program's attachment, with its kprobe's missed count where the kernel
        (`release`) and this loader expose one: a BPF link's (6.7+) or tracefs' kprobe_profile."""

    def missed_counts(self, attachments: Sequence[Attachment], release: str) -> List[Optional[int]]:
        """attachments()'s missed counts read again, in its order (None where it gave None).
        Why apart: the list is built once after attaching; a tick or scrape reads counts only."""

    def open_events(self, ringbuf: bool, handle: Callable[[bytes], None], lost: Callable[[int], None]) -> None:
        """Deliver each record of the `events` buffer to `handle`; `lost` counts the perf
        buffer's drops (a ring buffer counts its own in lost_events)."""

    def poll_events(self, ringbuf: bool) -> None:
        """Read what the buffer holds, waiting a short while first."""

    def close(self) -> None:
        """Detach every program and free the maps; safe to call twice."""

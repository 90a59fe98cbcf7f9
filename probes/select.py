"""Pick, per operation, the first spec candidate whose attach points exist on this kernel.

Why separate from the bcc front end: the choice only needs what tracefs and /proc say
(available_filter_functions, available_events, loaded modules), so it is tested on the
host against real captures, and the tools print it with --verbose before compiling.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Set, Tuple

from discover.errors import UserError
from discover.events import parse_format
from discover.tracefs import Host, find_tracefs


#: the `[module]` field of a module function's line in available_filter_functions
_MODULE_FIELD = re.compile(r"\[[^\]\s]*\]")


def filter_function_names(text: str) -> Set[str]:
    """The function names of available_filter_functions (`name` or `name [module]` a line):
    its words but the `[module]` ones. Split in C: a Python loop over the 50,000+ lines
    took 0.3 s of a tool's start in a TCG guest."""
    names = set(text.split())
    names.difference_update(_MODULE_FIELD.findall(text))
    return names


def why_denied(exc: OSError) -> str:
    """What is really missing when tracefs refuses a read: root, or (as root) the kernel's consent."""
    import errno
    import os
    if exc.errno not in (errno.EPERM, errno.EACCES):
        return "is tracefs complete on this kernel?"
    if os.geteuid() != 0:
        return "run as root"
    return ("refused even to root: kernel lockdown, a container or sandbox without tracing rights, "
            "or a missing CAP_SYS_ADMIN")


class KernelFacts:
    """What a kernel offers for attaching: traceable functions, tracepoints, modules."""

    def __init__(self, functions: Iterable[str], events: Iterable[str], modules: Iterable[str],
                 release: str = "?", tracefs: Optional[Path] = None,
                 formats: Optional[Dict[str, Set[str]]] = None) -> None:
        self.formats = formats or {}
        self.functions: Set[str] = set(functions)
        self.events: Set[str] = set(events)
        self.modules: Set[str] = set(modules)
        self.release = release
        self.tracefs = tracefs

    @staticmethod
    def parse_modules(text: str) -> Set[str]:
        """Module names from /proc/modules or `lsmod` output (header line skipped)."""
        return {line.split()[0] for line in text.splitlines()
                if line.strip() and line.split()[0] != "Module"}

    @classmethod
    def from_tracefs(cls, tracefs: Path, modules_text: str, release: str = "?") -> "KernelFacts":
        try:
            functions = filter_function_names((tracefs / "available_filter_functions").read_text(errors="replace"))
            events = {line.strip() for line in (tracefs / "available_events").read_text().splitlines()
                      if line.strip()}
        except OSError as exc:
            raise UserError(f"cannot read {exc.filename}: {exc.strerror} ({why_denied(exc)})") from None
        return cls(functions, events, cls.parse_modules(modules_text), release, tracefs)

    @classmethod
    def live(cls) -> "KernelFacts":
        import os
        tracefs = find_tracefs(Host.from_env())
        try:
            modules_text = Path("/proc/modules").read_text()
        except OSError:
            modules_text = ""
        return cls.from_tracefs(tracefs, modules_text, os.uname().release)

    @classmethod
    def from_profile(cls, profile: Any) -> "KernelFacts":
        """From a `discover snapshot` profile (discover.profile.KernelProfile): another kernel."""
        data = profile.data
        events: Set[str] = set()
        formats: Dict[str, Set[str]] = {}
        for system, names in (data.get("events") or {}).items():
            for name, info in names.items():
                events.add(f"{system}:{name}")
                if info and info.get("fields"):
                    formats[f"{system}:{name}"] = {f["name"] for f in info["fields"]}
        functions = {name for name, _module in data.get("filter_functions") or []}
        return cls(functions, events, (data.get("modules") or {}).keys(), profile.release, None, formats)

    def live_fields(self, event: str) -> Optional[List[Dict[str, Any]]]:
        """SYSTEM:EVENT's fields from its live format file (discover.events parses it)."""
        if self.tracefs is None:
            return None
        system, _, name = event.partition(":")
        try:
            return parse_format((self.tracefs / "events" / system / name / "format").read_text())["fields"]
        except (OSError, ValueError):
            return None

    def event_fields(self, event: str) -> Optional[Set[str]]:
        """Field names of SYSTEM:EVENT from its format, None when not known here."""
        if event in self.formats:
            return self.formats[event]
        fields = self.live_fields(event)
        return None if fields is None else {f["name"] for f in fields}

    def has(self, name: str, kind: str) -> bool:
        if kind == "tracepoint":
            return name in self.events
        return name in self.functions


class Chosen(NamedTuple):
    """The candidate used for one operation and the attach points present for it."""

    op: str
    letter: str
    index: int              # position of the candidate in the spec's list
    candidate: Dict[str, Any]
    points: List[Dict[str, Any]]
    skipped: List[str]      # why earlier candidates / optional points were not used
    #: tracked in flight only (spec.INFLIGHT_ALWAYS beneath what --ops asked): its
    #: completions are neither printed nor counted
    watch: bool = False
    #: one of the op's `context` candidates: it times nothing, it names what the op's
    #: request works on (nfsd's fh_verify: the export)
    context: bool = False


class Selection(NamedTuple):
    chosen: List[Chosen]
    uncovered: Dict[str, str]  # op -> why no candidate works

    def btf_modules(self) -> List[str]:
        """Modules whose BTF the tool loads for offsets: those the chosen points live in."""
        return sorted({m for c in self.chosen for p in c.points
                       for m in p.get("module", "").split(",") if m and m != "vmlinux"})


def _missing_reason(point: Dict[str, Any], facts: KernelFacts, kind: str, end: str) -> str:
    name = point[end]
    module = point.get("module", "")
    if module and module != "vmlinux" and facts.modules and module.split(",")[0] not in facts.modules:
        return f"{name}: module {module} not loaded"
    where = "available_events" if kind == "tracepoint" else "available_filter_functions"
    return f"{name}: not in {where}"


def _point_missing(point: Dict[str, Any], kind: str, facts: KernelFacts) -> Optional[str]:
    for end in ("entry", "exit"):
        if not facts.has(point[end], kind):
            return _missing_reason(point, facts, kind, end)
    return None


def _fields_missing(point: Dict[str, Any], cand: Dict[str, Any], facts: KernelFacts) -> Optional[str]:
    """A tracepoint whose format lacks a key field cannot be matched (format readable only live)."""
    if cand["kind"] != "tracepoint":
        return None
    for end, fields_needed in (("entry", cand.get("keys", [])), ("exit", cand.get("keys", []))):
        fields = facts.event_fields(point[end])
        if fields is None:
            continue
        absent = [f for f in fields_needed if f not in fields]
        if absent:
            return f"{point[end]}: no field {', '.join(absent)}"
    return None


def select(spec: Dict[str, Any], facts: KernelFacts, ops: Sequence[str]) -> Selection:
    """For each requested op, the first candidate with all required points present."""
    chosen: List[Chosen] = []
    uncovered: Dict[str, str] = {}
    for op in ops:
        entry = spec["ops"].get(op)
        if entry is None:
            uncovered[op] = "not in the probe spec"
            continue
        found, skipped = _first_present(op, entry["letter"], entry["candidates"], facts)
        if found is not None:
            chosen.append(found)
        else:
            uncovered[op] = "; ".join(skipped) or "no candidates"
    return Selection(chosen, uncovered)


def _first_present(op: str, letter: str, candidates: List[Dict[str, Any]], facts: KernelFacts,
                   context: bool = False) -> Tuple[Optional[Chosen], List[str]]:
    """The first candidate with all required points present (None), and why earlier ones were not."""
    skipped: List[str] = []
    for index, cand in enumerate(candidates):
        present: List[Dict[str, Any]] = []
        blocker = None
        notes = []
        for point in cand["attach"]:
            why = _point_missing(point, cand["kind"], facts) or _fields_missing(point, cand, facts)
            if why is None:
                present.append(point)
            elif point.get("optional", False):
                notes.append(f"optional {why}")
            else:
                blocker = why
                break
        label = f"#{index + 1} {cand['kind']} {'+'.join(p['entry'] for p in cand['attach'])}"
        if blocker is None and present:
            return Chosen(op, letter, index, cand, present, skipped + notes, context=context), skipped
        skipped.append(f"{label}: {blocker or 'no attach point present'}")
    return None, skipped


def select_context(spec: Dict[str, Any], facts: KernelFacts, op: str) -> Optional[Chosen]:
    """The first of `op`'s context candidates present here (None: the spec has none, or none is)."""
    entry = spec["ops"].get(op) or {}
    return _first_present(op, entry.get("letter", ""), entry.get("context", []), facts, context=True)[0]


def late_points(chosen: Chosen, facts: KernelFacts) -> List[Dict[str, Any]]:
    """The points of a running candidate that were absent when it was chosen and are present
    on `facts` (optional points of a module loaded since), in the spec's order."""
    cand = chosen.candidate
    return [point for point in cand["attach"] if point not in chosen.points
            and _point_missing(point, cand["kind"], facts) is None and _fields_missing(point, cand, facts) is None]

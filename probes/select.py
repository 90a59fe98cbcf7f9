"""Pick, per operation, the first spec candidate whose attach points exist on this kernel.

Why separate from the bcc front end: the choice only needs what the kernel says of a few
names (functions, tracepoints, loaded modules), so it is tested on the host against real
captures, and the tools print it with --verbose before compiling. A live start asks per
name (LiveFacts): the kernel's BTF for functions, tracefs's events directory for
tracepoints; the 57,000-line available_filter_functions only where BTF cannot answer.
"""
from __future__ import annotations

import re
from pathlib import Path

from discover.errors import UserError

TYPE_CHECKING = False  # typing's constant without typing (discover/records.py)
if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Set, Tuple
    from probes.layout import KernelLayout
else:
    from discover.records import NamedTuple


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
        self._functions: Set[str] = set(functions)
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

    @property
    def functions(self) -> Set[str]:
        """The traceable functions' names."""
        return self._functions

    @classmethod
    def live(cls, btf_dir: Optional[Path] = None, modules: Sequence[str] = ()) -> "LiveFacts":
        """The running kernel's (LiveFacts): with `btf_dir`, functions are looked up in the BTF
        of vmlinux and of those of `modules` that are loaded; else in the function list."""
        import os
        from discover.tracefs import Host, find_tracefs
        tracefs = find_tracefs(Host.from_env())
        try:  # a tracefs that refuses reading (or is not there) fails here, in one line, not as "nothing found"
            os.listdir(tracefs / "events")
        except OSError as exc:
            raise UserError(f"cannot read {exc.filename}: {exc.strerror} ({why_denied(exc)})") from None
        try:
            loaded = cls.parse_modules(Path("/proc/modules").read_text())
        except OSError:
            loaded = set()
        layout = None
        if btf_dir is not None:
            from probes.layout import KernelLayout
            layout = KernelLayout.live(btf_dir, tuple(m for m in modules if m in loaded))
        return LiveFacts(tracefs, loaded, os.uname().release, layout)

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
        from discover.events import parse_format
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

    def has(self, name: str, kind: str, module: str = "") -> bool:
        """Whether the function or SYSTEM:EVENT `name` (of the spec's `module`) is here."""
        if kind == "tracepoint":
            return name in self.events
        return name in self.functions

    def function_source(self, name: str, module: str = "") -> str:
        """Where has() looked for the function `name`: what a skipped candidate's reason names."""
        return "available_filter_functions"


class LiveFacts(KernelFacts):
    """The running kernel's facts, asked per name, as a start needs a few dozen of them.

    Why: the kernel writes available_filter_functions (57,000 lines on Debian 6.12) anew on
    every read, 1.2-1.8 s of a start in a TCG guest. A function the spec names is looked up
    in the BTF of vmlinux and of the spec's modules that are loaded (pahole encodes every
    function; those the kernel cannot trace are rare, and an fentry attach they refuse falls
    back to kprobes, runtime.Session); a module without BTF here, or no BTF at all (Debian
    11), leaves that name to available_filter_functions, read once when first needed. A
    tracepoint is its directory under tracefs's events/, which available_events lists.
    """

    def __init__(self, tracefs: Path, modules: Iterable[str], release: str,
                 layout: Optional["KernelLayout"]) -> None:
        super().__init__((), (), modules, release, tracefs)
        self.layout = layout
        self._listed: Optional[Set[str]] = None

    @property
    def functions(self) -> Set[str]:
        """available_filter_functions' names, read on first use."""
        if self._listed is None:
            assert self.tracefs is not None
            try:
                text = (self.tracefs / "available_filter_functions").read_text(errors="replace")
            except OSError as exc:
                raise UserError(f"cannot read {exc.filename}: {exc.strerror} ({why_denied(exc)})") from None
            self._listed = filter_function_names(text)
        return self._listed

    def _btf_answers(self, module: str) -> bool:
        """Whether BTF says all there is of `module`'s functions (and vmlinux's): it has
        vmlinux's BTF, and that of each of the named modules that is loaded."""
        if self.layout is None:
            return False
        named = [m for m in module.split(",") if m and m != "vmlinux"]
        return all(m in self.layout.modules for m in named if m in self.modules)

    def has(self, name: str, kind: str, module: str = "") -> bool:
        if kind == "tracepoint":
            assert self.tracefs is not None
            system, _, event = name.partition(":")
            return bool(system and event) and (self.tracefs / "events" / system / event).is_dir()
        if self.layout is not None and self.layout.btf_module_of(name) is not None:
            return True
        if self._btf_answers(module):
            return False
        return name in self.functions

    def function_source(self, name: str, module: str = "") -> str:
        if self._btf_answers(module):
            assert self.layout is not None
            return "in the BTF of " + ", ".join(["vmlinux"] + sorted(self.layout.modules))
        return "available_filter_functions"


def spec_modules(spec: Dict[str, Any]) -> List[str]:
    """Every module the spec's attach points name: those whose BTF a live start reads."""
    return sorted({m for op in spec["ops"].values() for cand in list(op["candidates"]) + list(op.get("context", []))
                   for point in cand["attach"] for m in point.get("module", "").split(",") if m and m != "vmlinux"})


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
    if kind == "tracepoint":
        return f"{name}: not in available_events"
    where = facts.function_source(name, module)
    return f"{name}: not {where}" if where.startswith("in ") else f"{name}: not in {where}"


def _point_missing(point: Dict[str, Any], kind: str, facts: KernelFacts) -> Optional[str]:
    for end in ("entry", "exit"):
        if not facts.has(point[end], kind, point.get("module", "")):
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

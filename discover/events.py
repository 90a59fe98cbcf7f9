"""Tracepoints of a subsystem: their fields, the pairs that bracket an operation, the singles.

Why: a latency needs two timestamps. A tracepoint pair (`nfs_getattr_enter`/`_exit`) is the
most stable way to get them, but only some events come in pairs, and an `initiate`/`done`
pair brackets asynchronous work (the done fires in another task, e.g. an rpciod kworker),
so it must be matched on shared fields (fileid, offset), not on the thread id.
"""
from __future__ import annotations

import re
from pathlib import Path

from discover.errors import UserError

TYPE_CHECKING = False  # typing's constant without typing (discover/records.py)
if TYPE_CHECKING:
    from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple
else:
    from discover.records import NamedTuple

_FIELD_RE = re.compile(r"^\s*field:(?P<decl>[^;]*);\s*offset:(?P<offset>\d+);\s*size:(?P<size>\d+);"
                       r"(?:\s*signed:(?P<signed>-?\d+);)?")

#: (start suffix, end suffixes) for same-task pairs, most specific first
SUFFIX_PAIRS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("_enter", ("_exit", "_done", "_return")),
    ("_entry", ("_exit", "_return")),
    ("_start", ("_done", "_end", "_finish", "_complete", "_exit")),
    ("_begin", ("_end", "_done")),
)
#: a bare event `X` paired with `X<suffix>` (nfs_aop_readpage / nfs_aop_readpage_done)
BARE_END_SUFFIXES = ("_done", "_exit", "_complete", "_end")
#: words that mark the start of asynchronous work whose completion is a `*_done` event
INITIATE_WORDS = ("initiate", "submit", "issue", "send")


class Field(NamedTuple):
    name: str
    type: str
    offset: int
    size: int
    signed: bool
    common: bool


class EventPair(NamedTuple):
    system: str
    start: str
    end: str
    #: "sync": both fire in the calling task around one call (match on pid/tid);
    #: "async": the end fires elsewhere (match on `keys`)
    kind: str
    #: non-common fields present in both events, to match a start with its end
    keys: Tuple[str, ...]

    @property
    def operation(self) -> str:
        """The operation the pair names (`nfs_getattr_enter` -> `getattr`)."""
        return operation_name(self.system, self.start)


def parse_format(text: str) -> Dict[str, Any]:
    """An `events/<sys>/<event>/format` file -> {"id", "print_fmt", "fields": [...]}."""
    event_id: Optional[int] = None
    print_fmt = ""
    fields: List[Dict[str, Any]] = []
    for line in text.splitlines():
        if line.startswith("ID:"):
            event_id = int(line[3:].strip())
        elif line.startswith("print fmt:"):
            print_fmt = line[len("print fmt:"):].strip()
        else:
            match = _FIELD_RE.match(line)
            if match:
                ftype, fname = _split_decl(match.group("decl"))
                fields.append({"name": fname, "type": ftype, "offset": int(match.group("offset")),
                               "size": int(match.group("size")),
                               "signed": match.group("signed") == "1",
                               "common": fname.startswith("common_")})
    if event_id is None and not fields:
        raise ValueError("not a tracepoint format file")
    return {"id": event_id, "print_fmt": print_fmt, "fields": fields}


def _split_decl(decl: str) -> Tuple[str, str]:
    """`unsigned long flags` -> (type, name); `char name[16]` -> ("char[16]", "name")."""
    decl = decl.strip()
    array = ""
    bracket = re.search(r"(\[[^\]]*\])$", decl)
    head = decl
    if bracket and not decl.endswith("[]"):
        array = bracket.group(1)
        head = decl[:bracket.start()]
    type_part, _, name = head.rpartition(" ")
    name = name.lstrip("*")
    stars = head[len(type_part) + 1:len(head) - len(name)]
    return (type_part + stars).strip() + array, name


def fields_of(event: Dict[str, Any]) -> List[Field]:
    return [Field(**f) for f in (event.get("fields") or [])]


def operation_name(system: str, event: str) -> str:
    """Strip the subsystem prefix and pairing suffix: `nfs_fsync_enter` -> `fsync`."""
    name = event
    for prefix in (system + "_", system.rstrip("0123456789") + "_"):
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    for word in INITIATE_WORDS:
        if name.startswith(word + "_"):
            return name[len(word) + 1:]
    for start, ends in SUFFIX_PAIRS:
        for suffix in (start,) + ends:
            if name.endswith(suffix):
                return name[:-len(suffix)]
    for suffix in BARE_END_SUFFIXES:
        if name.endswith(suffix):
            return name[:-len(suffix)]
    return name


def _shared_keys(system_events: Dict[str, Dict[str, Any]], start: str, end: str) -> Tuple[str, ...]:
    a = [f.name for f in fields_of(system_events.get(start) or {}) if not f.common]
    b = {f.name for f in fields_of(system_events.get(end) or {}) if not f.common}
    return tuple(name for name in a if name in b)


def find_pairs(system: str, system_events: Dict[str, Dict[str, Any]]) -> List[EventPair]:
    """Pair the events of one system that bracket an operation (each event in one pair at most)."""
    names = set(system_events)
    used: set = set()
    pairs: List[EventPair] = []

    def add(start: str, end: str, kind: str) -> None:
        used.update((start, end))
        pairs.append(EventPair(system, start, end, kind, _shared_keys(system_events, start, end)))

    for name in sorted(names):
        for start_sfx, end_sfxs in SUFFIX_PAIRS:
            if name.endswith(start_sfx) and name not in used:
                stem = name[:-len(start_sfx)]
                for end_sfx in end_sfxs:
                    if stem + end_sfx in names and stem + end_sfx not in used:
                        add(name, stem + end_sfx, "sync")
                        break
    for name in sorted(names - used):
        for end_sfx in BARE_END_SUFFIXES:
            if name + end_sfx in names - used:
                add(name, name + end_sfx, "sync")
                break
    for name in sorted(names - used):
        for word in INITIATE_WORDS:
            marker = f"_{word}_"
            if marker not in name:
                continue
            prefix, _, stem = name.partition(marker)
            done = [n for n in names - used
                    if n.startswith(f"{prefix}_{stem}") and n.endswith("_done")]
            if done:
                # the completion that shares the most fields (fileid, offset...) with the start
                best = max(sorted(done), key=lambda n: (len(_shared_keys(system_events, name, n)), -len(n)))
                add(name, best, "async")
                break
    return sorted(pairs, key=lambda p: p.start)


def singles(system_events: Dict[str, Dict[str, Any]], pairs: Sequence[EventPair]) -> List[str]:
    """Events in no pair: they mark a moment, they cannot time anything alone."""
    paired = {p.start for p in pairs} | {p.end for p in pairs}
    return sorted(name for name in system_events if name not in paired)


def read_system_from_tracefs(tracefs: Path, system: str) -> Dict[str, Dict[str, Any]]:
    """Every event of one system from a tracefs tree (`events/<sys>/<event>/format`)."""
    out: Dict[str, Dict[str, Any]] = {}
    sysdir = tracefs / "events" / system
    for event_dir in sorted(sysdir.iterdir()):
        fmt = event_dir / "format"
        if not event_dir.is_dir() or not fmt.exists():
            continue
        try:
            out[event_dir.name] = parse_format(fmt.read_text(errors="replace"))
        except (OSError, ValueError):
            out[event_dir.name] = {"id": None, "print_fmt": "", "fields": None}
    return out


def tracefs_systems(tracefs: Path) -> List[str]:
    events = tracefs / "events"
    if not events.is_dir():
        return []
    return sorted(p.name for p in events.iterdir() if p.is_dir())


def unknown_system_error(system: str, known: Sequence[str], where: str) -> UserError:
    import difflib  # for this error's suggestions only: every tool's start parses event formats here

    close = difflib.get_close_matches(system, list(known), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return UserError(f"no tracepoint subsystem {system!r} in {where}{hint} "
                     f"(is its module loaded? e.g. `modprobe {system}`)")


def describe_systems(systems: Sequence[str], events_by_system: Dict[str, Dict[str, Dict[str, Any]]],
                     where: str) -> List[Dict[str, Any]]:
    """The report `discover events` prints: per system its pairs, singles and fields."""
    report = []
    for system in systems:
        if system not in events_by_system:
            raise unknown_system_error(system, sorted(events_by_system), where)
        system_events = events_by_system[system]
        pairs = find_pairs(system, system_events)
        report.append({
            "system": system,
            "pairs": [dict(p._asdict(), operation=p.operation) for p in pairs],
            "singles": singles(system_events, pairs),
            "events": {name: [f.name for f in fields_of(ev) if not f.common]
                       if ev.get("fields") is not None else None
                       for name, ev in sorted(system_events.items())},
        })
    return report

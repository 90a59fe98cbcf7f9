"""Shape checks for the files probekit reads, with errors that name the file and the first bad field.

Why: a file that is valid JSON but not what a command expects (a string where a number
is due, a list of names instead of node objects) otherwise fails deep inside the
command as a KeyError or TypeError, or worse, is read as empty. Every loader checks its
input here first, so the user gets one line such as
`a.json: links[3].total_us: expected a number, got 'abc'`.

A shape is a Python type (str, int, float = any finite number, bool), a Shape object
below, or ANY. Shapes describe only what the code relies on; extra keys are allowed
unless a Record says otherwise (then they are rejected with a "did you mean").
"""
from __future__ import annotations

import difflib
import math
from typing import Any, Dict, Iterable, Optional, Sequence, Tuple

from discover.errors import UserError, short

ANY = object()


class Shape:
    """A rule for one value; `check` raises Invalid(path, problem) on the first violation."""

    def describe(self) -> str:
        raise NotImplementedError

    def check(self, value: Any, path: str) -> None:
        raise NotImplementedError


class Invalid(Exception):
    """The first field that does not fit, before the file name is known (see validate)."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path or '(top level)'}: {problem}")
        self.path = path
        self.problem = problem


_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


def describe(shape: Any) -> str:
    if shape is ANY:
        return "anything"
    if isinstance(shape, Shape):
        return shape.describe()
    return _NAMES[shape]


def _fits_scalar(value: Any, shape: type) -> bool:
    if shape is bool:
        return isinstance(value, bool)
    if shape is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if shape is float:
        return (isinstance(value, (int, float)) and not isinstance(value, bool)
                and math.isfinite(value))
    return isinstance(value, shape)


def check(value: Any, shape: Any, path: str) -> None:
    """Raise Invalid naming the first place where `value` does not fit `shape`."""
    if shape is ANY:
        return
    if isinstance(shape, Shape):
        shape.check(value, path)
    elif not _fits_scalar(value, shape):
        raise Invalid(path, f"expected {describe(shape)}, got {short(value)}")


def _at(path: str, key: Any) -> str:
    return f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else str(key))


class Nullable(Shape):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def describe(self) -> str:
        return f"{describe(self.inner)} or null"

    def check(self, value: Any, path: str) -> None:
        if value is not None:
            check(value, self.inner, path)


class OneOf(Shape):
    """One of a few literal values (a schema name, an enumeration)."""

    def __init__(self, *values: Any) -> None:
        self.values = values

    def describe(self) -> str:
        return " or ".join(repr(v) for v in self.values)

    def check(self, value: Any, path: str) -> None:
        if isinstance(value, bool) or value not in self.values:
            raise Invalid(path, f"expected {self.describe()}, got {short(value)}")


class AtLeast(Shape):
    """A number (int or float) not below `low`."""

    def __init__(self, kind: type, low: float) -> None:
        self.kind, self.low = kind, low

    def describe(self) -> str:
        return f"{describe(self.kind)} >= {self.low:g}"

    def check(self, value: Any, path: str) -> None:
        if not _fits_scalar(value, self.kind) or value < self.low:
            raise Invalid(path, f"expected {self.describe()}, got {short(value)}")


class NonEmpty(Shape):
    def describe(self) -> str:
        return "a non-empty string"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, str) or not value:
            raise Invalid(path, f"expected {self.describe()}, got {short(value)}")


class ListOf(Shape):
    def __init__(self, item: Any, min_len: int = 0) -> None:
        self.item, self.min_len = item, min_len

    def describe(self) -> str:
        return "a list" if self.min_len == 0 else "a non-empty list"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, list) or len(value) < self.min_len:
            raise Invalid(path, f"expected {self.describe()}, got {short(value)}")
        if self.item is not ANY:
            for i, item in enumerate(value):
                check(item, self.item, _at(path, i))


class Pair(Shape):
    """A fixed-length list, e.g. `[name, module]`."""

    def __init__(self, *items: Any) -> None:
        self.items = items

    def describe(self) -> str:
        return f"a list of {len(self.items)} ({', '.join(describe(i) for i in self.items)})"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, list) or len(value) != len(self.items):
            raise Invalid(path, f"expected {self.describe()}, got {short(value)}")
        for i, (item, shape) in enumerate(zip(value, self.items)):
            check(item, shape, _at(path, i))


class MapOf(Shape):
    """An object with free keys (names), every value of one shape."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def describe(self) -> str:
        return "an object"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, dict):
            raise Invalid(path, f"expected an object, got {short(value)}")
        if self.value is not ANY:
            for key, item in value.items():
                check(item, self.value, _at(path, key))


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """` (did you mean 'kernel'?)` for a likely typo of a known word, else the known words."""
    known = sorted(known)
    close = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(known)})"


class Record(Shape):
    """An object with named fields: `required` must be there, `optional` may be; with
    closed=True any other key is a typo and is rejected with a suggestion."""

    def __init__(self, required: Optional[Dict[str, Any]] = None, optional: Optional[Dict[str, Any]] = None,
                 closed: bool = False) -> None:
        self.required = required or {}
        self.optional = optional or {}
        self.closed = closed

    def describe(self) -> str:
        return "an object"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, dict):
            raise Invalid(path, f"expected an object, got {short(value)}")
        if self.closed:
            fields = set(self.required) | set(self.optional)
            for key in value:
                if key not in fields:
                    raise Invalid(_at(path, key), "unknown key" + did_you_mean(str(key), fields))
        for key, shape in self.required.items():
            if key not in value:
                raise Invalid(_at(path, key), f"missing (expected {describe(shape)})")
            check(value[key], shape, _at(path, key))
        for key, shape in self.optional.items():
            if key in value:
                check(value[key], shape, _at(path, key))


def validate(value: Any, shape: Any, origin: str, what: str = "") -> None:
    """check(), as one UserError line: `ORIGIN: [WHAT: ]PATH: PROBLEM`."""
    try:
        check(value, shape, "")
    except Invalid as exc:
        raise UserError(f"{origin}: {what + ': ' if what else ''}{exc}") from None
    except RecursionError:
        raise UserError(f"{origin}: {what + ': ' if what else ''}nested too deeply") from None


# -- the shapes of probekit's files -------------------------------------------------------

NUMBER = AtLeast(float, 0)
COUNT = AtLeast(int, 0)

#: a node-link graph as any tool writes it (networkx's "links" or newer "edges"): what
#: `discover propose --callgraphs` reads
NODE_LINK_NODE = Record({"id": ANY}, {"module": Nullable(str), "events": MapOf(COUNT), "min_depth": int})
NODE_LINK_LINK = Record({"source": ANY, "target": ANY}, {"total_us": NUMBER, "calls": COUNT})

#: what `discover callgraph --format json` writes (discover.callgraph.to_digraph), as `discover diff` reads it
CALLGRAPH_NODE = Record({"id": NonEmpty()}, {
    "calls": COUNT, "total_us": NUMBER, "self_us": float, "max_us": NUMBER, "module": Nullable(str),
    "min_depth": int, "irq": bool, "cut_start": COUNT, "cut_end": COUNT, "events": MapOf(COUNT)})
CALLGRAPH_LINK = Record({"source": NonEmpty(), "target": NonEmpty(), "calls": COUNT, "total_us": NUMBER,
                         "avg_us": NUMBER},
                        {"max_us": NUMBER, "irq_calls": COUNT, "irq_total_us": NUMBER, "irq_max_us": NUMBER,
                         "kind": str})


def node_link_parts(data: Any, origin: str, node: Any = NODE_LINK_NODE, link: Any = NODE_LINK_LINK,
                    closed: bool = False) -> Tuple[list, list]:
    """The checked nodes and links of a node-link JSON document (links under "links" or "edges");
    with closed=True every link must join two of the listed nodes."""
    key = "edges" if isinstance(data, dict) and "edges" in data and "links" not in data else "links"
    what = "not a node-link call graph"
    validate(data, Record({"nodes": ListOf(node)}, {key: ListOf(link)}), origin, what)
    links = data.get(key, [])
    if closed:
        ids = {n["id"] for n in data["nodes"]}
        for i, entry in enumerate(links):
            for end in ("source", "target"):
                if entry[end] not in ids:
                    raise UserError(f"{origin}: {what}: {key}[{i}].{end}: {short(entry[end])} is not one of the nodes")
    return data["nodes"], links


FIELD = Record({"name": NonEmpty(), "type": str}, {"offset": COUNT, "size": COUNT, "signed": ANY, "common": bool})
EVENT = Record({}, {"id": Nullable(int), "print_fmt": Nullable(str), "fields": Nullable(ListOf(FIELD))})
BTF_FUNCTION = Record({}, {"module": Nullable(str), "prototype": str, "return": str,
                           "params": ListOf(Pair(str, str))})

#: a kernel profile, every section (docs/kernel-profile.md); null = unavailable
PROFILE_SECTIONS: Dict[str, Any] = {
    "created": Nullable(str),
    "source": MapOf(ANY),
    "uname": Nullable(Record({}, {"sysname": str, "release": str, "version": str, "machine": str})),
    "config": Nullable(MapOf(str)),
    "modules": Nullable(MapOf(Record({}, {"size": COUNT, "refcount": int, "used_by": ListOf(str),
                                          "state": str}))),
    "mounts": Nullable(ListOf(Record({}, {"device": str, "mountpoint": str, "fstype": str, "options": str}))),
    "tracers": Nullable(ListOf(str)),
    "filter_functions": Nullable(ListOf(Pair(NonEmpty(), Nullable(str)))),
    "kprobe_blacklist": Nullable(ListOf(str)),
    "events": Nullable(MapOf(MapOf(EVENT))),
    "symbols": Nullable(MapOf(str)),
    "btf": Nullable(Record({}, {"modules": ListOf(str), "functions": MapOf(BTF_FUNCTION)})),
    "unavailable": Nullable(MapOf(ANY)),
    "package": MapOf(ANY),
}


def profile_shape(required: Sequence[str]) -> Record:
    """The profile record with `required` sections mandatory (the rest optional)."""
    return Record({k: v for k, v in PROFILE_SECTIONS.items() if k in required},
                  {k: v for k, v in PROFILE_SECTIONS.items() if k not in required})


#: `labs test --lab-results` / `probes compat --lab-results` (docs/compat.md)
LAB_RUN = Record({"candidate": Nullable(AtLeast(int, 0)), "ok": bool}, {})
LAB_RESULTS = MapOf(MapOf(LAB_RUN))

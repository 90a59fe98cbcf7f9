"""NamedTuple's class syntax without the typing module, for the modules a tool's start imports.

Why: typing.NamedTuple checks every field's annotation as it builds the class, compiling each
string annotation into a ForwardRef; with the typing import itself, the start of nfsslower
spent about a tenth of a second on it in an emulated 6.12 guest (bench/README.md, "Typing off
the start path"). The classes here are the same collections.namedtuple classes typing.NamedTuple
makes, built from the annotations' names alone. Type checkers see typing's, as each module
imports it:

    TYPE_CHECKING = False
    if TYPE_CHECKING:
        from typing import NamedTuple
    else:
        from discover.records import NamedTuple

A module doing so keeps `from __future__ import annotations`: its annotations are then strings
in the class body, which is all this reads.
"""
from __future__ import annotations

import collections

#: what a class body holds that is not the record's (typing.NamedTuple leaves the same alone)
_OWN = frozenset({"__module__", "__qualname__", "__annotations__", "__doc__", "__classcell__",
                  "__firstlineno__", "__static_attributes__"})


class _Builder(type):
    def __new__(mcs, name: str, bases: tuple, body: dict) -> type:  # type: ignore[misc]
        if not bases:  # NamedTuple itself
            return super().__new__(mcs, name, bases, body)
        if "__annotations__" not in body:
            raise TypeError(f"{name}: its module needs `from __future__ import annotations` "
                            "(discover.records reads the field names from the annotations' strings)")
        fields = list(body["__annotations__"])
        defaulted = [field for field in fields if field in body]
        if fields[len(fields) - len(defaulted):] != defaulted:
            raise TypeError(f"{name}: a field without a default follows one with a default")
        record = collections.namedtuple(name, fields, defaults=[body[field] for field in defaulted],
                                        module=body["__module__"])
        record.__annotations__ = body["__annotations__"]
        if body.get("__doc__"):
            record.__doc__ = body["__doc__"]
        for key, value in body.items():
            if key not in _OWN and key not in fields:
                setattr(record, key, value)
        record.__qualname__ = body.get("__qualname__", name)
        if "__classcell__" in body:  # a method's super() or __class__ names the record
            body["__classcell__"].cell_contents = record
        return record


class NamedTuple(metaclass=_Builder):
    """Base of a record class: `class Point(NamedTuple):` with annotated fields, defaults last."""

"""Readers of what the probe's emitters produce, shared by the generator tests."""
from __future__ import annotations

import re
from typing import Any, Dict


def defines(text: str) -> Dict[str, int]:
    """The generated constants of a bcc text (its settings among them), as integers."""
    return {name: int(value) for name, value in re.findall(r"^#define (\w+) (-?\d+)(?:ULL)?$", text, re.M)}


def formats_of(data: Dict[str, Any]) -> Any:
    """A profile's tracepoint formats, as the running kernel's tracefs gives them."""
    def fields(event: str) -> Any:
        system, _, name = event.partition(":")
        info = data["events"].get(system, {}).get(name)
        return info["fields"] if info else None
    return fields

"""The layout is the architecture: discover/ -> probes/ -> bpf/ -> labs/. A package may import
the ones before it, never one after it (discover reads kernels and writes specs; probes turn
specs into tools; labs prove the tools in VMs)."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, Tuple

import pytest

REPO = Path(__file__).resolve().parent.parent
PIPELINE = ("discover", "probes", "bpf", "labs")


def imports(package: str) -> Iterator[Tuple[Path, str]]:
    for path in sorted((REPO / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                yield from ((path, alias.name.split(".")[0]) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                yield path, node.module.split(".")[0]


@pytest.mark.parametrize("package", PIPELINE[:-1])
def test_no_import_points_back_up_the_pipeline(package: str) -> None:
    later = set(PIPELINE[PIPELINE.index(package) + 1:])
    wrong = [f"{path.relative_to(REPO)}: {name}" for path, name in imports(package) if name in later]
    assert wrong == []

"""The layout is the architecture: discover/ -> probes/ -> bpf/ -> labs/. A package may import
the ones before it, never one after it (discover reads kernels and writes specs; probes turn
specs into tools; labs prove the tools in VMs)."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

from labs.checks.shared import GUEST_SCRIPTS

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


#: the commands an NFS client runs ([project.scripts]); `discover`, `probes` and `labs` are the host's
CLIENT_TOOLS = ("nfsslower", "nfsdist", "nfstop", "nfsdtop", "fsslower", "fsdist", "fstop", "nfs-exporter")
#: the host-side analysis (Debian kernel packages, compatibility reports, the `probes` command) and
#: the lab, which no client tool may reach: a client runs without them (docs/install.md)
HOST_SIDE = ("probes.compat", "probes.kernelpkg", "probes.fetch", "probes.cli", "labs")


def _module_file(module: str) -> Optional[Path]:
    """The checkout's file of a dotted module name, or None (not ours: the standard library, click)."""
    base = REPO.joinpath(*module.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _imported(module: str) -> Set[str]:
    """Our modules a module imports anywhere in its file (top level, in functions, relative), and
    the packages on their way: `from probes import fetch` is probes and probes.fetch."""
    path = _module_file(module)
    assert path is not None, module
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: List[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1])
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            names += [source] + [f"{source}.{alias.name}" for alias in node.names]
    parts = {".".join(name.split(".")[:i]) for name in names for i in range(1, len(name.split(".")) + 1)}
    return {name for name in parts if _module_file(name) is not None}


def reachable(*modules: str) -> Dict[str, Optional[str]]:
    """Every module of ours the given ones import, transitively: each with the module that first
    imported it (None for a start), to name the path of a wrong import."""
    seen: Dict[str, Optional[str]] = {}
    todo: List[Tuple[str, Optional[str]]] = [(module, None) for module in modules]
    while todo:
        module, by = todo.pop(0)
        if module not in seen:
            seen[module] = by
            todo += [(name, module) for name in sorted(_imported(module))]
    return seen


def _client_modules() -> List[str]:
    section = (REPO / "pyproject.toml").read_text().split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    scripts = dict(re.findall(r'^([\w-]+) = "([\w.]+):\w+"$', section, re.M))
    assert set(CLIENT_TOOLS) <= set(scripts), sorted(set(CLIENT_TOOLS) - set(scripts))
    return sorted({scripts[tool] for tool in CLIENT_TOOLS})


def _path(seen: Dict[str, Optional[str]], module: str) -> str:
    chain = [module]
    while seen[chain[-1]] is not None:
        chain.append(seen[chain[-1]])  # type: ignore[arg-type]
    return " <- ".join(chain)


def test_client_tools_reach_none_of_the_host_side() -> None:
    """From the client tools' entry points (probes.commands, probes.exporter), no import, however
    indirect or deferred into a function, reaches the host-side modules."""
    seen = reachable(*_client_modules())
    wrong = [_path(seen, module) for module in sorted(seen)
             if any(module == host or module.startswith(host + ".") for host in HOST_SIDE)]
    assert wrong == []
    # the walk follows the tools into their runtime and the spec reader of discover/
    assert {"probes.runtime", "probes.exporter", "discover.spec"} <= set(seen)


def test_the_import_walk_sees_the_host_side_where_it_is() -> None:
    """The same walk from the `probes` host command reaches what the client tools must not: the
    previous test would see such an import."""
    seen = reachable("probes.cli")
    assert {"probes.compat", "probes.kernelpkg", "probes.fetch"} <= set(seen), sorted(seen)


def test_importing_the_client_tools_loads_none_of_the_host_side() -> None:
    """What Python really loads (an import the walk could not see, importlib's, would show here)."""
    check = ("import importlib, sys\n"
             f"for module in {_client_modules()!r}:\n"
             "    importlib.import_module(module)\n"
             f"host = {HOST_SIDE!r}\n"
             "print(sorted(m for m in sys.modules if m in host or m.startswith(tuple(h + '.' for h in host))))\n")
    res = subprocess.run([sys.executable, "-c", check], stdout=subprocess.PIPE, universal_newlines=True,
                         check=True, cwd=REPO)
    assert res.stdout.strip() == "[]"


def module_name(path: Path) -> str:
    """labs/checks/fs/guest.py -> labs.checks.fs.guest; a package is its __init__.py."""
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


#: every module of the pipeline's packages, by name
MODULES: Dict[str, Path] = {module_name(path): path for package in PIPELINE
                            for path in sorted((REPO / package).rglob("*.py"))}


def test_no_import_circle_among_the_modules() -> None:
    """The project's modules import each other without a circle, deferred imports included: one
    that imports another importing it back (labs.fleet_checks and labs.integration did) is one
    job in two modules."""
    graph = {name: sorted(_imported(name) - {name}) for name in MODULES}
    done: Set[str] = set()
    path: List[str] = []

    def visit(name: str) -> None:
        if name in path:
            raise AssertionError("import circle: " + " -> ".join(path[path.index(name):] + [name]))
        if name in done:
            return
        path.append(name)
        for target in graph[name]:
            visit(target)
        path.pop()
        done.add(name)

    for name in graph:
        visit(name)


#: the guest scripts the host runs, as modules (labs.checks.shared names their paths)
GUEST_MODULES = {module_name(REPO / path) for path in GUEST_SCRIPTS.values() if path.endswith(".py")}


def test_labs_reaches_a_guest_script_only_through_the_shared_module() -> None:
    """A host module of labs that imports a guest script runs all of it on the host (its
    sys.path set-up, its tools, its workloads) for one name: what both sides need is in
    labs.checks.shared. Guest scripts import each other, since they run together in a guest."""
    wrong = [f"{name} imports {target}" for name in sorted(MODULES)
             if name.split(".")[0] == "labs" and name not in GUEST_MODULES
             for target in sorted(_imported(name) & GUEST_MODULES)]
    assert wrong == []


def test_the_shared_module_is_stdlib_only() -> None:
    """labs.checks.shared runs in every guest, Debian 11's Python included, before anything
    else of the project is on its sys.path."""
    tree = ast.parse(MODULES["labs.checks.shared"].read_text())
    names = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names}
    names |= {node.module.split(".")[0] for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module and not node.level}
    assert names <= set(sys.stdlib_module_names) | {"__future__"}, names

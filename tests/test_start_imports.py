"""What a tool's start imports: what it uses before its first line, nothing kept for later.

Why: nfsslower's, nfsdist's and nfs-exporter's start is on their user's clock (start-up within
2x of libbpf-tools'), and a module costs its import there whether used or not: 0.4-1.3 ms
natively for each of the ones below (Python 3.13), some 20 times that in a TCG guest. Modules
that only an error, a server's tool or a served scrape use are imported where they are used.
typing is not imported at all: its import and its NamedTuple classes (each field's annotation
compiled into a ForwardRef) cost nfsslower's start about a tenth of a second in a TCG guest; the
modules take its names for type checkers only (discover/records.py).
"""
from __future__ import annotations

import ast
import importlib.util
import pickle
import subprocess
import sys
from pathlib import Path
from typing import List, NamedTuple, Set

import pytest

from discover.records import NamedTuple as Record

REPO = Path(__file__).resolve().parent.parent
#: imported where used, not at a start: schema's suggestions and difflib (a spec's or an event
#: format's error), ipaddress (a server's clients), importlib.util (whether bcc is there, asked
#: only where core cannot run), gzip and urllib.parse (a scrape served)
LATER = ("discover.schema", "difflib", "ipaddress", "importlib.util", "gzip", "urllib.parse")
#: the standard library the tools import, and what it imports itself (Python 3.11's pathlib
#: brings urllib.parse and ipaddress): not the tools' to avoid
STDLIB = "import argparse, contextlib, ctypes, json, pathlib, re, signal, socketserver, struct, threading"
#: a start as far as it runs without a kernel: the imports, the command line, the spec, and the
#: modules the Session imports once it has chosen core; the exporter's also binds its port
STARTS = {
    "nfsslower": "from probes import commands\n"
                 "commands.nfs_target(commands.nfsslower_parser().parse(['0']).spec_path)\n"
                 "import discover.events, discover.tracefs, probes.core_backend",
    "nfsdist": "from probes import commands\n"
               "commands.nfs_target(commands.nfsdist_parser().parse(['1']).spec_path)\n"
               "import discover.events, discover.tracefs, probes.core_backend",
    "nfs-exporter": "from probes import exporter\n"
                    "exporter.exporter_parser().parse([])\n"
                    "exporter.listen('127.0.0.1', 0, list).server_close()\n"
                    "import discover.events, discover.tracefs, probes.core_backend",
}
#: what a start uses of LATER: the exporter checks its --address with ipaddress
USES = {"nfs-exporter": {"ipaddress"}}


def loaded(code: str) -> Set[str]:
    """The modules a fresh interpreter holds after running `code` in the checkout."""
    res = subprocess.run([sys.executable, "-c", f"import sys\n{code}\nprint(' '.join(sorted(sys.modules)))"],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert res.returncode == 0, res.stderr
    return set(res.stdout.split())


@pytest.mark.parametrize("tool", sorted(STARTS))
def test_a_start_imports_nothing_kept_for_later(tool: str) -> None:
    started, stdlib = loaded(STARTS[tool]), loaded(STDLIB)
    unused = set(LATER) - USES.get(tool, set())
    assert sorted(name for name in unused if name in started and name not in stdlib) == []


@pytest.mark.parametrize("tool", sorted(STARTS))
def test_a_start_imports_no_typing(tool: str) -> None:
    """None of the project's modules imports typing on a start; the standard library may where
    the start needs it: tomllib reads a spec's TOML in a checkout whose CO-RE objects, and the
    parsed specs beside them, are not built (a package has them)."""
    watch = ("class Watch:\n"
             "    def find_spec(self, name, path=None, target=None):\n"
             "        frame = sys._getframe(1)\n"
             "        while frame.f_code.co_filename.startswith('<frozen'):\n"
             "            frame = frame.f_back\n"
             "        if name == 'typing':\n"
             "            print('typing imported by', frame.f_globals.get('__name__'), file=sys.stderr)\n"
             "sys.meta_path.insert(0, Watch())\n")
    code = f"import sys\n{watch}{STARTS[tool]}\nprint(' '.join(sorted(sys.modules)))"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert res.returncode == 0, res.stderr
    started = set(res.stdout.split())
    assert "probes.runtime" in started and "discover.records" in started
    importers = {line.split()[-1] for line in res.stderr.splitlines() if line.startswith("typing imported by")}
    assert importers <= {"tomllib._parser"}, importers
    assert ("typing" in started) == bool(importers) and ("tomllib" in started) == (importers == {"tomllib._parser"})


def type_checking_only(node: ast.AST) -> bool:
    """An `if TYPE_CHECKING:` block."""
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def typing_names_used_at_run_time(path: Path) -> List[str]:
    """Names the module imports from typing, and does not bind otherwise when not type checked,
    that it uses outside annotations and its `if TYPE_CHECKING:` block, as `name:line`: each
    a NameError once that line runs."""
    tree = ast.parse(path.read_text())
    from_typing: Set[str] = set()
    bound: Set[str] = set()  # what the module gives those names when not type checked (discover.records')
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "typing":
            from_typing.update(alias.asname or alias.name for alias in node.names)
        elif type_checking_only(node):
            for other in node.orelse:  # type: ignore[attr-defined]
                bound.update(alias.asname or alias.name for alias in getattr(other, "names", ()))
                bound.update(target.id for target in getattr(other, "targets", ()) if isinstance(target, ast.Name))
    from_typing -= bound
    used: List[str] = []

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            if type_checking_only(node):
                for child in node.orelse:
                    self.visit(child)
            else:
                self.generic_visit(node)

        def visit_arg(self, node: ast.arg) -> None:
            pass  # its annotation

        def visit_FunctionDef(self, node: ast.FunctionDef) -> None:  # all but the return annotation
            for child in [*node.decorator_list, *node.args.defaults, *node.args.kw_defaults, *node.body]:
                if child is not None:
                    self.visit(child)

        def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
            if node.value is not None:
                self.visit(node.value)

        def visit_Name(self, node: ast.Name) -> None:
            if node.id in from_typing:
                used.append(f"{node.id}:{node.lineno}")

    Visitor().visit(tree)
    return used


def project_modules(code: str) -> List[str]:
    return sorted(name for name in loaded(code) if name.split(".")[0] in ("probes", "discover"))


@pytest.mark.parametrize("module", project_modules("\n".join(STARTS.values())))
def test_a_start_modules_typing_names_are_annotations_only(module: str) -> None:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    assert typing_names_used_at_run_time(Path(spec.origin)) == []


class Sample(Record):
    """A record as the start's modules write them."""
    name: str
    size: int = 0
    tags: tuple = ()
    LIMIT = 10

    @property
    def big(self) -> bool:
        return self.size > self.LIMIT

    def grown(self, by: int) -> Sample:
        return self._replace(size=self.size + by)


class Typed(NamedTuple):
    name: str
    size: int = 0
    tags: tuple = ()


def test_a_record_is_the_namedtuple_typing_would_make() -> None:
    one = Sample("a", 12)
    assert one == ("a", 12, ()) and tuple(one) == tuple(Typed("a", 12))
    assert Sample._fields == Typed._fields and Sample._field_defaults == Typed._field_defaults
    assert one.big and not Sample("b").big and one.grown(3).size == 15 and Sample.LIMIT == 10
    assert one._asdict() == Typed("a", 12)._asdict() and repr(one) == "Sample(name='a', size=12, tags=())"
    assert Sample.__doc__ == "A record as the start's modules write them." and Sample.__module__ == __name__
    assert pickle.loads(pickle.dumps(one)) == one and type(pickle.loads(pickle.dumps(one))) is Sample
    with pytest.raises(TypeError, match="follows one with a default"):
        type(Record)("Bad", (Record,), {"__module__": __name__, "__annotations__": {"first": "int", "second": "int"},
                                        "first": 0})

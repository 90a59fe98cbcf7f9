"""The documents against the code: docs/ci.md's tables of which kernel runs which lab check
against tests/lab/conftest.py (the code that decides it), no other page restating those
lists, every path a document names existing, no run history in docs/*.md (it belongs in
bench/README.md and CHANGELOG.md), docs/README.md indexing every page, and each message
docs/troubleshooting.md quotes being one the code prints."""
from __future__ import annotations

import ast
import importlib.util
import os
import re
from pathlib import Path
from types import ModuleType
from typing import Dict, Iterator, List, Set, Tuple

import pytest

from labs.vm.images import suite_for_kernel

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
LAB = REPO / "tests" / "lab"
#: every Markdown document of the project a user or contributor reads
DOCUMENTS = [REPO / "README.md", REPO / "CHANGELOG.md", *sorted(DOCS.glob("*.md"))]


def lab_conftest() -> ModuleType:
    """tests/lab/conftest.py as a module of its own (its constants and functions; no hook of
    it is registered: the unit run ignores tests/lab)."""
    spec = importlib.util.spec_from_file_location("probekit_lab_conftest", LAB / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def lab() -> ModuleType:
    return lab_conftest()


# -- Markdown tables ------------------------------------------------------------------------

def section(path: Path, heading: str) -> str:
    """The text under `heading` (a Markdown heading line's words) to the next heading of its level or above."""
    text = path.read_text()
    match = re.search(rf"^(#+) {re.escape(heading)}\s*$", text, re.M)
    assert match, f"{path.name}: no heading {heading!r}"
    level = len(match.group(1))
    rest = text[match.end():]
    end = re.search(rf"^#{{1,{level}}} ", rest, re.M)
    return rest[:end.start()] if end else rest


def table(text: str) -> List[Dict[str, str]]:
    """The first Markdown table of `text`, one dict per row by header cell."""
    lines: List[str] = []
    for line in text.splitlines():
        if line.startswith("|"):
            lines.append(line)
        elif lines:
            break
    assert len(lines) >= 2, "no table"
    split = lambda line: [cell.strip() for cell in line.strip().strip("|").split("|")]  # noqa: E731
    header = split(lines[0])
    rows = [dict(zip(header, split(line))) for line in lines[2:]]
    assert all(len(row) == len(header) for row in rows)
    return rows


#: the lab kernels as the documents write them, "6.1" not matching inside "6.12"
KERNEL = re.compile(r"(?<![\w.])(5\.10|6\.12|6\.1|7\.2|7\.3)(?!\.?\d)")


def kernels(cell: str) -> Set[str]:
    return set(KERNEL.findall(cell))


def key_of(cell: str) -> str:
    match = re.fullmatch(r"`(\w+)`", cell)
    assert match, f"{cell!r}: the key column holds one `CI_MATRIX` key"
    return match.group(1)


CI = DOCS / "ci.md"


def test_ci_jobs_table_is_the_job_order_suites_and_topologies(lab: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = table(section(CI, "The jobs"))
    assert [row["job"] for row in rows] == list(lab.JOB_ORDER)
    vagrant = (LAB / "test_vagrant_pair.py").read_text()
    box = re.search(r'VagrantLab\(kernel="([\d.]+)", topology="(\w+)"', vagrant)
    assert box, "test_vagrant_pair.py: no VagrantLab(kernel=..., topology=...)"
    for row in rows:
        job = row["job"]
        kernel = box.group(1) if job == "vagrant" else job
        assert row["Debian suite"].split()[0] == suite_for_kernel(kernel), row
        for column, wanted in (("CI topology", "ci"), ("full-matrix topology", "full")):
            monkeypatch.setenv("PROBEKIT_LAB_MATRIX", wanted)
            topology = box.group(2) if job == "vagrant" else lab.lab_topology(job)
            assert row[column] == topology, f"docs/ci.md, job {job}: {column} {row[column]!r}, the code: {topology!r}"
    assert re.search(r"\bThree run at a time\b", CI.read_text()) and lab.LANES == 3, "docs/ci.md: LANES"


def test_ci_check_table_is_the_matrices(lab: ModuleType) -> None:
    """Each CI_MATRIX key once, with exactly its CI and full-matrix kernels, in the test module
    that narrows its tests to them; a kernel the row's text names is one of the row's."""
    rows = table(section(CI, "Which kernel runs which check"))
    keys = [key_of(row["key"]) for row in rows]
    assert sorted(keys) == sorted(lab.CI_MATRIX) and sorted(lab.CI_MATRIX) == sorted(lab.FULL_MATRIX), keys
    for row, key in zip(rows, keys):
        assert kernels(row["CI kernels"]) == set(lab.CI_MATRIX[key]), f"docs/ci.md, `{key}`: CI kernels"
        assert kernels(row["full matrix"]) == set(lab.FULL_MATRIX[key]), f"docs/ci.md, `{key}`: full matrix"
        module = (LAB / row["test module"]).read_text()
        if key == "probes":  # its main tests take kernel_lab's default: every kernel booted
            assert set(lab.CI_MATRIX[key]) == set(lab.FULL_MATRIX[key]) == set(lab.KERNELS)
            assert f'@guest_run("{key}"' in module, f"{row['test module']} does not run `{key}`"
        else:
            assert f'on_kernels("{key}")' in module, f"{row['test module']} does not run `{key}`"
        named = kernels(row["check"]) | kernels(row["what differs there"])
        assert named <= set(lab.CI_MATRIX[key]) | set(lab.FULL_MATRIX[key]), (key, named)


def literal(path: Path, name: str) -> object:
    """The value of a module-level assignment of literals (a comprehension over literals too)."""
    for node in ast.parse(path.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            assert node.value is not None
            return eval(compile(ast.Expression(node.value), str(path), "eval"), {"__builtins__": {}})  # noqa: S307
    raise AssertionError(f"{path.name}: no {name}")


#: the variants docs/ci.md lists: the check, and the kernels its test module gives them
VARIANTS = {
    "EXPORTER_OPTIONS": ("exporter", LAB / "test_exporter_lab.py"),
    "EXPORTER_KERNELS": ("fs", LAB / "test_fs_lab.py"),
    "FORCED_MISS_KERNELS": ("probes", LAB / "test_probes_lab.py"),
}


def test_ci_variants_table_is_the_test_modules(lab: ModuleType) -> None:
    rows = table(section(CI, "Variants within a check"))
    seen = set()
    for row in rows:
        name = re.match(r"`(\w+)` in (\S+)", row["decided by"])
        assert name and name.group(1) in VARIANTS, row["decided by"]
        check, path = VARIANTS[name.group(1)]
        assert path.name == name.group(2)
        chosen = set(literal(path, name.group(1)))  # type: ignore[call-overload]
        seen.add(name.group(1))
        for column, matrix in (("CI kernels", lab.CI_MATRIX), ("full matrix", lab.FULL_MATRIX)):
            assert kernels(row[column]) == chosen & set(matrix[check]), f"docs/ci.md, {name.group(1)}: {column}"
    assert seen == set(VARIANTS)


# -- which kernel runs which check: said in docs/ci.md only --------------------------------

#: what makes a sentence a statement of which lab kernel runs a check
CHECK_WORDS = re.compile(r"\btest_\w+_lab\.py\b|\bin CI\b|\bCI run|\bCI kernels?\b|\bfull matrix\b|"
                         r"PROBEKIT_LAB_MATRIX|\bevery CI\b|\bCI_MATRIX\b")


#: a lab kernel named by its Debian release
SUITE = re.compile(r"\b(bullseye|bookworm|trixie|sid)\b|\bDebian 1[1-4]\b", re.I)


def sentences(text: str) -> Iterator[Tuple[int, str]]:
    """(line number, sentence) of prose, code blocks and tables left out."""
    number, paragraph = 0, []  # type: Tuple[int, List[str]]
    lines = text.splitlines() + [""]
    for i, line in enumerate(lines, 1):
        if not line.strip() or line.startswith(("    ", "|", "#", "```")):
            if paragraph:
                for sentence in re.split(r"(?<=[.:;])\s+(?=[A-Z`(])", " ".join(paragraph)):
                    yield number, sentence
            paragraph = []
            continue
        if not paragraph:
            number = i
        paragraph.append(line.strip())


def test_only_ci_md_says_which_kernel_runs_which_check() -> None:
    """Elsewhere a page links docs/ci.md instead of naming kernels beside a lab check, which is
    how README.md and half the docs went stale when checks moved between kernels."""
    found = []
    for path in DOCUMENTS:
        if path == CI or not path.exists():
            continue
        for number, sentence in sentences(path.read_text()):
            if CHECK_WORDS.search(sentence) and (KERNEL.search(sentence) or SUITE.search(sentence)):
                found.append(f"{path.relative_to(REPO)}:{number}: {sentence[:160]}")
    assert not found, "say which kernel runs a check in docs/ci.md only:\n" + "\n".join(found)


# -- the command lists ---------------------------------------------------------------------

def console_scripts() -> Set[str]:
    """[project.scripts] of pyproject.toml."""
    text = (REPO / "pyproject.toml").read_text().split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    return {line.split("=")[0].strip() for line in text.splitlines() if "=" in line}


def test_errors_md_names_every_command() -> None:
    first = (DOCS / "errors.md").read_text().split("\n\n")[1]
    assert set(re.findall(r"`([\w-]+)`", first)) >= console_scripts(), "docs/errors.md: a command is missing"


def test_install_md_lists_every_installed_command() -> None:
    """The package installs every command but the VM lab's (`labs` runs from a checkout): the
    tracing tools in /usr/sbin, discover and probes in /usr/bin (packaging/debian/rules)."""
    rows = {line.split("|")[1].strip(): set(re.findall(r"[\w-]+", line.split("|")[2]))
            for line in (DOCS / "install.md").read_text().splitlines() if line.startswith(("| `/usr/bin/`", "| `/usr/sbin/`"))}
    assert rows["`/usr/bin/`"] == {"discover", "probes"}, rows
    assert rows["`/usr/sbin/`"] == console_scripts() - {"labs", "discover", "probes"}, rows
    wheel = section(DOCS / "install.md", "The wheel, for pip users")
    links = re.search(r"^    ln -s (.*?)/usr/local/bin/$", wheel, re.M | re.S)
    assert links, "docs/install.md: no `ln -s ... /usr/local/bin/` of the wheel's commands"
    linked = set(re.findall(r"/usr/local/probekit/bin/([\w-]+)", links.group(1)))
    tools = {name for name in console_scripts() if name not in ("labs", "discover", "probes")}
    assert linked == tools, f"docs/install.md: the wheel's links: {sorted(tools ^ linked)}"


# -- troubleshooting quotes what the tools print -------------------------------------------

def code_literals() -> Set[str]:
    """Every string literal of the tools' code, f-strings' fixed parts included."""
    found: Set[str] = set()
    for package in ("probes", "discover"):
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    found.add(node.value)
    return found | {os.strerror(errno) for errno in range(1, 134)}  # what an OSError fills in


#: what starts a tool's line: its name, and for a filesystem of nfs-exporter -t that too
PROGRAMS = ("nfsslower", "nfsdist", "nfstop", "nfsdtop", "fsslower", "fsdist", "fstop", "nfs-exporter", "discover",
            "probes")
#: words a quote puts in place of what the tool fills in (docs/troubleshooting.md says so)
PLACEHOLDER = re.compile(r"\b(?:RELEASE|PROGRAM|SECTION|TARGET)\b|…|\.\.\.|\[Errno \d+\]")


def quoted_messages(path: Path) -> List[Tuple[int, str]]:
    """(line number, message without the program's name) of each indented line a tool prints."""
    found = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        match = re.match(rf"    ({'|'.join(map(re.escape, PROGRAMS))}): (?:(?:xfs|ext4|btrfs|cifs): )?(.*)", line)
        if match:
            found.append((number, match.group(2)))
    return found


def uncovered(message: str, literals: Set[str]) -> List[str]:
    """The runs of `message` no literal of the code (6 characters or more) covers."""
    covered = [False] * len(message)
    for literal in literals:
        literal = literal.strip()
        if len(literal) < 6:
            continue
        start = message.find(literal)
        while start >= 0:
            covered[start:start + len(literal)] = [True] * len(literal)
            start = message.find(literal, start + 1)
    for match in PLACEHOLDER.finditer(message):
        covered[match.start():match.end()] = [True] * (match.end() - match.start())
    return [run for run in re.split(r"\x00+", "".join("\x00" if c else ch for ch, c in zip(message, covered)))
            if run.strip()]


def test_troubleshooting_quotes_messages_of_the_code() -> None:
    """Each message docs/troubleshooting.md quotes is made of the code's own text: what is not
    in a literal of probes/ or discover/ is a value the tool filled in (a path, a release, a
    count), never a sentence of the document's."""
    literals = code_literals()
    quotes = quoted_messages(DOCS / "troubleshooting.md")
    assert len(quotes) >= 15, quotes
    bad = []
    for number, message in quotes:
        runs = uncovered(message, literals)
        if any(len(run) > 40 for run in runs) or sum(map(len, runs)) > len(message) / 2:
            bad.append(f"docs/troubleshooting.md:{number}: {runs}")
    assert not bad, "not what the code prints:\n" + "\n".join(bad)


# -- every path a document names exists ----------------------------------------------------

#: a repository path as the documents write it (relative to the root, in prose or code)
PATH = re.compile(r"(?<![\w/.~$-])((?:docs|tests|probes|labs|bench|packaging|scripts|discover|bpf)/[\w.+*/-]*[\w*/+-])")
#: a Markdown link's target
LINK = re.compile(r"\]\(([^)\s]+)\)")
#: a word of a path that stands for any name (probes/specs/FS.toml, kernel-K/)
PATH_PLACEHOLDER = re.compile(r"(?<![a-z])(?:FS|K|KERNEL|NAME|PROG|TOOL|DATE|PID)(?![a-z])")


def path_exists(text: str) -> bool:
    if PATH_PLACEHOLDER.search(text):
        return True  # a pattern, not a file
    if "*" in text or text.endswith("-"):
        return any(REPO.glob(text if "*" in text else text + "*"))
    if (REPO / text).exists():
        return True
    module, _, attribute = text.rpartition(".")  # labs/checks/probes/verdicts.counted_once
    return bool(attribute) and (REPO / f"{module}.py").is_file()


def test_every_path_and_link_in_the_documents_exists() -> None:
    missing = []
    for path in DOCUMENTS:
        text = path.read_text()
        for match in PATH.finditer(text):
            if not path_exists(match.group(1)):
                missing.append(f"{path.relative_to(REPO)}: {match.group(1)}")
        for match in LINK.finditer(text):
            target = match.group(1).split("#")[0]
            if target and not re.match(r"[a-z]+:", target) and not (path.parent / target).exists():
                missing.append(f"{path.relative_to(REPO)}: ({match.group(1)})")
    assert not missing, "no such file:\n" + "\n".join(missing)


def test_the_indexes_list_every_page() -> None:
    """docs/README.md links every page of docs/; README.md's Documentation section names each."""
    pages = {path.name for path in DOCS.glob("*.md")} - {"README.md"}
    index = (DOCS / "README.md").read_text()
    assert pages <= set(LINK.findall(index)), sorted(pages - set(LINK.findall(index)))
    readme = section(REPO / "README.md", "Documentation")
    assert {f"docs/{page}" for page in pages} <= set(PATH.findall(readme)), "README.md, Documentation"


# -- no run history in the manual ----------------------------------------------------------

#: a date, a test count of a run, a commit (hex with both letters and digits: not a number
#: such as a bucket edge `1.073741823`, which is what the exporter serves)
HISTORY = re.compile(r"\b20\d\d-\d\d-\d\d\b|\bpassed, \d+ failed\b|"
                     r"(?<![0-9A-Za-z])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![0-9A-Za-z])")


def test_the_manual_holds_no_run_history() -> None:
    """Dated runs, their commits and test counts go to bench/README.md (figures) or stay in
    `git log`; docs/examples/ keep the date of the lab run their outputs come from."""
    found = [f"{path.relative_to(REPO)}:{number}: {match.group(0)}"
             for path in sorted(DOCS.glob("*.md"))
             for number, line in enumerate(path.read_text().splitlines(), 1)
             for match in HISTORY.finditer(line)]
    assert not found, "history in the manual:\n" + "\n".join(found)

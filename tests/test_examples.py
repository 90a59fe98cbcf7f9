"""docs/examples/ against the code: each file is what labs.capture.examples writes today (the lab
captures, --help, discover's outputs), and the headers, columns and JSON keys in the captures
are the ones the tools print today (each captured command run again on a Session attached to
nothing), so that an example cannot show a layout the tools no longer print."""
from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest

from discover.arguments import Parser
from discover.errors import UsageError
from discover.spec import SPEC_OPS
from labs.capture import examples
from probes import commands, exporter
from probes.histogram import format_log2
from probes.mounts import MountTable

#: lines whose text is the clock (nfsdist's `HH:MM:SS:`, nfstop's `HH:MM:SS loadavg: ...`)
CLOCK = re.compile(r"^\d\d:\d\d:\d\d[: ]")
TOOLS = {"nfsslower": commands.nfsslower, "nfsdist": commands.nfsdist, "nfstop": commands.nfstop,
         "nfsdtop": commands.nfsdtop,
         "fsslower": commands.fsslower, "fsdist": commands.fsdist, "fstop": commands.fstop}
#: one completed operation as Session.on_events hands it to a tool (op 0: the first traced)
EVENT = {"op": 0, "name": "f", "dev": 0, "fileid": 7, "pid": 1, "comm": "dd", "end_ns": 10**9, "bytes": 4096,
         "offset": 0, "lat_ns": 10**9, "cgroup": 0}


class _Probe:
    def __init__(self, ops: List[str]) -> None:
        self.ops, self.letters, self.ringbuf = ops, [SPEC_OPS[op] for op in ops], False


class FakeSession:
    """commands.Session attached to nothing: the tool prints its banner and headers, one
    completed operation (event-printing tools), and ends at once."""

    def __init__(self, _prog: str, _tool: Any, ops: List[str], *_args: Any, **_kwargs: Any) -> None:
        self.probe = _Probe(list(ops))
        self.events: Optional[Callable[[List[Dict[str, Any]]], None]] = None
        self.ops = list(ops)

    def __enter__(self) -> "FakeSession":
        return self

    def __exit__(self, *_exc: Any) -> None:
        return None

    def on_events(self, callback: Callable[[List[Dict[str, Any]]], None]) -> None:
        self.events = callback

    def on_tick(self, _callback: Callable[[], None]) -> None:
        return None

    def poll_until_stopped(self, _seconds: Optional[float] = None) -> None:
        assert self.events is not None
        self.events([dict(EVENT)])

    def wait(self, _seconds: float) -> bool:
        return False

    def op_name(self, op: int) -> str:
        return self.probe.ops[op]

    def letter(self, op: int) -> str:
        return self.probe.letters[op]

    def dist(self, clear: bool) -> Dict[str, Any]:
        return {}

    def top(self) -> Dict[Any, Any]:
        return {}

    def in_flight(self) -> List[Any]:
        return []

    def requests(self) -> Dict[Any, Any]:
        return {}

    def requests_in_progress(self) -> List[Any]:
        return []

    unvouched: List[str] = []

    def missed_causes_since(self, _reader: str) -> Dict[Any, int]:
        return {}

    def anomalies(self) -> int:
        return 0


def printed_today(command: str, monkeypatch: pytest.MonkeyPatch) -> List[str]:
    """What `command` (as a capture's .cmd has it) prints today, on a Session attached to nothing
    (and filters that accept the lab's --mount-point, which this machine may not have)."""
    monkeypatch.setattr(commands, "Session", FakeSession)
    monkeypatch.setattr(commands, "Filters", lambda _target, _cgroup, _mount_point: SimpleNamespace(
        mounts=MountTable(), cgroup_dir=None, mount_dev=0))
    argv = shlex.split(command)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        TOOLS[argv[0]](argv[1:])
    return out.getvalue().splitlines()


#: every capture's command file, the NFS runs' and the -t FS runs'
COMMANDS = sorted([*examples.CAPTURES.glob("*.cmd"), *examples.FS_CAPTURES.glob("*.cmd")])
TOOL_COMMANDS = [path for path in COMMANDS if path.read_text().split()[0] in TOOLS]


def captured(command: Path) -> List[str]:
    return command.with_suffix(".out").read_text().splitlines()


def test_every_tool_has_an_example_from_the_lab() -> None:
    # nfsdtop's outputs come from its lab check's run (examples.NFSDTOP_LAB), not capture_examples.sh
    assert {path.read_text().split()[0] for path in COMMANDS} | {"nfsdtop"} == {*TOOLS, "nfs-exporter"}
    assert sorted(p.name for p in examples.OUT.glob("*_example.txt")) == sorted(
        f"{tool}_example.txt" for tool in examples.TOOLS)
    assert set(examples.TOOLS) == {*TOOLS, "nfs-exporter", "discover"}


@pytest.mark.parametrize("path", TOOL_COMMANDS, ids=lambda path: path.stem)
def test_banners_and_headers_are_what_the_tool_prints_today(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every line the tool prints before its records (and nfstop's header each interval) is in
    the capture as it is printed today."""
    command = path.read_text().strip()
    today = printed_today(command, monkeypatch)
    event_tool = command.split()[0] in ("nfsslower", "fsslower")
    fixed = [line for line in (today[:-1] if event_tool else today) if line and not CLOCK.match(line)]
    assert fixed, command
    lines = captured(path)
    missing = [line for line in fixed if line not in lines]
    assert missing == [], f"{command}: the tool now prints {missing}, which the capture lacks: capture it again"


@pytest.mark.parametrize("by", ["client", "proc"])
def test_nfsdtop_runs_have_todays_banner_and_header(by: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """nfsdtop's text runs in its lab run: the banner and each table's header as printed today;
    its --json run: the first line and an interval's keys."""
    run = examples.nfsdtop_run()
    text = run["texts"][by]
    today = printed_today(" ".join(text["argv"]), monkeypatch)
    fixed = [line for line in today if line and not CLOCK.match(line)]
    assert len(fixed) == 2 and all(line in text["lines"] for line in fixed), (fixed, text["lines"][:3])
    printed = run["nfsdtop"]["lines"]
    today = printed_today(" ".join(run["nfsdtop"]["argv"]).replace(" -v", ""), monkeypatch)
    assert json.loads(printed[0]) == json.loads(today[0])
    assert [list(json.loads(line)) for line in printed[1:]] == [list(json.loads(today[1]))] * (len(printed) - 1)


@pytest.mark.parametrize("path", [p for p in TOOL_COMMANDS if p.stem.startswith(("nfsdist", "fsdist"))],
                         ids=lambda path: path.stem)
def test_histograms_have_todays_header(path: Path) -> None:
    unit = "msecs" if re.search(r"(^| )-m( |$)", path.read_text()) else "usecs"
    assert format_log2([0, 1], unit)[0] in captured(path)


def test_json_records_have_todays_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """nfsslower's capture and fsslower's fs lab run: the first line and each completed
    operation's keys, in order, as printed today."""
    command, lines, _ = examples.fs_lab_run("xfs")
    for printed, today_command in ((captured(examples.CAPTURES / "nfsslower-json.cmd"), "nfsslower --json 50"),
                                   (lines, command.replace(" -v", ""))):
        today = printed_today(today_command, monkeypatch)
        records = [json.loads(line) for line in printed[1:]]
        assert list(json.loads(printed[0])) == list(json.loads(today[0]))
        done = [record for record in records if not record["in_flight"]]
        assert done and all(list(record) == list(json.loads(today[-1])) for record in done), today_command


@pytest.mark.parametrize("path", [examples.CAPTURES / f"{name}.cmd" for name in ("nfsslower", "nfsslower-M",
                                                                                  "nfsslower-csv")]
                         + [examples.FS_CAPTURES / "fsslower.cmd"], ids=lambda path: path.stem)
def test_records_have_todays_columns(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A record printed today splits into as many fields as each captured one (bcc's layout)."""
    command = path.read_text().strip()
    today = printed_today(command, monkeypatch)[-1]
    csv = "-j" in command.split()
    split: Callable[[str], List[str]] = (lambda line: line.split(",")) if csv else str.split
    records = [line for line in captured(path) if "[ino" not in line  # a name with a space
               and (line[:1].isdigit() if csv else CLOCK.match(line))]
    assert records and all(len(split(line)) == len(split(today)) for line in records)


def test_scrape_has_todays_series_and_labels() -> None:
    """Each probekit family of the captured scrape, with its HELP and TYPE, and each sample's
    label names are what the exporter serves today."""
    from prometheus_client.parser import text_string_to_metric_families
    from test_exporter import _scrape_text
    lab = Path(__file__).resolve().parent / "fixtures/6.1.0-50-amd64/exporter"  # real NFS mounts: the per-mount families
    text, _ = _scrape_text(MountTable(lab / "mountinfo", lab / "mountstats"))
    scrape = (examples.CAPTURES / "nfs-exporter.out").read_text()
    today = {f.name: f for f in text_string_to_metric_families(text) if f.name.startswith("probekit_")}
    then = {f.name: f for f in text_string_to_metric_families(scrape) if f.name.startswith("probekit_")}
    assert then and set(then) <= set(today), set(then) - set(today)
    for name, family in then.items():
        assert (family.type, family.documentation) == (today[name].type, today[name].documentation), name
        labels_today = {frozenset(s.labels) for s in today[name].samples}
        assert {frozenset(s.labels) for s in family.samples} <= labels_today, name


@pytest.mark.parametrize("tool", examples.TOOLS)
def test_example_files_are_current(tool: str) -> None:
    path = examples.OUT / f"{tool}_example.txt"
    assert path.read_text() == examples.render(examples.example(tool)), (
        f"{path.relative_to(examples.REPO)} is not what `python3 -m labs.capture.examples` writes today (a --help, "
        "a discover output or a capture changed): run it and commit the result")


# -- the user documents that quote the examples -----------------------------------------

#: documents whose output blocks are quoted from docs/examples/: an indented block whose first
#: line is an example's command line (`# nfsslower 50`) holds lines of that command's output
QUOTING = (examples.REPO / "README.md", examples.REPO / "docs" / "install.md", examples.REPO / "docs" / "server.md")
#: a quoted line cut short ends with this; it matches the example line it begins
CUT_SHORT = "…"
#: the tool commands (console scripts) whose invocations the documents show
COMMAND_LINES: Dict[str, Callable[[], Parser]] = {**{name: getattr(commands, f"{name}_parser") for name in TOOLS},
                                                   "nfs-exporter": exporter.exporter_parser}


def indented_blocks(text: str) -> List[Tuple[int, List[str]]]:
    """(line number, lines) of each Markdown indented code block, blank lines inside kept."""
    blocks: List[Tuple[int, List[str]]] = []
    current: Optional[List[str]] = None
    previous = ""
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("    ") and (current is not None or not previous.strip()):
            if current is None:
                current = []
                blocks.append((number, current))
            current.append(line[4:])
        elif not line.strip() and current is not None:
            current.append("")
        else:
            current = None
        previous = line
    return [(number, lines[:len(lines) - next(i for i, l in enumerate(reversed(lines)) if l)])
            for number, lines in blocks]


def quotes(path: Path) -> List[Tuple[int, List[str]]]:
    """The quotes of examples in `path`: from a line `# COMMAND` of a known tool at a block's
    start or after a blank line, to the next such line or the block's end."""
    known = {*examples.TOOLS, "curl"}
    found: List[Tuple[int, List[str]]] = []
    for number, lines in indented_blocks(path.read_text()):
        current: Optional[List[str]] = None
        for i, line in enumerate(lines):
            if line.startswith("# ") and line[2:].split()[0] in known and (i == 0 or not lines[i - 1]):
                current = []
                found.append((number + i, current))
            if current is not None:
                current.append(line)
    return found


def command_words(line: str) -> List[str]:
    """A shell line's first command as the shell splits it: no prompt, `sudo`, comment, or
    what follows a pipe, `&&`, `;` or a redirection."""
    lexer = shlex.shlex(line.lstrip("$ "), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words: List[str] = []
    for word in lexer:
        if word in ("|", "||", "&&", ";", "&", ">", ">>", "<", "2>"):
            break
        words.append(word)
    return words[1:] if words[:1] == ["sudo"] else words


def same_line(quoted: str, line: str) -> bool:
    return line.startswith(quoted[:-1].rstrip()) if quoted.endswith(CUT_SHORT) else quoted == line


def find_section(header: str) -> Tuple[str, examples.Section]:
    """The example section whose command line `header` is (or begins, when cut short)."""
    for tool in examples.TOOLS:
        for section in examples.example(tool).sections:
            if same_line(header, f"# {section.command}"):
                return tool, section
    raise AssertionError(f"{header!r} is the command of no docs/examples section")


@pytest.mark.parametrize("path", QUOTING, ids=lambda path: path.name)
def test_quoted_outputs_are_the_examples(path: Path) -> None:
    """Every output the document shows is an example's (real, from a lab run or the fixtures,
    and checked above against what the tools print today): its lines in the example's order,
    within one command's section; blank lines aside."""
    found = quotes(path)
    assert found, f"{path.name} quotes no docs/examples output"
    for number, lines in found:
        _, section = find_section(lines[0])
        output = [line for line in section.output if line]
        at = 0
        for quoted in (line for line in lines[1:] if line):
            while at < len(output) and not same_line(quoted, output[at]):
                at += 1
            assert at < len(output), (f"{path.name}:{number}: {quoted!r} is not (after the lines before it) in "
                                      f"the output of `{section.command}` in docs/examples/: quote it from there")
            at += 1


def test_readme_shows_each_tool_and_nfsslower_first() -> None:
    """The README shows real output of every tool; its first screen, what nfsslower prints by
    default (bcc's table, not CSV or JSON)."""
    readme = QUOTING[0]
    found = quotes(readme)
    tools = {find_section(lines[0])[0] for _, lines in found}
    assert tools == set(examples.TOOLS), f"README.md shows no output of {sorted(set(examples.TOOLS) - tools)}"
    number, lines = found[0]
    argv = lines[0][2:].split()
    assert argv[0] == "nfsslower" and not {"-j", "--csv", "--json"} & set(argv) and number <= 45, (number, argv)
    assert "TIME     COMM           PID    T BYTES   OFF_KB   LAT(ms) FILENAME" in lines


@pytest.mark.parametrize("path", QUOTING, ids=lambda path: path.name)
def test_shown_commands_parse_today(path: Path) -> None:
    """Each tool command the document shows (`nfsslower -M --cgroup ... 10`) is one the
    tool's options and arguments accept today; checked as a shell would split it, without
    running it."""
    shown = 0
    for number, block in indented_blocks(path.read_text()):
        lines: List[str] = []
        for line in block:  # a line ending in `\` goes on in the next, for the shell
            lines[-1:] = [lines[-1][:-1] + line] if lines and lines[-1].endswith("\\") else [*lines[-1:], line]
        for line in lines:
            first = line.lstrip("$ ").split()[:2]
            first = first[1:] if first[:1] == ["sudo"] else first
            name = first[0].rsplit("/", 1)[-1] if first else ""
            if name not in COMMAND_LINES:
                continue
            words = command_words(line)
            try:
                COMMAND_LINES[name]().parse(words[1:])
            except SystemExit as exc:  # --help: printed, and ends there
                assert exc.code == 0, f"{path.name}:{number}: `{line.strip()}`"
            except UsageError as exc:
                raise AssertionError(f"{path.name}:{number}: `{line.strip()}`: {exc}") from None
            shown += 1
    assert shown or path.name != "README.md"

"""docs/examples/ against the code: each file is what labs.examples writes today (the lab
captures, --help, discover's outputs), and the headers, columns and JSON keys in the captures
are the ones the tools print today (each captured command run again on a Session attached to
nothing), so that an example cannot show a layout the tools no longer print."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional

import pytest
from click.testing import CliRunner

from discover.spec import OPS
from labs import examples
from probes import commands
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
        self.ops, self.letters, self.ringbuf = ops, [OPS[op] for op in ops], False


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

    def missed_since(self, _reader: str) -> Dict[str, int]:
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
    result = CliRunner().invoke(TOOLS[argv[0]], argv[1:])
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


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
    text, _ = _scrape_text()
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
        f"{path.relative_to(examples.REPO)} is not what `python3 -m labs.examples` writes today (a --help, "
        "a discover output or a capture changed): run it and commit the result")

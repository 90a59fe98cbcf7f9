"""The structured half of the bad-input catalogue: hypothesis mangles real call graphs,
probe specs, kernel profiles and lab results, and the commands that read them must
either work or refuse in one line (exit 1) naming the file. Run in-process through the
real boundary (discover.errors.run_cli), so a few hundred examples take seconds."""
from __future__ import annotations

import contextlib
import io
import json
import signal
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import badinput as bi
from discover.errors import run_cli

SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])

#: JSON values of every type, small: what a hand edit or another tool puts in a field
JSON = st.recursive(st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats(allow_nan=True)
                    | st.text(max_size=12),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=6)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    return bi.shared_inputs(tmp_path_factory.mktemp("inputs"))


def _paths(doc: Any, prefix: Tuple[Any, ...] = (), depth: int = 4) -> List[Tuple[Any, ...]]:
    """Every place in a document a mangle can hit (bounded: the first items of long lists)."""
    out = [prefix] if prefix else []
    if depth == 0:
        return out
    if isinstance(doc, dict):
        for key in list(doc)[:12]:
            out += _paths(doc[key], prefix + (key,), depth - 1)
    elif isinstance(doc, list):
        for i, item in enumerate(doc[:3]):
            out += _paths(item, prefix + (i,), depth - 1)
    return out


def _mangle(doc: Any, path: Tuple[Any, ...], value: Any, mode: str) -> Any:
    doc = json.loads(json.dumps(doc))
    target = doc
    for key in path[:-1]:
        target = target[key]
    if mode == "delete":
        del target[path[-1]]
    elif mode == "add-key" and isinstance(target, dict):
        target[f"{path[-1]}x"] = value
    else:
        target[path[-1]] = value
    return doc


def run(prog: str, argv: List[str]) -> Tuple[int, str]:
    """A console script in-process through the boundary: (exit status, stderr)."""
    from discover.cli import discover
    from probes.cli import probes
    command = {"discover": discover, "probes": probes}[prog]
    err = io.StringIO()
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            with pytest.raises(SystemExit) as exited:
                run_cli(prog, command, argv)
    finally:
        for signum, handler in old.items():
            signal.signal(signum, handler)
    return int(exited.value.code or 0), err.getvalue()


def assert_refused_or_fine(code: int, stderr: str, name: str) -> None:
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr
    if code:
        assert code == 1, stderr
        lines = stderr.splitlines()
        assert len(lines) == 1 and lines[0].split(": ")[1] == "error", stderr
        if any(word in lines[0] for word in ("expected", "unknown key", "missing")):
            assert name in lines[0], stderr  # a schema complaint names the file
        # else a refusal of a well-formed input (e.g. a profile with no traceable functions)


def _mangles(doc: Any) -> st.SearchStrategy:
    return st.tuples(st.sampled_from(_paths(doc)), JSON, st.sampled_from(["set", "delete", "add-key"]))


def test_callgraphs(inputs: Dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> None:
    graph = json.loads(inputs["graph"].read_text())
    graph["nodes"], graph["links"] = graph["nodes"][:4], [l for l in graph["links"] if l["calls"]][:4]
    work = tmp_path_factory.mktemp("graphs")

    @SETTINGS
    @given(_mangles(graph))
    def check(mangle: Tuple[Tuple[Any, ...], Any, str]) -> None:
        path = work / "mangled graph.json"
        path.write_text(json.dumps(_mangle(graph, *mangle)))
        code, err = run("discover", ["diff", str(path), str(inputs["graph_b"]), "--json"])
        assert_refused_or_fine(code, err, str(path))
        (work / "graphs").mkdir(exist_ok=True)
        (work / "graphs" / "g.json").write_text(path.read_text())
        code, err = run("discover", ["propose", "nfs", "--kernel-profile", str(inputs["profile"]),
                                     "--callgraphs", str(work / "graphs"), "--ops", "read"])
        assert_refused_or_fine(code, err, "g.json")

    check()


def test_specs(inputs: Dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> None:
    from discover.spec import load_spec
    spec = load_spec(bi.SPEC)
    work = tmp_path_factory.mktemp("specs")

    @SETTINGS
    @given(_mangles(spec))
    def check(mangle: Tuple[Tuple[Any, ...], Any, str]) -> None:
        path = work / "mangled.json"  # the same keys as the TOML, as JSON (docs/probe-spec.md)
        path.write_text(json.dumps(_mangle(spec, *mangle)))
        code, err = run("probes", ["compat", str(path), "--kernel", str(inputs["profile"])])
        assert_refused_or_fine(code, err, str(path))
        if mangle[2] == "add-key" and isinstance(_parent(spec, mangle[0]), dict):
            # a typo is never accepted silently (in [ops] a new key is an unknown operation)
            assert code == 1 and ("unknown key" in err or "unknown operation" in err), err

    check()


def _parent(doc: Any, path: Tuple[Any, ...]) -> Any:
    for key in path[:-1]:
        doc = doc[key]
    return doc


def test_profiles(inputs: Dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> None:
    profile = json.loads(inputs["profile"].read_text())
    # still the real profile, with the config options and event systems propose looks at
    profile["config"] = {k: v for k, v in profile["config"].items() if any(w in k for w in ("TRACE", "KPROBE", "BPF", "BTF", "NFS"))}
    profile["events"] = {k: v for k, v in profile["events"].items() if k in ("nfs", "nfs4", "sunrpc")}
    work = tmp_path_factory.mktemp("profiles")

    @SETTINGS
    @given(_mangles(profile))
    def check(mangle: Tuple[Tuple[Any, ...], Any, str]) -> None:
        path = work / "mangled.json"
        path.write_text(json.dumps(_mangle(profile, *mangle)))
        code, err = run("discover", ["propose", "nfs", "--kernel-profile", str(path)])
        assert_refused_or_fine(code, err, str(path))

    check()


def test_lab_results(inputs: Dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> None:
    work = tmp_path_factory.mktemp("lab")
    ops = st.sampled_from(["read", "write", "open", "getattr", "fsync", "commit", "reed", ""])
    run_entry = st.fixed_dictionaries({"candidate": st.none() | st.integers(-1, 5) | JSON, "ok": st.booleans() | JSON})
    kernels = st.sampled_from(["6.1.0-50-amd64", "6.1.0-50", "9.9.9"])
    results = st.dictionaries(kernels, st.dictionaries(ops, run_entry | JSON, max_size=3), max_size=2) | JSON

    @SETTINGS
    @given(results)
    def check(doc: Any) -> None:
        path = work / "lab.json"
        path.write_text(json.dumps(doc))
        code, err = run("probes", ["compat", str(bi.SPEC), "--kernel", str(inputs["profile"]),
                                   "--lab-results", str(path)])
        assert_refused_or_fine(code, err, str(path))

    check()

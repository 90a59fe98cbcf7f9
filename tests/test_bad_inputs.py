"""The bad-input catalogue: every console script against every kind of input it takes.

Each case is a real command line run as a subprocess (tests/badinput.py) and must end
with the expected exit status, exactly one line on stderr, no traceback, and nothing
left behind: no files, no processes, no tracefs mounts. The inputs are real captures
(traces, a kernel profile, the shipped probe spec) mangled in the ways users mangle them.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

import pytest

import badinput as bi

ROOT: Dict[str, Path] = {}


# -- inputs -----------------------------------------------------------------------------------

def _real(slot_kind: str) -> bytes:
    """The real input a slot normally takes, as bytes (paths are fixed: repository files)."""
    if slot_kind == "trace":
        return bi.TRACE.read_bytes()
    if slot_kind == "spec":
        return bi.SPEC.read_bytes()
    if slot_kind == "profile":
        return (ROOT["inputs"] / "profile.json").read_bytes()
    if slot_kind == "graph":
        return (ROOT["inputs"] / "graph.json").read_bytes() if ROOT else b""
    if slot_kind == "lab":
        return json.dumps({"6.1.0-50-amd64": {"read": {"candidate": 0, "ok": True}}}).encode()
    if slot_kind == "state":
        return json.dumps({"kernel": "6.1", "topology": "single"}).encode()
    return b""


def _kinds(slot_kind: str) -> Dict[str, Any]:
    """name -> file content (None: the file is missing; {}: a directory) for one slot."""
    real = _real(slot_kind)
    other = bi.TRACE.read_bytes() if slot_kind != "trace" else bi.SPEC.read_bytes()
    return {
        "missing": None,
        "directory": {},
        "empty": b"",
        "binary": bytes(range(256)) * 64,
        "nul": b"\0" * 4096,
        "truncated": real[:len(real) // 3],
        "gzip": gzip.compress(real, mtime=0),
        "gzip-corrupt": gzip.compress(real, mtime=0)[:200],
        "latin1": real.replace(b"nfs", "nf\u00e9".encode("latin-1"), 1) if b"nfs" in real else b"\xe9" + real,
        "utf16": real.decode("utf-8").encode("utf-16"),
        "huge-line": b"x" * (3 << 20),
        "json-list": b"[1, 2, 3]",
        "other-file": other,
    }


#: (slot name, input kind the slot takes, argv with FILE, kinds where the command must succeed)
SLOTS = [
    ("callgraph", "trace", ["discover", "callgraph", "--from-file", "FILE", "--format", "folded"],
     {"truncated", "gzip", "latin1"}),
    ("diff-a", "graph", ["discover", "diff", "FILE", "{graph_b}"], set()),
    ("diff-b", "graph", ["discover", "diff", "{graph}", "FILE", "--json"], set()),
    ("propose-profile", "profile", ["discover", "propose", "nfs", "--kernel-profile", "FILE"], {"gzip"}),
    ("events-profile", "profile", ["discover", "events", "nfs", "--kernel-profile", "FILE"], {"gzip"}),
    ("compat-spec", "spec", ["probes", "compat", "FILE", "--kernel", "{profile}"], set()),
    ("compat-kernel", "profile", ["probes", "compat", "{spec}", "--kernel", "FILE"], {"gzip"}),
    ("compat-lab", "lab", ["probes", "compat", "{spec}", "--kernel", "{profile}", "--lab-results", "FILE"], set()),
    ("kernel-profile", "deb", ["probes", "kernel-profile", "FILE", "-o", "out.json"], set()),
    ("nfsslower-spec", "spec", ["nfsslower", "--spec", "FILE"], set()),
    ("nfstop-spec", "spec", ["nfstop", "--spec", "FILE"], set()),  # nfsdist: the same Session, see signal cases
    ("labs-status", "state", ["labs", "status", "--name", "x"], set()),
    ("labs-run", "state", ["labs", "run", "--name", "x", "--", "true"], set()),
]

#: a directory given where a file is asked for is a usage error (2)
USAGE_ON_DIRECTORY = {"nfsslower-spec", "nfstop-spec", "compat-lab", "propose-profile",
                      "events-profile"}


def _place(files: Dict[str, Any], name: str, content: Any) -> None:
    if content is None:
        return
    if content == {}:
        files[name] = lambda p: p.mkdir()
    else:
        files[name] = content


def _fill(argv: List[str]) -> List[str]:
    names = {"graph": "graph", "graph_b": "graph_b", "profile": "profile", "spec": "spec"}
    out = []
    for arg in argv:
        for key, value in names.items():
            arg = arg.replace("{" + key + "}", str(ROOT["inputs"] / f"{value}.json") if key != "spec"
                              else str(bi.SPEC))
        out.append(arg)
    return out


def file_cases() -> Iterator[bi.Case]:
    for slot, slot_kind, argv, ok in SLOTS:
        for kind, content in _kinds(slot_kind).items():
            files: Dict[str, Any] = {}
            if slot.startswith("labs-"):
                files["../cache/labs/x.backend"] = "qemu\n"
                _place(files, "../cache/labs/x/state.json", content)
                args = argv
            else:
                suffix = {"spec": ".toml", "trace": ".trace"}.get(slot_kind, ".json")
                if kind.startswith("gzip"):
                    suffix += ".gz"
                name = f"in put{suffix}"  # a space in the name: quoting must not matter
                _place(files, name, content)
                args = _fill([name if a == "FILE" else a for a in argv])
            code = 0 if kind in ok else 1
            if kind == "directory" and slot in USAGE_ON_DIRECTORY:
                code = 2
            # a directory given as --kernel is a package directory: its analysis is announced first
            lines = None if code == 0 else 2 if (slot, kind) == ("compat-kernel", "directory") else 1
            yield bi.Case(f"file/{slot}/{kind}", args, code=code, files=files, lines=lines,
                          keep=("out.json",) if code == 0 else ())


# -- structured mangles of real inputs ------------------------------------------------------

def _set(doc: Any, path: List[Any], value: Any) -> Any:
    """A deep copy of doc with the value at path replaced (or deleted when value is DELETE)."""
    doc = json.loads(json.dumps(doc))
    target = doc
    for key in path[:-1]:
        target = target[key]
    if value is DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return doc


DELETE = object()


def graph_cases() -> Iterator[bi.Case]:
    graph = json.loads((ROOT["inputs"] / "graph.json").read_text())
    link = next(i for i, l in enumerate(graph["links"]) if l["calls"])
    for field in ("source", "target", "calls", "total_us", "avg_us"):
        for label, value in (("deleted", DELETE), ("abc", "abc"), ("negative", -1), ("null", None)):
            if field in ("source", "target") and label == "negative":
                value = 7
            yield bi.Case(f"graph/links.{field}/{label}", ["discover", "diff", "g.json", _fill(["{graph}"])[0]],
                          files={"g.json": json.dumps(_set(graph, ["links", link, field], value))},
                          match=f"links[{link}].{field}")
    mangles = {
        "nodes-strings": _set(graph, ["nodes"], [n["id"] for n in graph["nodes"]]),
        "nodes-missing": _set(graph, ["nodes"], DELETE),
        "links-object": _set(graph, ["links"], {"a": 1}),
        "format-other": _set(graph, ["graph", "format"], "networkx"),
        "graph-string": _set(graph, ["graph"], "probekit-callgraph"),
        "node-id-number": _set(graph, ["nodes", 0, "id"], 5),
        "node-calls-text": _set(graph, ["nodes", 0, "calls"], "12"),
        "node-events-list": _set(graph, ["nodes", 0, "events"], ["nfs:x"]),
        "top-list": [graph],
    }
    for label, doc in mangles.items():
        yield bi.Case(f"graph/{label}", ["discover", "diff", "g.json", _fill(["{graph}"])[0]],
                      files={"g.json": json.dumps(doc)})
    text = (ROOT["inputs"] / "graph.json").read_text()
    specials = {"nan": text.replace('"total_us": 0.0', '"total_us": NaN', 1),
                "infinity": re.sub(r'"avg_us": [0-9.]+', '"avg_us": Infinity', text, count=1),
                "deep": "[" * 100000 + "]" * 100000}
    for label, doc in specials.items():
        yield bi.Case(f"graph/{label}", ["discover", "diff", "g.json", _fill(["{graph}"])[0]], files={"g.json": doc})
    # networkx 3.4+ writes "edges": the same graph, read the same (exit 0, same report as "links")
    edges = dict(graph)
    edges["edges"] = edges.pop("links")
    yield bi.Case("graph/edges-key", ["discover", "diff", "g.json", _fill(["{graph_b}"])[0], "--json"],
                  files={"g.json": json.dumps(edges)}, code=0, lines=0)
    # any node-link graph as evidence for propose
    for label, doc in {"nodes-strings": {"nodes": ["a", "b"], "links": []},
                       "link-total-text": {"nodes": [{"id": "a"}], "links": [{"source": "a", "target": "b",
                                                                              "total_us": "abc"}]},
                       "events-text": {"nodes": [{"id": "a", "events": {"nfs:x": "many"}}], "links": []},
                       "no-source": {"nodes": [{"id": "a"}], "links": [{"target": "a"}]},
                       "list": [1, 2]}.items():
        yield bi.Case(f"evidence/{label}", ["discover", "propose", "nfs", "--kernel-profile",
                                            _fill(["{profile}"])[0], "--callgraphs", "graphs"],
                      files={"graphs/g.json": json.dumps(doc)})


def profile_cases() -> Iterator[bi.Case]:
    from discover.schema import PROFILE_SECTIONS
    profile = bi.small_profile()
    argv = ["discover", "propose", "nfs", "--kernel-profile", "p.json"]
    for section in PROFILE_SECTIONS:
        if section == "package":
            continue
        for label, value in (("text", "x"), ("number", 7)):
            if section in ("created",) and label == "text":
                continue
            yield bi.Case(f"profile/{section}/{label}", argv, files={"p.json": json.dumps(_set(profile, [section], value))},
                          match=section)
    first_event = next(iter(profile["events"]["nfs"]))
    first_btf = next(iter(profile["btf"]["functions"]))
    deep = {
        "filter-function-string": (["filter_functions", 0], "nfs_file_read"),
        "filter-function-triple": (["filter_functions", 0], ["a", "b", "c"]),
        "event-fields-text": (["events", "nfs", first_event, "fields"], "abc"),
        "event-field-name-number": (["events", "nfs", first_event, "fields", 0, "name"], 1),
        "event-id-text": (["events", "nfs", first_event, "id"], "12"),
        "btf-params-text": (["btf", "functions", first_btf, "params"], "x"),
        "module-size-text": (["modules", "nfs", "size"], "520192"),
        "mount-options-list": (["mounts", 0, "options"], ["rw"]),
        "uname-release-number": (["uname", "release"], 6.1),
        "config-value-number": (["config", "CONFIG_NFS_FS"], 1),
        "version-true": (["version"], True),
        "version-zero": (["version"], 0),
        "version-future": (["version"], 99),
        "schema-other": (["schema"], "probekit-probe-spec"),
        "uname-missing": (["uname"], DELETE),
        "events-missing": (["events"], DELETE),
    }
    for label, (path, value) in deep.items():
        yield bi.Case(f"profile/{label}", argv, files={"p.json": json.dumps(_set(profile, path, value))})
    yield bi.Case("profile/compat-kernel-wrong-section", ["probes", "compat", str(bi.SPEC), "--kernel", "p.json"],
                  files={"p.json": json.dumps(_set(profile, ["filter_functions"], "nfs_file_read"))},
                  match="filter_functions")


def _spec_edits() -> Dict[str, Callable[[str], str]]:
    def sub(pattern: str, repl: str) -> Callable[[str], str]:
        return lambda text: re.sub(pattern, repl, text, count=1, flags=re.M)
    return {
        "top-typo-kernal": sub(r"^kernel =", "kernal ="),
        "top-typo-modles": sub(r"^modules =", "modles ="),
        "top-version-true": sub(r"^version = 1", "version = true"),
        "top-version-text": sub(r"^version = 1", 'version = "1"'),
        "top-filesystem-number": sub(r"^filesystem = .*$", "filesystem = 7"),
        "top-modules-text": sub(r"^modules = .*$", 'modules = "nfs"'),
        "top-schema-other": sub(r"^schema = .*$", 'schema = "probekit-kernel-profile"'),
        "top-unknown-table": lambda t: t + '\n[opts.read]\nletter = "R"\n',
        "op-typo-lettre": sub(r'^letter = "R"', 'lettre = "R"'),
        "op-letter-wrong": sub(r'^letter = "R"', 'letter = "Z"'),
        "op-unknown": sub(r"^\[ops\.read\]", "[ops.reed]"),
        "op-unknown-key": sub(r'^letter = "R"', 'letter = "R"\ncolour = "red"'),
        "candidate-typo-kind": sub(r"^kind = ", "knid = "),
        "candidate-kind-bad": sub(r'^kind = "\w+"', 'kind = "uprobe"'),
        "candidate-match-bad": sub(r'^match = "\w+"', 'match = "pid"'),
        "candidate-stability-number": sub(r"^stability = .*$", "stability = 3"),
        "candidate-reasons-text": sub(r"^reasons = \[", 'reasons = "x"\nreasonz = ['),
        "attach-entry-number": sub(r'^entry = ".*"$', "entry = 1"),
        "attach-typo-optional": sub(r"^optional = ", "optionl = "),
        "attach-optional-text": sub(r"^optional = \w+", 'optional = "yes"'),
        "attach-exit-kind-bad": sub(r'^exit_kind = "\w+"', 'exit_kind = "fentry"'),
        "args-unknown-role": sub(r"^\[ops\.(\w+)\.candidates\.attach\.args\]", r"[ops.\1.candidates.attach.args]\ncolor = \"x\""),
        "args-expr-number": sub(r"^\[ops\.(\w+)\.candidates\.attach\.args\]", r"[ops.\1.candidates.attach.args]\nfile = 3"),
        "toml-broken": lambda t: t.replace("]", "", 1),
        "toml-duplicate": lambda t: t + '\nschema = "x"\n',
    }


def spec_cases() -> Iterator[bi.Case]:
    text = bi.SPEC.read_text()
    for label, edit in _spec_edits().items():
        mangled = edit(text)
        assert mangled != text, label
        yield bi.Case(f"spec/compat/{label}", ["probes", "compat", "s.toml", "--kernel", _fill(["{profile}"])[0]],
                      files={"s.toml": mangled})
        yield bi.Case(f"spec/nfsslower/{label}", ["nfsslower", "--spec", "s.toml"], files={"s.toml": mangled})
    for label in ("top-typo-kernal", "op-typo-lettre", "attach-typo-optional"):
        expected = {"top-typo-kernal": "did you mean 'kernel'", "op-typo-lettre": "did you mean 'letter'",
                    "attach-typo-optional": "did you mean 'optional'"}[label]
        yield bi.Case(f"spec/suggests/{label}", ["nfsdist", "--spec", "s.toml"],
                      files={"s.toml": _spec_edits()[label](text)}, match=expected)


def lab_cases() -> Iterator[bi.Case]:
    good = {"read": {"candidate": 0, "ok": True}}
    mangles = {
        "list": [good], "kernel-unknown": {"9.9.9-1-amd64": good},
        "op-unknown": {"6.1.0-50-amd64": {"reed": {"candidate": 0, "ok": True}}},
        "candidate-text": {"6.1.0-50-amd64": {"read": {"candidate": "0", "ok": True}}},
        "candidate-negative": {"6.1.0-50-amd64": {"read": {"candidate": -1, "ok": True}}},
        "ok-text": {"6.1.0-50-amd64": {"read": {"candidate": 0, "ok": "yes"}}},
        "ok-missing": {"6.1.0-50-amd64": {"read": {"candidate": 0}}},
        "per-op-list": {"6.1.0-50-amd64": ["read"]},
        "run-number": {"6.1.0-50-amd64": {"read": 1}},
    }
    for label, doc in mangles.items():
        yield bi.Case(f"lab/{label}", ["probes", "compat", str(bi.SPEC), "--kernel", _fill(["{profile}"])[0],
                                       "--lab-results", "lab.json"], files={"lab.json": json.dumps(doc)},
                      match="did you mean 'read'" if label == "op-unknown" else None)
    # the cheap check comes first: a bad lab file is refused before any kernel is read
    yield bi.Case("lab/before-kernels", ["probes", "compat", str(bi.SPEC), "--kernel", "no-such-kernel.json",
                                         "--lab-results", "lab.json"], files={"lab.json": "[]"}, match="lab.json")


def state_cases() -> Iterator[bi.Case]:
    good = {"kernel": "6.1", "topology": "single", "ssh": True, "memory_mib": 1536, "vcpus": None, "accel": "tcg",
            "project_dir": "/work", "image": {}, "nodes": [], "pids": {}, "console_offsets": {}}
    mangles = {"object-empty": {}, "topology-bad": _set(good, ["topology"], "ring"),
               "nodes-strings": _set(good, ["nodes"], ["lab"]), "pids-text": _set(good, ["pids"], {"lab": "12"}),
               "kernel-number": _set(good, ["kernel"], 6.1), "list": [good]}
    for label, doc in mangles.items():
        for command in (["status"], ["run", "--", "true"], ["shell"]):
            yield bi.Case(f"state/{command[0]}/{label}", ["labs", command[0], "--name", "x"] + command[1:],
                          files={"../cache/labs/x.backend": "qemu\n", "../cache/labs/x/state.json": json.dumps(doc)},
                          match="labs down --name x")
    for label, backend in (("backend-unknown", "xen\n"), ("backend-binary", b"\xff\xfe\0")):
        yield bi.Case(f"state/marker/{label}", ["labs", "run", "--name", "x", "--", "true"],
                      files={"../cache/labs/x.backend": backend}, match="labs down --name x")
    # `labs down` clears a state that is not a lab's, as the lines above say, but not silently:
    # one line naming the file and what is wrong, exit 1 (a script must not take it for a clean stop)
    broken: Dict[str, Any] = {**{label: json.dumps(doc) for label, doc in mangles.items()},
                              "not-json": "{", "directory": lambda path: path.mkdir()}
    whole = {"not-json": "lab state is not JSON", "directory": "Is a directory"}
    for label, content in broken.items():
        line = f"{whole[label]}; cleared it: lab 'x' is down" if label in whole else "lab state: "
        yield bi.Case(f"state/down/{label}", ["labs", "down", "--name", "x"],
                      files={"../cache/labs/x.backend": "qemu\n", "../cache/labs/x/state.json": content},
                      match=f"labs: error: {{home}}/cache/labs/x/state.json: {line}")
    yield bi.Case("state/down/marker-unknown", ["labs", "down", "--name", "x"],
                  files={"../cache/labs/x.backend": "xen\n"},
                  match="labs: error: {home}/cache/labs/x.backend: unknown backend 'xen'; cleared it: lab 'x' is down")
    # a stale marker (a `labs up` killed before it wrote any state) is recoverable: `labs down`
    # clears it (and then `labs up` is not refused)
    yield bi.Case("state/down-clears-stale", ["labs", "down", "--name", "x"], code=0, lines=0,
                  files={"../cache/labs/x.backend": "qemu\n"})
    # a marker without state (a `labs up` killed before it wrote any): not "run `labs up`", which refuses
    for command in (["status"], ["run", "--", "true"], ["shell"]):
        yield bi.Case(f"state/{command[0]}/stale-marker", ["labs", command[0], "--name", "x"] + command[1:],
                      files={"../cache/labs/x.backend": "qemu\n"},
                      match="labs: error: lab 'x' is not running: {home}/cache/labs/x.backend is left from a "
                            "`labs up` that did not finish; `labs down --name x` clears it")


def option_cases() -> Iterator[bi.Case]:
    g, gb, p, s, t = (_fill(["{graph}"])[0], _fill(["{graph_b}"])[0], _fill(["{profile}"])[0], str(bi.SPEC),
                      str(bi.TRACE))
    usage = [
        ["discover"], ["discover", "bogus"], ["discover", "--bogus"], ["discover", "diff", g],
        ["discover", "diff", g, gb, "--top", "0"], ["discover", "diff", g, gb, "--top", "abc"],
        ["discover", "callgraph", "--depth", "0", "--from-file", t], ["discover", "callgraph", "--pid", "abc"],
        ["discover", "callgraph", "--format", "pdf", "--from-file", t],
        ["discover", "callgraph", "--min-time", "-1", "--from-file", t],
        ["discover", "callgraph", "--duration", "abc", "x"], ["discover", "events"], ["discover", "propose"],
        ["discover", "snapshot"], ["probes"], ["probes", "compat", s], ["probes", "compat", s, "--kernel", p, "--format", "pdf"],
        ["probes", "fetch-kernel"], ["probes", "kernel-profile", "x.deb"],
        ["nfsslower", "-1"], ["nfsslower", "abc"], ["nfsslower", "-p", "0"], ["nfsslower", "1", "2"],
        ["nfsdist", "0"], ["nfsdist", "1", "0"], ["nfsdist", "-p", "x"], ["nfstop", "-i", "0"], ["nfstop", "extra"],
        ["labs"], ["labs", "up", "--topology", "ring"], ["labs", "up", "--backend", "xen"], ["labs", "run"],
        ["labs", "run", "--timeout", "abc", "--", "true"], ["labs", "test", "--topology", "ring"],
        ["probes", "compat", s, "--kernel", p, "-o", "."], ["discover", "propose", "nfs", "--kernel-profile", "."],
        ["nfstop", "--by", "uid"], ["nfsdtop", "0"], ["nfsdtop", "1", "0"], ["nfsdtop", "1", "2", "3"],
        ["nfsdtop", "--by", "mount"], ["nfsdtop", "-r", "0"], ["nfsdtop", "--backend", "ebpf"],
        ["nfs-exporter", "--nfsd", "--client-limit", "0"], ["nfs-exporter", "--client-limit", "x"],
    ]
    for i, argv in enumerate(usage):
        yield bi.Case(f"usage/{i:02d}-{'-'.join(a.strip('-') for a in argv[:3])}", argv, code=2)
    errors = {
        "callgraph-nan": (["discover", "callgraph", "nfs_file_read", "--duration", "nan"], None),
        "callgraph-negative": (["discover", "callgraph", "nfs_file_read", "--duration", "-1"], None),
        "callgraph-inf": (["discover", "callgraph", "nfs_file_read", "--duration", "inf"], None),
        "callgraph-both": (["discover", "callgraph", "x", "--workload", "true", "--duration", "1"], None),
        "callgraph-no-function": (["discover", "callgraph"], None),
        "callgraph-pid-and-comm": (["discover", "callgraph", "--from-file", t, "--pid", "1", "--comm", "x"], None),
        "callgraph-live-options-from-file": (["discover", "callgraph", "--from-file", t, "--duration", "1"], None),
        "callgraph-select-absent": (["discover", "callgraph", "no_such_function", "--from-file", t], None),
        "callgraph-out-over-input": (["discover", "callgraph", "--from-file", "in.trace", "-o", "in.trace"],
                                     "would be overwritten"),
        "callgraph-out-dev-full": (["discover", "callgraph", "--from-file", t, "-o", "/dev/full"], "/dev/full"),
        "callgraph-out-directory": (["discover", "callgraph", "--from-file", t, "-o", "."], None),
        "compat-out-missing-dir": (["probes", "compat", s, "--kernel", p, "-o", "no/dir/r.txt"], "no/dir"),
        "callgraph-out-missing-dir": (["discover", "callgraph", "--from-file", t, "-o", "no/dir/x.txt"], "no/dir"),
        "callgraph-newline-name": (["discover", "callgraph", "--from-file", "a\nb.trace"], "a\\nb.trace"),
        "diff-newline-name": (["discover", "diff", "x\ny.json", g], "x\\ny.json"),
        "propose-ops-empty": (["discover", "propose", "nfs", "--kernel-profile", p, "--ops", ""], None),
        "propose-ops-unknown": (["discover", "propose", "nfs", "--kernel-profile", p, "--ops", "read,bogus"],
                                "unknown operation 'bogus'"),
        "propose-live-no-tracefs": (["discover", "propose", "nfs"], None),
        "propose-out-dev-full": (["discover", "propose", "nfs", "--kernel-profile", p, "-o", "/dev/full"],
                                 "/dev/full"),
        "events-live-no-tracefs": (["discover", "events", "nfs"], None),
        "compat-kernel-empty": (["probes", "compat", s, "--kernel", ""], "--kernel"),
        "compat-kernel-blank": (["probes", "compat", s, "--kernel", "  "], "--kernel"),
        "compat-kernel-twice": (["probes", "compat", s, "--kernel", p, "--kernel", p], "twice"),
        "compat-reference-absent": (["probes", "compat", s, "--kernel", p, "--reference", "nope"], "--reference"),
        "compat-out-dev-full": (["probes", "compat", s, "--kernel", p, "-o", "/dev/full"], "/dev/full"),
        "compat-kernel-no-such": (["probes", "compat", s, "--kernel", "nothing-here.json"], None),
        "fetch-not-a-version": (["probes", "fetch-kernel", "latest"], "not a kernel version"),
        "fetch-empty": (["probes", "fetch-kernel", ""], "not a kernel version"),
        "fetch-path": (["probes", "fetch-kernel", "../../etc/passwd"], "not a kernel version"),
        "kernel-profile-missing": (["probes", "kernel-profile", "nothing.deb", "-o", "out.json"], None),
        "slower-csv-and-json": (["nfsslower", "-j", "--json"], None),
        "slower-ops-unknown": (["nfsslower", "--ops", "bogus"], "bogus"),
        "slower-ops-empty": (["nfsslower", "--ops", ""], None),
        "slower-ops-commas": (["nfsslower", "--ops", ",,"], None),
        "dist-ops-unknown": (["nfsdist", "--ops", "R,Q"], "'Q'"),
        "top-ops-unknown": (["nfstop", "--ops", "reed"], None),
        "slower-cgroup-missing": (["nfsslower", "--cgroup", "/no/such.scope"], "not a cgroup v2 directory"),
        "dist-cgroup-a-file": (["nfsdist", "--cgroup", "/etc/hostname"], "not a cgroup v2 directory"),
        "top-mount-point-not-nfs": (["nfstop", "--mount-point", "/"], "not on an NFS mount"),
        "slower-mount-point-missing": (["nfsslower", "--mount-point", "/no/such/dir"], "--mount-point"),
        "slower-spec-missing": (["nfsslower", "--spec", "none.toml"], "none.toml"),
        "fsslower-no-type": (["fsslower", "1"], "-t FS"),
        "fsslower-type-unknown": (["fsslower", "-t", "zfs"], "no spec for it"),
        "fsdist-type-path": (["fsdist", "-t", "../nfs"], "no spec for it"),
        "fstop-type-not-the-spec": (["fstop", "-t", "xfs", "--spec", s], "a spec for nfs"),
        "fsslower-two-minimums": (["fsslower", "-t", "xfs", "-m", "2", "5"], "two minimum latencies"),
        "fsslower-mount-point-not-xfs": (["fsslower", "-t", "xfs", "--mount-point", "/"], "not on an XFS mount"),
        "fsdist-ops-unknown": (["fsdist", "-t", "ext4", "--ops", "R,Q"], "'Q'"),
        "fsslower-live": (["fsslower", "-t", "ext4"], None),
        "fstop-live": (["fstop", "-t", "btrfs", "-i", "1"], None),
        "slower-live": (["nfsslower"], None),
        "dist-live": (["nfsdist", "1", "1"], None),
        "top-live": (["nfstop", "-i", "1"], None),
        "nfsdtop-client-spec": (["nfsdtop", "--spec", s], "no request with a client address"),
        "nfsdtop-spec-missing": (["nfsdtop", "--spec", "none.toml"], "none.toml"),
        "nfsdtop-live": (["nfsdtop", "1", "1"], None),
        "labs-run-not-up": (["labs", "run", "--name", "nothere", "--", "true"], "labs up"),
        "labs-shell-not-up": (["labs", "shell", "--name", "nothere"], None),
        "labs-test-results-nowhere": (["labs", "test", "--lab-results", "no/dir/lab.json"], "no/dir"),
    }
    for label, (argv, match) in errors.items():
        files = {"in.trace": bi.TRACE.read_bytes()} if label == "callgraph-out-over-input" else {}
        yield bi.Case(f"option/{label}", argv, files=files, match=match)
    fine = {
        "propose-ops-letters": ["discover", "propose", "nfs", "--kernel-profile", p, "--ops", "R,W"],
        "propose-ops-mixed-case": ["discover", "propose", "nfs", "--kernel-profile", p, "--ops", "Read,g"],
        "diff-columns-zero": ["discover", "diff", g, gb],
        "labs-status-absent": ["labs", "status", "--name", "nothere"],
        "labs-down-absent": ["labs", "down", "--name", "nothere"],
        "help-discover": ["discover", "--help"], "help-nfsslower": ["nfsslower", "-h"],
    }
    for label, argv in fine.items():
        env = {"COLUMNS": "0"} if label == "diff-columns-zero" else {}
        yield bi.Case(f"fine/{label}", argv, code=0, lines=None, env=env)


def signal_cases() -> Iterator[bi.Case]:
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) and SIGTERM while a
    command reads its input: the FIFO is opened by the command, so it is mid-run."""
    part = bi.TRACE.read_bytes()[:50000]
    spec_part = bi.SPEC.read_bytes()[:2000]
    json_part = b'{"nodes": ['
    readers = {
        "callgraph": (["discover", "callgraph", "--from-file", "pipe"], part),
        "diff": (["discover", "diff", "pipe", _fill(["{graph}"])[0]], json_part),
        "propose": (["discover", "propose", "nfs", "--kernel-profile", "pipe"], json_part),
        "compat-lab": (["probes", "compat", str(bi.SPEC), "--kernel", _fill(["{profile}"])[0],
                        "--lab-results", "pipe"], json_part),
        "compat-spec": (["probes", "compat", "pipe", "--kernel", _fill(["{profile}"])[0]], spec_part),
        "nfsslower": (["nfsslower", "--spec", "pipe"], spec_part),
        "nfsdist": (["nfsdist", "--spec", "pipe"], spec_part),
        "nfstop": (["nfstop", "--spec", "pipe"], spec_part),
        "labs": (["labs", "status", "--name", "x"], json_part),
    }
    for label, (argv, data) in readers.items():
        for name, signum, code in (("sigint", signal.SIGINT, 130), ("sigterm", signal.SIGTERM, 143)):
            files = {"../cache/labs/x.backend": "qemu\n", "../cache/labs/x/.keep": ""} if label == "labs" else {}
            fifo = "../cache/labs/x/state.json" if label == "labs" else "pipe"
            yield bi.Case(f"signal/{label}/{name}", [a if a != "pipe" else fifo for a in argv], code=code,
                          files=files, fifo=(fifo, data, signum),
                          match="interrupted" if signum == signal.SIGINT else "terminated by SIGTERM")
    # `dot` rendering an SVG when the command is told to stop: its process group goes too
    # (a stand-in `dot` that only waits, so the test does not depend on Graphviz's speed)
    dot = "#!/bin/sh\ntouch dot-started\nexec sleep 60\n"
    for name, signum, code in (("sigterm", signal.SIGTERM, 143), ("sigint", signal.SIGINT, 130)):
        yield bi.Case(f"signal/callgraph-svg-dot/{name}",
                      ["discover", "callgraph", "--from-file", str(bi.TRACE), "--format", "svg", "-o", "out.svg"],
                      code=code, files={"bin/dot": lambda path: (path.write_text(dot), path.chmod(0o755))},
                      env={"PATH": "{cwd}/bin:/usr/bin:/bin"}, signal_on_file=("dot-started", signum),
                      keep=("dot-started",))


def package_signal_cases() -> Iterator[bi.Case]:
    """Ctrl-C and SIGTERM while real Debian packages are analysed (the compat report's
    workers, the kernel-profile's xz children): one line, no worker tracebacks, no
    child left. Needs the cached packages the package tests use (tests/debian_kernels.py)."""
    cached = Path.home() / ".cache" / "probekit" / "kernels"
    dirs = [cached / abi for abi in ("6.1.0-50", "6.12.95+deb12") if (cached / abi / "manifest.json").is_file()]
    if len(dirs) < 2:
        return
    compat = ["probes", "compat", str(bi.SPEC), "--kernel", str(dirs[0]), "--kernel", str(dirs[1])]
    for name, signum, code in (("sigint", signal.SIGINT, 130), ("sigterm", signal.SIGTERM, 143)):
        yield bi.Case(f"signal/compat-packages/{name}", compat,
                      code=code, signal_after=(5.0, signum), match="stopped and cleaned up")
        yield bi.Case(f"signal/kernel-profile/{name}", ["probes", "kernel-profile", str(dirs[0]), "-o", "out.json"],
                      code=code, signal_after=(4.0, signum), match="stopped and cleaned up")
    # the moments a signal was lost with multiprocessing's Pool (probes.compat.analyse_packages
    # says how): as the workers are forked, before they set their signals up, as they start
    # work, and into it; counted from the first worker's fork, whatever the host's load
    for name, signum, code in (("sigterm", signal.SIGTERM, 143), ("sigint", signal.SIGINT, 130),
                               ("sighup", signal.SIGHUP, 129)):
        for delay in (0.0, 0.001, 0.003, 0.01, 0.05, 0.3, 1.5):
            yield bi.Case(f"signal/compat-workers-start/{name}-{delay}", compat, code=code,
                          signal_on_child=(delay, signum), timeout=60.0,
                          match="interrupted (Ctrl-C)" if signum == signal.SIGINT else f"terminated by {name.upper()}")
    # kernel-profile's module children (6.12 ships .ko.xz), forked after xz, the command's first
    # child: with a ProcessPoolExecutor, the signal's handler lost in a fork hook, a worker's
    # traceback, a worker killed half-way through its answer (the pool's thread then read for ever)
    profile = ["probes", "kernel-profile", str(dirs[1]), "-o", "out.json"]
    for name, signum, code in (("sigterm", signal.SIGTERM, 143), ("sigint", signal.SIGINT, 130)):
        for delay in (0.0, 0.001, 0.003, 0.01, 0.05, 0.3, 1.0):
            yield bi.Case(f"signal/kernel-profile-workers-start/{name}-{delay}", profile, code=code,
                          signal_on_child=(delay, signum), nth_child=2, timeout=60.0, match="stopped and cleaned up")
    # one module child ended by someone else, as it starts: one line naming its modules
    for name, signum, how in (("sigkill", signal.SIGKILL, "killed by SIGKILL"),
                              ("sigterm", signal.SIGTERM, "stopped by SIGTERM")):
        yield bi.Case(f"signal/kernel-profile-worker-alone/{name}", profile, kill_child=(0.0, signum), nth_child=2,
                      timeout=60.0, match=f".ko.xz) ended without an answer ({how})")
    # a worker ended by someone else (the OOM killer, a kill): the Pool waited for its task for ever
    for name, signum, how in (("sigkill", signal.SIGKILL, "killed by SIGKILL"),
                              ("sigterm", signal.SIGTERM, "stopped by SIGTERM")):
        yield bi.Case(f"signal/compat-worker-alone/{name}", compat, kill_child=(0.5, signum), timeout=60.0,
                      match=f"probes: error: --kernel {dirs[1]}: the package's analysis ended without an answer ({how})")


def output_cases() -> Iterator[bi.Case]:
    """-o (and --lab-results) refused before any work: naming an input (the same file, a
    symlink to it, a hard link), under a regular file, in a missing directory. Each line exact."""
    p, s = _fill(["{profile}"])[0], str(bi.SPEC)
    spec, profile = bi.SPEC.read_text(), bi.small_profile()
    over = "(it would be overwritten); write elsewhere"
    cases = {
        "propose-over-profile": (["discover", "propose", "nfs", "--kernel-profile", "p.json", "-o", "p.json"],
                                 {"p.json": json.dumps(profile)},
                                 f"discover: error: -o p.json: is the input p.json {over}"),
        "propose-over-profile-symlink": (["discover", "propose", "nfs", "--kernel-profile", "p.json", "-o", "l.toml"],
                                         {"p.json": json.dumps(profile), "l.toml": lambda path: path.symlink_to("p.json")},
                                         f"discover: error: -o l.toml: is the input p.json {over}"),
        "propose-over-callgraph": (["discover", "propose", "nfs", "--kernel-profile", p, "--callgraphs", "graphs",
                                    "-o", "graphs/g.json"], {"graphs/g.json": _real("graph")},
                                   f"discover: error: -o graphs/g.json: is the input graphs/g.json {over}"),
        "propose-under-file": (["discover", "propose", "nfs", "--kernel-profile", p, "-o", "afile/nfs.toml"],
                               {"afile": "x"},
                               "discover: error: -o afile/nfs.toml: the parent afile is a file, not a directory"),
        "compat-over-spec": (["probes", "compat", "s.toml", "--kernel", p, "-o", "s.toml"], {"s.toml": spec},
                             f"probes: error: -o s.toml: is the input s.toml {over}"),
        "compat-over-spec-hardlink": (["probes", "compat", "s.toml", "--kernel", p, "-o", "h.toml"],
                                      {"s.toml": spec, "h.toml": lambda path: os.link(path.with_name("s.toml"), path)},
                                      f"probes: error: -o h.toml: is the input s.toml {over}"),
        "compat-over-lab": (["probes", "compat", s, "--kernel", p, "--lab-results", "lab.json", "-o", "./lab.json"],
                            {"lab.json": _real("lab")}, f"probes: error: -o lab.json: is the input lab.json {over}"),
        "compat-over-kernel-profile": (["probes", "compat", s, "--kernel", "p.json", "-o", "p.json"],
                                       {"p.json": json.dumps(profile)},
                                       f"probes: error: -o p.json: is the input p.json {over}"),
        "compat-under-file": (["probes", "compat", s, "--kernel", p, "-o", "afile/r.txt"], {"afile": "x"},
                              "probes: error: -o afile/r.txt: the parent afile is a file, not a directory"),
        "kernel-profile-over-package": (["probes", "kernel-profile", "k.deb", "-o", "k.deb"], {"k.deb": b"!<arch>\n"},
                                        f"probes: error: -o k.deb: is the input k.deb {over}"),
        "callgraph-under-file": (["discover", "callgraph", "--from-file", str(bi.TRACE), "-o", "afile/sub"],
                                 {"afile": "x"}, "discover: error: -o afile/sub: the parent afile is a file, not a directory"),
        "callgraph-under-file-deeper": (["discover", "callgraph", "--from-file", str(bi.TRACE), "-o", "afile/a/b"],
                                        {"afile": "x"},
                                        "discover: error: -o afile/a/b: the parent afile is a file, not a directory"),
        "labs-test-results-under-file": (["labs", "test", "--lab-results", "afile/lab.json"], {"afile": "x"},
                                         "labs: error: --lab-results afile/lab.json: the parent afile is a file, "
                                         "not a directory"),
    }
    for label, (argv, files, line) in cases.items():
        yield bi.Case(f"output/{label}", argv, files=files, match=line)
    # snapshot on a (minimal) tracefs: without the pre-check it printed ten progress lines first
    tracefs = {"tracefs/available_events": "", "tracefs/available_tracers": "nop\n"}
    for label, out, files, line in (
            ("snapshot-missing-dir", "no/dir/p.json", {}, "discover: error: -o no/dir/p.json: no directory no/dir; "
                                                            "create it first"),
            ("snapshot-under-file", "afile/p.json", {"afile": "x"},
             "discover: error: -o afile/p.json: the parent afile is a file, not a directory"),
            ("snapshot-dev-full", "/dev/full", {}, "discover: error: -o /dev/full: cannot write: No space left on device")):
        yield bi.Case(f"output/{label}", ["discover", "snapshot", "-o", out], files={**tracefs, **files},
                      env={"PROBEKIT_TRACEFS": "{cwd}/tracefs"}, match=line)


def refusal_cases() -> Iterator[bi.Case]:
    """Values that were taken as good and misled later: each refused in one exact line."""
    p = _fill(["{profile}"])[0]
    names = "btrfs, ceph, cifs, ext4, f2fs, fuse, nfs, xfs, zfs"
    for label, fs in (("empty", ""), ("blank", " "), ("path", "../nfs")):
        yield bi.Case(f"refuse/propose-fs-{label}", ["discover", "propose", fs, "--kernel-profile", p],
                      match=f"discover: error: FS {fs!r}: not a filesystem type name (letters, digits, _; as "
                            f"/proc/filesystems lists them: {names})")
    graph = json.loads((ROOT["inputs"] / "graph.json").read_text())
    yield bi.Case("refuse/diff-graph-newer-version", ["discover", "diff", "g.json", _fill(["{graph_b}"])[0]],
                  files={"g.json": json.dumps(_set(graph, ["graph", "version"], 2))},
                  match="discover: error: g.json: call graph format version 2 is newer than this probekit reads "
                        "(version 1); upgrade probekit, or write the graph with this one")
    xfs = bi.REPO / "probes" / "specs" / "xfs.toml"
    yield bi.Case("refuse/exporter-spec-not-asked", ["nfs-exporter", "-t", "nfs,ext4", "--spec", str(xfs)],
                  match=f"nfs-exporter: error: --spec {xfs}: a spec for xfs, which -t nfs,ext4 does not name")
    known = "btrfs, cifs, ext4, nfs, nfsd, xfs"
    for label, types, line in (
            ("unknown", "nfs,zfs", f"-t zfs: no spec for it in probekit (known: {known}); write one with "
                                   "`discover propose zfs` and pass it with --spec FILE"),
            ("twice", "xfs,nfs,xfs", "-t xfs,nfs,xfs: xfs is given twice"),
            ("empty", "nfs,,xfs", "-t 'nfs,,xfs': an empty filesystem name (FS[,FS...]: btrfs, cifs, ext4, nfs, xfs)"),
            ("nfsd", "nfs,nfsd", "-t nfsd: an NFS server's requests are --nfsd's families (per client, export and "
                                 "procedure); -t names the filesystems whose operations this host runs")):
        yield bi.Case(f"refuse/exporter-types-{label}", ["nfs-exporter", "-t", types], match=f"nfs-exporter: error: {line}")
    # a HOME that cannot hold the cache (here: a file): the line names the cache and the variable
    for argv in (["probes", "fetch-kernel", "6.1"], ["labs", "down", "--name", "x"]):
        yield bi.Case(f"refuse/cache-in-unusable-home/{argv[0]}", argv, files={"home": "not a directory"},
                      env={"HOME": "{cwd}/home", "PROBEKIT_CACHE": ""},
                      match="error: cannot use the cache directory {cwd}/home/.cache/probekit: Not a directory: ")
        yield bi.Case(f"refuse/cache-unusable/{argv[0]}", argv, files={"cache": "not a directory"},
                      env={"PROBEKIT_CACHE": "{cwd}/cache"},
                      match="error: cannot use the cache directory {cwd}/cache (PROBEKIT_CACHE): Not a directory: ")


def profile_cache_cases() -> Iterator[bi.Case]:
    """PROBEKIT_PROFILE_CACHE naming a file (or a path under one): the variable and what is
    wrong, before the kernel is fetched (a version) or analysed (a package directory)."""
    for label, kernel in (("version", "6.1"), ("package", "{cwd}/pkg")):
        for value, line in (("afile", "PROBEKIT_PROFILE_CACHE={cwd}/afile is a file, not a directory; "),
                            ("afile/sub", "PROBEKIT_PROFILE_CACHE={cwd}/afile/sub: {cwd}/afile is a file, not a "
                                          "directory; ")):
            yield bi.Case(f"refuse/profile-cache-{value.replace('/', '-')}/{label}",
                          ["probes", "compat", str(bi.SPEC), "--kernel", kernel],
                          files={"afile": "x", "pkg/linux-image.deb": b"!<arch>\n"},
                          env={"PROBEKIT_PROFILE_CACHE": "{cwd}/" + value},
                          match=f"probes: error: {line}point it at a directory (or unset it for "
                                "{home}/cache/profiles)")


#: a package index as the private apt keeps it (one kernel), fetched three days ago
OLD_INDEX = "pc/apt/state/lists/deb.debian.org_debian_dists_bookworm_main_binary-amd64_Packages"
OLD_INDEX_TIME = time.time() - 3 * 86400 - 600
OLD_INDEX_TEXT = ("Package: linux-image-6.1.0-99-amd64\nArchitecture: amd64\nVersion: 6.1.999-1\n"
                  "Filename: pool/main/l/linux-signed-amd64/linux-image-6.1.0-99-amd64_6.1.999-1_amd64.deb\n"
                  "Size: 100\nDescription: Linux 6.1 for 64-bit PCs (signed)\n\n")


def _old_index(path: Path) -> None:
    path.write_text(OLD_INDEX_TEXT)
    os.utime(path, (OLD_INDEX_TIME, OLD_INDEX_TIME))


def old_index_cases() -> Iterator[bi.Case]:
    """Offline (apt's proxy a closed port: apt-get update exits 0 and keeps the old lists), a
    kernel the lists do not have: the answer says how old the lists are, and that updating
    them failed."""
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(OLD_INDEX_TIME))
    for label, argv in (("fetch-kernel", ["probes", "fetch-kernel", "9.99"]),
                        ("compat", ["probes", "compat", str(bi.SPEC), "--kernel", "9.99"])):
        yield bi.Case(f"refuse/old-package-lists/{label}", argv,
                      files={OLD_INDEX: _old_index, "apt.conf": 'Acquire::http::Proxy "http://127.0.0.1:9";\n'},
                      env={"PROBEKIT_CACHE": "{cwd}/pc", "APT_CONFIG": "{cwd}/apt.conf"}, keep=("pc",),
                      match="probes: error: no Debian amd64 kernel 9.99 in bullseye, bookworm, bookworm-backports, "
                            f"trixie, trixie-backports, sid (available: 6.1); package lists from {when} (3 days "
                            "old): updating them failed (Failed to fetch http://deb.debian.org/debian/dists/")


def all_cases() -> List[bi.Case]:
    return [*file_cases(), *graph_cases(), *profile_cases(), *spec_cases(), *lab_cases(), *state_cases(),
            *option_cases(), *output_cases(), *refusal_cases(), *profile_cache_cases(), *old_index_cases(),
            *signal_cases(), *package_signal_cases()]


def _inputs_dir() -> Path:
    """The shared real inputs, made at collection (the case list reads them), removed at exit."""
    import atexit
    import shutil
    import tempfile
    base = Path(tempfile.mkdtemp(prefix="probekit-bad-inputs-"))
    atexit.register(shutil.rmtree, base, True)
    bi.shared_inputs(base / "inputs")
    return base / "inputs"


ROOT["inputs"] = _inputs_dir()
CASES = {case.id: case for case in all_cases()}


@pytest.fixture(scope="module")
def results(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Dict[str, bi.Result]:
    """Run the selected cases once, in parallel; each test then checks its own."""
    wanted = [CASES[item.callspec.params["case_id"]] for item in request.session.items
              if item.module is request.module and hasattr(item, "callspec") and "case_id" in item.callspec.params]
    mounts = bi.tracefs_mounts()
    out = bi.run_all(wanted, tmp_path_factory.mktemp("cases"))
    ROOT["mounts_after"] = bi.tracefs_mounts()  # type: ignore[assignment]
    ROOT["mounts_before"] = mounts  # type: ignore[assignment]
    return out


def test_catalogue_is_large_enough() -> None:
    assert len(CASES) >= 300, len(CASES)


@pytest.mark.parametrize("case_id", list(CASES))
def test_bad_input(case_id: str, results: Dict[str, bi.Result]) -> None:
    case = CASES[case_id]
    result = results[case_id]
    bi.check(case, result)
    if case_id == "fine/diff-columns-zero":
        assert b"calls only in" in result.stdout
    if case_id == "graph/edges-key":  # read as the graph it is: nothing added or removed against itself's twin
        report = json.loads(result.stdout)
        assert report["shifted"] or report["removed"]


def test_nothing_left_mounted(results: Dict[str, bi.Result]) -> None:
    """nfsslower/nfsdist/nfstop mount tracefs to look at the kernel and fail here: unmounted again."""
    assert ROOT["mounts_after"] == ROOT["mounts_before"]

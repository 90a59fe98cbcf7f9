"""Probe spec validator: a proposal written as TOML reads back; bad keys are named in one line."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Dict

import pytest

from discover.errors import UserError
from discover.spec import compile_spec, dumps_spec, load_spec, validate_spec

GOOD: Dict[str, Any] = {
    "schema": "probekit-probe-spec", "version": 1, "filesystem": "nfs", "kernel": "6.1.0-57-amd64",
    "ops": {"read": {"letter": "R", "candidates": [{
        "kind": "kprobe", "match": "task", "reasons": ["why \"quoted\" ünïcode"],
        "attach": [{"entry": "nfs_file_read", "exit": "nfs_file_read", "entry_kind": "kprobe",
                    "exit_kind": "kretprobe", "module": "nfs", "optional": False,
                    "args": {"file": "iocb->ki_filp", "bytes": "retval"}}]}]}},
}


def test_roundtrip(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(dumps_spec(GOOD))
    assert load_spec(path) == GOOD


def test_context_points_roundtrip(tmp_path: Path) -> None:
    """An operation's context (nfsd's fh_verify naming the export) is written after its
    candidates and reads back the same."""
    spec = copy.deepcopy(GOOD)
    spec["ops"]["rpc"] = {"letter": "P", "candidates": copy.deepcopy(GOOD["ops"]["read"]["candidates"]),
                          "context": [{"kind": "fentry", "match": "task", "attach": [{
                              "entry": "fh_verify", "exit": "fh_verify", "entry_kind": "fentry", "exit_kind": "fexit",
                              "module": "nfsd", "optional": False,
                              "args": {"client": "rqstp->rq_addr", "export": "fhp->fh_export"}}]}]}
    text = dumps_spec(spec)
    assert text.index("[[ops.rpc.candidates]]") < text.index("[[ops.rpc.context]]") \
        < text.index("[ops.rpc.context.attach.args]")
    path = tmp_path / "s.toml"
    path.write_text(text)
    assert load_spec(path) == spec


@pytest.mark.parametrize("mutate, key", [
    (lambda s: s["ops"].__setitem__("readdirs", s["ops"]["read"]), "ops.readdirs"),
    (lambda s: s["ops"]["read"].__setitem__("letter", "W"), "ops.read.letter"),
    (lambda s: s["ops"]["read"]["candidates"][0].__setitem__("kind", "uprobe"), "ops.read.candidates[0].kind"),
    (lambda s: s["ops"]["read"]["candidates"][0]["attach"][0].__setitem__("exit_kind", "kprobe"),
     "ops.read.candidates[0].attach[0].exit_kind"),
    (lambda s: s["ops"]["read"]["candidates"][0]["attach"][0]["args"].__setitem__("size", "x"),
     "ops.read.candidates[0].attach[0].args.size"),
    (lambda s: s["ops"]["read"]["candidates"][0].__setitem__("match", "keys"), "ops.read.candidates[0].keys"),
    (lambda s: s["ops"]["read"].__setitem__("candidates", []), "ops.read.candidates"),
    (lambda s: s.__setitem__("version", 7), "version"),
    (lambda s: s["ops"]["read"].__setitem__("context", {"kind": "fentry"}), "ops.read.context"),
    (lambda s: s["ops"]["read"].__setitem__("context", [dict(s["ops"]["read"]["candidates"][0], kind="fentry")]),
     "ops.read.context[0].attach[0].entry_kind"),
])
def test_bad_key_is_named(mutate: Any, key: str) -> None:
    spec = copy.deepcopy(GOOD)
    mutate(spec)
    with pytest.raises(UserError) as err:
        validate_spec(spec, "x.toml")
    assert str(err.value).startswith(f"x.toml: {key}:")


def test_not_toml_and_not_spec(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[[[ nope")
    with pytest.raises(UserError, match="not valid TOML"):
        load_spec(bad)
    bad.write_text('schema = "other"\n')
    with pytest.raises(UserError, match="not a probe spec"):
        load_spec(bad)


def test_json_spec_reads_like_toml(tmp_path: Path) -> None:
    """Debian 11 guests (Python 3.9, no TOML module) are given the spec as JSON."""
    import json
    path = tmp_path / "s.json"
    path.write_text(json.dumps(GOOD))
    assert load_spec(path) == GOOD
    path.write_text("{nope")
    with pytest.raises(UserError, match="not valid JSON"):
        load_spec(path)


@pytest.mark.parametrize("spec_file", sorted((Path(__file__).resolve().parent.parent / "probes" / "specs").glob("*.toml")),
                         ids=lambda p: p.stem)
def test_a_compiled_spec_is_taken_only_while_it_matches_its_file(spec_file: Path, tmp_path: Path) -> None:
    """Each shipped spec read through its compiled JSON is the spec the TOML gives; a JSON that
    is absent or not compile_spec's is passed over; once the file changes (an edit) the TOML
    is parsed again, and a bad edit is still one line."""
    path = tmp_path / spec_file.name
    path.write_text(spec_file.read_text(encoding="utf-8"), encoding="utf-8")
    compiled = tmp_path / "compiled.json"
    compiled.write_text(compile_spec(path), encoding="utf-8")
    parsed = load_spec(path)
    # the same spec in the same order (the CO-RE object numbers its points in the file's order)
    assert json.dumps(load_spec(path, compiled)) == json.dumps(parsed)
    assert load_spec(path, tmp_path / "absent.json") == parsed
    for junk in ("[]", "{", '{"source": 1}'):
        (tmp_path / "junk.json").write_text(junk, encoding="utf-8")
        assert load_spec(path, tmp_path / "junk.json") == parsed
    path.write_text(path.read_text(encoding="utf-8").replace(f'filesystem = "{parsed["filesystem"]}"',
                                                             'filesystem = "edited"', 1), encoding="utf-8")
    assert load_spec(path, compiled)["filesystem"] == "edited"
    path.write_text(path.read_text(encoding="utf-8") + "\n[ops\n", encoding="utf-8")
    with pytest.raises(UserError, match="not valid TOML"):
        load_spec(path, compiled)

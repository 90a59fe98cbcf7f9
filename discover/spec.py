"""Probe specs: where to time each filesystem operation, as an ordered fallback list.

Why a file: `discover propose` decides attach points from evidence on one kernel; the probe
generator (and a human reviewer) consume that decision later, maybe on another kernel, and
take the first candidate whose attach points exist there. Schema: docs/probe-spec.md.
This module writes and reads specs and validates them with errors that name the bad key.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from discover.errors import UserError, short

TYPE_CHECKING = False  # typing's constant without typing (discover/records.py)
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Sequence, Tuple

SCHEMA = "probekit-probe-spec"
VERSION = 1

#: operation name -> the one-letter code the latency tools print (bcc nfsslower style).
#: The first six are what the tools trace by default (bcc's R W O G plus F and C); the
#: metadata operations a process can also wait in, and the RPC layer beneath them all
#: (P: every RPC, whichever VFS path or kworker started it), are there by `--ops`.
OPS: Dict[str, str] = {"read": "R", "write": "W", "open": "O", "getattr": "G", "fsync": "F", "commit": "C",
                       "lookup": "L", "create": "N", "unlink": "U", "rename": "M", "mkdir": "K",
                       "rmdir": "X", "setattr": "S", "readdir": "D", "access": "A", "link": "H",
                       "symlink": "Y", "rpc": "P"}
#: what `--ops` means when not given
DEFAULT_OPS = ("read", "write", "open", "getattr", "fsync", "commit")
#: the layer every other operation waits in: tracked in flight by the tools that show stuck
#: operations whatever `--ops` asks (a create stuck on a dead server is then seen as its RPC),
#: its completions counted and printed only when `--ops` names it
INFLIGHT_ALWAYS = ("rpc",)
#: operations only an NFS server's requests have (nfsdtop, nfs-exporter --nfsd: no --ops):
#: each NFSv4 operation inside a COMPOUND, timed between the kernel's per-operation tracepoints
SERVER_OPS: Dict[str, str] = {"v4op": "V"}
#: every operation a spec may have: the tools' and the server's
SPEC_OPS: Dict[str, str] = {**OPS, **SERVER_OPS}


def parse_ops(text: Optional[str], option: str = "--ops") -> List[str]:
    """`read,W,all` (names, letters, or `all`) -> op names in OPS order; None -> DEFAULT_OPS.

    One vocabulary for every command that takes operations (the tools, propose, compat)."""
    if text is None:
        return list(DEFAULT_OPS)
    letters = {letter: name for name, letter in OPS.items()}
    wanted = set()
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        raise UserError(f"{option} is empty (known: {', '.join(OPS)}, their letters, or all)")
    for item in items:
        if item.lower() == "all":
            wanted.update(OPS)
            continue
        name = letters.get(item.upper(), item.lower()) if len(item) == 1 else item.lower()
        if name not in OPS:
            raise UserError(f"{option}: unknown operation {item!r} "
                            f"(known: {', '.join(f'{n} ({l})' for n, l in OPS.items())}, or all)")
        wanted.add(name)
    return [op for op in OPS if op in wanted]

KINDS = ("tracepoint", "kprobe", "fentry")
#: for each candidate kind, the probe kind at entry and at exit
ATTACH_KINDS: Dict[str, tuple] = {"tracepoint": ("tracepoint", "tracepoint"),
                                  "kprobe": ("kprobe", "kretprobe"),
                                  "fentry": ("fentry", "fexit")}
MATCHES = ("task", "keys")
#: what an argument expression may describe
ARG_ROLES = ("file", "dentry", "inode", "fileid", "dev", "bytes", "offset", "name", "error",
             "client", "export")
#: Argument roles a pointer parameter gives, by the struct it points to ("{}" is the
#: parameter name). One table for `discover propose` (BTF prototypes as text) and the
#: generator (raw BTF), so both read a prototype the same way.
ROLES_BY_POINTEE: Dict[str, Tuple[Tuple[str, str], ...]] = {
    "kiocb": (("file", "{}->ki_filp"), ("offset", "{}->ki_pos")),
    "file": (("file", "{}"),),
    "path": (("dentry", "{}->dentry"),),
    "dentry": (("dentry", "{}"),),
    "inode": (("inode", "{}"),),
    # the NFS server's request (nfsd): who sent it, and the export a file handle resolved to
    "svc_rqst": (("client", "{}->rq_addr"), ("name", "{}->rq_procinfo->pc_name")),
    "svc_fh": (("export", "{}->fh_export"),),
}


def add_pointer_roles(roles: Dict[str, str], param: str, struct_name: str) -> None:
    """Record the roles a `struct <struct_name> *` parameter gives; the first parameter wins."""
    for role, expr in ROLES_BY_POINTEE.get(struct_name, ()):
        roles.setdefault(role, expr.format(param))


CANDIDATE_KEYS = {"kind", "match", "keys", "module", "window", "stability", "coverage",
                  "traceability", "evidence", "reasons", "attach"}
ATTACH_KEYS = {"entry", "exit", "entry_kind", "exit_kind", "module", "optional", "args"}
#: top-level keys and the shape of the optional ones (docs/probe-spec.md)
TOP_KEYS: Dict[str, Any] = {"schema": str, "version": int, "filesystem": str, "title": str, "fstypes": [str],
                            "kernel": str, "modules": [str], "generated_by": str, "callgraphs": [str],
                            "ops": dict}
OP_KEYS = {"letter", "candidates", "context"}
#: candidate keys that are free text for the reviewer
CANDIDATE_TEXT_KEYS = ("module", "window", "stability", "coverage", "traceability", "evidence")


def spec_title(spec: Dict[str, Any]) -> str:
    """How the tools name the filesystem in their banners (`NFS`, `XFS`, `ext4`: its usual spelling)."""
    return str(spec.get("title") or spec["filesystem"])


def serves_fstype(spec: Dict[str, Any], fstype: str) -> bool:
    """Whether a mount of this type (/proc/self/mountinfo's fstype) is the spec's filesystem:
    one of `fstypes`, else the filesystem's name, alone or with a version number (nfs4)."""
    if spec.get("fstypes"):
        return fstype in spec["fstypes"]
    return re.fullmatch(re.escape(spec["filesystem"]) + r"\d*", fstype) is not None


def _load_toml_text(text: str, origin: str) -> Dict[str, Any]:
    """Parse TOML with tomllib (3.11+), else tomli or toml (Debian python3-tomli / python3-toml)."""
    try:
        import tomllib as toml_reader  # type: ignore[import-not-found]
    except ImportError:
        try:
            import tomli as toml_reader  # type: ignore[import-not-found,no-redef]
        except ImportError:
            try:
                import toml  # type: ignore[import-untyped]
            except ImportError:
                raise UserError("reading probe specs needs Python 3.11+, python3-tomli or python3-toml "
                                "(Debian 11: apt-get install python3-toml), or a spec as .json") from None
            try:
                return toml.loads(text)
            except Exception as exc:  # toml raises its own TomlDecodeError hierarchy
                raise UserError(f"{origin}: not valid TOML: {str(exc).splitlines()[0]}") from None
    try:
        return toml_reader.loads(text)
    except toml_reader.TOMLDecodeError as exc:
        raise UserError(f"{origin}: not valid TOML: {str(exc).splitlines()[0]}") from None


def load_spec(path: Path, compiled: Optional[Path] = None) -> Dict[str, Any]:
    """Read and validate a probe spec; any problem is one UserError line naming the key.
    `compiled`: compile_spec's JSON of it, taken instead of parsing when it was made from this
    very text (parsing the TOML was 0.1-0.2 s of a tool's start in a TCG guest)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: no such probe spec") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read probe spec: {exc}") from None
    spec = _compiled(compiled, text) if compiled is not None else None
    if spec is None:
        spec = _parse(text, Path(path))
    validate_spec(spec, str(path))
    return spec


def _parse(text: str, path: Path) -> Dict[str, Any]:
    if path.suffix == ".json":  # the same keys as JSON: readable on Python 3.9 without a TOML module
        try:
            return json.loads(text)
        except ValueError as exc:
            raise UserError(f"{path}: not valid JSON: {exc}") from None
    return _load_toml_text(text, str(path))


def compile_spec(path: Path) -> str:
    """The spec at `path` parsed and validated, as JSON with the text it was parsed from
    (load_spec's `compiled`: built with the package, beside the CO-RE objects). Its keys keep
    the file's order: the CO-RE object numbers the spec's points in that order."""
    spec = load_spec(path)
    return json.dumps({"source": Path(path).read_text(encoding="utf-8"), "spec": spec})


def _compiled(compiled: Path, text: str) -> Optional[Dict[str, Any]]:
    """compile_spec's spec from `compiled` if it was made from `text`; None otherwise (no such
    file, another version of the spec, not compile_spec's JSON)."""
    try:
        data = json.loads(compiled.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("source") != text or not isinstance(data.get("spec"), dict):
        return None
    return data["spec"]


def _fail(origin: str, key: str, problem: str) -> UserError:
    return UserError(f"{origin}: {key}: {problem}")


def _no_unknown(origin: str, where: str, table: Dict[str, Any], known: Any) -> None:
    """Reject a key the schema does not have, suggesting the likely intended one (a typo is not ignored).
    discover.schema (and difflib) only for such a key: every tool's start validates its spec."""
    for key in table:
        if key not in known:
            from discover.schema import did_you_mean
            raise _fail(origin, f"{where}{'.' if where else ''}{key}", "unknown key" + did_you_mean(str(key), known))


def _want_type(origin: str, key: str, value: Any, kind: Any) -> None:
    """A top-level value of the expected type (`[str]`: a list of strings)."""
    if isinstance(kind, list):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _fail(origin, key, f"expected a list of strings, got {short(value)}")
    elif not isinstance(value, kind) or isinstance(value, bool):
        raise _fail(origin, key, f"expected {'a string' if kind is str else kind.__name__}, got {short(value)}")


def _want_str(origin: str, key: str, value: Any, allowed: Sequence[str] = ()) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(origin, key, f"expected a non-empty string, got {short(value)}")
    if allowed and value not in allowed:
        raise _fail(origin, key, f"{short(value)} is not one of {', '.join(allowed)}")
    return value


def validate_spec(spec: Any, origin: str) -> None:
    """Check every key the generator relies on; raise UserError naming the first bad key."""
    if not isinstance(spec, dict) or spec.get("schema") != SCHEMA:
        raise UserError(f"{origin}: not a probe spec (no schema = \"{SCHEMA}\")")
    _no_unknown(origin, "", spec, TOP_KEYS)
    version = spec.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise _fail(origin, "version", f"expected a positive integer, got {short(version)}")
    if version > VERSION:
        raise _fail(origin, "version", f"{version} is newer than this probekit reads ({VERSION})")
    _want_str(origin, "filesystem", spec.get("filesystem"))
    for key, kind in TOP_KEYS.items():
        if key in spec:
            _want_type(origin, key, spec[key], kind)
    ops = spec.get("ops")
    if not isinstance(ops, dict) or not ops:
        raise _fail(origin, "ops", "expected at least one [ops.NAME] table")
    for op_name, op in ops.items():
        where = f"ops.{op_name}"
        if op_name not in SPEC_OPS:
            from discover.schema import did_you_mean
            raise _fail(origin, where, "unknown operation" + did_you_mean(str(op_name), SPEC_OPS))
        if not isinstance(op, dict):
            raise _fail(origin, where, "expected a table")
        _no_unknown(origin, where, op, OP_KEYS)
        letter = op.get("letter")
        if letter != SPEC_OPS[op_name]:
            raise _fail(origin, f"{where}.letter", f"expected {SPEC_OPS[op_name]!r}, got {letter!r}")
        candidates = op.get("candidates")
        if not isinstance(candidates, list) or not candidates:
            raise _fail(origin, f"{where}.candidates", "expected a non-empty list of candidates")
        for i, cand in enumerate(candidates):
            _validate_candidate(origin, f"{where}.candidates[{i}]", cand)
        context = op.get("context", [])
        if not isinstance(context, list):
            raise _fail(origin, f"{where}.context", "expected a list of candidates")
        for i, cand in enumerate(context):
            _validate_candidate(origin, f"{where}.context[{i}]", cand)


def _validate_candidate(origin: str, where: str, cand: Any) -> None:
    if not isinstance(cand, dict):
        raise _fail(origin, where, "expected a table")
    _no_unknown(origin, where, cand, CANDIDATE_KEYS)
    kind = _want_str(origin, f"{where}.kind", cand.get("kind"), KINDS)
    match = _want_str(origin, f"{where}.match", cand.get("match"), MATCHES)
    keys = cand.get("keys", [])
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise _fail(origin, f"{where}.keys", "expected a list of field names")
    if match == "keys" and not keys:
        raise _fail(origin, f"{where}.keys", "match = \"keys\" needs the fields that pair start and end")
    for key in CANDIDATE_TEXT_KEYS:
        if not isinstance(cand.get(key, ""), str):
            raise _fail(origin, f"{where}.{key}", f"expected a string, got {short(cand[key])}")
    reasons = cand.get("reasons", [])
    if not isinstance(reasons, list) or not all(isinstance(r, str) for r in reasons):
        raise _fail(origin, f"{where}.reasons", "expected a list of strings")
    attach = cand.get("attach")
    if not isinstance(attach, list) or not attach:
        raise _fail(origin, f"{where}.attach", "expected a non-empty list of attach points")
    entry_kind, exit_kind = ATTACH_KINDS[kind]
    for j, point in enumerate(attach):
        at = f"{where}.attach[{j}]"
        if not isinstance(point, dict):
            raise _fail(origin, at, "expected a table")
        _no_unknown(origin, at, point, ATTACH_KEYS)
        _want_str(origin, f"{at}.entry", point.get("entry"))
        _want_str(origin, f"{at}.exit", point.get("exit"))
        _want_str(origin, f"{at}.entry_kind", point.get("entry_kind"), (entry_kind,))
        _want_str(origin, f"{at}.exit_kind", point.get("exit_kind"), (exit_kind,))
        if kind == "tracepoint":
            for end in ("entry", "exit"):
                if ":" not in point[end]:
                    raise _fail(origin, f"{at}.{end}", "a tracepoint is spelled SYSTEM:EVENT")
        if not isinstance(point.get("module", ""), str):
            raise _fail(origin, f"{at}.module", f"expected a string, got {short(point['module'])}")
        if not isinstance(point.get("optional", False), bool):
            raise _fail(origin, f"{at}.optional", "expected true or false")
        args = point.get("args", {})
        if not isinstance(args, dict):
            raise _fail(origin, f"{at}.args", "expected a table of role = expression")
        for role, expr in args.items():
            if role not in ARG_ROLES:
                raise _fail(origin, f"{at}.args.{role}", f"unknown role (known: {', '.join(ARG_ROLES)})")
            _want_str(origin, f"{at}.args.{role}", expr)


# writing -------------------------------------------------------------------------------
def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        if all(isinstance(v, str) for v in value) and sum(len(v) for v in value) > 60:
            return "[\n" + "".join(f"  {_value(v)},\n" for v in value) + "]"
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to a probe spec")


def dumps_spec(spec: Dict[str, Any]) -> str:
    """The spec as TOML, in a fixed key order so diffs between kernels stay readable."""
    validate_spec(spec, "<generated spec>")
    lines: List[str] = ["# probekit probe spec: ordered fallback attach points per operation.",
                        "# Schema: docs/probe-spec.md. Written by `discover propose`; edit with care.", ""]
    for key, value in spec.items():
        if key != "ops":
            lines.append(f"{key} = {_value(value)}")
    for op_name, op in spec["ops"].items():
        lines += ["", f"[ops.{op_name}]"]
        lines += [f"{k} = {_value(v)}" for k, v in op.items() if k not in ("candidates", "context")]
        for table in ("candidates", "context"):
            for cand in op.get(table, []):
                lines += ["", f"[[ops.{op_name}.{table}]]"]
                lines += [f"{k} = {_value(v)}" for k, v in cand.items() if k != "attach"]
                for point in cand["attach"]:
                    lines += [f"[[ops.{op_name}.{table}.attach]]"]
                    lines += [f"{k} = {_value(v)}" for k, v in point.items() if k != "args"]
                    if point.get("args"):
                        lines += [f"[ops.{op_name}.{table}.attach.args]"]
                        lines += [f"{k} = {_value(v)}" for k, v in point["args"].items()]
    return "\n".join(lines) + "\n"

"""Per-kernel compatibility of a probe spec: does each attach point exist, and mean the same?

Why: a probe written and tested on one kernel silently breaks on another when a function
is renamed (nfs_readpage -> nfs_read_folio), inlined, split into compiler copies, moved
to a module, or changes its first parameter. This module answers, for every attach point
of a spec and every kernel profile (live, saved JSON, Debian package), what the runtime
would find there, and which candidate each operation would fall back to.

The pick is the generated tool's own code run on the profile: probes.select.select (the
first candidate whose non-optional attach points are traceable functions or listed events)
and probes.model.points_of (fentry candidates are attached as kprobe/kretprobe pairs).
What BTF the kernel lacks then only costs detail (file names, offsets), said as such.
"""
from __future__ import annotations

import html
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Set, Tuple

from discover.errors import UserError
from discover.profile import KernelProfile, clone_base

if TYPE_CHECKING:
    from probes.kernelpkg import Lookup

#: cell statuses, most to least usable; `usable` ones let a candidate be picked
OK, CHANGED, DUPLICATE, MODULE_NOT_LOADED = "ok", "changed", "duplicate", "module-not-loaded"
COPIES, NOTRACE, BLACKLISTED, INLINED, ABSENT, NO_BTF, UNKNOWN = (
    "copies-only", "not-traceable", "blacklisted", "possibly-inlined", "absent", "no-btf", "unknown")
USABLE = (OK, CHANGED, DUPLICATE)
NO_BTF_NOTE = "no BTF prototype here: argument types unchecked"
NO_FIELDS_NOTE = "record fields unknown here (no BTF for this module)"
#: short cell words for the table and markdown output
SHORT = {OK: "ok", CHANGED: "CHANGED", DUPLICATE: "dup", MODULE_NOT_LOADED: "not loaded",
         COPIES: "copies only", NOTRACE: "notrace", BLACKLISTED: "blacklisted",
         INLINED: "absent (inlined?)", ABSENT: "absent", NO_BTF: "no BTF", UNKNOWN: "unknown"}


class Kernel(NamedTuple):
    """A profile plus how the user named it on the command line."""

    label: str
    profile: KernelProfile

    @property
    def from_package(self) -> bool:
        return (self.profile.data.get("source") or {}).get("how") == "package"


class AttachPoint(NamedTuple):
    name: str  # function or SYSTEM:EVENT
    kind: str  # "function" | "tracepoint"
    module: Optional[str]  # as the spec says
    args: Dict[str, str]  # role -> expression the spec reads from this point
    exit_args: Dict[str, str]  # role -> exit.FIELD expressions (tracepoints, read at the exit event)


def load_lab_results(path: Path) -> Dict[str, Any]:
    """A lab results file (`labs test --lab-results`: kernel release -> operation -> run), its
    shape checked; every problem is one line naming the file."""
    from discover.schema import LAB_RESULTS, validate
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise UserError(f"--lab-results {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise UserError(f"{path}: not lab results JSON ({str(exc).splitlines()[0][:80]})") from None
    validate(data, LAB_RESULTS, str(path), "lab results")
    return data


# --------------------------------------------------------------------------- spec walking

def op_candidates(op: Dict[str, Any]) -> List[Dict[str, Any]]:
    """An operation's candidates, then its context candidates: every attach point it has."""
    return list(op["candidates"]) + list(op.get("context", []))


def spec_attach_points(spec: Dict[str, Any]) -> List[AttachPoint]:
    """Every distinct attach point of a spec, in spec order."""
    seen: Dict[str, AttachPoint] = {}
    for op in spec["ops"].values():
        for cand in op_candidates(op):
            kind = "tracepoint" if cand["kind"] == "tracepoint" else "function"
            for point in cand["attach"]:
                args = point.get("args", {})
                for end in ("entry", "exit"):
                    name = point[end]
                    if name in seen:
                        continue
                    if end == "entry":
                        mine = {r: e for r, e in args.items() if not e.startswith("exit.") and e != "retval"}
                        exit_args: Dict[str, str] = {}
                    else:
                        mine = {}
                        exit_args = {r: e[5:] for r, e in args.items() if e.startswith("exit.")}
                    seen[name] = AttachPoint(name, kind, point.get("module"), mine, exit_args)
    return list(seen.values())


def spec_functions(spec: Dict[str, Any]) -> Set[str]:
    """Function names a report needs prototypes of (kprobe/fentry attach points)."""
    return {p.name for p in spec_attach_points(spec) if p.kind == "function"}


# --------------------------------------------------------------------------- one cell

def _event(profile: KernelProfile, name: str) -> Tuple[Optional[str], Optional[Dict[str, Any]]]:
    """(system found, event record); packages cannot name vmlinux systems, so match by event."""
    system, _, event = name.partition(":")
    found = profile.event(system, event)
    if found is not None:
        return system, found
    for other, events in profile.events.items():
        if other.startswith("?") and event in events:
            return other, events[event]
    return None, None


def _field_names(record: Dict[str, Any]) -> Optional[List[str]]:
    fields = record.get("fields")
    if fields is None:
        return None
    names = []
    for f in fields:
        if f.get("common"):
            continue
        name = f["name"]
        names.append(name[len("__data_loc_"):] if name.startswith("__data_loc_") else name)
    return names


def _param_types(func: Dict[str, Any]) -> List[str]:
    return [t for _n, t in func.get("params") or []]


def _describe_signature_change(ref: Dict[str, Any], cur: Dict[str, Any]) -> Optional[str]:
    notes = []
    if ref.get("return") != cur.get("return"):
        notes.append(f"returns {cur.get('return')} (was {ref.get('return')})")
    rp, cp = ref.get("params") or [], cur.get("params") or []
    for i in range(max(len(rp), len(cp))):
        r = rp[i] if i < len(rp) else None
        c = cp[i] if i < len(cp) else None
        if r is None:
            notes.append(f"new param {i + 1} {c[1]} {c[0]}")
        elif c is None:
            notes.append(f"param {i + 1} {r[1]} {r[0]} removed")
        elif r[1] != c[1]:
            notes.append(f"param {i + 1} {r[1]} -> {c[1]} {c[0]}")
    return "; ".join(notes) or None


def _args_broken(point: AttachPoint, func: Optional[Dict[str, Any]], fields: Optional[List[str]],
                 exit_fields: Optional[List[str]]) -> List[str]:
    """Argument expressions of the spec that name something this kernel does not have."""
    broken = []
    if point.kind == "function" and func is not None:
        params = {n for n, _t in func.get("params") or []}
        for role, expr in point.args.items():
            first = re.split(r"->|\.|\[", expr, 1)[0].strip()
            if first and first not in params:
                broken.append(f"args.{role} = {expr!r}: no parameter {first!r}")
    if point.kind == "tracepoint":
        for role, expr in point.args.items():
            if fields is not None and expr not in fields:
                broken.append(f"args.{role} = {expr!r}: no field {expr!r}")
        for role, expr in point.exit_args.items():
            if exit_fields is not None and expr not in exit_fields:
                broken.append(f"args.{role} = exit.{expr}: no field {expr!r}")
    return broken


class Cell(NamedTuple):
    status: str
    module: Optional[str]
    notes: List[str]
    prototype: Optional[str]

    def as_dict(self) -> Dict[str, Any]:
        return {"status": self.status, "module": self.module, "notes": self.notes, "prototype": self.prototype}


def filter_entries(profile: KernelProfile, names: Set[str]) -> Dict[str, List[Optional[str]]]:
    """name -> module of each available_filter_functions line with that name (duplicates kept)."""
    out: Dict[str, List[Optional[str]]] = {}
    for name, module in profile.data.get("filter_functions") or []:
        if name in names:
            out.setdefault(name, []).append(module)
    return out


def _unloaded_module(kernel: Kernel, point: Optional[AttachPoint]) -> Optional[str]:
    """On a live kernel, the spec's module for this point when it is not loaded (so it cannot be seen)."""
    if point is None or not point.module or point.module == "vmlinux" or kernel.from_package:
        return None
    if (kernel.profile.data.get("source") or {}).get("how") != "live" or kernel.profile.data.get("modules") is None:
        return None
    missing = [m for m in point.module.split(",") if not kernel.profile.module_loaded(m.strip())]
    return missing[0] if missing else None


def function_cell(kernel: Kernel, name: str, reference: Optional[Kernel], seen_elsewhere: bool,
                  point: Optional[AttachPoint] = None,
                  entries: Optional[List[Optional[str]]] = None) -> Cell:
    prof = kernel.profile
    notes: List[str] = []
    func = prof.btf_function(name)
    proto = func.get("prototype") if func else None
    if entries is None:
        entries = filter_entries(prof, {name}).get(name, [])
    if not entries and prof.data.get("filter_functions") is None:
        why = prof.unavailable("filter_functions") or "no function list in this profile"
        return Cell(UNKNOWN, func.get("module") if func else None, [f"cannot tell: {why}"], proto)
    unloaded = _unloaded_module(kernel, point) if not entries else None
    if unloaded:
        return Cell(MODULE_NOT_LOADED, unloaded, [f"module {unloaded} is not loaded: modprobe {unloaded} "
                                                  "and take the profile again"], proto)
    if not entries:
        clones = prof.clones(name)
        if clones:
            return Cell(COPIES, None, [f"only compiler copies: {', '.join(sorted(clones)[:4])} "
                                       "(a probe on the name fails; the copy may have a different ABI)"], proto)
        sym = prof.symbol_type(name)
        if sym == "notrace" or (func is not None and prof.data.get("filter_functions")):
            why = "in the symbol table but has no ftrace call site (notrace/__init)" if sym == "notrace" \
                else "has a BTF prototype but is not in available_filter_functions"
            return Cell(NOTRACE, func.get("module") if func else None, [why], proto)
        if seen_elsewhere:
            return Cell(INLINED, None, ["not found, possibly inlined, renamed or removed "
                                        "(it exists on another kernel of this report)"], None)
        return Cell(ABSENT, None, ["not found on this kernel"], None)
    modules = sorted({m or "vmlinux" for m in entries})
    module = ",".join(modules)
    status = OK
    if len(entries) > 1:
        status = DUPLICATE
        notes.append(f"{len(entries)} functions share this name ({module}): a kprobe by name hits one of them")
    if module != "vmlinux":
        live = (prof.data.get("source") or {}).get("how") == "live"
        if live and not all(prof.module_loaded(m) for m in modules if m != "vmlinux"):
            return Cell(MODULE_NOT_LOADED, module, [f"lives in module {module}, not loaded: modprobe {modules[0]}"], proto)
        notes.append(f"lives in module {module}" + ("" if live else ": load it before attaching"))
    if prof.has_blacklist and prof.blacklisted(name):
        return Cell(BLACKLISTED, module, ["in the kprobe blacklist"], proto)
    if reference is not None and reference is not kernel and func is not None:
        ref_func = reference.profile.btf_function(name)
        if ref_func is not None:
            change = _describe_signature_change(ref_func, func)
            if change:
                status = CHANGED
                notes.append(f"signature changed vs {reference.label}: {change}")
    if func is None:
        notes.append(NO_BTF_NOTE)
    elif point is not None:
        broken = _args_broken(point, func, None, None)
        if broken:
            status = CHANGED
            notes += broken
    return Cell(status, module, notes, proto)


def tracepoint_cell(kernel: Kernel, name: str, reference: Optional[Kernel], seen_elsewhere: bool,
                    point: Optional[AttachPoint] = None, exit_name: Optional[str] = None) -> Cell:
    prof = kernel.profile
    system, record = _event(prof, name)
    if record is None and prof.data.get("events") is None:
        why = prof.unavailable("events") or "no event list in this profile"
        return Cell(UNKNOWN, None, [f"cannot tell: {why}"], None)
    unloaded = _unloaded_module(kernel, point) if record is None else None
    if unloaded:
        return Cell(MODULE_NOT_LOADED, unloaded, [f"module {unloaded} is not loaded: its events are not listed"], None)
    if record is None:
        if seen_elsewhere:
            return Cell(ABSENT, None, ["event not defined on this kernel (it exists on another kernel of this report)"], None)
        return Cell(ABSENT, None, ["event not defined on this kernel"], None)
    notes = []
    module = record.get("module")
    if system and system.startswith("?"):
        notes.append("system name not recorded in the package (stripped vmlinux): matched by event name")
    if module:
        notes.append(f"defined in module {module}")
    status = OK
    fields = _field_names(record)
    if reference is not None and reference is not kernel:
        _s, ref_record = _event(reference.profile, name)
        if ref_record is not None:
            ref_fields = _field_names(ref_record)
            if fields is not None and ref_fields is not None and fields != ref_fields:
                added = [f for f in fields if f not in ref_fields]
                removed = [f for f in ref_fields if f not in fields]
                if added or removed:
                    status = CHANGED
                    notes.append(f"fields changed vs {reference.label}: "
                                 + ", ".join([f"+{f}" for f in added] + [f"-{f}" for f in removed]))
            if record.get("proto") and ref_record.get("proto") and record["proto"] != ref_record["proto"]:
                status = CHANGED
                notes.append(f"TP_PROTO changed vs {reference.label}: {record['proto']} (was {ref_record['proto']})")
    if fields is None:
        notes.append(NO_FIELDS_NOTE)
    if point is not None:
        broken = _args_broken(point, None, fields, None)
        if broken:
            status = CHANGED
            notes += broken
    return Cell(status, module, notes, record.get("proto"))


def _names_in(kernel: Kernel, point: AttachPoint, module: Optional[str]) -> Set[str]:
    """Functions of `module` (None = vmlinux), or events of the point's system, on a kernel."""
    prof = kernel.profile
    if point.kind == "function":
        return {n for n, m in prof.data.get("filter_functions") or [] if m == module and clone_base(n) == n}
    system, _, event = point.name.partition(":")
    _s, record = _event(prof, point.name)
    names: Set[str] = set(prof.events.get(system, {}))
    return {f"{system}:{n}" for n in names}


def rename_hint(point: AttachPoint, here: Kernel, there: Kernel) -> Optional[str]:
    """Names only this kernel has that look like the missing one (nfs_readpage -> nfs_read_folio).

    A hint, not a verdict: packages cannot tell a rename from an inlining or a removal.
    """
    import difflib
    if point.kind == "function":
        modules = there.profile.function_modules(point.name) or {None}
        module = sorted(modules, key=lambda m: m or "")[0]
    else:
        module = None
    mine, theirs = _names_in(here, point, module), _names_in(there, point, module)
    new = sorted(mine - theirs)
    close = difflib.get_close_matches(point.name, new, n=3, cutoff=0.6)
    if not close:
        return None
    return f"renamed? names here and not on {there.label}: {', '.join(close)}"


# --------------------------------------------------------------------------- candidates

def kernel_facts(kernel: Kernel, spec: Dict[str, Any]):
    """What the generated tool's runtime check (probes.select) would see on this kernel.

    Tracepoint formats (field names) are passed when the profile knows them, since the
    runtime reads them from tracefs to check a keyed candidate's keys.
    """
    from probes.select import KernelFacts
    prof = kernel.profile
    points = spec_attach_points(spec)
    functions = [p.name for p in points if p.kind == "function" and prof.traceable(p.name)]
    events, formats = [], {}
    for p in points:
        if p.kind != "tracepoint":
            continue
        record = _event(prof, p.name)[1]
        if record is None:
            continue
        events.append(p.name)
        fields = _field_names(record)
        if fields is not None:
            formats[p.name] = set(fields)
    if kernel.from_package:  # nothing is loaded in a package: every shipped module can be
        modules = list((prof.data.get("package") or {}).get("modules") or {})
    else:
        modules = list(prof.modules)
    return KernelFacts(functions, events, modules, prof.release, formats=formats)


#: argument roles a kprobe handler reads through BTF offsets (probes.model.plan_point)
BTF_ROLES = ("file", "dentry", "offset")


def _module_has_btf(kernel: Kernel, module: str) -> Optional[bool]:
    """Whether a module ships/loads BTF on this kernel; None when the profile does not say."""
    data = kernel.profile.data
    if kernel.from_package:
        info = ((data.get("package") or {}).get("modules") or {}).get(module)
        return None if info is None else bool(info["btf"])
    return True if module in ((data.get("btf") or {}).get("modules") or []) else None


def _degraded(kernel: Kernel, point, cells: Dict[str, Cell], layout_modules: Set[str]) -> List[str]:
    """What the generated tool loses at one attach point of the pick on this kernel.

    The runtime builds probes.layout.KernelLayout from /sys/kernel/btf: vmlinux plus the
    modules the chosen points name (`layout_modules`). Without vmlinux BTF there is no
    layout (no file names, no offsets); without the function's prototype in those blobs its
    file/dentry/offset arguments cannot be resolved (nor inferred when the spec names none)
    and are left out of the events.
    """
    if point.kind != "kprobe":
        return []  # tracepoint fields are read by name from the event format: no BTF needed
    roles = [r for r in BTF_ROLES if point.args.get(r) and point.args[r] != "retval"]
    if kernel.profile.data.get("btf") is None:
        why = kernel.profile.unavailable("btf") or kernel.profile.unavailable("vmlinux") or "no vmlinux BTF"
        return [f"no kernel BTF ({why}): no file names or offsets in its events"]
    cell = cells[point.entry]
    if cell.prototype is not None or not (roles or not point.args):
        return []
    lost = ", ".join(roles) if roles else "the arguments it would infer from BTF"
    module = cell.module
    if module and module != "vmlinux":
        if module not in layout_modules:
            why = f"lives in {module}, whose BTF the tool does not load (the spec does not name it)"
        elif _module_has_btf(kernel, module) is False:
            why = f"module {module} has no BTF here"
        else:
            return []  # the profile did not record this module's prototypes: cannot tell
    else:
        why = "no BTF prototype in vmlinux"
    return [f"{point.entry}: {why}, so {lost} not read (no file name/offset in its events)"]


def runtime_picks(spec: Dict[str, Any], kernel: Kernel, cells: Dict[str, Cell]) -> Dict[str, Dict[str, Any]]:
    """Per op: the candidate probes.select picks and how probes.model attaches it there.

    `attached_as`: the generator's point kinds (fentry candidates become kprobe/kretprobe
    pairs); `warnings`: the pick will misbehave (a point not usable, or an `args`
    expression naming a parameter/field this kernel lacks; other signature or field
    changes are shown in the cells: the code reads parameters and fields by name);
    `degraded`: it works but loses detail (no BTF for names/offsets).
    """
    from probes.model import points_of
    from probes.select import select
    facts = kernel_facts(kernel, spec)
    selection = select(spec, facts, list(spec["ops"]))
    layout_modules = set(selection.btf_modules())  # what probes.runtime.Session loads BTF of
    out: Dict[str, Dict[str, Any]] = {}
    for chosen in selection.chosen:
        warnings: List[str] = []
        degraded: List[str] = []
        context = spec["ops"][chosen.op].get("context")
        if context:  # picked the same way: the first context candidate whose points are there
            picked = select({"ops": {chosen.op: {"letter": chosen.letter, "candidates": context}}},
                            facts, [chosen.op])
            warnings += [f"context: {why}" for why in picked.uncovered.values()]
            chosen_points = points_of([chosen] + picked.chosen, None)
        else:
            chosen_points = points_of([chosen], None)
        points = chosen_points
        for point in points:
            for end in (point.entry, point.exit):
                cell = cells[end]
                broken = [n for n in cell.notes if n.startswith("args.")]
                if cell.status not in USABLE:
                    warnings.append(f"{end}: {SHORT[cell.status]}")
                elif broken:  # a changed signature or record the code reads by name is no failure
                    warnings.append(f"{end}: " + "; ".join(broken))
            degraded += _degraded(kernel, point, cells, layout_modules)
        out[chosen.op] = {"candidate": chosen.index, "label": candidate_label(chosen.candidate),
                          "attached_as": sorted({p.kind for p in points}),
                          "skipped": chosen.skipped, "covered": True, "warnings": sorted(set(warnings)),
                          "degraded": sorted(set(degraded))}
    for op, why in selection.uncovered.items():
        out[op] = {"candidate": None, "label": None, "attached_as": [], "skipped": [why], "covered": False,
                   "warnings": [], "degraded": []}
    return out


def candidate_label(cand: Dict[str, Any]) -> str:
    points = [p["entry"] if p["entry"] == p["exit"] or cand["kind"] != "tracepoint"
              else f"{p['entry']}..{p['exit'].split(':', 1)[-1]}" for p in cand["attach"]]
    return f"{cand['kind']} {' + '.join(points)}"


# --------------------------------------------------------------------------- the report

def build_report(spec: Dict[str, Any], kernels: Sequence[Kernel], reference: Optional[Kernel],
                 spec_origin: str = "", lab_results: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Everything the renderers print, as plain data (also the JSON output)."""
    points = spec_attach_points(spec)
    ops_of: Dict[str, List[str]] = {}
    for op_name, op in spec["ops"].items():
        for cand in op_candidates(op):
            for point in cand["attach"]:
                for end in (point["entry"], point["exit"]):
                    ops_of.setdefault(end, [])
                    if op_name not in ops_of[end]:
                        ops_of[end].append(op_name)
    exit_of = {}
    for op in spec["ops"].values():
        for cand in op_candidates(op):
            for point in cand["attach"]:
                exit_of.setdefault(point["entry"], point["exit"])

    def exists(kernel: Kernel, point: AttachPoint) -> bool:
        if point.kind == "function":
            prof = kernel.profile
            return prof.traceable(point.name) or bool(prof.clones(point.name))
        return _event(kernel.profile, point.name)[1] is not None

    cells: Dict[str, Dict[str, Cell]] = {k.label: {} for k in kernels}
    names = {p.name for p in points if p.kind == "function"}
    entries = {k.label: filter_entries(k.profile, names) for k in kernels}
    for point in points:
        for kernel in kernels:
            elsewhere = any(exists(other, point) for other in kernels if other is not kernel)
            if point.kind == "function":
                cell = function_cell(kernel, point.name, reference, elsewhere, point,
                                     entries[kernel.label].get(point.name, []))
            else:
                cell = tracepoint_cell(kernel, point.name, reference, elsewhere, point)
            if elsewhere and cell.status in (INLINED, ABSENT):
                other = next(o for o in kernels if o is not kernel and exists(o, point))
                hint = rename_hint(point, kernel, other)
                if hint:
                    cell = Cell(cell.status, cell.module, cell.notes + [hint], cell.prototype)
            cells[kernel.label][point.name] = cell
    # exit.FIELD arguments are checked against the exit event's fields
    for kernel in kernels:
        for point in points:
            if point.kind == "tracepoint" and point.exit_args:
                _s, rec = _event(kernel.profile, point.name)
                fields = _field_names(rec) if rec else None
                cell = cells[kernel.label][point.name]
                broken = _args_broken(point, None, None, fields)
                if broken and cell.status in USABLE:
                    cells[kernel.label][point.name] = Cell(CHANGED, cell.module, cell.notes + broken, cell.prototype)

    picks = {kernel.label: runtime_picks(spec, kernel, cells[kernel.label]) for kernel in kernels}
    ops: Dict[str, Dict[str, Any]] = {}
    for op_name, op in spec["ops"].items():
        per_kernel = {kernel.label: picks[kernel.label][op_name] for kernel in kernels}
        ops[op_name] = {"letter": op.get("letter"), "candidates": [candidate_label(c) for c in op["candidates"]],
                        "kernels": per_kernel}

    lab = lab_verdicts(lab_results or {}, ops)
    return {
        "spec": spec_origin, "filesystem": spec.get("filesystem"), "spec_kernel": spec.get("kernel"),
        "reference": reference.label if reference else None,
        "kernels": [{"label": k.label, "release": k.profile.release,
                     "source": (k.profile.data.get("source") or {}).get("how"),
                     "origin": k.profile.origin,
                     "notes": list((k.profile.data.get("package") or {}).get("notes") or [])
                     + [f"{s}: {why}" for s, why in sorted((k.profile.data.get("unavailable") or {}).items())
                        if k.from_package is False]}
                    for k in kernels],
        "attach_points": [{"name": p.name, "kind": p.kind, "ops": ops_of.get(p.name, []),
                           "cells": {k.label: cells[k.label][p.name].as_dict() for k in kernels}}
                          for p in points],
        "ops": ops,
        "lab": lab,
    }


def lab_verdicts(results: Dict[str, Any], ops: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """Hook for the empirical column: compare lab runs with the static verdicts.

    `results` (from `labs test --kernel K`, see docs/compat.md): {kernel label:
    {op: {"candidate": index (0-based) or null, "ok": bool}}}. Returns per kernel and op
    "verified" when the lab ran the candidate the report predicts and it worked,
    otherwise "disagrees: ..." (a test fails on those).
    """
    out: Dict[str, Dict[str, str]] = {}
    # a lab names its kernel by `uname -r` (5.10.0-32-amd64), a package report by its ABI (5.10.0-32)
    report_labels = {short_label(lab): lab for op in ops.values() for lab in op.get("kernels", {})}
    for given, per_op in results.items():
        label = report_labels.get(short_label(given), given)
        for op_name, run in per_op.items():
            predicted = ops.get(op_name, {}).get("kernels", {}).get(label)
            if predicted is None:
                continue
            if run.get("candidate") == predicted["candidate"] and run.get("ok"):
                verdict = "verified"
            else:
                verdict = (f"disagrees: report picks {predicted['candidate']}, lab ran "
                           f"{run.get('candidate')} ({'ok' if run.get('ok') else 'failed'})")
            out.setdefault(label, {})[op_name] = verdict
    return out


def disagreements(report: Dict[str, Any]) -> List[str]:
    """`kernel op: why` for every lab run that contradicts the static report."""
    return [f"{label} {op}: {verdict}" for label, per_op in report["lab"].items()
            for op, verdict in per_op.items() if verdict != "verified"]


# --------------------------------------------------------------------------- rendering

def _cell_text(cell: Dict[str, Any]) -> str:
    word = SHORT[cell["status"]]
    if cell["status"] in USABLE and cell.get("module") and cell["module"] != "vmlinux":
        word += f" [{cell['module']}]"
    return word


def _op_text(report: Dict[str, Any], op_name: str, label: str) -> str:
    pick = report["ops"][op_name]["kernels"][label]
    text = f"#{pick['candidate'] + 1}" if pick["covered"] else "UNCOVERED"
    if pick["warnings"]:
        text += " (!)"
    elif pick["degraded"]:
        text += " (~)"
    lab = report["lab"].get(label, {}).get(op_name)
    if lab:
        text += " lab-verified" if lab == "verified" else " LAB DISAGREES"
    return text


#: cell notes that repeat for every attach point of a kernel: summarised once per kernel
_ROUTINE = ("lives in module", "defined in module", "system name not", NO_BTF_NOTE, NO_FIELDS_NOTE)


def _details(report: Dict[str, Any]) -> List[Tuple[str, str, str]]:
    """(attach point, kernel, note) for every cell that is not plainly ok, then per-kernel summaries."""
    rows = []
    unknown: Dict[str, int] = {}
    for point in report["attach_points"]:
        for label, cell in point["cells"].items():
            interesting = [n for n in cell["notes"] if not n.startswith(_ROUTINE)]
            if any(n.startswith((NO_BTF_NOTE, NO_FIELDS_NOTE)) for n in cell["notes"]):
                unknown[label] = unknown.get(label, 0) + 1
            if interesting or cell["status"] not in (OK,):
                rows.append((point["name"], label, "; ".join(interesting or cell["notes"])))
    for label, count in unknown.items():
        rows.append(("(all)", label, f"{count} attach points without BTF prototype or tracepoint fields: "
                                     "argument types and fields unchecked (what the tool loses: the (~) picks)"))
    return rows


def render_text(report: Dict[str, Any], markdown: bool = False) -> str:
    labels = [k["label"] for k in report["kernels"]]
    head = ["attach point", "ops"] + labels
    rows = [[p["name"], ",".join(p["ops"])] + [_cell_text(p["cells"][lab]) for lab in labels]
            for p in report["attach_points"]]
    op_rows = [[f"{op} ({info['letter']})", ""] + [_op_text(report, op, lab) for lab in labels]
               for op, info in report["ops"].items()]
    out: List[str] = []
    title = f"Compatibility of {report['spec'] or 'spec'} ({report['filesystem']})"
    ref = f"reference kernel: {report['reference']}" if report["reference"] else "no reference kernel"
    if markdown:
        out += [f"# {title}", "", ref, "", "## Attach points", ""]
        out += _md_table(head, rows)
        out += ["", "## Candidate picked per operation", ""]
        out += _md_table(["operation", ""] + labels, op_rows)
    else:
        out += [title, ref, ""]
        out += _text_table(head, rows)
        out += ["", "Candidate picked per operation (probes.select + probes.model, the generated tool's code; "
                "(!) = will misbehave, (~) = works with less detail, see Details):"]
        out += _text_table(["operation", ""] + labels, op_rows)
    out += ["", "## Candidates" if markdown else "Candidates:"]
    for op, info in report["ops"].items():
        for i, lab in enumerate(info["candidates"]):
            out.append(f"{'- ' if markdown else '  '}{op} #{i + 1}: {lab}")
    out += ["", "## Details" if markdown else "Details:"]
    for name, label, note in _details(report):
        out.append(f"{'- ' if markdown else '  '}{name} @ {label}: {note}")
    for op, info in report["ops"].items():
        for label, pick in info["kernels"].items():
            if pick["skipped"]:
                out.append(f"{'- ' if markdown else '  '}{op} @ {label}: skipped " + "; ".join(pick["skipped"]))
            if pick["warnings"]:
                out.append(f"{'- ' if markdown else '  '}{op} @ {label}: (!) picked #{pick['candidate'] + 1} but "
                           + "; ".join(pick["warnings"]))
            if pick["degraded"]:
                out.append(f"{'- ' if markdown else '  '}{op} @ {label}: (~) #{pick['candidate'] + 1} attaches "
                           f"({'/'.join(pick['attached_as'])}) but " + "; ".join(pick["degraded"]))
    out += ["", "## Kernels" if markdown else "Kernels:"]
    for k in report["kernels"]:
        out.append(f"{'- ' if markdown else '  '}{k['label']}: {k['release']} ({k['source']}, {k['origin']})")
        for note in k["notes"]:
            out.append(f"{'  - ' if markdown else '      '}{note}")
    if not report["lab"]:
        out += ["", "Lab column: no lab results given (--lab-results FILE from `labs test`)."]
    return "\n".join(out) + "\n"


def _text_table(head: List[str], rows: List[List[str]]) -> List[str]:
    widths = [max(len(str(r[i])) for r in [head] + rows) for i in range(len(head))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*head).rstrip(), fmt.format(*["-" * w for w in widths])] + \
        [fmt.format(*r).rstrip() for r in rows]


def _md_table(head: List[str], rows: List[List[str]]) -> List[str]:
    esc = [[str(c).replace("|", "\\|") for c in r] for r in [head] + rows]
    return ["| " + " | ".join(esc[0]) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in esc[1:]]


_CSS = """body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.25em .5em;font-size:90%}
th{background:#f3f3f3}td.ok{background:#e6f4e6}td.dup{background:#fff6d6}td.CHANGED{background:#ffe7c2}
td.bad{background:#f9d6d6}td.mod{background:#e6eefb}code{font-size:95%}.lab{font-weight:bold;color:#06c}
details{margin:.3em 0}"""


def render_html(report: Dict[str, Any]) -> str:
    """One self-contained page: inline CSS, no scripts, no external links."""
    e = html.escape
    labels = [k["label"] for k in report["kernels"]]
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'>",
             f"<title>{e(report['filesystem'] or '')} probe compatibility</title><style>{_CSS}</style></head><body>",
             f"<h1>Compatibility of <code>{e(report['spec'])}</code></h1>",
             f"<p>Reference kernel: <b>{e(report['reference'] or 'none')}</b>. Hover a cell for details.</p>",
             "<h2>Attach points</h2><table><tr><th>attach point</th><th>ops</th>"
             + "".join(f"<th>{e(lab)}</th>" for lab in labels) + "</tr>"]
    for p in report["attach_points"]:
        parts.append(f"<tr><td><code>{e(p['name'])}</code></td><td>{e(','.join(p['ops']))}</td>")
        for lab in labels:
            cell = p["cells"][lab]
            cls = {OK: "ok", DUPLICATE: "dup", CHANGED: "CHANGED"}.get(cell["status"], "bad")
            tip = "\n".join(([cell["prototype"]] if cell["prototype"] else []) + cell["notes"])
            parts.append(f"<td class='{cls}' title='{e(tip)}'>{e(_cell_text(cell))}</td>")
        parts.append("</tr>")
    parts.append("</table><h2>Candidate picked per operation</h2><table><tr><th>operation</th>"
                 + "".join(f"<th>{e(lab)}</th>" for lab in labels) + "</tr>")
    for op, info in report["ops"].items():
        parts.append(f"<tr><td>{e(op)}</td>")
        for lab in labels:
            pick = info["kernels"][lab]
            cls = "ok" if pick["covered"] else "bad"
            parts.append(f"<td class='{cls}' title='{e(pick['label'] or 'no usable candidate')}'>"
                         f"{e(_op_text(report, op, lab))}</td>")
        parts.append("</tr>")
    parts.append("</table><h2>Candidates</h2><ul>")
    for op, info in report["ops"].items():
        for i, lab in enumerate(info["candidates"]):
            parts.append(f"<li>{e(op)} #{i + 1}: <code>{e(lab)}</code></li>")
    parts.append("</ul><h2>Details</h2><ul>")
    for name, label, note in _details(report):
        parts.append(f"<li><code>{e(name)}</code> @ {e(label)}: {e(note)}</li>")
    parts.append("</ul><h2>Kernels</h2><ul>")
    for k in report["kernels"]:
        notes = "".join(f"<li>{e(n)}</li>" for n in k["notes"])
        parts.append(f"<li>{e(k['label'])}: {e(k['release'])} ({e(k['source'] or '?')})<ul>{notes}</ul></li>")
    parts.append("</ul></body></html>\n")
    return "".join(parts)


def render(report: Dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(report, indent=1) + "\n"
    if fmt == "html":
        return render_html(report)
    if fmt == "md":
        return render_text(report, markdown=True)
    if fmt == "table":
        return render_text(report)
    raise UserError(f"unknown format {fmt!r} (table, md, html, json)")


# --------------------------------------------------------------------------- kernels

def short_label(release: str) -> str:
    """6.12.117+deb13-amd64 -> 6.12.117+deb13: the flavour is the same for all Debian amd64 kernels."""
    return release[:-len("-amd64")] if release.endswith("-amd64") else release


def _analyse(task: Tuple[Path, Lookup]) -> None:
    """A child's work: fill the profile cache for one kernel's packages."""
    from probes.kernelpkg import cached_profile_from_package
    path, lookup = task
    cached_profile_from_package([path], lookup, workers=1)  # the kernels are the parallel unit


def analyse_packages(packages: Sequence[Path], lookup: Lookup, workers: int) -> None:
    """Fill the profile cache for several kernels' packages, `workers` forked children at a
    time, one per kernel, in the order given (probes.forked says why not a Pool). The first
    error, Ctrl-C or SIGTERM ends them all, none left behind."""
    from probes.forked import Forked
    with Forked(_analyse, workers, lambda task: f"--kernel {task[0]}: the package's analysis") as children:
        for path in packages:
            children.submit((path, lookup))
        for _ in children.answers():
            pass


def spec_events(spec: Dict[str, Any]) -> Set[str]:
    """SYSTEM:EVENT names of a spec's tracepoint attach points."""
    return {p.name for p in spec_attach_points(spec) if p.kind == "tracepoint"}


def spec_modules(spec: Dict[str, Any]) -> List[str]:
    """Modules the spec's attach points name (vmlinux excluded)."""
    return sorted({m.strip() for p in spec_attach_points(spec) if p.module
                   for m in p.module.split(",") if m.strip() and m.strip() != "vmlinux"})


def load_kernels(args: Sequence[str], functions: Set[str], modules: Sequence[str], log=None,
                 events: Iterable[str] = ()) -> List[Tuple[str, Kernel]]:
    """load_kernel for each --kernel value; packages not yet profiled are analysed in parallel.

    Analysing one package is CPU-bound (decompressing ~100-400 MB of modules), so several
    kernels go to forked workers, one per core (analyse_packages), before being loaded in order.
    """
    from probes.fetch import fetch_kernel
    from probes.kernelpkg import Lookup, profile_cache_dir, profile_is_cached
    if any(arg != "live" and not (Path(arg).is_file() and not _is_deb(Path(arg))) for arg in args):
        profile_cache_dir()  # a bad PROBEKIT_PROFILE_CACHE is said before any download or analysis
    lookup = Lookup.of(functions, events, modules)
    resolved = []
    for arg in args:
        if arg != "live" and not Path(arg).exists() and re.match(r"^\d+\.\d+", arg):
            resolved.append(str(fetch_kernel(arg, log=log)))
        else:
            resolved.append(arg)
    packages = [r for r in resolved if r != "live" and (Path(r).is_dir() or (Path(r).is_file() and _is_deb(Path(r))))
                and not profile_is_cached([Path(r)], lookup)]
    if len(packages) > 1:
        workers = min(len(packages), os.cpu_count() or 1)
        # biggest first, so that no large package is left running alone at the end
        packages.sort(key=lambda p: -sum(f.stat().st_size for f in ([Path(p)] if Path(p).is_file()
                                                                    else Path(p).rglob("*")) if f.is_file()))
        analyse_packages([Path(p) for p in packages], lookup, workers)
    out = []
    for arg, res in zip(args, resolved):
        if log and (res == "live" or Path(res).is_dir() or (Path(res).is_file() and _is_deb(Path(res)))):
            log(f"loading kernel {arg}")  # a package takes a while; a profile JSON is read at once
        out.append((arg, load_kernel(res, functions, modules, log=log, events=events)))
    return out


def _is_deb(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(8) == b"!<arch>\n"


def load_kernel(arg: str, functions: Set[str], modules: Sequence[str], log=None,
                events: Iterable[str] = ()) -> Kernel:
    """A Kernel from what --kernel names: live, a profile JSON, a .deb/directory, or a version.

    A package is read for `functions`, `events` (SYSTEM:EVENT) and `modules` only
    (kernelpkg.Lookup): its profile answers for those names, not for others.
    """
    from discover.profile import load_profile
    from probes.fetch import fetch_kernel
    from probes.kernelpkg import Lookup, cached_profile_from_package

    if arg == "live":
        from discover.snapshot import build_profile, find_live_tracefs
        data = build_profile(find_live_tracefs(), btf_modules=list(modules))
        prof = KernelProfile(data, origin="live")
        return Kernel(prof.release, prof)
    path = Path(arg)
    if path.is_file() and not _is_deb(path):  # a profile JSON (maybe gzipped); else one-line error
        prof = load_profile(path)
        return Kernel(prof.release, prof)
    if path.exists():
        paths = [path]
    elif re.match(r"^\d+\.\d+", arg):
        paths = [fetch_kernel(arg, log=log)]
    else:
        raise UserError(f"--kernel {arg}: no such file, and not a kernel version (e.g. 6.12) or `live`")
    data = cached_profile_from_package(paths, Lookup.of(functions, events, modules))
    prof = KernelProfile(data, origin=str(paths[0]))
    return Kernel(short_label(prof.release), prof)

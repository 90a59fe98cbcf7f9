"""The libbpf peer of probes.backend.Backend: loads the spec's prebuilt CO-RE object (no compiler).

Why: bcc compiles at every start, with LLVM in the process (seconds to minutes of start-up,
100-200 MB resident). The object built from the whole spec (probes.generate_core) is opened
from memory, only the programs of the points `select` chose are loaded, and the settings
probes.model decided for them on the running kernel are written into their instructions.
This module decides nothing about the spec: it numbers the chosen points as the object does,
loads and attaches.
"""
from __future__ import annotations

import os
from pathlib import Path

from discover.errors import UserError
from probes.backend import MISSES_MIN_KERNEL, RINGBUF_READ_MS, Attachment, Rejected, major_minor
from probes.generate import tracepoint_program_name
from probes.generate_core import CoreTable, cfg_bytes, core_table, function_program_names, settings_inlined
from probes.layout import KernelLayout
from probes.libbpf import BpfObject, Libbpf, LibbpfError, kernel_btf_fds
from probes.model import (Point, Probe, Tool, check_tool, map_flags, map_sizes, plan_point, points_of,
                          probe_settings, program_ops)
from probes.select import Chosen

TYPE_CHECKING = False  # typing's constant without typing (discover/records.py)
if TYPE_CHECKING:
    from typing import Any, Callable, Collection, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple
    from probes.model import Formats
else:
    from discover.records import NamedTuple

#: the first libbpf that takes a fentry target as MODULE:FUNCTION; an older one finds a module
#: function's BTF by scanning vmlinux's types again for every module BTF before it, per
#: program (a 6.1 guest's nfsslower, 10 such programs: start 26-37 s against 10-11 s on
#: kprobes and 26-29 s on bcc), so fentry/fexit runs on 1.5+ only, kprobes before
MODULE_TARGET_VERSION = (1, 5)


def inline_settings(obj: BpfObject, programs: Sequence[str], cfg: bytes) -> None:
    """The settings of `cfg` (cfg_bytes) written into these programs' instructions before the
    load, where bcc's text has its constants: the verifier then prunes what a setting turns
    off, and no program reads a setting at run time."""
    for name in programs:
        try:
            insns = settings_inlined(obj.program_insns(name), cfg)
        except ValueError as exc:
            raise LibbpfError(0, f"{name}: {exc}") from None
        obj.set_program_insns(name, insns)


class FentryTarget(NamedTuple):
    """A fentry/fexit program's function, the BTF that declares it (probes.layout: "vmlinux" or a
    module) and its type id there (None where the layout has none)."""

    btf: str
    function: str
    type_id: Optional[int]

    @property
    def name(self) -> str:
        """As libbpf is given it: MODULE:FUNCTION for a module's (libbpf >= 1.5), else FUNCTION."""
        return self.function if self.btf == "vmlinux" else f"{self.btf}:{self.function}"


def target_paths(targets: Mapping[str, FentryTarget], lacking: Sequence[str], fds: Mapping[str, int],
                 walk_error: str = "") -> Tuple[Dict[str, Tuple[int, int]], Dict[str, str], List[str]]:
    """How each fentry/fexit program gets its target: by a module's BTF object fd and type id
    (`fds`: the modules' objects found, probes.libbpf.kernel_btf_fds), where libbpf has the calls
    for it (`lacking` none of libbpf.BTF_OBJ_TARGET_CALLS), the object is loaded and the layout
    knows the id; else named to libbpf (FentryTarget.name), as before: a module's MODULE:FUNCTION
    makes libbpf load every module's BTF. Returns (program -> (fd, type id), program -> name,
    what -v says of it)."""
    direct: Dict[str, Tuple[int, int]] = {}
    why: Dict[str, str] = {}
    for program, target in sorted(targets.items()):
        if target.btf == "vmlinux":
            continue
        if lacking:
            why[program] = f"libbpf.so.1 lacks {', '.join(lacking)}"
        elif target.btf not in fds:
            why[program] = f"no loaded BTF object named {target.btf}" + (f" ({walk_error})" if walk_error else "")
        elif target.type_id is None:
            why[program] = f"no type id of {target.function} in {target.btf}'s BTF"
        else:
            direct[program] = (fds[target.btf], target.type_id)
    notes = []
    if direct:
        modules = sorted({targets[program].btf for program in direct})
        notes.append(f"fentry targets: {len(direct)} programs' in {', '.join(modules)} given by BTF object and "
                     "type id (libbpf loads no module's BTF)")
    if why:
        functions = sorted({targets[program].name for program in why})
        notes.append(f"fentry targets: {', '.join(functions)} named to libbpf, which loads every module's BTF for "
                     f"them ({'; '.join(sorted(set(why.values())))})")
    return direct, {program: target.name for program, target in targets.items() if program not in direct}, notes


class _Plan(NamedTuple):
    """The chosen points as one instance of the object runs them (CoreBackend._plan_points)."""

    settings: Dict[int, Dict[str, int]]   # the object's point number -> its settings
    programs: Dict[str, Tuple[str, ...]]  # program -> the ops a skipped run of it loses
    mountless: List[str]
    targets: Dict[str, FentryTarget]      # fentry/fexit program -> its target


class CoreBackend:
    """probes.backend.Backend with libbpf: nothing is compiled on this machine."""

    name = "core"

    def __init__(self, spec: Dict[str, Any], object_path: Path, lib: Libbpf) -> None:
        """`lib`: a libbpf probes.backend_choice found new enough, on a kernel it found able;
        `object_path`: the spec's CO-RE object, read at each open (libbpf copies what it keeps)."""
        self.lib = lib
        self.version = ".".join(map(str, self.lib.version))
        #: the object's numbering of this spec's points, as it was built
        self.table: CoreTable = core_table(spec)
        self.object_path = object_path
        self.obj: Optional[BpfObject] = None
        self._plan: Optional[Tuple[Probe, List[str], bytes, Dict[str, int]]] = None
        #: fentry/fexit program -> its target, for the plan's functions
        self._targets: Dict[str, FentryTarget] = {}
        #: what -v says of the last prepare(): how the fentry targets were given
        self._notes: List[str] = []
        self._maps: Dict[str, Any] = {}
        #: the tool's settings and the kernel's tracepoint formats as generate() was given them
        #: (a later instance's cfg repeats them)
        self._tool: Optional[Tool] = None
        self._formats: Formats = lambda event: None
        #: instances loaded later beside the first (extend()): each with the programs it runs
        self._late: List[Tuple[BpfObject, List[str]]] = []

    def ringbuf_support(self, release: str) -> Tuple[bool, str]:
        return True, f"events: BPF ring buffer, submitted without wakeups, read every {RINGBUF_READ_MS} ms"

    def task_storage_support(self, release: str, have_btf: bool) -> Tuple[bool, str]:
        if not have_btf:
            return False, "start times: hash map (task storage needs the kernel's BTF)"
        return True, "start times: task local storage"

    def fentry_support(self) -> Tuple[bool, str]:
        if self.lib.version < MODULE_TARGET_VERSION:
            return False, (f"attach: kprobes (libbpf {self.version} looks a module function's fentry target up "
                           f"by scanning every module's BTF, seconds per program; MODULE:FUNCTION needs "
                           f"{'.'.join(map(str, MODULE_TARGET_VERSION))})")
        return True, "attach: fentry/fexit for functions with a BTF prototype, kprobes for the others"

    def _core_id(self, point: Point, chosen: Chosen) -> int:
        for core in self.table.points:
            if ((core.op, core.candidate, core.context, core.entry, core.exit) ==
                    (point.op, chosen.index, point.context, point.entry, point.exit)):
                return core.id
        raise UserError(f"{point.op}: {point.entry} is not in the built object (built from another spec?)")

    def _plan_points(self, points: Sequence[Point], ops: Sequence[str], chosen: Sequence[Chosen],
                     layout: Optional[KernelLayout], formats: Formats, server: bool) -> _Plan:
        """Each point's settings (probes.model.plan_point; it starts in the slot of its id), the
        programs that run it, their fentry targets in modules, the ops that cannot tell their mount."""
        by_op = {(c.op, c.context): c for c in chosen}
        plan = _Plan({}, {}, [], {})
        for point in points:
            core = self._core_id(point, by_op[(point.op, point.context)])
            decided = plan_point(point, ops.index(point.op), point.id, self.table.nkeys, server, layout, formats)
            plan.settings[core] = decided.values
            if decided.mountless:
                plan.mountless.append(point.op)
            if point.kind == "tracepoint":
                names = [tracepoint_program_name(point.entry), tracepoint_program_name(point.exit)]
            else:
                names = list(function_program_names(self.table.points[core], point.kind))
                if point.kind == "fentry" and layout is not None:
                    for name, function in zip(names, (point.entry, point.exit)):
                        btf = layout.btf_module_of(function)
                        if btf is not None:
                            plan.targets[name] = FentryTarget(btf, function, layout.func_type_id(function))
            for name in names:
                plan.programs[name] = tuple(sorted(set(plan.programs.get(name, ())) | set(program_ops(point, server))))
        return plan

    def generate(self, chosen: Sequence[Chosen], tool: Tool, layout: Optional[KernelLayout], formats: Formats,
                 ringbuf: bool, task_storage: bool, fentry: Collection[str]) -> Probe:
        ops = check_tool(chosen, tool)
        points = points_of(chosen, layout, fentry)
        plan = self._plan_points(points, ops, chosen, layout, formats, tool.server)
        self._targets = plan.targets
        cfg = cfg_bytes(self.table, probe_settings(tool, task_storage, ops), plan.settings)
        sizes = map_sizes(tool, len(ops), task_storage, any(p.match == "keys" for p in points))
        probe = Probe("", ops, [c.letter for c in chosen if not c.context], points, [], layout is not None, True,
                      task_storage, sorted(set(plan.mountless)), plan.programs,
                      tuple(c.op for c in chosen if c.watch))
        self._plan = (probe, sorted(plan.programs), cfg, sizes)
        self._tool = tool
        self._formats = formats
        return probe

    def late_plan(self, probe: Probe, added: Sequence[Chosen], layout: Optional[KernelLayout],
                  fentry: Collection[str]) -> Optional[Tuple[List[Point], _Plan, bytes]]:
        """The points of `added` numbered after the probe's (each starts in its own slot: same
        candidates, and the object has slots for all of their points), how a second instance
        runs them, and its `cfg`: the tool's settings, every other point off (nothing is timed
        twice). None when a program it needs already runs (a tracepoint the probe handles)."""
        assert self._tool is not None
        points = [p._replace(id=len(probe.points) + i) for i, p in enumerate(points_of(added, layout, fentry))]
        plan = self._plan_points(points, probe.ops, added, layout, self._formats, self._tool.server)
        if set(plan.programs) & set(probe.programs):
            return None
        settings = probe_settings(self._tool, probe.task_storage, probe.ops)
        return points, plan, cfg_bytes(self.table, settings, plan.settings)

    def prepare_late(self, probe: Probe, added: Sequence[Chosen], layout: Optional[KernelLayout],
                     fentry: Collection[str]) -> Optional[Tuple[Probe, BpfObject, List[str]]]:
        """The probe with `added`'s points, and a second instance of the object opened and set
        for them alone (its programs), not loaded (as prepare(): the host's tests check it)."""
        late = self.late_plan(probe, added, layout, fentry)
        if late is None:
            return None
        points, plan, cfg = late
        obj, _notes = self._open(sorted(plan.programs), plan.targets)
        try:
            inline_settings(obj, sorted(plan.programs), cfg)
        except LibbpfError as exc:
            obj.close()
            raise Rejected(str(exc)) from None
        programs = dict(probe.programs)
        programs.update(plan.programs)
        extended = probe._replace(points=probe.points + points, programs=programs,
                                  mountless=sorted(set(probe.mountless) | set(plan.mountless)))
        return extended, obj, sorted(plan.programs)

    def extend(self, probe: Probe, added: Sequence[Chosen], layout: Optional[KernelLayout],
               fentry: Collection[str]) -> Optional[Probe]:
        """A second instance of the object (prepare_late), with settings of its own and every
        map the first instance's, reused by fd before loading: its programs count into what
        the readers read, and close() destroys its links with the first's."""
        assert self.obj is not None
        late = self.prepare_late(probe, added, layout, fentry)
        if late is None:
            return None
        extended, obj, programs = late
        try:
            obj.reuse_maps(self.obj)
            obj.load()
            for name in programs:
                obj.attach(name)
        except LibbpfError as exc:
            obj.close()
            raise Rejected(str(exc)) from None
        self._late.append((obj, programs))
        return extended

    def _open(self, programs: Sequence[str], targets: Mapping[str, FentryTarget]) -> Tuple[BpfObject, List[str]]:
        """The object opened with only `programs` autoloading and each fentry/fexit target given
        (target_paths), and what -v says of the targets; Rejected where libbpf refuses."""
        try:
            data = self.object_path.read_bytes()  # dropped once open: libbpf keeps copies of what it needs
        except OSError as exc:
            raise Rejected(f"{self.object_path}: {exc.strerror}") from None
        modules = sorted({t.btf for t in targets.values() if t.btf != "vmlinux"})
        lacking = self.lib.lacking
        fds, walk_error = kernel_btf_fds(self.lib, modules) if modules and not lacking else ({}, "")
        direct, named, notes = target_paths(targets, lacking, fds, walk_error)
        used = {fd for fd, _type_id in direct.values()}
        for fd in set(fds.values()) - used:
            os.close(fd)
        try:
            obj = BpfObject(self.lib, data, sorted(used))
        except LibbpfError as exc:
            raise Rejected(str(exc)) from None
        try:
            obj.autoload_only(list(programs))
            for name, (fd, type_id) in direct.items():
                obj.set_attach_btf(name, fd, type_id)
            for name, target in named.items():
                obj.set_attach_target(name, target)
        except LibbpfError as exc:
            obj.close()
            raise Rejected(str(exc)) from None
        return obj, notes

    def load_notes(self) -> List[str]:
        return list(self._notes)

    def prepare(self, probe: Probe) -> BpfObject:
        """The object opened and set for this probe, not loaded: only the chosen points'
        programs autoload (libbpf relocates, and the kernel verifies, no other), their
        settings written in, the maps sized, module functions' fentry targets named
        MODULE:FUNCTION (that lookup reads the kernel's BTF; without it nothing calls bpf(), so
        the host's tests check the rest)."""
        if self._plan is None or self._plan[0] is not probe:
            raise Rejected("the core backend loads only the probe it generated last")
        _probe, programs, cfg, sizes = self._plan
        obj, self._notes = self._open(programs, self._targets)
        try:
            inline_settings(obj, programs, cfg)
            for name, entries in sizes.items():
                obj.set_max_entries(name, entries)
            assert self._tool is not None
            for name, flags in map_flags(self._tool).items():
                obj.set_map_flags(name, flags)
        except LibbpfError as exc:
            obj.close()
            raise Rejected(str(exc)) from None
        return obj

    def load(self, probe: Probe) -> None:
        self.close()
        obj = self.prepare(probe)
        try:
            obj.load()
        except LibbpfError as exc:
            obj.close()
            # libbpf's log names the program it could not load: one of the trampolines'?
            fentry = any(name.endswith(("_fentry", "_fexit")) and f"'{name}'" in str(exc) for name in probe.programs)
            raise Rejected(str(exc), "fentry" if fentry else None) from None
        self.obj = obj

    def attach(self, probe: Probe) -> None:
        assert self.obj is not None and self._plan is not None
        for name in self._plan[1]:
            try:
                self.obj.attach(name)
            except LibbpfError as exc:
                if name.endswith(("_fentry", "_fexit")):  # a function in BTF without a trampoline site
                    raise Rejected(f"cannot attach {exc}", "fentry") from None
                raise UserError(f"cannot attach {exc}") from None

    def set_cgroup_filter(self, fd: int) -> None:
        assert self.obj is not None
        self.obj.map("cgroup_filter").set(0, fd)

    def map(self, name: str) -> Any:
        assert self.obj is not None
        if name not in self._maps:
            self._maps[name] = self.obj.map(name)
        return self._maps[name]

    def program_fds(self) -> Dict[str, int]:
        assert self.obj is not None and self._plan is not None
        out = {name: self.obj.program_fd(name) for name in self._plan[1]}
        for obj, programs in self._late:
            out.update((name, obj.program_fd(name)) for name in programs)
        return out

    def attachments(self, release: str) -> List[Attachment]:
        """From each program's section (`kprobe/FUNCTION`, `tp/SYSTEM/EVENT`...) and, for a
        kprobe or kretprobe, its perf link's info: libbpf links them through BPF links where
        the kernel has them, whose info carries the kprobe's missed count from 6.7."""
        assert self.obj is not None and self._plan is not None
        counted = self._links_count_misses(release)
        out: List[Attachment] = []
        for obj, programs in [(self.obj, self._plan[1])] + self._late:
            for name in programs:
                kind, _, target = obj.section(name).partition("/")
                kind = {"tp": "tracepoint", "tracepoint": "tracepoint"}.get(kind, kind)
                out.append(Attachment(name, kind, target.replace("/", ":") if kind == "tracepoint" else target,
                                      self._link_missed(obj, name) if counted and kind in ("kprobe", "kretprobe")
                                      else None))
        return out

    def missed_counts(self, attachments: Sequence[Attachment], release: str) -> List[Optional[int]]:
        assert self.obj is not None and self._plan is not None
        counted = self._links_count_misses(release)
        owner = {name: obj for obj, programs in [(self.obj, self._plan[1])] + self._late for name in programs}
        return [self._link_missed(owner[a.program], a.program) if counted and a.missed is not None else None
                for a in attachments]

    @staticmethod
    def _links_count_misses(release: str) -> bool:
        """Whether a kprobe link's info carries its missed count on this kernel."""
        version = major_minor(release)
        return version is not None and version >= MISSES_MIN_KERNEL

    @staticmethod
    def _link_missed(obj: BpfObject, program: str) -> Optional[int]:
        link = obj.kprobe_link(program)
        return link[2] if link is not None else None

    def open_events(self, ringbuf: bool, handle: Callable[[bytes], None], lost: Callable[[int], None]) -> None:
        assert self.obj is not None
        self.obj.open_ring("events", handle)

    def poll_events(self, ringbuf: bool) -> None:
        assert self.obj is not None
        self.obj.poll(RINGBUF_READ_MS)

    def close(self) -> None:
        for obj, _programs in self._late:  # their links first: they write the first instance's maps
            obj.close()
        self._late = []
        if self.obj is not None:
            self.obj.close()
            self.obj = None
        self._maps = {}

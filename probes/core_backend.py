"""The libbpf peer of probes.backend.Backend: loads the spec's prebuilt CO-RE object (no compiler).

Why: bcc compiles at every start, with LLVM in the process (issue 22's figures: seconds to
minutes of start-up, 100-200 MB resident). The object built from the whole spec
(probes.generate_core) is opened from memory, only the programs of the points `select`
chose are loaded, and `cfg` tells them their op, start slot and where their arguments are,
from the running kernel's BTF and tracepoint formats.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Collection, Dict, List, NamedTuple, Optional, Sequence, Tuple

from discover.errors import UserError
from discover.events import parse_format
from probes.backend import RINGBUF_READ_MS, Rejected
from probes.generate import PTR_KINDS, Point, Probe, Tool, dist_entries, points_of, total_entries
from probes.generate_core import CoreTable, PointSettings, cfg_bytes, core_table, tracepoint_program
from probes.layout import KernelLayout
from probes.libbpf import BpfObject, Libbpf, LibbpfError
from probes.select import Chosen

#: where built objects are looked for: one per spec, named after its filesystem
OBJECTS_DIR = Path(__file__).resolve().parent / "objects"
#: BPF ring buffers (5.8), task storage for tracing (5.11), bpf_get_func_arg (5.17)
MIN_KERNEL = (5, 17)
#: the first libbpf that takes a fentry target as MODULE:FUNCTION; an older one finds a module
#: function's BTF by scanning vmlinux's types again for every module BTF before it, per
#: program (a 6.1 guest's nfsslower, 10 such programs: start 26-37 s against 10-11 s on
#: kprobes and 26-29 s on bcc), so fentry/fexit runs on 1.5+ only, kprobes before
MODULE_TARGET_VERSION = (1, 5)
#: a tracepoint field each role of the spec's args may name, at the start or the end
_TP_START_ROLES = ("fileid", "offset", "bytes", "dev")
#: the read-only data section of the per-point settings: each instance has its own
CFG_MAP = ".rodata.cfg"


def object_path(spec: Dict[str, Any], objects_dir: Path = OBJECTS_DIR) -> Path:
    return objects_dir / f"{spec['filesystem']}.bpf.o"


def compiled_spec_path(spec_path: Path, objects_dir: Path = OBJECTS_DIR) -> Path:
    """Where the build puts the spec file `spec_path` parsed (discover.spec.compile_spec), beside
    the objects: load_spec takes it while it matches the file."""
    return objects_dir / f"{Path(spec_path).stem}.spec.json"


def live_format(event: str, tracefs: Path) -> Optional[List[Dict[str, Any]]]:
    """SYSTEM:EVENT's fields (offset, size, signed) from the running kernel's format file."""
    system, _, name = event.partition(":")
    try:
        return parse_format((tracefs / "events" / system / name / "format").read_text())["fields"]
    except (OSError, ValueError):
        return None


class _Plan(NamedTuple):
    """The chosen points as one instance of the object runs them (CoreBackend._settings)."""

    settings: Dict[int, PointSettings]
    programs: Dict[str, Tuple[str, ...]]
    mountless: List[str]
    targets: Dict[str, str]


class CoreBackend:
    """probes.backend.Backend with libbpf: nothing is compiled on this machine."""

    name = "core"

    def __init__(self, spec: Dict[str, Any], data: bytes, lib: Libbpf,
                 formats: Callable[[str], Optional[List[Dict[str, Any]]]]) -> None:
        """`lib`: a libbpf probes.backend_choice found new enough, on a kernel it found able."""
        self.lib = lib
        self.version = ".".join(map(str, self.lib.version))
        #: the object's numbering of this spec's points, as it was built
        self.table: CoreTable = core_table(spec)
        self.data = data
        self.formats = formats
        self.obj: Optional[BpfObject] = None
        self._plan: Optional[Tuple[Probe, List[str], bytes, Dict[str, int]]] = None
        #: fentry/fexit program -> MODULE:FUNCTION, for the plan's module functions
        self._targets: Dict[str, str] = {}
        self._maps: Dict[str, Any] = {}
        #: the tool's settings as generate() was given them (a later instance's cfg repeats them)
        self._tool: Optional[Tool] = None
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
            if ((core.op, core.candidate, core.entry, core.exit) ==
                    (point.op, chosen.index, point.entry, point.exit)):
                return core.id
        raise UserError(f"{point.op}: {point.entry} is not in the built object (built from another spec?)")

    def _settings(self, points: Sequence[Point], ops: Sequence[str], chosen: Sequence[Chosen],
                  layout: Optional[KernelLayout]) -> _Plan:
        """What cfg says of these points (each starts in the slot of its id), the programs
        that time them, their fentry targets in modules, and the ops they cannot tell the mount of."""
        by_op = {c.op: c for c in chosen}
        plan = _Plan({}, {}, [], {})
        for point in points:
            core = self._core_id(point, by_op[point.op])
            args: List[Optional[Tuple[int, Tuple[int, ...]]]] = [None, None]
            ptr_kind = "none"
            tp: Dict[str, Tuple[int, int, bool]] = {}
            if point.kind in ("fentry", "kprobe"):
                for role in ("dentry", "file", "offset"):
                    expr = point.args.get(role)
                    if not expr or expr == "retval" or layout is None or (role != "offset" and ptr_kind != "none"):
                        continue
                    src = layout.resolve(point.entry, expr)
                    if src is None:
                        continue
                    args[1 if role == "offset" else 0] = (src.param, src.derefs)
                    if role != "offset":
                        ptr_kind = role
                if ptr_kind == "none" or layout is None:
                    plan.mountless.append(point.op)
                suffix = ("fentry", "fexit") if point.kind == "fentry" else ("kprobe", "kretprobe")
                names = [f"p{core}_{suffix[0]}", f"p{core}_{suffix[1]}"]
                if point.kind == "fentry" and layout is not None:
                    for name, function in zip(names, (point.entry, point.exit)):
                        module = layout.btf_module_of(function)
                        if module not in (None, "vmlinux"):
                            plan.targets[name] = f"{module}:{function}"
            else:
                tp = self._tp_fields(point)
                if "dev" not in point.args and point.op != "rpc":
                    plan.mountless.append(point.op)
                names = [tracepoint_program(point.entry), tracepoint_program(point.exit)]
            for name in names:
                plan.programs[name] = tuple(sorted(set(plan.programs.get(name, ())) | {point.op}))
            plan.settings[core] = PointSettings(point.id, ops.index(point.op), point.id, PTR_KINDS[ptr_kind],
                                                point.args.get("bytes") == "retval", (args[0], args[1]), tp,
                                                point.watch)
        return plan

    def generate(self, chosen: Sequence[Chosen], tool: Tool, layout: Optional[KernelLayout], enums: Sequence[str],
                 ringbuf: bool, task_storage: bool, fentry: Collection[str]) -> Probe:
        ops = [c.op for c in chosen]
        points = points_of(chosen, layout, fentry)
        plan = self._settings(points, ops, chosen, layout)
        self._targets = plan.targets
        cfg = cfg_bytes(self.table, tool, task_storage, plan.settings)
        nops = len(ops)
        sizes = {"dist": dist_entries(tool, nops), "op_totals": total_entries(tool, nops),
                 "cgroup_ids": max(tool.cgroup_limit, 1)}
        # the maps no chosen setting writes get one entry (the bcc form leaves them out):
        # preallocated, they held ~7 MB of kernel memory the kernel zeroes at every start
        unused = [] if tool.top else ["top_stats", "top_hist"]
        unused += ["starts"] if task_storage else []
        unused += [] if any(self.table.points[core].match == "keys" for core in plan.settings) else ["async_starts"]
        sizes.update({name: 1 for name in unused})
        probe = Probe("", ops, [c.letter for c in chosen], points, [], layout is not None, True, task_storage,
                      sorted(set(plan.mountless)), plan.programs, tuple(c.op for c in chosen if c.watch))
        self._plan = (probe, sorted(plan.programs), cfg, sizes)
        self._tool = tool
        return probe

    def late_plan(self, probe: Probe, added: Sequence[Chosen], layout: Optional[KernelLayout],
                  fentry: Collection[str]) -> Optional[Tuple[List[Point], _Plan, bytes]]:
        """The points of `added` numbered after the probe's (each starts in its own slot: same
        candidates, and the object has slots for all of their points), how a second instance
        runs them, and its `cfg`: the tool's settings, every other point off (nothing is timed
        twice). None when a program it needs already runs (a tracepoint the probe handles)."""
        assert self._tool is not None
        points = [p._replace(id=len(probe.points) + i) for i, p in enumerate(points_of(added, layout, fentry))]
        plan = self._settings(points, probe.ops, added, layout)
        if set(plan.programs) & set(probe.programs):
            return None
        return points, plan, cfg_bytes(self.table, self._tool, probe.task_storage, plan.settings)

    def prepare_late(self, probe: Probe, added: Sequence[Chosen], layout: Optional[KernelLayout],
                     fentry: Collection[str]) -> Optional[Tuple[Probe, BpfObject, List[str]]]:
        """The probe with `added`'s points, and a second instance of the object opened and set
        for them alone (its programs), not loaded (as prepare(): the host's tests check it)."""
        late = self.late_plan(probe, added, layout, fentry)
        if late is None:
            return None
        points, plan, cfg = late
        try:
            obj = BpfObject(self.lib, self.data)
        except LibbpfError as exc:
            raise Rejected(str(exc)) from None
        try:
            obj.autoload_only(sorted(plan.programs))
            for name, target in plan.targets.items():
                obj.set_attach_target(name, target)
            obj.set_initial_value(CFG_MAP, cfg)
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
        """A second instance of the object (prepare_late) whose maps but `cfg` are the first
        instance's, reused by fd before loading: its programs count into what the readers
        read, and close() destroys its links with the first's."""
        assert self.obj is not None
        late = self.prepare_late(probe, added, layout, fentry)
        if late is None:
            return None
        extended, obj, programs = late
        try:
            obj.reuse_maps(self.obj, (CFG_MAP,))
            obj.load()
            for name in programs:
                obj.attach(name)
        except LibbpfError as exc:
            obj.close()
            raise Rejected(str(exc)) from None
        self._late.append((obj, programs))
        return extended

    def _tp_fields(self, point: Point) -> Dict[str, Tuple[int, int, bool]]:
        """Offsets, sizes and signedness of the tracepoint fields this point reads."""
        out: Dict[str, Tuple[int, int, bool]] = {}
        entry = {f["name"]: f for f in self.formats(point.entry) or []}
        exit_ = {f["name"]: f for f in self.formats(point.exit) or []}

        def put(role: str, fields: Dict[str, Dict[str, Any]], name: str) -> None:
            field = fields.get(name)
            if field is not None:
                out[role] = (int(field["offset"]), int(field["size"]), bool(field["signed"]))
        for role in _TP_START_ROLES:
            expr = point.args.get(role, "")
            if expr and not expr.startswith("exit.") and expr != "retval":
                put(role, entry, expr)
        bytes_expr = point.args.get("bytes", "")
        if bytes_expr.startswith("exit."):
            put("exit_bytes", exit_, bytes_expr[len("exit."):])
        name_expr = point.args.get("name", "")
        if name_expr.startswith("exit."):
            put("exit_name", exit_, name_expr[len("exit."):])
        elif name_expr:
            put("name", entry, name_expr)
        for i, key in enumerate(point.keys):
            put(f"key{i}", entry, key)
            put(f"exit_key{i}", exit_, key)
        return out

    def prepare(self, probe: Probe) -> BpfObject:
        """The object opened and set for this probe, not loaded: only the chosen points'
        programs autoload (libbpf relocates, and the kernel verifies, no other), `cfg` is
        filled, the maps sized, module functions' fentry targets named MODULE:FUNCTION (that
        lookup reads the kernel's BTF; without it nothing calls bpf(), so the host's tests
        check the rest)."""
        if self._plan is None or self._plan[0] is not probe:
            raise Rejected("the core backend loads only the probe it generated last")
        _probe, programs, cfg, sizes = self._plan
        try:
            obj = BpfObject(self.lib, self.data)
        except LibbpfError as exc:
            raise Rejected(str(exc)) from None
        try:
            obj.autoload_only(programs)
            for name, target in self._targets.items():
                obj.set_attach_target(name, target)
            obj.set_initial_value(CFG_MAP, cfg)
            for name, entries in sizes.items():
                obj.set_max_entries(name, entries)
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
            raise Rejected(str(exc)) from None
        self.obj = obj

    def attach(self, probe: Probe) -> None:
        assert self.obj is not None and self._plan is not None
        for name in self._plan[1]:
            try:
                self.obj.attach(name)
            except LibbpfError as exc:
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

"""--backend auto|core|bcc: which BPF loader a tool runs on here, and why (one --verbose line).

Why named checks: the prebuilt CO-RE object needs four things of the machine, each a fact
read before anything is loaded, as libbpf-tools check `fentry_can_attach`: a 5.15+ x86-64
kernel, its BTF and that of every module a chosen point lives in, libbpf.so.1 >= 1.0, and the
object shipped for the spec. `auto` takes core when all hold, else bcc, saying the first
check that failed (in that order); with neither loader possible the tool stops in one line
before anything is attached.
"""
from __future__ import annotations

import os
from pathlib import Path

from discover.errors import UserError
from probes.backend import major_minor
from probes.objects import MIN_KERNEL, OBJECTS_DIR, object_path
from probes.libbpf import MIN_VERSION, Libbpf, LibbpfError, shared

TYPE_CHECKING = False  # typing's constant without typing (discover/records.py)
if TYPE_CHECKING:
    from typing import Any, Dict, NamedTuple, Optional, Sequence, Tuple
else:
    from discover.records import NamedTuple

BACKENDS = ("auto", "core", "bcc")
#: uname's machine the objects are built for (probes.build_core's -D__TARGET_ARCH_x86)
OBJECT_MACHINE = "x86_64"


class Choice(NamedTuple):
    """The loader to open: `name` core or bcc; `why` what --verbose says after "backend: ";
    for core the libbpf already loaded and the object's path (read at each open, not held:
    its 3 MB would be in the peak of every start, the parse of the kernel's BTF on top)."""

    name: str
    why: str
    lib: Optional[Libbpf] = None
    object_path: Optional[Path] = None


def dotted(version: Tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def libbpf_check(path: Optional[str] = None) -> Tuple[Optional[Libbpf], str]:
    """(libbpf, its version) where libbpf.so.1 loads and is new enough, else (None, why not)."""
    try:
        lib = shared(path)
    except LibbpfError as exc:
        return None, str(exc.strerror).split(": apt-get")[0]
    if lib.version < MIN_VERSION:
        return None, f"libbpf {dotted(lib.version)} is older than {dotted(MIN_VERSION)}"
    return lib, f"libbpf {dotted(lib.version)}"


def kernel_check(release: str, machine: str) -> Optional[str]:
    """Why this kernel cannot run the object's programs (bpf_task_pt_regs is 5.15's, the kprobe
    programs read x86-64 registers); None when it can."""
    if machine != OBJECT_MACHINE:
        return f"the CO-RE objects are built for {OBJECT_MACHINE}, this machine is {machine}"
    version = major_minor(release)
    if version is None or version < MIN_KERNEL:
        return f"kernel {release} is older than {dotted(MIN_KERNEL)} (bpf_task_pt_regs)"
    return None


def btf_check(btf_dir: Path, modules: Sequence[str]) -> Optional[str]:
    """Why the kernel's BTF does not cover the chosen points (CO-RE relocates against vmlinux's,
    a module's points need that module's); None when it does."""
    if not (btf_dir / "vmlinux").is_file():
        return f"no kernel BTF ({btf_dir / 'vmlinux'})"
    missing = [m for m in modules if not (btf_dir / m).is_file()]
    if missing:
        return f"no module BTF for {', '.join(missing)} ({btf_dir})"
    return None


def object_check(spec: Dict[str, Any], objects_dir: Path = OBJECTS_DIR) -> Tuple[Optional[Path], str]:
    """(the object's path, "") where the spec's CO-RE object is shipped and readable, else
    (None, why not)."""
    path = object_path(spec, objects_dir)
    if path.is_file() and os.access(path, os.R_OK):
        return path, ""
    return None, f"no CO-RE object for {spec['filesystem']} ({path})"


def bcc_check() -> Optional[str]:
    """Why bcc cannot run here; None when its Python module is installed (found, not imported:
    importing it loads LLVM). importlib.util is imported here: core's start never asks."""
    import importlib.util

    return None if importlib.util.find_spec("bcc") is not None else "bcc's Python module is missing (python3-bpfcc)"


def core_blocker(spec: Dict[str, Any], release: str, modules: Sequence[str], btf_dir: Path,
                 objects_dir: Path = OBJECTS_DIR) -> Tuple[Optional[str], Optional[Choice]]:
    """(the first core check that fails, None) or (None, the core choice with what allowed it)."""
    blocker = kernel_check(release, os.uname().machine) or btf_check(btf_dir, modules)
    if blocker is not None:
        return blocker, None
    lib, said = libbpf_check()
    if lib is None:
        return said, None
    path, why = object_check(spec, objects_dir)
    if path is None:
        return why, None
    return None, Choice("core", f"{said}; BTF: {' '.join(['vmlinux', *modules])}; {path.name}", lib, path)


def choose(requested: str, spec: Dict[str, Any], release: str, modules: Sequence[str], btf_dir: Path,
           objects_dir: Path = OBJECTS_DIR) -> Choice:
    """The loader for --backend `requested` on this machine: UserError (one line) when the one
    asked for, or under auto both, cannot run."""
    if requested == "bcc":
        return Choice("bcc", "bcc (--backend bcc)")
    blocker, core = core_blocker(spec, release, modules, btf_dir, objects_dir)
    if core is not None:
        return core._replace(why=f"core ({'auto: ' if requested == 'auto' else ''}{core.why})")
    if requested == "core":
        raise UserError(f"--backend core: {blocker}: use --backend bcc")
    no_bcc = bcc_check()
    if no_bcc is not None:
        raise UserError(f"no BPF loader here: core: {blocker}; bcc: {no_bcc}")
    return Choice("bcc", f"bcc (auto: {blocker})")

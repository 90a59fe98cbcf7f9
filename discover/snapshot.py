"""Build a kernel profile from the running kernel, reading only (tracefs, /proc, /sys, /boot).

Why read-only: a snapshot is taken on machines people care about; it must leave tracing,
debugfs and modules exactly as it found them, so it never mounts or writes anything.
Each section that cannot be read is recorded with its reason in "unavailable".
"""
from __future__ import annotations

import datetime
import fnmatch
import gzip
import os
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set

from discover.btf import Btf, BtfError
from discover.errors import UserError
from discover.events import parse_format
from discover.profile import empty_profile, parse_filter_functions
from discover.tracefs import Host, find_tracefs


#: vmlinux functions whose prototypes a filesystem latency probe may need (VFS entries and
#: the generic page-cache paths below them)
DEFAULT_VMLINUX_GLOBS = (
    "vfs_*", "do_filp_open", "path_openat", "do_sys_openat2", "do_dentry_open", "lookup_open",
    "filemap_*", "generic_file_*", "generic_perform_write", "iterate_dir", "do_fsync",
    "notify_change", "file_write_and_wait_range",
)


def host_paths() -> Dict[str, Path]:
    """/proc, /sys and /boot of the host (under $PROBEKIT_SYSROOT when set, as discover.tracefs does)."""
    host = Host.from_env()
    return {"proc": host.path("/proc"), "sysfs": host.path("/sys"), "boot": host.path("/boot")}


def find_live_tracefs(hint: str = "") -> Path:
    """tracefs of the live kernel for read-only commands: found as tracing finds it, never mounted."""
    return find_tracefs(Host.from_env(), mount=False, hint=hint)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def read_config(proc: Path, boot: Path, release: str) -> Optional[Dict[str, Any]]:
    """(options, path) from /proc/config.gz or /boot/config-<release>; None when neither exists."""
    gz = proc / "config.gz"
    plain = boot / f"config-{release}"
    if gz.exists():
        text, source = gzip.decompress(gz.read_bytes()).decode("utf-8", "replace"), gz
    elif plain.exists():
        text, source = plain.read_text(errors="replace"), plain
    else:
        return None
    options: Dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("CONFIG_") and "=" in line:
            key, _, value = line.partition("=")
            options[key] = value
    return {"options": options, "source": str(source)}


def parse_proc_modules(text: str) -> Dict[str, Dict[str, Any]]:
    """/proc/modules lines: `name size refcount deps, state address`."""
    modules: Dict[str, Dict[str, Any]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 5:
            continue
        deps = [d for d in parts[3].split(",") if d and d != "-"]
        modules[parts[0]] = {"size": int(parts[1]), "refcount": int(parts[2]) if parts[2].isdigit() else None,
                             "used_by": deps, "state": parts[4]}
    return modules


def parse_mounts(text: str) -> List[Dict[str, str]]:
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4:
            out.append({"device": parts[0], "mountpoint": parts[1], "fstype": parts[2], "options": parts[3]})
    return out


def parse_blacklist(text: str) -> List[str]:
    """debugfs kprobes/blacklist: `0xstart-0xend\tname` (name may carry ` [module]`)."""
    names = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            names.append(parts[1])
    return names


def parse_available_events(text: str) -> Dict[str, List[str]]:
    systems: Dict[str, List[str]] = {}
    for line in text.splitlines():
        system, sep, event = line.strip().partition(":")
        if sep:
            systems.setdefault(system, []).append(event)
    return systems


def filesystem_modules(proc: Path, modules: Dict[str, Any]) -> List[str]:
    """Loaded modules named after a registered filesystem type (nfs -> nfs, nfsv3, nfsv4, nfsd)."""
    try:
        fstypes = {line.split()[-1] for line in (proc / "filesystems").read_text().splitlines() if line.split()}
    except OSError:
        return []
    fstypes = {t[:-1] if t[-1].isdigit() else t for t in fstypes if len(t) > 2}
    return sorted(m for m in modules if any(m.startswith(t) for t in fstypes))


def read_btf(sysfs: Path, modules: Sequence[str], vmlinux_globs: Sequence[str]) -> Dict[str, Any]:
    """Prototypes of all functions of `modules` and of vmlinux functions matching the globs."""
    btf_dir = sysfs / "kernel" / "btf"
    base = Btf((btf_dir / "vmlinux").read_bytes())
    functions: Dict[str, Dict[str, Any]] = {}
    read = ["vmlinux"]

    def record(blob: Btf, names: Iterable[str], module: Optional[str]) -> None:
        for name in names:
            func = blob.function(name)
            if func is not None and name not in functions:
                functions[name] = {"module": module, "prototype": func.prototype(), "return": func.return_type,
                                   "params": [[p.name, p.type] for p in func.params]}

    record(base, [n for n in base.function_names() if any(fnmatch.fnmatchcase(n, g) for g in vmlinux_globs)], None)
    missing = []
    for module in modules:
        path = btf_dir / module
        if not path.exists():
            missing.append(module)
            continue
        blob = Btf(path.read_bytes(), base=base)
        record(blob, blob.function_names(), module)
        read.append(module)
    return {"modules": read, "functions": functions, "missing_modules": missing}


def read_kallsyms_types(proc: Path, wanted: Set[str]) -> Dict[str, str]:
    out: Dict[str, str] = {}
    with open(proc / "kallsyms", errors="replace") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) >= 3 and parts[2] in wanted and parts[1] in "TtWw":
                out.setdefault(parts[2], parts[1])
    return out


def build_profile(tracefs: Optional[Path], proc: Path = Path("/proc"), sysfs: Path = Path("/sys"),
                  boot: Path = Path("/boot"), btf_modules: Optional[Sequence[str]] = None,
                  vmlinux_globs: Sequence[str] = DEFAULT_VMLINUX_GLOBS,
                  progress: Callable[[str], None] = lambda msg: None) -> Dict[str, Any]:
    """Everything a profile holds, read from the running kernel. Writes nothing anywhere."""
    if tracefs is None:
        raise UserError("tracefs not found at /sys/kernel/tracing or /sys/kernel/debug/tracing "
                        "(snapshot does not mount it: `mount -t tracefs nodev /sys/kernel/tracing`, "
                        "or set PROBEKIT_TRACEFS)")
    data = empty_profile()
    unavailable: Dict[str, str] = data["unavailable"]
    uname = os.uname()
    data["created"] = _now()
    data["uname"] = {"sysname": uname.sysname, "release": uname.release, "version": uname.version,
                     "machine": uname.machine}
    source: Dict[str, Any] = {"how": "live", "host": uname.nodename, "tool": "discover snapshot",
                              "tracefs": str(tracefs)}
    data["source"] = source

    def section(name: str, reader: Callable[[], Any]) -> Any:
        progress(name)
        try:
            return reader()
        except (OSError, BtfError, ValueError) as exc:
            where = getattr(exc, "filename", None)
            why = getattr(exc, "strerror", None) or str(exc)
            unavailable[name] = f"{where}: {why}" if where else why
            return None

    config = section("config", lambda: read_config(proc, boot, uname.release))
    if config is None:
        unavailable.setdefault("config", f"neither {proc}/config.gz nor {boot}/config-{uname.release} exists")
    else:
        data["config"], source["config"] = config["options"], config["source"]

    data["modules"] = section("modules", lambda: parse_proc_modules((proc / "modules").read_text()))
    data["mounts"] = section("mounts", lambda: parse_mounts((proc / "self" / "mounts").read_text()))
    data["tracers"] = section("tracers", lambda: (tracefs / "available_tracers").read_text().split())
    data["filter_functions"] = section("filter_functions", lambda: parse_filter_functions(
        (tracefs / "available_filter_functions").read_text(errors="replace").splitlines()))
    blacklist = sysfs / "kernel" / "debug" / "kprobes" / "blacklist"
    source["kprobe_blacklist"] = str(blacklist)
    data["kprobe_blacklist"] = section("kprobe_blacklist", lambda: parse_blacklist(blacklist.read_text()))

    def read_events() -> Dict[str, Dict[str, Any]]:
        events: Dict[str, Dict[str, Any]] = {}
        listed = parse_available_events((tracefs / "available_events").read_text())
        for system, names in sorted(listed.items()):
            for name in names:
                try:
                    fmt = parse_format((tracefs / "events" / system / name / "format").read_text(errors="replace"))
                except (OSError, ValueError):
                    fmt = {"id": None, "print_fmt": "", "fields": None}
                events.setdefault(system, {})[name] = fmt
        return events

    data["events"] = section("events", read_events)

    modules = btf_modules if btf_modules is not None else filesystem_modules(proc, data["modules"] or {})
    source["btf"] = str(sysfs / "kernel" / "btf")
    btf = section("btf", lambda: read_btf(sysfs, modules, vmlinux_globs))
    if btf is not None:
        if btf["missing_modules"]:
            unavailable["btf_modules"] = "no BTF for: " + ", ".join(btf["missing_modules"])
        data["btf"] = {"modules": btf["modules"], "functions": btf["functions"]}
        source["kallsyms"] = str(proc / "kallsyms")
        data["symbols"] = section("symbols", lambda: read_kallsyms_types(proc, set(btf["functions"]))) or {}
    return data

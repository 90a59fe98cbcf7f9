"""Kernel profiles: one JSON file with everything probekit needs to know about one kernel.

Why: `discover propose`, `discover events` and the compatibility report must run on a
machine other than the traced one (a laptop without tracefs, CI, a host with another
kernel). `discover snapshot` writes a profile on the traced kernel; this module defines the
format and loads it. The full schema is in docs/kernel-profile.md; in short (version 1):

    {
      "schema": "probekit-kernel-profile",   # marks the file as a profile
      "version": 1,                          # bumped on incompatible changes
      "created": "2026-11-29T16:00:00Z",
      "source": {"how": "live", "host": "...", "tool": "discover snapshot",
                 "tracefs": "/sys/kernel/tracing", "config": "/proc/config.gz",
                 "btf": "/sys/kernel/btf", "kprobe_blacklist": "/sys/kernel/debug/kprobes/blacklist"},
      "uname": {"sysname", "release", "version", "machine"},
      "config": {"CONFIG_KPROBES": "y", ...} | null,           # set options only
      "modules": {"nfs": {"size": 524288, "refcount": 4, "used_by": ["nfsv4"], "state": "Live"}},
      "mounts": [{"device", "mountpoint", "fstype", "options"}],
      "tracers": ["function_graph", "function", "nop"],
      "filter_functions": [["nfs_file_read", "nfs"], ["vfs_read", null], ...],  # file order
      "kprobe_blacklist": ["do_int3", ...] | null,
      "events": {"nfs": {"nfs_getattr_enter": {"id": 1983, "print_fmt": "...",
                 "fields": [{"name", "type", "offset", "size", "signed", "common"}]}}},
      "symbols": {"nfs_file_read": "t"},      # kallsyms type of the BTF-covered functions
      "btf": {"modules": ["vmlinux", "nfs", ...],
              "functions": {"nfs_file_read": {"module": "nfs", "prototype": "...",
                            "return": "ssize_t", "params": [["iocb", "struct kiocb *"], ...]}}},
      "unavailable": {"kprobe_blacklist": "why it could not be read", ...}
    }

A missing section is `null` plus a reason in "unavailable", never silently empty.
"""
from __future__ import annotations

import fnmatch
import gzip
import json
import zlib
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Set

from discover.errors import UserError, write_file
from discover.schema import profile_shape, validate

SCHEMA = "probekit-kernel-profile"
VERSION = 1

#: top-level keys every version-1 profile has (values may be null when unavailable)
REQUIRED_KEYS = ("uname", "modules", "filter_functions", "events")

#: suffixes GCC gives to specialised copies of a function (the original may be gone)
CLONE_MARKERS = (".isra.", ".constprop.", ".part.", ".cold", ".lto_priv.")


def clone_base(name: str) -> str:
    """`nfs_foo.constprop.0.isra.0` -> `nfs_foo`: the source function a copy was made from."""
    cut = len(name)
    for marker in CLONE_MARKERS:
        pos = name.find(marker)
        if pos > 0:
            cut = min(cut, pos)
    return name[:cut]


class KernelProfile:
    """A loaded profile with the look-ups the proposer and the events lister need."""

    def __init__(self, data: Dict[str, Any], origin: str = "<memory>") -> None:
        self.data = data
        self.origin = origin
        self._modules_of: Dict[str, Set[Optional[str]]] = {}
        self._clones: Dict[str, List[str]] = {}
        self._by_module: Dict[Optional[str], List[str]] = {}
        for name, module in data.get("filter_functions") or []:
            if module not in self._modules_of.setdefault(name, set()):
                self._modules_of[name].add(module)
                self._by_module.setdefault(module, []).append(name)
            if "." in name:  # every compiler-copy suffix has a dot: skip the scan for the ~99% without
                base = clone_base(name)
                if base != name:
                    self._clones.setdefault(base, []).append(name)
        self._blacklist: Set[str] = set(data.get("kprobe_blacklist") or [])

    # identity -----------------------------------------------------------
    @property
    def release(self) -> str:
        return str((self.data.get("uname") or {}).get("release", "?"))

    @property
    def machine(self) -> str:
        return str((self.data.get("uname") or {}).get("machine", "?"))

    def describe(self) -> str:
        """One line: which kernel, from where."""
        src = self.data.get("source") or {}
        return f"{self.release} ({src.get('how', '?')} on {src.get('host', '?')}, {self.origin})"

    def unavailable(self, section: str) -> Optional[str]:
        """Why a section could not be captured, or None when it was."""
        return (self.data.get("unavailable") or {}).get(section)

    # config and modules ---------------------------------------------------
    def config(self, option: str) -> Optional[str]:
        """Value of a CONFIG_ option ("y", "m", a string) or None when unset or unknown."""
        cfg = self.data.get("config")
        return None if cfg is None else cfg.get(option)

    @property
    def has_config(self) -> bool:
        return self.data.get("config") is not None

    def module_loaded(self, module: str) -> bool:
        return module in (self.data.get("modules") or {})

    @property
    def modules(self) -> Dict[str, Dict[str, Any]]:
        return dict(self.data.get("modules") or {})

    @property
    def mounts(self) -> List[Dict[str, str]]:
        return list(self.data.get("mounts") or [])

    # functions ------------------------------------------------------------
    def traceable(self, function: str) -> bool:
        """In available_filter_functions: ftrace, kprobes-on-ftrace and fentry can attach."""
        return function in self._modules_of

    def function_modules(self, function: str) -> Set[Optional[str]]:
        """Modules a function name appears in (None = vmlinux); empty when not traceable."""
        return set(self._modules_of.get(function, set()))

    def clones(self, function: str) -> List[str]:
        """Traceable compiler copies of a function (`.isra.0`, `.constprop.0`, `.part.0`)."""
        return list(self._clones.get(function, []))

    def functions_matching(self, pattern: str) -> List[str]:
        return [name for name in self._modules_of if fnmatch.fnmatchcase(name, pattern)]

    def functions_in(self, module: Optional[str]) -> List[str]:
        """Traceable functions of one module (None = vmlinux), in file order."""
        return list(self._by_module.get(module, []))

    @property
    def has_blacklist(self) -> bool:
        return self.data.get("kprobe_blacklist") is not None

    def blacklisted(self, function: str) -> bool:
        return function in self._blacklist

    def symbol_type(self, function: str) -> Optional[str]:
        """kallsyms type letter: 'T' global, 't' static (file-local), None when not recorded."""
        return (self.data.get("symbols") or {}).get(function)

    def btf_function(self, function: str) -> Optional[Dict[str, Any]]:
        return ((self.data.get("btf") or {}).get("functions") or {}).get(function)

    @property
    def btf_modules(self) -> List[str]:
        return list((self.data.get("btf") or {}).get("modules") or [])

    # events ---------------------------------------------------------------
    @property
    def events(self) -> Dict[str, Dict[str, Dict[str, Any]]]:
        return self.data.get("events") or {}

    def event_systems(self) -> List[str]:
        return sorted(self.events)

    def event(self, system: str, name: str) -> Optional[Dict[str, Any]]:
        return self.events.get(system, {}).get(name)


def check_profile(data: Any, origin: str) -> Dict[str, Any]:
    """Validate the schema marker, the version and every section's shape; raise UserError
    naming the first bad field (docs/kernel-profile.md)."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise UserError(f"{origin}: not a kernel profile (no \"schema\": \"{SCHEMA}\"); "
                        f"make one with `discover snapshot -o PROFILE.json`")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise UserError(f"{origin}: kernel profile has no valid \"version\"")
    if version > VERSION:
        raise UserError(f"{origin}: kernel profile version {version} is newer than this "
                        f"probekit reads ({VERSION}); upgrade probekit")
    missing = [key for key in REQUIRED_KEYS if key not in data]
    if missing:
        raise UserError(f"{origin}: kernel profile lacks {', '.join(missing)}")
    validate(data, profile_shape(REQUIRED_KEYS), origin, "kernel profile")
    return data


def load_profile(path: Path) -> KernelProfile:
    """Read a profile file (plain or gzip-compressed JSON); every problem is one UserError line."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path}: no such kernel profile") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read kernel profile: {exc.strerror or exc}") from None
    if raw[:2] == b"\x1f\x8b":  # gzip: profiles are stored compressed as test fixtures
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise UserError(f"{path}: corrupt gzip-compressed kernel profile ({exc})") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        raise UserError(f"{path}: not a kernel profile (not JSON); "
                        f"make one with `discover snapshot -o PROFILE.json`") from None
    return KernelProfile(check_profile(data, str(path)), origin=str(path))


def dump_profile(data: Dict[str, Any], path: Path) -> None:
    """Write a profile (compact per line enough to diff, small enough to commit)."""
    check_profile(data, str(path))
    write_file(path, json.dumps(data, indent=1, sort_keys=False) + "\n")


def empty_profile() -> Dict[str, Any]:
    """The skeleton `discover snapshot` fills in, in schema order."""
    return {
        "schema": SCHEMA, "version": VERSION, "created": None, "source": {},
        "uname": None, "config": None, "modules": None, "mounts": None, "tracers": None,
        "filter_functions": None, "kprobe_blacklist": None, "events": None,
        "symbols": {}, "btf": None, "unavailable": {},
    }


def parse_filter_functions(lines: Iterable[str]) -> List[List[Optional[str]]]:
    """available_filter_functions lines (`name` or `name [module]`) -> [[name, module|None]]."""
    out: List[List[Optional[str]]] = []
    for line in lines:
        line = line.strip()
        if not line:
            continue
        name, _, rest = line.partition(" ")
        module = rest.strip()[1:-1] if rest.strip().startswith("[") else None
        out.append([name, module])
    return out

"""tracefs access and the capture session that leaves every tracefs file as it found it.

Why a session object: ftrace is global kernel state shared with every other
tracer on the machine. A capture must (1) not start while someone else traces,
(2) record each file's original content before its first write, and (3) put
all of it back on every exit path (normal end, exception, SIGINT, SIGTERM,
SIGHUP, interpreter exit) — and a failed restore must cost one stderr line,
never a traceback.

Environment overrides (tests and unusual systems):
  PROBEKIT_TRACEFS  use this directory as tracefs instead of searching
                    /sys/kernel/tracing then /sys/kernel/debug/tracing
  PROBEKIT_SYSROOT  prefix for every other host path this module reads or
                    writes (/proc/kallsyms, /proc/modules, /proc/PID/task,
                    /proc/meminfo, /lib/modules, /var/tmp/.ftrace-lock,
                    /sys/kernel/debug/kprobes/blacklist); no mounting under it
  PROBEKIT_EUID     the effective uid to assume for the root check
"""
from __future__ import annotations

import atexit
import errno
import fnmatch
import os
import re
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from discover.errors import UserError, at_exit

TYPE_CHECKING = False  # typing's constant without typing (discover/records.py)
if TYPE_CHECKING:
    from typing import Callable, Dict, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Set, Tuple
else:
    from discover.records import NamedTuple

TRACEFS_DIRS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
#: perf-tools' lock: the file holds the owner's PID; present means "ftrace busy".
FTRACE_LOCK = "/var/tmp/.ftrace-lock"
KPROBE_BLACKLIST = "/sys/kernel/debug/kprobes/blacklist"

#: Files holding function lists: reading shows a comment line when the list is empty.
FUNCTION_LIST_FILES = ("set_ftrace_filter", "set_ftrace_notrace", "set_graph_function", "set_graph_notrace")
#: Files holding PID lists: reading shows "no pid" when empty.
PID_LIST_FILES = ("set_ftrace_pid", "set_ftrace_notrace_pid", "set_event_pid", "set_event_notrace_pid")
#: Signals that end a capture; each restores tracefs before the process goes on or exits.
SESSION_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_MODULE_SUFFIX = re.compile(r"^(\S+)\s+\[(\S+)\]$")
_EXPANDED = re.compile(r"^\d+ \(expanded: (\d+)\)$")
_FUNC_PATTERN = re.compile(r"^[A-Za-z0-9_.*?\[\]!-]+$")
#: gcc's clone suffixes: a function only present in these forms was inlined or specialised.
_CLONE_SUFFIX = re.compile(r"\.(isra|constprop|part|cold|lto_priv|localalias)(\.\d+)*")


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Host(NamedTuple):
    """Where the host's kernel files live; every path goes through here so tests can fake a host.
    (A NamedTuple, not a dataclass: the tracing tools' start reads tracefs through it, and
    dataclasses imports inspect.)"""

    sysroot: Path = Path("/")
    tracefs_override: Optional[Path] = None
    euid: int = 0
    release: str = ""

    @classmethod
    def from_env(cls) -> "Host":
        sysroot = Path(os.environ.get("PROBEKIT_SYSROOT", "/"))
        override = os.environ.get("PROBEKIT_TRACEFS")
        euid = int(os.environ.get("PROBEKIT_EUID", os.geteuid()))
        return cls(sysroot=sysroot, tracefs_override=Path(override) if override else None,
                   euid=euid, release=os.uname().release)

    def path(self, absolute: str) -> Path:
        return self.sysroot / absolute.lstrip("/")

    @property
    def is_real(self) -> bool:
        """True when paths are the live system's (mounting and modprobe advice make sense)."""
        return self.sysroot == Path("/")


def require_root(host: Host) -> None:
    if host.euid != 0:
        raise UserError("tracing needs root (ftrace files are root-only): run with sudo")


#: files any tracefs has; a tree with only the event files still serves read-only commands
TRACEFS_MARKERS = ("available_tracers", "available_events")


def _is_tracefs(directory: Path) -> bool:
    return any((directory / marker).is_file() for marker in TRACEFS_MARKERS)


def _unmounter(target: str) -> Callable[[], None]:
    def unmount_tracefs() -> None:
        import subprocess

        subprocess.run(["umount", target], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return unmount_tracefs


def find_tracefs(host: Host, mount: bool = True, hint: str = "") -> Path:
    """Return the tracefs directory, mounting tracefs when root, absent and `mount` is set.

    Read-only commands (snapshot, events, propose) pass mount=False: they change nothing.
    `hint` is appended to the not-found error.
    """
    if host.tracefs_override is not None:
        if _is_tracefs(host.tracefs_override):
            return host.tracefs_override
        raise UserError(f"PROBEKIT_TRACEFS={host.tracefs_override} is not a tracefs directory "
                        f"(no available_tracers or available_events in it){hint}")
    candidates = [host.path(d) for d in TRACEFS_DIRS]
    for cand in candidates:
        if _is_tracefs(cand):
            return cand
    if mount and host.is_real and host.euid == 0:
        import subprocess  # here: a start that finds tracefs mounted (the tools' usual one) skips it

        for fstype, target in (("tracefs", TRACEFS_DIRS[0]), ("debugfs", "/sys/kernel/debug")):
            if Path(target).is_dir() and subprocess.run(
                    ["mount", "-t", fstype, "nodev", target],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False).returncode == 0:
                at_exit(_unmounter(target))  # mounted by us: unmounted when the command ends, however
            for cand in candidates:
                if _is_tracefs(cand):
                    return cand
    if host.is_real and host.euid != 0:  # first what this user lacks: root would find (or mount) tracefs
        raise UserError(f"tracing needs root (running as uid {host.euid}; tracefs is root-only"
                        f"{' and mounting it needs root' if mount else ''}; or CAP_BPF, CAP_PERFMON and "
                        f"CAP_SYS_ADMIN): run with sudo{hint}")
    how = "mount it" if mount else "this command does not mount it"
    raise UserError("tracefs not found at /sys/kernel/tracing or /sys/kernel/debug/tracing "
                    f"(kernel without CONFIG_FTRACE, or {how}: mount -t tracefs nodev /sys/kernel/tracing){hint}")


#: The kernel's lockdown state: every mode listed, the active one in brackets.
LOCKDOWN = "/sys/kernel/security/lockdown"


def lockdown_mode(host: Host) -> Optional[str]:
    """The active lockdown mode ("none", "integrity", "confidentiality"), None when unknown."""
    try:
        text = host.path(LOCKDOWN).read_text()
    except OSError:
        return None
    match = re.search(r"\[(\w+)\]", text)
    return match.group(1) if match else None


def lockdown_refusal(host: Host) -> Optional[UserError]:
    """The one-line error for a kernel whose lockdown refuses tracefs, else None.

    The kernel lists tracefs among the confidentiality reasons (LOCKDOWN_TRACEFS comes
    after LOCKDOWN_INTEGRITY_MAX), so confidentiality mode always refuses it; this is
    also asked after a tracefs open failed with EPERM, whatever the mode."""
    mode = lockdown_mode(host)
    if mode in (None, "none"):
        return None
    return UserError(f"the kernel is locked down ({mode} mode, {LOCKDOWN}) and refuses tracefs: "
                     "boot with lockdown=none (and Secure Boot off if it enforces lockdown) to trace, "
                     "or run discover --from-file on a trace captured on an unlocked kernel")


def require_function_graph(tracefs: Path, host: Optional[Host] = None) -> None:
    """function_graph must be available and tracefs readable (lockdown says why not)."""
    if host is not None and lockdown_mode(host) == "confidentiality":
        raise lockdown_refusal(host)  # type: ignore[misc]
    listing = tracefs / "available_tracers"
    try:
        tracers = listing.read_text().split() if listing.is_file() else []
    except PermissionError:
        refusal = lockdown_refusal(host) if host is not None else None
        if refusal is not None:
            raise refusal from None
        raise UserError(f"{listing}: permission denied (is tracefs mounted for root only?)") from None
    if "function_graph" not in tracers:
        raise UserError("the function_graph tracer is not available on this kernel "
                        f"(available_tracers: {' '.join(tracers) or 'none'}): "
                        "it was built without CONFIG_FUNCTION_GRAPH_TRACER")


class FilterFunctions:
    """available_filter_functions as name -> modules ('' for vmlinux); the set ftrace can trace."""

    def __init__(self, lines: Iterable[str]) -> None:
        self.modules: Dict[str, Set[str]] = {}
        for line in lines:
            line = line.strip()
            if not line:
                continue
            match = _MODULE_SUFFIX.match(line)
            name, module = (match.group(1), match.group(2)) if match else (line.split()[0], "")
            self.modules.setdefault(name, set()).add(module)

    @classmethod
    def load(cls, tracefs: Path) -> "FilterFunctions":
        with open(tracefs / "available_filter_functions", errors="replace") as f:
            return cls(f)

    def matching(self, pattern: str) -> List[str]:
        if is_glob(pattern):
            return [n for n in self.modules if fnmatch.fnmatchcase(n, pattern)]
        return [pattern] if pattern in self.modules else []

    def close_matches(self, name: str, limit: int = 3) -> List[str]:
        """Names a typo or a renamed function most likely meant (prefilter keeps this fast on 80k names)."""
        head = name[:3]
        pool = [n for n in self.modules if n.startswith(head) or name in n]
        import difflib  # for an error's suggestions only

        return difflib.get_close_matches(name, pool, n=limit, cutoff=0.7)

    def clones(self, name: str) -> List[str]:
        """gcc clones of name (name.isra.0, name.constprop.0, name.part.0, ...)."""
        prefix = name + "."
        return sorted(n for n in self.modules if n.startswith(prefix) and _CLONE_SUFFIX.match(n[len(name):]))


def is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def validate_functions(patterns: Sequence[str], tracefs: Path, host: Host) -> List[str]:
    """Check every requested function or glob is traceable; explain the first that is not."""
    if not patterns:
        raise UserError("name at least one kernel function to trace")
    for pattern in patterns:
        if not _FUNC_PATTERN.match(pattern):
            raise UserError(f"'{pattern}' is not a kernel function name or glob")
    available = FilterFunctions.load(tracefs)
    for pattern in patterns:
        if not available.matching(pattern):
            raise UserError(explain_unknown(pattern, available, host))
    return list(patterns)


def explain_unknown(name: str, available: FilterFunctions, host: Host) -> str:
    """One line: why name is not traceable here, close matches, and what to do."""
    what = "no traceable function matches" if is_glob(name) else "cannot trace"
    head = f"{what} '{name}' (not in available_filter_functions)"
    literal = re.split(r"[*?\[]", name)[0]
    close = [] if is_glob(name) else available.close_matches(name)
    hint = f"; close matches: {', '.join(close)}" if close else ""
    clones = [] if is_glob(name) else available.clones(name)
    if clones:
        return (f"{head}: gcc inlined or specialised it, only its copies are traceable: "
                f"{', '.join(clones[:4])}; trace one of those")
    kallsyms = _kallsyms_functions(host)
    if not is_glob(name) and name in kallsyms:
        blacklisted = name in _kprobe_blacklist(host)
        cause = ("it is notrace and kprobe-blacklisted (in kprobes/blacklist)" if blacklisted
                 else "it exists but ftrace cannot trace it (notrace, __init or a non-traceable section)")
        return f"{head}: {cause}{hint}"
    module = _module_holding(name, literal, host)
    if module:
        return f"{head}: it lives in module {module}, which is not loaded: modprobe {module}{hint}"
    unloaded = _unloaded_modules_like(literal, host)
    modules = (f"modules named like it are not loaded ({', '.join(unloaded[:4])}): modprobe the right one"
               if unloaded else "")
    if close:
        return f"{head}: not in the running kernel, a typo?{hint}" + (f"; or {modules}" if modules else "")
    if modules:
        return f"{head}: not in the running kernel; {modules}"
    if is_glob(name):
        return f"{head}: widen the glob or check the spelling"
    return f"{head}: not in the running kernel (inlined into its callers, or absent in this version){hint}"


def _kallsyms_functions(host: Host) -> Set[str]:
    names: Set[str] = set()
    try:
        with open(host.path("/proc/kallsyms"), errors="replace") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[1] in "tTwW":
                    names.add(parts[2])
    except OSError:
        pass
    return names


def _kprobe_blacklist(host: Host) -> Set[str]:
    try:
        text = host.path(KPROBE_BLACKLIST).read_text(errors="replace")
    except OSError:
        return set()
    return {line.split()[-1] for line in text.splitlines() if line.split()}


def _loaded_modules(host: Host) -> Set[str]:
    try:
        text = host.path("/proc/modules").read_text()
    except OSError:
        return set()
    return {line.split()[0] for line in text.splitlines() if line.split()}


def _module_files(host: Host) -> Dict[str, Path]:
    """Module name -> .ko path, from modules.dep (installed systems) or modules.order."""
    moddir = host.path(f"/lib/modules/{host.release}")
    files: Dict[str, Path] = {}
    for listing in ("modules.dep", "modules.order"):
        try:
            text = (moddir / listing).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            rel = line.split(":")[0].strip()
            if not rel:
                continue
            base = rel.rsplit("/", 1)[-1].split(".ko")[0].replace("-", "_")
            files[base] = moddir / rel
        break
    return files


def _unloaded_modules_like(literal: str, host: Host) -> List[str]:
    """Unloaded modules whose name starts like the function (nfs4_... -> nfs, nfsv4, ...)."""
    stem = re.match(r"[A-Za-z]+", literal)
    if not stem or len(stem.group(0)) < 2:
        return []
    loaded = _loaded_modules(host)
    token = literal.split("_")[0]
    unloaded = [m for m in _module_files(host) if m.startswith(stem.group(0)) and m not in loaded]
    import difflib

    return sorted(unloaded, key=lambda m: (-difflib.SequenceMatcher(None, token, m).ratio(), m))


def _module_holding(name: str, literal: str, host: Host) -> Optional[str]:
    """The unloaded module whose symbol table names this function (reads the .ko files)."""
    if is_glob(name):
        return None
    files = _module_files(host)
    # the symbol itself, or a gcc clone of it (name.isra.0 ...), in the string table
    needles = (b"\0" + name.encode() + b"\0", b"\0" + name.encode() + b".")
    for module in _unloaded_modules_like(literal, host):
        data = _read_module(files[module])
        if data is not None and any(needle in data for needle in needles):
            return module
    return None


def _read_module(path: Path) -> Optional[bytes]:
    """A module's bytes, decompressed (lzma/gzip imported here: minimal guests may lack them)."""
    try:
        if path.name.endswith(".ko.xz"):
            import lzma
            return lzma.decompress(path.read_bytes())
        if path.name.endswith(".ko.gz"):
            import gzip
            return gzip.decompress(path.read_bytes())
        if path.name.endswith(".ko.zst"):
            import subprocess

            res = subprocess.run(["zstd", "-dc", str(path)], capture_output=True, check=False)
            return res.stdout if res.returncode == 0 else None
        return path.read_bytes()
    except Exception:  # an unreadable or damaged module only costs the hint
        return None


def thread_ids(host: Host, pid: int) -> List[int]:
    """Every thread of a process (/proc/PID/task/*), so set_ftrace_pid covers them all."""
    task_dir = host.path(f"/proc/{pid}/task")
    try:
        tids = sorted(int(t) for t in os.listdir(task_dir) if t.isdigit())
    except OSError:
        tids = []
    if not tids:
        raise UserError(f"no process with PID {pid}")
    return tids


def buffer_kb_limit(host: Host, ncpus: int) -> int:
    """Largest per-CPU buffer we allow: all CPUs' buffers together within a quarter of free memory."""
    try:
        for line in host.path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return max(1024, int(line.split()[1]) // 4 // max(1, ncpus))
    except (OSError, ValueError, IndexError):
        pass
    return 65536


class Original(NamedTuple):
    """A file's content before our first write, plus dependent files a summary value hides
    (relative name -> content; none where the file's own value says it all)."""

    name: str
    text: str
    parts: Optional[Dict[str, str]] = None


class TraceSession:
    """Exclusive use of tracefs: lock, recorded writes, and restoration on every exit path.

    Use as a context manager. SIGINT/SIGTERM/SIGHUP received while it is open call
    `on_signal(signum)` (default: raise Interrupted), and restoration runs with
    those signals deferred so a second Ctrl-C cannot cut it short.
    """

    def __init__(self, tracefs: Path, host: Host, force: bool = False,
                 warn: Callable[[str], None] = _stderr) -> None:
        self.tracefs = tracefs
        self.host = host
        self.force = force
        self.warn = warn
        self.lock_file = host.path(FTRACE_LOCK)
        self.on_signal: Callable[[int], None] = _raise_interrupted
        self._originals: Dict[str, Original] = {}
        self._locked = False
        self._restoring = False
        self._deferred: List[int] = []
        self._old_handlers: Dict[int, object] = {}

    # --- lifecycle -------------------------------------------------------
    def __enter__(self) -> "TraceSession":
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        """Acquire (signals are ours first, so nothing acquired is left behind on a signal)."""
        self._install_handlers()
        try:
            self._acquire()
            atexit.register(self.close)
        except BaseException:
            self._release()
            self._remove_handlers()
            raise

    def close(self) -> None:
        """Restore everything, release, give signals back. Safe to call twice."""
        try:
            self.restore()
        finally:
            self._release()
            self._remove_handlers()
            atexit.unregister(self.close)

    def _acquire(self) -> None:
        """The global tracer: take the lock and refuse a busy tracer."""
        self._take_lock()
        tracer = self.read("current_tracer").strip()
        if tracer != "nop" and not self.force:
            raise UserError(f"ftrace is in use (current_tracer is {tracer}): "
                            "stop the other tracer, or use --force to take over and restore it after")

    def _release(self) -> None:
        self._drop_lock()

    # --- lock ------------------------------------------------------------
    def _take_lock(self) -> None:
        try:
            fd = os.open(self.lock_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            raise UserError(self._lock_busy_message()) from None
        except OSError as exc:
            raise UserError(f"cannot write the ftrace lock {self.lock_file}: {exc.strerror}") from None
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()}\n")
        self._locked = True

    def _lock_busy_message(self) -> str:
        try:
            owner = self.lock_file.read_text().strip()
        except OSError:
            owner = "?"
        msg = f"ftrace may be in use by PID {owner} ({self.lock_file} exists)"
        if owner.isdigit() and not self.host.path(f"/proc/{owner}").exists():
            msg += f"; PID {owner} is not running: if no tracer is active, rm {self.lock_file}"
        return msg

    def _drop_lock(self) -> None:
        if not self._locked:
            return
        try:
            if self.lock_file.read_text().strip() == str(os.getpid()):
                self.lock_file.unlink()
        except OSError as exc:
            self.warn(f"probekit: could not remove {self.lock_file}: {exc.strerror}")
        self._locked = False

    # --- reads and recorded writes ---------------------------------------
    def path_of(self, name: str) -> Path:
        """The file behind a setting name."""
        return self.tracefs / name

    def read(self, name: str) -> str:
        with open(self.path_of(name), errors="replace") as f:
            return f.read()

    def write(self, name: str, value: str) -> None:
        """Replace a file's setting (truncating write), recording its original first."""
        self._record(name)
        _write_file(self.path_of(name), value)

    def _record(self, name: str) -> None:
        if name in self._originals:
            return
        text, parts = self.read(name), None
        if name == "buffer_size_kb" and text.strip() == "X":
            parts = self._read_parts("per_cpu/cpu*/buffer_size_kb")
        elif name.startswith("events/") and name.endswith("/enable") and text.strip() == "X":
            parts = self._read_parts(name[: -len("enable")] + "*/enable")
        self._originals[name] = Original(name, text, parts)

    def _read_parts(self, pattern: str) -> Dict[str, str]:
        parts = {}
        for path in sorted(self.tracefs.glob(pattern)):
            rel = str(path.relative_to(self.tracefs))
            parts[rel] = self.read(rel)
        return parts

    @property
    def written(self) -> List[str]:
        """Files written so far, in first-write order."""
        return list(self._originals)

    def clear_buffer(self) -> None:
        """Empty the ring buffer (the buffer's content is not a setting and is not restored)."""
        _write_file(self.tracefs / "trace", "")

    # --- restoration -----------------------------------------------------
    def restore(self) -> List[str]:
        """Put every written file back, last written first; return the names that failed."""
        failed: List[str] = []
        if self._restoring:
            return failed
        self._restoring = True
        try:
            for name in reversed(list(self._originals)):
                original = self._originals[name]
                try:
                    for rel, value in restore_writes(original):
                        _write_file(self.path_of(rel), value)
                except OSError as exc:
                    failed.append(name)
                    self.warn(f"probekit: could not restore {self.path_of(name)} to "
                              f"{original.text.strip()[:60]!r}: {exc.strerror or exc}")
                del self._originals[name]
        finally:
            self._restoring = False
            pending, self._deferred = self._deferred, []
        for signum in pending:
            self.on_signal(signum)
        return failed

    # --- signals ---------------------------------------------------------
    def _install_handlers(self) -> None:
        if not _in_main_thread():
            return
        for signum in SESSION_SIGNALS:
            self._old_handlers[signum] = signal.signal(signum, self._handle_signal)

    def _remove_handlers(self) -> None:
        for signum, handler in self._old_handlers.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        self._old_handlers = {}

    def _handle_signal(self, signum: int, frame: object) -> None:
        if self._restoring:
            self._deferred.append(signum)
            return
        self.on_signal(signum)


#: Private instances are named INSTANCE_PREFIX + the owner's PID (a later run removes
#: those whose owner is dead).
INSTANCE_PREFIX = "probekit-"


class InstanceUnsupported(Exception):
    """This kernel cannot run function_graph in an instance (before 6.11): use the global tracer."""


class InstanceSession(TraceSession):
    """function_graph in a private tracefs instance (instances/probekit-<pid>, Linux 6.11+).

    The instance has its own ring buffer, tracer, pid filters and options, so the capture
    coexists with trace-cmd, perf ftrace or anything else on the global buffer that is not
    function_graph: no lock is taken and a busy global tracer is no reason to refuse.
    `tracefs` is the instance directory. The graph filters are still global (6.12 and 7.3
    instances have no set_graph_function, set_graph_notrace, max_graph_depth nor
    tracing_thresh, and the kernel applies the top-level ones to every function_graph
    user), so those are written at `top`, recorded and restored like any other file, and
    another function_graph user (the global tracer or another instance) is refused unless
    force: each would change the other's graph. Closing removes the instance on every exit
    path; opening first removes instances a killed run left (only those whose PID is dead).
    """

    def __init__(self, tracefs: Path, host: Host, force: bool = False,
                 warn: Callable[[str], None] = _stderr) -> None:
        self.top = tracefs
        self.instance = tracefs / "instances" / f"{INSTANCE_PREFIX}{os.getpid()}"
        super().__init__(self.instance, host, force=force, warn=warn)
        self._created = False

    def _acquire(self) -> None:
        """Clear stale instances, create ours and check function_graph runs in it alone."""
        for stale in stale_instances(self.top, self.host):
            remove_instance(stale, self.warn)
        if self.instance.exists():  # left by a dead process that had our PID
            remove_instance(self.instance, self.warn)
        try:
            make_instance(self.instance)
        except OSError as exc:  # instances/ refused (not writable, out of memory): the global path
            raise InstanceUnsupported() from exc
        self._created = True
        tracers = (self.instance / "available_tracers").read_text().split()
        if "function_graph" not in tracers:
            raise InstanceUnsupported()
        others = self.graph_users()
        if others and not self.force:
            raise UserError(f"function_graph is already running in {', '.join(others)}; its graph filters "
                            "(set_graph_function, max_graph_depth) are global on this kernel, so both graphs "
                            "would change: wait for it to end, or use --force to share them")

    def _release(self) -> None:
        """Remove our instance (the kernel frees its buffer and files)."""
        if self._created:
            self._created = False
            remove_instance(self.instance, self.warn)

    def graph_users(self) -> List[str]:
        """Other function_graph users: the global tracer, other instances."""
        users = []
        for where, directory in [("the global tracer", self.top)] + [
                (f"instance {d.name}", d) for d in sorted((self.top / "instances").iterdir())
                if d.is_dir() and d != self.instance]:
            try:
                if (directory / "current_tracer").read_text().strip() == "function_graph":
                    users.append(where)
            except OSError:
                continue
        return users

    def path_of(self, name: str) -> Path:
        """Where a setting lives: in the instance, else (a top-level-only file) at the top."""
        inside = self.instance / name
        return inside if inside.exists() or not (self.top / name).exists() else self.top / name


def stale_instances(tracefs: Path, host: Host) -> List[Path]:
    """Our instances whose owner PID is no longer running."""
    found = []
    for path in sorted((tracefs / "instances").glob(INSTANCE_PREFIX + "*")):
        pid = path.name[len(INSTANCE_PREFIX):]
        if pid.isdigit() and int(pid) != os.getpid() and not host.path(f"/proc/{pid}").exists():
            found.append(path)
    return found


def make_instance(path: Path) -> None:
    """mkdir in instances/ is how tracefs creates an instance (populated by the kernel)."""
    os.mkdir(path)


def unmake_instance(path: Path) -> None:
    """rmdir of an instance: the kernel removes its files and frees its buffer."""
    os.rmdir(path)


#: How long rmdir of an instance is retried while the kernel says EBUSY: any process
#: holding one of its files open (a monitor polling current_tracer, a shell's cat) makes
#: rmdir fail until it closes it, which such readers do within milliseconds.
RMDIR_BUSY_SECONDS = 3.0


def remove_instance(path: Path, warn: Callable[[str], None]) -> None:
    """Stop the instance's tracer, then rmdir it (the kernel frees its buffer and files).

    current_tracer is written only when it is not nop already: on 6.1 any tracer write,
    even nop into an instance, marks the ring buffers expanded, and the global buffer of a
    kernel that never traced then stays at its boot-time 7 KB instead of growing to its
    real size (seen on a 6.1 guest: "7 (expanded: 1408)" became "7")."""
    try:
        _write_file(path / "tracing_on", "0")
        if (path / "current_tracer").read_text().strip() != "nop":
            _write_file(path / "current_tracer", "nop")
    except OSError:
        pass
    deadline = time.monotonic() + RMDIR_BUSY_SECONDS
    while True:
        try:
            unmake_instance(path)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno == errno.EBUSY and time.monotonic() < deadline:
                time.sleep(0.05)
                continue
            warn(f"probekit: could not remove tracefs instance {path}: {exc.strerror or exc}; "
                 f"remove it with: rmdir {path}")
            return


@contextmanager
def open_session(tracefs: Path, host: Host, force: bool = False,
                 warn: Callable[[str], None] = _stderr) -> Iterator[TraceSession]:
    """An open session, closed on leaving: a private instance where the kernel runs
    function_graph in instances, else the global tracer (lock, refusal of a busy tracer
    unless force)."""
    session: TraceSession = InstanceSession(tracefs, host, force=force, warn=warn)
    try:
        if not (tracefs / "instances").is_dir():
            raise InstanceUnsupported()
        session.open()
    except InstanceUnsupported:
        session = TraceSession(tracefs, host, force=force, warn=warn)
        session.open()
    try:
        yield session
    finally:
        session.close()


class Interrupted(UserError):
    """A session ended by a signal before it could finish normally (exit status 128+signal)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}; tracefs restored")
        self.signum = signum
        self.exit_code = 128 + signum


def _raise_interrupted(signum: int) -> None:
    raise Interrupted(signum)


def _in_main_thread() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()


def _write_file(path: Path, value: str) -> None:
    """One truncating open, writes in whitespace-aligned chunks (ftrace parses per write)."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        for chunk in _chunks(value, 4000):
            os.write(fd, chunk.encode())
    finally:
        os.close(fd)


def _chunks(value: str, size: int) -> List[str]:
    if len(value) <= size:
        return [value] if value else []
    chunks: List[str] = []
    current = ""
    for token in value.split(" "):
        if current and len(current) + 1 + len(token) > size:
            chunks.append(current + " ")
            current = token
        else:
            current = f"{current} {token}" if current else token
    if current:
        chunks.append(current)
    return chunks


def restore_writes(original: Original) -> List[Tuple[str, str]]:
    """The (file, text) writes that bring a file back to `original`, per the file's write syntax.

    Reading and writing differ for several ftrace files: an empty function list
    reads as a '####' comment but is restored by a truncating open with nothing
    written; an empty PID list reads 'no pid'; an unexpanded ring buffer reads
    'N (expanded: M)' and M is the size it really has once tracing ran; a mixed
    per-CPU size or event-enable state reads 'X' and is restored part by part.
    """
    name = original.name
    text = original.text
    base = name.rsplit("/", 1)[-1]
    if base in FUNCTION_LIST_FILES:
        return [(name, " ".join(_function_list_entries(base, text)))]
    if base in PID_LIST_FILES:
        pids = [] if text.strip() == "no pid" else text.split()
        return [(name, " ".join(pids))]
    if base == "buffer_size_kb":
        stripped = text.strip()
        expanded = _EXPANDED.match(stripped)
        if expanded:
            return [(name, expanded.group(1))]
        if stripped == "X":
            return [(rel, value.strip().split(" ")[0]) for rel, value in (original.parts or {}).items()]
        return [(name, text)]
    if original.parts:
        return list(original.parts.items())
    return [(name, text)]


def _function_list_entries(base: str, text: str) -> List[str]:
    """Entries to write back: comments and trigger lines (func:cmd, untouched by us) skipped."""
    entries = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _MODULE_SUFFIX.match(line)
        if match:
            func, module = match.groups()
            # set_graph_* have no :mod: command; the bare name matches the same function.
            entries.append(f"{func}:mod:{module}" if base in ("set_ftrace_filter", "set_ftrace_notrace") else func)
        elif ":" not in line:
            entries.append(line)
    return entries

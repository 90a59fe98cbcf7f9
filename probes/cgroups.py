"""Which cgroup an operation's task was in: cgroup v2 ids as paths, and the --cgroup filter's directory.

Why here and not in the probe: the kernel side keeps only bpf_get_current_cgroup_id(), one
helper call per printed event or process entry. On cgroup v2 that id is the inode number
of the cgroup's directory (kernfs, 64-bit ino since Linux 5.5), so user space names it by
walking the cgroup2 mount once and again only when an id is new (a unit started later).
Paths are relative to the cgroup2 root, as /proc/PID/cgroup's `0::` line writes them:
`/system.slice/nfs-client.target`, `/user.slice/user-0.slice/session-3.scope`.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from discover.errors import UserError
from probes.mounts import MOUNTINFO, _unescape

TYPE_CHECKING = False  # typing's constant without typing (discover/records.py)
if TYPE_CHECKING:
    from typing import Callable, Dict, Iterable, List, Optional

#: a walk of the whole cgroup tree is done at most this often for ids not seen yet
REWALK_S = 1.0
#: ids kept named, so that a cgroup gone since keeps its name in later intervals
MAX_KNOWN = 65536


def cgroup2_root(mountinfo: Path = MOUNTINFO) -> Optional[str]:
    """Where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup, or .../unified on hybrid systems)."""
    try:
        text = mountinfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if sep and len(fields) >= 5 and tail[:1] == ["cgroup2"]:
            return _unescape(fields[4])
    return None


class CgroupNames:
    """cgroup v2 id -> path below the root; unknown ids trigger a (rate-limited) walk."""

    def __init__(self, root: Optional[str] = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.root = root if root is not None else cgroup2_root()
        self.clock = clock
        self.known: Dict[int, str] = {}
        self._walked_at: Optional[float] = None

    def _walk(self) -> None:
        if self.root is None:
            return
        self._walked_at = self.clock()
        if len(self.known) > MAX_KNOWN:
            self.known.clear()
        root_ino = os.stat(self.root).st_ino
        self.known[root_ino] = "/"
        for top, dirs, _files in os.walk(self.root):
            for name in dirs:
                path = os.path.join(top, name)
                try:
                    self.known[os.stat(path).st_ino] = "/" + os.path.relpath(path, self.root)
                except OSError:  # gone while walking
                    continue

    def name(self, cgroup_id: int) -> str:
        """The cgroup's path, or `cgroup:<id>` when no cgroup v2 directory has that id (gone
        before it was ever seen, or a cgroup v1-only system)."""
        if cgroup_id not in self.known and cgroup_id:
            if self._walked_at is None or self.clock() - self._walked_at >= REWALK_S:
                self._walk()
        return self.known.get(cgroup_id, f"cgroup:{cgroup_id}")


class CgroupLabels:
    """The exporter's `cgroup` label: admitted ids as paths, id 0 as OVERFLOW, and which
    admitted ids are gone (their directory removed, or its path now another cgroup's) past a
    grace, so that their series leave and their places among the admitted are freed."""

    OVERFLOW = "other"

    def __init__(self, grace: float, names: Optional[CgroupNames] = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.names = names or CgroupNames(clock=clock)
        self.grace, self.clock = grace, clock
        self._missing_since: Dict[int, float] = {}

    def label(self, cgroup_id: int) -> str:
        return self.OVERFLOW if cgroup_id == 0 else self.names.name(cgroup_id)

    def alive(self, cgroup_id: int) -> bool:
        path = self.names.name(cgroup_id)
        if self.names.root is None or not path.startswith("/"):
            return False
        try:
            return os.stat(os.path.join(self.names.root, path.lstrip("/"))).st_ino == cgroup_id
        except OSError:
            return False

    def expired(self, admitted: Iterable[int]) -> List[int]:
        """Admitted ids gone for longer than the grace (each handed out once)."""
        now, out = self.clock(), []
        admitted = set(admitted)
        for cgroup_id in admitted:
            if self.alive(cgroup_id):
                self._missing_since.pop(cgroup_id, None)
            elif now - self._missing_since.setdefault(cgroup_id, now) >= self.grace:
                out.append(cgroup_id)
                del self._missing_since[cgroup_id]
        for cgroup_id in set(self._missing_since) - admitted:
            del self._missing_since[cgroup_id]
        return out


def filter_dir(path: str, mountinfo: Path = MOUNTINFO) -> str:
    """The --cgroup argument as a cgroup v2 directory (absolute, or relative to the cgroup2
    root as /proc/PID/cgroup writes it); one-line UserError otherwise, before anything starts."""
    root = cgroup2_root(mountinfo)
    if root is None:
        raise UserError("--cgroup needs the cgroup v2 hierarchy, and none is mounted")
    candidates = [path] if path.startswith(root.rstrip("/") + "/") or path == root else []
    candidates.append(os.path.join(root, path.lstrip("/")))
    for candidate in candidates:
        if os.path.isfile(os.path.join(candidate, "cgroup.procs")):
            return os.path.normpath(candidate)
    raise UserError(f"--cgroup {path}: not a cgroup v2 directory (under {root})")


def task_cgroup(pid: int) -> Optional[str]:
    """A live task's cgroup v2 path from /proc/PID/cgroup (its `0::` line), or None."""
    try:
        with open(f"/proc/{pid}/cgroup") as handle:
            for line in handle:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        return None
    return None

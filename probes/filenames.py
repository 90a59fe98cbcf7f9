"""A file name for lines whose attach point knows only the inode (`[ino N]` before).

Why in user space: NFS's enter/exit tracepoints (fsync, getattr, setattr, access) carry the
superblock dev and the fileid, no dentry; reading a name in the probe would cost every
operation. A printed line is rare by comparison, so its name is found when it is printed:
first from what earlier printed lines of the same inode were called (file-timed lines carry
the inode number too), then from the process's open descriptors (an fsync needs one): /proc/PID/fdinfo's inode
number (Linux 5.14 and later; older kernels name from earlier lines only).
"""
from __future__ import annotations

import os
from collections import OrderedDict

from probes.mounts import kernel_dev

TYPE_CHECKING = False  # typing's constant without typing (discover/records.py)
if TYPE_CHECKING:
    from typing import Dict, Optional, Tuple

#: inodes remembered by name (the most recently printed ones)
MAX_NAMES = 4096


class FileNames:
    """(dev, inode number) -> base name, learnt from printed lines and /proc/PID/fd."""

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        self.names: "OrderedDict[Tuple[int, int], str]" = OrderedDict()

    def learn(self, dev: int, ino: int, name: str) -> None:
        if not (dev and ino and name):
            return
        self.names[(dev, ino)] = name
        self.names.move_to_end((dev, ino))
        while len(self.names) > MAX_NAMES:
            self.names.popitem(last=False)

    def _mount_devs(self, pid: int) -> Dict[int, int]:
        """mount id -> kernel dev, from the process's mountinfo (its first and third fields)."""
        out: Dict[int, int] = {}
        try:
            with open(f"{self.proc}/{pid}/mountinfo") as handle:
                for line in handle:
                    fields = line.split()
                    major, _, minor = fields[2].partition(":") if len(fields) > 2 else ("", "", "")
                    if fields[0].isdigit() and major.isdigit() and minor.isdigit():
                        out[int(fields[0])] = kernel_dev(int(major), int(minor))
        except OSError:
            pass
        return out

    def _from_fds(self, pid: int, dev: int, ino: int) -> Optional[str]:
        """The name of the process's open descriptor on (dev, ino), from /proc/PID/fdinfo (its
        ino: and mnt_id: lines, Linux 5.14+) and the fd link: never a stat of the file, which
        on NFS is itself a getattr the tools would count."""
        fd_dir = f"{self.proc}/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            return None
        devs: Optional[Dict[int, int]] = None
        for fd in fds:
            try:
                with open(f"{self.proc}/{pid}/fdinfo/{fd}") as handle:
                    info = dict(line.split(":", 1) for line in handle if ":" in line)
                if int(info.get("ino", "-1")) != ino:
                    continue
                if devs is None:
                    devs = self._mount_devs(pid)
                if devs.get(int(info.get("mnt_id", "-1"))) == dev:
                    return os.path.basename(os.readlink(f"{fd_dir}/{fd}")) or None
            except (OSError, ValueError):
                continue
        return None

    def name(self, event_name: str, dev: int, ino: int, pid: int) -> str:
        """The line's FILENAME: its own name (remembered), else the inode's, else `[ino N]`
        (an inode never printed with a name and not open in the process), else "?"."""
        if event_name:
            self.learn(dev, ino, event_name)
            return event_name
        if not ino:
            return "?"
        known = self.names.get((dev, ino))
        if known is None:
            known = self._from_fds(pid, dev, ino)
            if known is not None:
                self.learn(dev, ino, known)
        return known if known is not None else f"[ino {ino}]"

"""An NFS server's exports by their root's (dev, inode): how a request's export is named.

Why: the server probe reads, at fh_verify's return, the export of the request's file handle
as the probe can reach it cheaply: the export root's inode number and its superblock's dev.
The export's path is what an administrator reads in /etc/exports; the kernel lists the
exports it serves in /proc/fs/nfs/exports (the path, then each client and its options), so
a stat() of each listed path gives the same (dev, inode) pair. Looked up again only when a
pair is new (an export added since), at most once a second.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from probes.mounts import _unescape, kernel_dev

TYPE_CHECKING = False  # typing's constant without typing (discover/records.py)
if TYPE_CHECKING:
    from typing import Callable, Dict, Optional, Tuple

#: the kernel's list of what it exports (nfsd's export cache)
PROC_EXPORTS = Path("/proc/fs/nfs/exports")
#: a new (dev, inode) pair reads the exports again at most this often
REREAD_S = 1.0


def exported_paths(text: str) -> Dict[str, None]:
    """The paths of /proc/fs/nfs/exports, in order, once each (an export to several clients is
    listed once per client; `\\040`-style escapes undone)."""
    out: Dict[str, None] = {}
    for line in text.splitlines():
        fields = line.split()
        if fields and not fields[0].startswith("#"):
            out[_unescape(fields[0])] = None
    return out


class ExportNames:
    """(kernel dev, inode) of an export's root -> its path."""

    def __init__(self, source: Path = PROC_EXPORTS, clock: Callable[[], float] = time.monotonic) -> None:
        self.source, self.clock = source, clock
        self.known: Dict[Tuple[int, int], str] = {}
        self._read_at: Optional[float] = None

    def _read(self) -> None:
        self._read_at = self.clock()
        try:
            text = self.source.read_text()
        except OSError:
            return
        for path in exported_paths(text):
            try:
                st = os.stat(path)
            except OSError:  # removed since it was exported
                continue
            self.known[(kernel_dev(os.major(st.st_dev), os.minor(st.st_dev)), st.st_ino)] = path

    def name(self, dev: int, ino: int) -> str:
        """The export's path; "" for a request that verified no file handle (NULL, an NFSv4
        COMPOUND of SEQUENCE alone...); `dev MAJ:MIN ino N` for an export not listed (or whose
        stat() gives another dev than its superblock's: a btrfs subvolume)."""
        if not dev and not ino:
            return ""
        if (dev, ino) not in self.known and (self._read_at is None or self.clock() - self._read_at >= REREAD_S):
            self._read()
        return self.known.get((dev, ino), f"dev {dev >> 20}:{dev & 0xFFFFF} ino {ino}")

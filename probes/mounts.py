"""Which mount a superblock dev is: mount point, export (or device), transport, server, NFS version.

Why here and not in the probe: the kernel side keeps only the superblock's s_dev per
operation (a tracepoint field, or two pointer reads); everything a person or a join needs
comes from /proc/self/mountinfo (dev -> mount point) and /proc/self/mountstats (mount
point -> export, options, transport), read again when a dev is new, so mounts made after
the start are named too. Label names and values follow node_exporter's mountstats
collector (`export`: the mount's device, `protocol`: the transport of mountstats' `xprt:`
line, `mountaddr`: the server address, mountinfo's `addr=` super option, not mountstats'
`mountaddr=` mount-protocol option, which NFSv4 has not), so a PromQL join
`on (export, mountaddr, protocol)` meets its series.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from discover.errors import UserError

TYPE_CHECKING = False  # typing's constant without typing (discover/records.py)
if TYPE_CHECKING:
    from typing import Callable, Dict, List, NamedTuple, Optional, Tuple
else:
    from discover.records import NamedTuple

MOUNTINFO = Path("/proc/self/mountinfo")
MOUNTSTATS = Path("/proc/self/mountstats")
#: the kernel's dev_t inside (MINORBITS): what sb->s_dev and the tracepoints' dev hold
MINOR_BITS = 20
#: NFS client file systems (nfsd's control file system is not one)
NFS_TYPES = frozenset({"nfs", "nfs4"})


class Mount(NamedTuple):
    dev: int
    mountpoint: str
    fstype: str
    export: str
    protocol: str
    mountaddr: str
    nfs_version: str


def kernel_dev(major: int, minor: int) -> int:
    return (major << MINOR_BITS) | minor


def _unescape(field: str) -> str:
    """mountinfo and mountstats escape space, tab, newline and backslash as \\ooo."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit() and len(field[i + 1:i + 4]) == 3:
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> Dict[int, Dict[str, str]]:
    """dev -> {mountpoint, fstype, source, addr (the addr= super option)} of every mount (the last one of a dev wins:
    a bind mount or a remount shows the same superblock again)."""
    out: Dict[int, Dict[str, str]] = {}
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or ":" not in fields[2]:
            continue
        major, _, minor = fields[2].partition(":")
        if not (major.isdigit() and minor.isdigit()):
            continue
        addr = next((opt[len("addr="):] for opt in tail[2].split(",") if opt.startswith("addr=")), "")
        out[kernel_dev(int(major), int(minor))] = {"mountpoint": _unescape(fields[4]), "fstype": tail[0],
                                                   "source": _unescape(tail[1]), "addr": addr}
    return out


def parse_mountstats(text: str) -> Dict[str, Dict[str, str]]:
    """mount point -> {export, fstype, opts..., protocol} for each NFS mount in mountstats."""
    out: Dict[str, Dict[str, str]] = {}
    current: Optional[Dict[str, str]] = None
    for line in text.splitlines():
        words = line.split()
        if line.startswith("device ") and len(words) >= 8 and words[2:4] == ["mounted", "on"]:
            current = None
            if words[7] in NFS_TYPES:
                current = {"export": _unescape(words[1]), "fstype": words[7], "protocol": ""}
                out[_unescape(words[4])] = current
        elif current is not None and words[:1] == ["opts:"] and len(words) > 1:
            for option in words[1].split(","):
                key, _, value = option.partition("=")
                current.setdefault("opt_" + key, value)
        elif current is not None and words[:1] == ["xprt:"] and len(words) > 1:
            current["protocol"] = words[1]
    return out


#: how long a mount that went away keeps its labels (its last operations still get scraped
#: under them), before its counts are dropped: several scrape intervals of a usual Prometheus
GONE_GRACE_S = 300.0


class MountTable:
    """dev -> Mount, re-read from /proc when a dev is not known yet (a mount made later).

    A mount that went away stays known for `grace` seconds, then its dev is handed out once
    by take_expired() so that its counts can be dropped: they must neither fall into the
    unlabelled series nor be counted for a later mount the kernel gives the same dev (it
    reuses anonymous devs). A dev that names another mount than before is expired at once."""

    def __init__(self, mountinfo: Path = MOUNTINFO, mountstats: Path = MOUNTSTATS,
                 grace: float = GONE_GRACE_S, clock: Callable[[], float] = time.monotonic,
                 serves: Callable[[str], bool] = NFS_TYPES.__contains__) -> None:
        self.paths = (mountinfo, mountstats)
        #: which mount types are the traced filesystem's (NFS unless a spec says otherwise)
        self.serves = serves
        self.grace, self.clock = grace, clock
        self.known: Dict[int, Optional[Mount]] = {}
        self.gone: Dict[int, Tuple[Mount, float]] = {}
        self._expired: List[int] = []
        #: the last mountinfo text read in full, and what it gave
        self._seen: Tuple[Optional[str], Dict[int, Optional[Mount]]] = (None, {})

    def _read(self) -> Dict[int, Optional[Mount]]:
        """dev -> Mount of every mount served now. mountstats (kilobytes of counters per NFS
        mount) is read and parsed only when mountinfo changed since the last complete read:
        what is taken from it (export, transport, version) stays while mountinfo does."""
        info_text = self.paths[0].read_text()
        if info_text == self._seen[0]:
            return dict(self._seen[1])
        info = parse_mountinfo(info_text)
        stats = parse_mountstats(self.paths[1].read_text())
        current: Dict[int, Optional[Mount]] = {}
        complete = True
        for dev, mount in info.items():
            if not self.serves(mount["fstype"]):
                continue
            if mount["fstype"] in NFS_TYPES:
                nfs = stats.get(mount["mountpoint"])
                if nfs is None:  # mounted between the two reads: read both again next time
                    complete = False
                    continue
                current[dev] = Mount(dev, mount["mountpoint"], mount["fstype"], nfs["export"], nfs["protocol"],
                                     mount["addr"], nfs.get("opt_vers", ""))
            else:  # a local or SMB mount: its source (device or share) stands for the export
                current[dev] = Mount(dev, mount["mountpoint"], mount["fstype"], mount["source"], "",
                                     mount["addr"], "")
        self._seen = (info_text if complete else None, dict(current))
        return current

    def refresh(self) -> None:
        try:
            current = self._read()
        except OSError:
            return
        now = self.clock()
        for dev, before in list(self.known.items()) + [(d, m) for d, (m, _) in self.gone.items()]:
            if before is None:
                continue
            if dev not in current:
                self.gone.setdefault(dev, (before, now))
            elif current[dev] != before and dev not in self._expired:
                self._expired.append(dev)  # the dev of a new mount: the old one's counts go
                self.gone.pop(dev, None)
            else:
                self.gone.pop(dev, None)
        for dev, (_, since) in list(self.gone.items()):
            if now - since >= self.grace:
                del self.gone[dev]
                self._expired.append(dev)
        self.known = dict(current)
        for dev, (mount, _) in self.gone.items():
            self.known[dev] = mount

    def take_expired(self) -> List[int]:
        """Devs whose counts belong to no mount any more (gone past the grace, or reused)."""
        expired, self._expired = self._expired, []
        return expired

    def get(self, dev: int) -> Optional[Mount]:
        """The NFS mount of a superblock dev, or None (dev 0, a mount gone, not NFS)."""
        if dev and dev not in self.known:
            self.refresh()
            self.known.setdefault(dev, None)
        return self.known.get(dev)


def mount_dev(path: str, table: Optional["MountTable"] = None, title: str = "NFS") -> int:
    """--mount-point: the kernel dev (the superblock's s_dev, what the probe reads) of the
    traced filesystem's mount holding `path`; one-line UserError when there is none (checked
    before anything is compiled or attached). stat's st_dev is tried first; a filesystem
    whose stat reports another dev than its superblock's (btrfs: one per subvolume) is found
    by the longest mount point above the path."""
    table = table or MountTable()
    try:
        st = os.stat(path)
    except OSError as exc:
        raise UserError(f"--mount-point {path}: {exc.strerror}") from None
    dev = kernel_dev(os.major(st.st_dev), os.minor(st.st_dev))
    if table.get(dev) is not None:
        return dev
    real = os.path.realpath(path)
    above = [m for m in table.known.values()
             if m is not None and (real == m.mountpoint or real.startswith(m.mountpoint.rstrip("/") + "/"))]
    if not above:
        article = "an" if title[0] in "AEFHILMNORSXaeio" else "a"  # an NFS, an XFS, an ext4, a btrfs
        raise UserError(f"--mount-point {path}: not on {article} {title} mount")
    return max(above, key=lambda m: len(m.mountpoint)).dev

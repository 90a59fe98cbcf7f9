"""Names for lines that carry only an inode: from earlier lines of that inode, else from the
process's open descriptors (real files and this process's real /proc/PID/fd)."""
from __future__ import annotations

import os
from pathlib import Path

from probes import filenames
from probes.filenames import FileNames
from probes.mounts import kernel_dev


def ident(path: Path) -> tuple:
    st = path.stat()
    return kernel_dev(os.major(st.st_dev), os.minor(st.st_dev)), st.st_ino


def test_an_open_file_is_named_from_the_process_descriptors(tmp_path: Path) -> None:
    path = tmp_path / "write-1.bin"
    path.write_bytes(b"x")
    dev, ino = ident(path)
    names = FileNames()
    assert names.name("", dev, ino, os.getpid()) == f"[ino {ino}]"  # not open, never printed
    with open(path, "rb"):
        assert names.name("", dev, ino, os.getpid()) == "write-1.bin"
    assert names.name("", dev, ino, os.getpid()) == "write-1.bin"  # remembered once closed
    assert names.name("", dev + 1, ino, os.getpid()) == f"[ino {ino}]"  # another mount's inode


def test_printed_names_are_learnt_and_bounded(monkeypatch) -> None:
    monkeypatch.setattr(filenames, "MAX_NAMES", 2)
    names = FileNames()
    assert names.name("a.bin", 57, 1, 0) == "a.bin"
    names.name("b.bin", 57, 2, 0)
    names.name("c.bin", 57, 3, 0)
    assert names.name("", 57, 3, 0) == "c.bin" and names.name("", 57, 1, 0) == "[ino 1]"
    assert names.name("", 57, 0, 0) == "?"  # no inode at all (a kprobe without BTF)

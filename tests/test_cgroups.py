"""cgroup v2 ids as paths, and --cgroup's directory, on this host's real cgroup2 hierarchy.

The kernel's cgroup id (bpf_get_current_cgroup_id) is the cgroup directory's inode number:
that it matches is checked in the lab (labs/checks/probes/guest.py identity); here the walk,
its rate limit and the argument check run against real cgroups made for the test.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from discover.errors import UserError
from probes.cgroups import REWALK_S, CgroupNames, cgroup2_root, filter_dir, task_cgroup


def test_cgroup2_root_is_the_cgroup2_mount() -> None:
    found = subprocess.run(["findmnt", "-n", "-t", "cgroup2", "-o", "TARGET"], stdout=subprocess.PIPE,
                           universal_newlines=True, check=True).stdout.split()
    assert cgroup2_root() == found[0]


def test_ids_are_named_and_new_ones_wait_for_the_next_walk(cgroup: Path) -> None:
    now = [100.0]
    names = CgroupNames(clock=lambda: now[0])
    assert names.name(cgroup.stat().st_ino) == "/" + cgroup.name
    assert names.name(os.stat(names.root).st_ino) == "/"
    later = cgroup / "unit.scope"
    later.mkdir()
    assert names.name(later.stat().st_ino) == f"cgroup:{later.stat().st_ino}"  # walked just now
    now[0] += REWALK_S
    assert names.name(later.stat().st_ino) == f"/{cgroup.name}/unit.scope"
    ino = later.stat().st_ino
    later.rmdir()
    assert names.name(ino) == f"/{cgroup.name}/unit.scope"  # a cgroup gone keeps its name


def test_filter_dir_takes_a_directory_or_a_proc_path(cgroup: Path) -> None:
    assert filter_dir(str(cgroup)) == str(cgroup)
    assert filter_dir("/" + cgroup.name) == str(cgroup)
    for bad in ("/no/such.scope", "/etc", str(cgroup / "cgroup.procs")):
        with pytest.raises(UserError, match="not a cgroup v2 directory"):
            filter_dir(bad)


def test_task_cgroup_is_procs_v2_line() -> None:
    line = next(l for l in Path(f"/proc/{os.getpid()}/cgroup").read_text().splitlines() if l.startswith("0::"))
    assert task_cgroup(os.getpid()) == line[3:]
    assert task_cgroup(2 ** 22 + 1) is None

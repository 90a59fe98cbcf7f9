"""`discover snapshot` against a tracefs tree laid out from the real Debian 6.1 capture."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from discover.events import find_pairs
from discover.profile import KernelProfile, check_profile, load_profile
from discover.snapshot import build_profile

FIXTURES = Path(__file__).resolve().parent.parent.parent / "shared" / "fixtures" / "debian-6.1.0-57-amd64" / "tracefs"
REPO = Path(__file__).resolve().parent.parent


def fixture_tracefs(tmp: Path) -> Path:
    """The shared capture under the file names tracefs really uses (symlinks, nothing typed)."""
    root = tmp / "tracing"
    root.mkdir()
    (root / "available_filter_functions").symlink_to(FIXTURES / "available_filter_functions.nfs.txt")
    (root / "available_events").symlink_to(FIXTURES / "available_events.nfs-nfs4-sunrpc.txt")
    (root / "available_tracers").symlink_to(FIXTURES / "available_tracers.txt")
    (root / "events").symlink_to(FIXTURES / "events")
    return root


def test_build_profile_from_tracefs_tree(tmp_path: Path) -> None:
    tracefs = fixture_tracefs(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    data = build_profile(tracefs, proc=empty, sysfs=empty, boot=empty)
    check_profile(json.loads(json.dumps(data)), "roundtrip")
    prof = KernelProfile(data)
    assert data["tracers"] == ["blk", "mmiotrace", "function_graph", "function", "nop"]
    assert len(data["filter_functions"]) == len(
        [l for l in (FIXTURES / "available_filter_functions.nfs.txt").read_text().splitlines() if l.strip()])
    assert prof.traceable("nfs_file_read") and prof.function_modules("nfs_file_read") == {"nfs"}
    listed = [l for l in (FIXTURES / "available_events.nfs-nfs4-sunrpc.txt").read_text().splitlines() if l]
    assert sum(len(v) for v in data["events"].values()) == len(listed)
    assert prof.event("nfs", "nfs_getattr_enter")["id"] == 1983
    # nfs4 formats were not captured: listed, fields null, never invented
    assert prof.event("nfs4", "nfs4_read") == {"id": None, "print_fmt": "", "fields": None}
    # what could not be read says why, instead of pretending to be empty
    for section in ("config", "modules", "mounts", "kprobe_blacklist", "btf"):
        assert section in data["unavailable"], section
    assert data["modules"] is None and data["kprobe_blacklist"] is None


def test_cli_snapshot_then_events_from_profile(tmp_path: Path) -> None:
    env = dict(os.environ, PROBEKIT_TRACEFS=str(fixture_tracefs(tmp_path)))
    out = tmp_path / "profile.json"
    snap = subprocess.run([sys.executable, "-m", "discover", "snapshot", "-o", str(out)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)
    assert snap.returncode == 0, snap.stderr
    prof = load_profile(out)
    assert prof.traceable("nfs_getattr")
    live = subprocess.run([sys.executable, "-m", "discover", "events", "nfs", "--json"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    offline = subprocess.run([sys.executable, "-m", "discover", "events", "nfs", "--json",
                              "--kernel-profile", str(out)], cwd=REPO, capture_output=True, text=True,
                             timeout=120)
    assert live.returncode == offline.returncode == 0, offline.stderr
    assert json.loads(live.stdout)[0]["pairs"] == json.loads(offline.stdout)[0]["pairs"]
    assert find_pairs("nfs", prof.events["nfs"])


def test_no_tracefs_is_one_line_and_mounts_nothing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PROBEKIT_TRACEFS"}
    env["PROBEKIT_SYSROOT"] = str(tmp_path)  # a root with no tracefs under it
    for args in (["snapshot", "-o", str(tmp_path / "p.json")], ["propose", "nfs"], ["events", "nfs"]):
        res = subprocess.run([sys.executable, "-m", "discover", *args], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=120)
        assert res.returncode != 0
        assert res.stderr.count("\n") == 1 and "tracefs not found" in res.stderr, res.stderr
    assert not (tmp_path / "p.json").exists() and list(tmp_path.iterdir()) == []

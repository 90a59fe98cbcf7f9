"""probes.mounts on the real mount tables of the 6.1 lab guest (NFSv3 and v4.2 of one export)."""
from __future__ import annotations

from pathlib import Path

from probes.mounts import MountTable, kernel_dev, parse_mountinfo

FIXTURES = Path(__file__).resolve().parent / "fixtures/6.1.0-50-amd64/exporter"


def table() -> MountTable:
    mounts = MountTable(FIXTURES / "mountinfo", FIXTURES / "mountstats")
    mounts.refresh()
    return mounts


def test_both_lab_mounts_are_named_by_their_superblock_dev() -> None:
    mounts = table()
    v3, v42 = mounts.get(kernel_dev(0, 44)), mounts.get(kernel_dev(0, 47))
    assert v3 is not None and v42 is not None
    assert (v3.mountpoint, v3.fstype, v3.export, v3.protocol, v3.mountaddr, v3.nfs_version) == \
        ("/mnt/nfs3", "nfs", "127.0.0.1:/srv/nfs", "tcp", "127.0.0.1", "3")
    assert (v42.mountpoint, v42.fstype, v42.export, v42.protocol, v42.mountaddr, v42.nfs_version) == \
        ("/mnt/nfs42", "nfs4", "127.0.0.1:/srv/nfs", "tcp", "127.0.0.1", "4.2")
    assert sorted(m.mountpoint for m in mounts.known.values() if m) == ["/mnt/nfs3", "/mnt/nfs42"]


def test_labels_meet_node_exporters_series() -> None:
    """export, mountaddr and protocol as node_exporter printed them for the v3 mount, same boot."""
    line = (FIXTURES / "node-mountstats.txt").read_text().split("{", 1)[1].split("}", 1)[0]
    labels = dict(part.split("=", 1) for part in line.split(","))
    v3 = table().get(kernel_dev(0, 44))
    assert v3 is not None
    assert {k: v.strip('"') for k, v in labels.items()} == {"export": v3.export, "mountaddr": v3.mountaddr,
                                                            "protocol": v3.protocol}


def test_no_mount_for_dev_0_or_a_non_nfs_superblock() -> None:
    mounts = table()
    nfsd = next(dev for dev, m in parse_mountinfo((FIXTURES / "mountinfo").read_text()).items()
                if m["mountpoint"] == "/proc/fs/nfsd")
    assert mounts.get(0) is None and mounts.get(nfsd) is None


def test_escaped_mount_points_are_unescaped(tmp_path: Path) -> None:
    info = (FIXTURES / "mountinfo").read_text().replace(" /mnt/nfs3 ", " /mnt/nfs\\0403 ")
    stats = (FIXTURES / "mountstats").read_text().replace(" on /mnt/nfs3 ", " on /mnt/nfs\\0403 ")
    (tmp_path / "mountinfo").write_text(info)
    (tmp_path / "mountstats").write_text(stats)
    mounts = MountTable(tmp_path / "mountinfo", tmp_path / "mountstats")
    v3 = mounts.get(kernel_dev(0, 44))
    assert v3 is not None and v3.mountpoint == "/mnt/nfs 3"


def test_nfsdist_per_mount_sections_name_each_mount() -> None:
    """nfsdist --per-mount: one section per op and mount, titled with the mount point."""
    from probes.commands import _dist_sections

    def entry(slots: dict) -> dict:
        return {"slots": slots, "count": sum(slots.values()), "bytes": 0, "lat_ns": 0}

    data = {"read": dict(entry({8: 3, 9: 1}), mounts={kernel_dev(0, 44): entry({8: 3}), kernel_dev(0, 47): entry({9: 1})}),
            "rpc": dict(entry({7: 2}), mounts={0: entry({7: 2})}), "write": dict(entry({}), mounts={})}
    sections = _dist_sections(data, table())
    assert sections == [("read, mount = /mnt/nfs3", [0] * 8 + [3]), ("read, mount = /mnt/nfs42", [0] * 9 + [1]),
                        ("rpc, mount = (no mount: RPC or other)", [0] * 7 + [2])]
    assert _dist_sections(data, None) == [("read", [0] * 8 + [3, 1]), ("rpc", [0] * 7 + [2])]


def unmounted(tmp: Path, mountpoint: str) -> MountTable:
    """The same real tables with one mount's lines taken out, as its umount leaves them."""
    info = [line for line in (FIXTURES / "mountinfo").read_text().splitlines(keepends=True)
            if f" {mountpoint} " not in line]
    stats, skipping = [], False
    for line in (FIXTURES / "mountstats").read_text().splitlines(keepends=True):
        if line.startswith("device "):
            skipping = f" mounted on {mountpoint} " in line
        if not skipping:
            stats.append(line)
    (tmp / "mountinfo").write_text("".join(info))
    (tmp / "mountstats").write_text("".join(stats))
    return MountTable(tmp / "mountinfo", tmp / "mountstats")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_gone_mount_keeps_its_labels_for_the_grace_then_expires_once(tmp_path: Path) -> None:
    clock = Clock()
    mounts = MountTable(FIXTURES / "mountinfo", FIXTURES / "mountstats", grace=300, clock=clock)
    mounts.refresh()
    v42 = mounts.get(kernel_dev(0, 47))
    after = unmounted(tmp_path, "/mnt/nfs42")
    mounts.paths = after.paths  # the umount
    clock.now += 10
    mounts.refresh()
    assert mounts.get(kernel_dev(0, 47)) == v42 and mounts.take_expired() == []
    clock.now += 299  # 299 s after it was seen gone
    mounts.refresh()
    assert mounts.get(kernel_dev(0, 47)) == v42 and mounts.take_expired() == []
    clock.now += 1
    mounts.refresh()
    assert mounts.take_expired() == [kernel_dev(0, 47)] and mounts.take_expired() == []
    assert kernel_dev(0, 47) not in mounts.known and mounts.get(kernel_dev(0, 44)) is not None
    mounts.refresh()
    assert mounts.take_expired() == []


def test_a_dev_given_to_another_mount_expires_at_once(tmp_path: Path) -> None:
    """The kernel reuses anonymous devs: 0:47 now names a mount of another export."""
    mounts = MountTable(FIXTURES / "mountinfo", FIXTURES / "mountstats")
    mounts.refresh()
    for name in ("mountinfo", "mountstats"):
        text = (FIXTURES / name).read_text().replace("127.0.0.1:/srv/nfs mounted on /mnt/nfs42",
                                                     "127.0.0.1:/srv/other mounted on /mnt/nfs42")
        (tmp_path / name).write_text(text.replace("- nfs4 127.0.0.1:/srv/nfs ", "- nfs4 127.0.0.1:/srv/other "))
    mounts.paths = (tmp_path / "mountinfo", tmp_path / "mountstats")
    mounts.refresh()
    assert mounts.take_expired() == [kernel_dev(0, 47)]
    assert mounts.get(kernel_dev(0, 47)).export == "127.0.0.1:/srv/other"

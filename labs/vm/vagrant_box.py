"""Package a lab image (labs/vm/images.py) as a vagrant-libvirt box, once per image key.

A vagrant-libvirt box is a tar of box.img (the qcow2), metadata.json and a
Vagrantfile with provider defaults. The box name carries the image key, so a
changed image gets a new box and an unchanged one is never packaged twice.
The kernel and initrd for direct kernel boot are copied where the libvirt-qemu
user can read them (the image cache lives under root's home, which it cannot).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Callable, List, NamedTuple

from discover.errors import UserError
from labs.vm.images import ImageInfo

#: Readable by the libvirt-qemu user (Debian's default QEMU user under libvirt).
BOOT_DIR = Path("/var/lib/libvirt/boot")

BOX_VAGRANTFILE = """\
# probekit lab box: provider defaults (the project's Vagrantfile sets the rest)
Vagrant.configure("2") do |config|
  config.vm.provider :libvirt do |lv|
    lv.driver = "qemu"
  end
end
"""

Progress = Callable[[str], None]


class Box(NamedTuple):
    name: str       # as `vagrant box add --name` got it
    vmlinuz: Path   # copies readable by libvirt's QEMU user
    initrd: Path


def box_name(image: ImageInfo) -> str:
    return f"probekit-{image.key}"


def box_installed(name: str) -> bool:
    """True when `vagrant box list` knows a libvirt box of that name."""
    out = subprocess.run(["vagrant", "box", "list", "--machine-readable"],
                         capture_output=True, text=True, check=False)
    fields = [line.split(",") for line in out.stdout.splitlines()]
    names = {f[3] for f in fields if len(f) > 3 and f[2] == "box-name"}
    return name in names


def _virtual_size_gib(qcow2: Path) -> int:
    info = json.loads(subprocess.run(["qemu-img", "info", "--output=json", str(qcow2)],
                                     check=True, capture_output=True, text=True).stdout)
    return max(1, -(-int(info["virtual-size"]) // (1 << 30)))  # round up


def _boot_files(image: ImageInfo) -> Box:
    target = BOOT_DIR / f"probekit-{image.key}"
    vmlinuz, initrd = target / "vmlinuz", target / "initrd.img"
    if not (vmlinuz.exists() and initrd.exists()):
        target.mkdir(parents=True, exist_ok=True)
        for src, dst in ((image.vmlinuz, vmlinuz), (image.initrd, initrd)):
            tmp = dst.with_suffix(".tmp")
            shutil.copyfile(src, tmp)
            os.chmod(tmp, 0o644)
            os.replace(tmp, dst)
    return Box(box_name(image), vmlinuz, initrd)


def ensure_box(image: ImageInfo, progress: Progress = print) -> Box:
    """Add the box for this image unless vagrant already has it; return its boot files."""
    if not shutil.which("vagrant"):
        raise UserError("vagrant is not installed: run `bash scripts/setup`")
    box = _boot_files(image)
    if box_installed(box.name):
        progress(f"[box] cached {box.name}")
        return box
    progress(f"[box] packaging {image.rootfs} as vagrant box {box.name}")
    metadata = {"provider": "libvirt", "format": "qcow2",
                "virtual_size": _virtual_size_gib(image.rootfs)}
    with tempfile.TemporaryDirectory(prefix="probekit-box-", dir=image.directory.parent) as tmp:
        box_file = Path(tmp) / f"{box.name}.box"
        # Uncompressed tar: the qcow2 is already compact and gzip would cost a minute of CPU.
        with tarfile.open(box_file, "w") as tar:
            tar.add(image.rootfs, arcname="box.img")
            for name, text in (("metadata.json", json.dumps(metadata) + "\n"),
                               ("Vagrantfile", BOX_VAGRANTFILE)):
                member = Path(tmp) / name
                member.write_text(text)
                tar.add(member, arcname=name)
        proc = subprocess.run(["vagrant", "box", "add", "--force", "--name", box.name, str(box_file)],
                              capture_output=True, text=True)
    if proc.returncode != 0:
        raise UserError(f"vagrant box add {box.name} failed: "
                        + " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-5:]))
    progress(f"[box] added {box.name}")
    prune_stale_boxes(image, progress)
    return box


def prune_stale_boxes(image: ImageInfo, progress: Progress = print) -> List[str]:
    """Remove boxes, base volumes and boot files of older images of the same suite
    (called right after a box was added).

    Each changed image input makes a new box of about the image's size three times
    over (box store, libvirt pool, boot copy); without this they pile up. Skipped while
    any probekit domain exists, since it may run on one of them.
    """
    listing = subprocess.run(["virsh", "-c", "qemu:///system", "list", "--all", "--name"],
                             capture_output=True, text=True)
    if listing.returncode != 0 or any(n.startswith("probekit_") for n in listing.stdout.split()):
        return []
    keep = box_name(image)
    stale_prefix = f"probekit-{image.suite}-"
    out = subprocess.run(["vagrant", "box", "list", "--machine-readable"],
                         capture_output=True, text=True, check=False).stdout
    stale = sorted({f[3] for f in (line.split(",") for line in out.splitlines())
                    if len(f) > 3 and f[2] == "box-name" and f[3].startswith(stale_prefix)
                    and f[3] != keep})
    volumes = subprocess.run(["virsh", "-c", "qemu:///system", "vol-list", "default"],
                             capture_output=True, text=True).stdout.split()
    for name in stale:
        subprocess.run(["vagrant", "box", "remove", "--force", "--all", name], capture_output=True)
        shutil.rmtree(BOOT_DIR / name, ignore_errors=True)
        progress(f"[box] removed stale box {name}")
    # Base volumes are named after the box and its add time: a box just (re-)added gets a
    # fresh upload at the next `vagrant up`, so every volume of these names is stale now.
    for name in stale + [keep]:
        for volume in (v for v in volumes if v.startswith(f"{name}_vagrant_box_image_")):
            subprocess.run(["virsh", "-c", "qemu:///system", "vol-delete", volume, "--pool", "default"],
                           capture_output=True)
            progress(f"[box] removed stale base volume {volume}")
    return stale

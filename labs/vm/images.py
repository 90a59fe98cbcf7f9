"""Lab guest images from Debian packages only: mmdebstrap -> ext4 -> qcow2, plus vmlinuz/initrd.

One image serves every lab node and both backends (QEMU directly, and the Vagrant box
built on top of it). Images are cached under ``~/.cache/probekit/images/<key>/`` where
the key hashes every input (suite, package list, provision scripts, the lab SSH key,
builder version), so a changed input builds a new image and an unchanged one is reused.

Stable API (used by labs.vm.qemu and labs.vm.vagrant)::

    info = build_image("6.1")          # ImageInfo; builds once, then returns the cache
    info.rootfs, info.vmlinuz, info.initrd, info.kernel_release, info.ssh_private_key

Building needs root (mmdebstrap in root mode, ownership kept by ``mkfs.ext4 -d``) and
deb.debian.org (or the host's own Debian mirror); no loop mounts.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Optional

from discover.errors import UserError, cache_root
from discover.schema import ListOf, MapOf, NonEmpty, Record, validate

#: Bump when the build steps change in a way that changes the image.
BUILDER_VERSION = "1"

PROVISION_DIR = Path(__file__).resolve().parents[1] / "provision"
DEFAULT_MIRROR = "http://deb.debian.org/debian"

#: kernel series -> the Debian suite whose linux-image-amd64 ships it (checked after the build).
#: A "-backports" suite is its base suite with the kernel (image and headers) taken from
#: backports: a backports kernel is never a suite's default, so it has to be asked for.
KERNEL_SUITES: Dict[str, str] = {
    "5.10": "bullseye",
    "6.1": "bookworm",
    "6.12": "trixie",
    "7.2": "sid",
    "7.3": "trixie-backports",
    "7": "sid",
}
BACKPORTS = "-backports"

Progress = Callable[[str], None]


class ImageInfo(NamedTuple):
    """A built image: every path the backends need, and what is inside."""

    key: str
    suite: str
    kernel_release: str      # uname -r of the image's kernel, e.g. 6.1.0-57-amd64
    directory: Path
    rootfs: Path             # qcow2, ext4 on the whole disk (root=/dev/vda)
    vmlinuz: Path
    initrd: Path
    ssh_private_key: Path    # key pair accepted for `vagrant` and root
    ssh_public_key: Path
    packages: List[str]
    #: kernel suite -> uname -r of every kernel the image carries (the fields above: the base suite's)
    kernels: Dict[str, str] = {}

    def to_json(self) -> Dict[str, object]:
        out = {k: (str(v) if isinstance(v, Path) else v) for k, v in self._asdict().items()}
        return out

    @classmethod
    def from_json(cls, data: Dict[str, object]) -> "ImageInfo":
        path_fields = {"directory", "rootfs", "vmlinuz", "initrd", "ssh_private_key", "ssh_public_key"}
        values = {k: (Path(str(v)) if k in path_fields else v) for k, v in data.items()}
        return cls(**values)  # type: ignore[arg-type]


#: the paths image.json records, by name only: the image's files in its own directory, the lab
#: key pair in the cache's ssh directory. A cache copied elsewhere and named by PROBEKIT_CACHE
#: is read where it lies now (an absolute path recorded by an older builder is re-rooted too).
IMAGE_FILES = ("rootfs", "vmlinuz", "initrd")
KEY_FILES = ("ssh_private_key", "ssh_public_key")
IMAGE_RECORD = Record({"key": str, "suite": str, "kernel_release": str, "packages": ListOf(str),
                       **{name: NonEmpty() for name in IMAGE_FILES + KEY_FILES}},
                      {"directory": str, "kernels": MapOf(str)}, closed=True)


def write_image_record(info: ImageInfo, path: Path) -> None:
    """image.json of a built image, without any absolute path (IMAGE_FILES)."""
    data = info.to_json()
    del data["directory"]
    data.update({name: getattr(info, name).name for name in IMAGE_FILES + KEY_FILES})
    path.write_text(json.dumps(data, indent=2) + "\n")


def read_image_record(path: Path, suite: str) -> ImageInfo:
    """The image whose image.json is `path`, as seen by one of its kernel suites, its files
    found beside the record; a record that cannot be read, is not an image's, or whose
    files are gone is one line naming the file (before anything boots from it)."""
    hint = f"; remove {path.parent} and `labs up` builds the image again"
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise UserError(f"{path}: {exc.strerror or exc}{hint}") from None
    except (ValueError, RecursionError):
        raise UserError(f"{path}: image record is not JSON{hint}") from None
    try:
        validate(data, IMAGE_RECORD, str(path), "image record")
    except UserError as exc:
        raise UserError(f"{exc}{hint}") from None
    data["directory"] = path.parent
    data.update({name: path.parent / Path(data[name]).name for name in IMAGE_FILES})
    data.update({name: cache_root() / "ssh" / Path(data[name]).name for name in KEY_FILES})
    info = _for_suite(ImageInfo(**data), suite)
    for name in IMAGE_FILES:
        if not getattr(info, name).is_file():
            raise UserError(f"{path}: the image's {name} {getattr(info, name)} is missing{hint}")
    return info


def suite_for_kernel(kernel: str) -> str:
    """Map a requested kernel ('6.1', '6.12', '7.2', or a suite name) to a Debian suite."""
    if kernel in KERNEL_SUITES.values():
        return kernel
    if kernel in KERNEL_SUITES:
        return KERNEL_SUITES[kernel]
    major = kernel.split(".")[0]
    if major in KERNEL_SUITES:
        return KERNEL_SUITES[major]
    known = ", ".join(list(KERNEL_SUITES) + sorted(set(KERNEL_SUITES.values())))
    raise UserError(f"no Debian suite known for kernel {kernel!r} (known: {known})")


def host_mirror() -> str:
    """The Debian mirror the host's apt uses (so a local mirror or proxy is honoured)."""
    texts: List[str] = []
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        if path.suffix in (".list", ".sources") and path.is_file():
            texts.append(path.read_text(errors="replace"))
    for text in texts:
        for match in re.finditer(r"(?m)^(?:URIs:\s*|deb\s+(?:\[[^\]]*\]\s+)?)(\S+)", text):
            uri = match.group(1).rstrip("/")
            if "security" not in uri and uri.startswith(("http://", "https://")):
                return uri
    return DEFAULT_MIRROR


def base_suite(suite: str) -> str:
    """The suite whose packages an image is built from (trixie for trixie-backports)."""
    return suite[:-len(BACKPORTS)] if suite.endswith(BACKPORTS) else suite


def image_suites(suite: str) -> List[str]:
    """The kernel suites one image carries: its base suite's kernel and the backports kernel
    KERNEL_SUITES names for that base (trixie's 6.12 and trixie-backports' 7.3 share one
    image: one build, one package download, the same userland either way)."""
    base = base_suite(suite)
    return [base] + [s for s in dict.fromkeys(KERNEL_SUITES.values()) if s == base + BACKPORTS]


def read_package_list(suite: str) -> List[str]:
    """packages.txt + packages-<base suite>.txt + the base suite's kernel image and headers
    (a backports kernel is installed beside it by the build: image_suites)."""
    names: List[str] = []
    for path in (PROVISION_DIR / "packages.txt", PROVISION_DIR / f"packages-{base_suite(suite)}.txt"):
        if path.exists():
            for line in path.read_text().splitlines():
                names.extend(line.split("#", 1)[0].split())
    names += ["linux-image-amd64", "linux-headers-amd64"]
    return sorted(set(names))


def ensure_ssh_key(progress: Progress = print) -> Path:
    """The lab's SSH key pair, generated once and kept in the cache (Vagrant needs a key)."""
    key = cache_root() / "ssh" / "lab_ed25519"
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        with _locked(key.parent / ".lock"):
            if not key.exists():
                progress(f"[image] generating the lab SSH key {key}")
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "probekit-lab",
                                "-f", str(key)], check=True)
    return key


def image_key(suite: str, packages: List[str], pubkey: bytes) -> str:
    """Hash of every build input: same inputs, same cached image (one key for the suites
    of one image)."""
    digest = hashlib.sha256()
    suite = base_suite(suite)
    for part in (BUILDER_VERSION, "+".join(image_suites(suite)), " ".join(packages)):
        digest.update(part.encode() + b"\0")
    for path in sorted(PROVISION_DIR.rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(PROVISION_DIR)).encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(pubkey)
    return f"{suite}-{digest.hexdigest()[:16]}"


def cached_image(kernel: str) -> Optional[ImageInfo]:
    """The cached image for a kernel request, or None when it would have to be built."""
    suite = suite_for_kernel(kernel)
    key_path = cache_root() / "ssh" / "lab_ed25519.pub"
    if not key_path.exists():
        return None
    key = image_key(suite, read_package_list(suite), key_path.read_bytes())
    info_file = cache_root() / "images" / key / "image.json"
    if info_file.exists():
        return read_image_record(info_file, suite)
    return None


def build_image(kernel: str = "6.1", progress: Progress = print, rebuild: bool = False) -> ImageInfo:
    """Return the image for a kernel request, building it (as root) when not cached.

    The build runs in a temporary directory beside the cache entry and is renamed into
    place only when complete, so an interrupted build never leaves a half image behind.
    """
    suite = suite_for_kernel(kernel)
    packages = read_package_list(suite)
    private_key = ensure_ssh_key(progress)
    public_key = private_key.with_suffix(".pub")
    key = image_key(suite, packages, public_key.read_bytes())
    images = cache_root() / "images"
    final = images / key
    images.mkdir(parents=True, exist_ok=True)
    with _locked(images / f"{key}.lock"):
        if final.exists() and (final / "image.json").exists() and not rebuild:
            info = read_image_record(final / "image.json", suite)
            progress(f"[image] cached {key} (kernel {info.kernel_release})")
            _check_series(kernel, info)
            return info
        if os.geteuid() != 0:
            raise UserError("building a lab image needs root (mmdebstrap, mkfs.ext4 -d)")
        for tool in ("mmdebstrap", "mkfs.ext4", "qemu-img"):
            if not shutil.which(tool):
                raise UserError(f"{tool} not found: run `bash scripts/setup` first")
        for old in images.glob(f".tmp-{key}-*"):  # a build that was killed: its mounts, then its files
            unmount_below(old)
            shutil.rmtree(old, ignore_errors=True)
        work = images / f".tmp-{key}-{os.getpid()}"
        work.mkdir()
        try:
            info = _for_suite(_build(suite, packages, key, work, final, private_key, progress), suite)
        finally:
            unmount_below(work)
            shutil.rmtree(work, ignore_errors=True)
    _check_series(kernel, info)
    return info


def _build(suite: str, packages: List[str], key: str, work: Path, final: Path,
           private_key: Path, progress: Progress) -> ImageInfo:
    started = time.monotonic()
    root = work / "root"
    mirror = host_mirror()
    progress(f"[image] building {key}: Debian {suite} from {mirror}, {len(packages)} packages")
    guest_provision = "/usr/local/lib/probekit/provision"
    cmd = [
        "mmdebstrap", "--variant=minbase", "--mode=root", "--format=directory",
        "--aptopt=APT::Install-Recommends \"false\"",
        # mirrors frozen at a date (snapshots) serve Release files past their Valid-Until
        "--aptopt=Acquire::Check-Valid-Until \"false\"",
        "--include=" + ",".join(packages),
        f"--customize-hook=mkdir -p \"$1{guest_provision}\"",
        f"--customize-hook=cp -a {PROVISION_DIR}/. \"$1{guest_provision}/\"",
        *(f"--customize-hook=chroot \"$1\" apt-get install -y -q -t {extra} linux-image-amd64 linux-headers-amd64"
          for extra in image_suites(suite)[1:]),
        f"--customize-hook=cp {private_key.with_suffix('.pub')} \"$1/tmp/lab_key.pub\"",
        f"--customize-hook=chroot \"$1\" sh {guest_provision}/node.sh /tmp/lab_key.pub",
        "--customize-hook=rm -f \"$1/tmp/lab_key.pub\"",
        base_suite(suite), str(root), mirror,
    ]
    cmd += [f"deb {mirror} {extra} main" for extra in image_suites(suite)[1:]]
    _run_logged(cmd, work / "mmdebstrap.log", progress)
    progress(f"[image] mmdebstrap done in {time.monotonic() - started:.0f} s")

    kernels = _kernel_releases(root, image_suites(suite))
    out = work / "image"
    out.mkdir()
    for release in kernels.values():
        shutil.copy2(root / "boot" / f"vmlinuz-{release}", out / f"vmlinuz-{release}")
        shutil.copy2(root / "boot" / f"initrd.img-{release}", out / f"initrd.img-{release}")
    used = int(subprocess.run(["du", "-sb", str(root)], check=True, capture_output=True,
                              text=True).stdout.split()[0])
    size_mib = used * 13 // 10 // (1 << 20) + 1536   # headroom for workloads and traces
    raw = work / "rootfs.raw"
    progress(f"[image] mkfs.ext4 -d ({used >> 20} MiB of files, {size_mib} MiB filesystem)")
    subprocess.run(["mkfs.ext4", "-q", "-F", "-L", "probekit-root", "-d", str(root), str(raw),
                    f"{size_mib}M"], check=True)
    shutil.rmtree(root)
    progress("[image] qemu-img convert -> qcow2")
    subprocess.run(["qemu-img", "convert", "-O", "qcow2", str(raw), str(out / "rootfs.qcow2")], check=True)
    raw.unlink()
    shutil.copy2(work / "mmdebstrap.log", out / "mmdebstrap.log")

    base = kernels[base_suite(suite)]
    info = ImageInfo(key=key, suite=base_suite(suite), kernel_release=base, directory=final,
                     rootfs=final / "rootfs.qcow2", vmlinuz=final / f"vmlinuz-{base}",
                     initrd=final / f"initrd.img-{base}", ssh_private_key=private_key,
                     ssh_public_key=private_key.with_suffix(".pub"), packages=packages, kernels=kernels)
    write_image_record(info, out / "image.json")
    if final.exists():
        shutil.rmtree(final)
    os.rename(out, final)
    progress(f"[image] built {key} (kernels {', '.join(kernels.values())}) in {time.monotonic() - started:.0f} s")
    return info


def _release_order(release: str) -> List[int]:
    return [int(n) for n in re.findall(r"\d+", release)]


def _kernel_releases(root: Path, suites: List[str]) -> Dict[str, str]:
    """suite -> uname -r of its kernel in the built tree: the base suite's is the oldest, a
    backports suite's the newest (backports only ever carries a newer series)."""
    kernels = sorted((p.name[len("vmlinuz-"):] for p in (root / "boot").glob("vmlinuz-*")), key=_release_order)
    if len(kernels) != len(suites):
        raise UserError(f"expected {len(suites)} kernel(s) in the image ({', '.join(suites)}), "
                        f"found {kernels or 'none'}")
    return dict(zip(suites, kernels))


def _for_suite(info: ImageInfo, suite: str) -> ImageInfo:
    """The image as seen by one of its kernel suites: that kernel's release and boot files
    (an image of one kernel, as images before BUILDER_VERSION 2's layout, is itself)."""
    release = info.kernels.get(suite, info.kernel_release)
    if release == info.kernel_release:
        return info._replace(suite=suite)
    return info._replace(suite=suite, kernel_release=release, vmlinuz=info.directory / f"vmlinuz-{release}",
                         initrd=info.directory / f"initrd.img-{release}")


def _check_series(kernel: str, info: ImageInfo) -> None:
    """A numeric request must be met by the kernel the suite really ships."""
    if kernel in KERNEL_SUITES.values():
        return
    if not (info.kernel_release == kernel or info.kernel_release.startswith(kernel + ".")
            or info.kernel_release.startswith(kernel + "-")):
        raise UserError(f"kernel {kernel} requested but Debian {info.suite} ships "
                        f"{info.kernel_release}; ask for {info.suite!r} or another version")


def unmount_below(path: Path) -> None:
    """Detach every mount under `path`, deepest first. mmdebstrap mounts /proc, /sys and /dev
    (the host's /dev/shm among them) in its chroot; a build stopped before it unmounted them
    would leave them behind, and removing the tree would reach into the host's /dev/shm."""
    prefix = str(path.resolve()) + "/"
    with open("/proc/self/mountinfo") as mounts:
        points = {line.split()[4].replace("\\040", " ") for line in mounts}
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", point], check=False)


#: how long a stopped build step may take to end by itself (mmdebstrap then unmounts its
#: chroot) before its session is killed; an apt or dpkg run inside it can ignore SIGTERM
STOP_GRACE_S = 20.0


def _stop_session(proc: subprocess.Popen) -> None:
    """SIGTERM to the step's session, SIGKILL after STOP_GRACE_S; unmount_below does the rest."""
    for sig, grace in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(grace)
            break
        except subprocess.TimeoutExpired:
            continue


def _run_logged(cmd: List[str], log: Path, progress: Progress) -> None:
    """Run a long build step, keeping its full output in a log and showing its progress; if
    this process is stopped meanwhile, the step is stopped too (and waited for)."""
    with log.open("w") as sink:
        # its own session: when this process is stopped, so is every process of the step
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", start_new_session=True)
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                sink.write(line)
                if line.startswith(("I: ", "E: ", "W: ")) or "Setting up linux-image" in line:
                    progress("[image] " + line.rstrip())
        except BaseException:
            _stop_session(proc)
            raise
        code = proc.wait()
    if code != 0:
        kept = log.parent.parent / (log.parent.name.lstrip(".") + ".failed.log")
        shutil.copy2(log, kept)
        tail = kept.read_text(errors="replace").splitlines()[-15:]
        raise UserError(f"mmdebstrap failed ({code}); log {kept}; last lines: " + " | ".join(tail))


class _locked:
    """An exclusive flock held for a with-block: concurrent builders wait, not collide."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = -1

    def __enter__(self) -> "_locked":
        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def _main(argv: List[str]) -> None:
    """`python -m labs.vm.images KERNEL`: build or show the cached image (for scripts and benches).
    SIGTERM (a test session's prebuild being stopped) ends it through its clean-up."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    info = build_image(argv[0] if argv else "6.1", progress=lambda m: print(m, file=sys.stderr, flush=True))
    print(json.dumps(info.to_json(), indent=2))


if __name__ == "__main__":
    _main(sys.argv[1:])

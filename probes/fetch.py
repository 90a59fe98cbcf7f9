"""Download Debian kernel packages through a private apt setup and cache them.

Why private: the report must be able to look at any kernel Debian ships
(bullseye 5.10 .. sid 7.x) on a machine whose own apt setup points at one
release only, and it must not change that setup. Every apt call here gets its
own sources.list, state, lists and archive cache under ~/.cache/probekit/apt/;
downloaded packages are kept per kernel ABI under ~/.cache/probekit/kernels/.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Tuple

from discover.errors import UserError, at_exit, cache_root, forget, run_child

MIRROR = "http://deb.debian.org/debian"
SUITES = ("bullseye", "bookworm", "bookworm-backports", "trixie", "trixie-backports", "sid")
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
#: refresh the package indexes when they are older than this (seconds)
INDEX_MAX_AGE = 24 * 3600
MANIFEST = "manifest.json"

#: linux-image-<abi>-amd64[-unsigned]; <abi> as Debian spells it: 5.10.0-32, 6.12.95+deb12, 7.2.13+deb14
_IMAGE_RE = re.compile(r"^linux-image-(\d+\.\d+(?:\.\d+)?(?:-\d+)?(?:\+deb\d+(?:\.\d+)?)?)-amd64(-unsigned)?$")



def kernels_dir() -> Path:
    return cache_root() / "kernels"


class KernelRelease(NamedTuple):
    """One Debian amd64 kernel build, named by the ABI string in its package names."""

    abi: str
    packages: Tuple[str, ...]  # package names to download, image first


def abi_sort_key(abi: str) -> Tuple[int, ...]:
    """Order ABIs numerically: 6.12.117+deb13 after 6.12.95+deb12, 5.10.0-32 after 5.10.0-30."""
    return tuple(int(n) for n in re.findall(r"\d+", abi))


def abi_matches(abi: str, wanted: str) -> bool:
    """True if a version as the user writes it (6.1, 6.12.95, 6.1.0-50, 7.2.13+deb14) names this ABI."""
    return abi == wanted or any(abi.startswith(wanted + sep) for sep in ".-+")


class PrivateApt:
    """apt-get/apt-cache confined to their own directories under the probekit cache."""

    def __init__(self, root: Optional[Path] = None) -> None:
        self.root = root or cache_root() / "apt"
        self.warnings: List[str] = []
        self.update_failed: Optional[str] = None

    def _prepare(self) -> None:
        for sub in ("state/lists/partial", "cache/archives/partial", "etc/sources.list.d",
                    "etc/preferences.d", "etc/apt.conf.d"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "state" / "status").touch()
        if not KEYRING.exists():
            raise UserError(f"{KEYRING} is missing: install the debian-archive-keyring package")
        lines = [f"deb [signed-by={KEYRING}] {MIRROR} {suite} main" for suite in SUITES]
        (self.root / "etc" / "sources.list").write_text("\n".join(lines) + "\n")

    def options(self) -> List[str]:
        """The -o options that point apt at the private directories only."""
        etc = self.root / "etc"
        settings = {
            "Dir::State": self.root / "state",
            "Dir::State::status": self.root / "state" / "status",
            "Dir::Cache": self.root / "cache",
            # keep the binary package cache (Docker-style images switch it off): 20x faster queries
            "Dir::Cache::pkgcache": "pkgcache.bin",
            "Dir::Cache::srcpkgcache": "srcpkgcache.bin",
            "Dir::Etc::SourceList": etc / "sources.list",
            "Dir::Etc::SourceParts": etc / "sources.list.d",
            "Dir::Etc::Preferences": etc / "preferences",
            "Dir::Etc::PreferencesParts": etc / "preferences.d",
            "APT::Architecture": "amd64",
            "APT::Architectures::": "amd64",
            "APT::Sandbox::User": "root" if os.geteuid() == 0 else "",
            "Acquire::Languages": "none",
        }
        opts: List[str] = []
        for key, value in settings.items():
            if value != "":
                opts += ["-o", f"{key}={value}"]
        return opts

    def _run(self, tool: str, args: List[str], cwd: Optional[Path] = None) -> str:
        if shutil.which(tool) is None:
            raise UserError(f"{tool} not found: fetching Debian kernels needs apt")
        proc = run_child([tool, "-q", *self.options(), *args], cwd=cwd,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
            raise UserError(f"{tool} {args[0]} failed: {last}")
        self.warnings = [line for line in proc.stderr.splitlines() if line.startswith(("W:", "E:"))]
        return proc.stdout

    def indexes_age(self) -> Optional[float]:
        """Seconds since the package indexes were fetched, None if never."""
        lists = list((self.root / "state" / "lists").glob("*_Packages*"))
        if not lists:
            return None
        return time.time() - min(p.stat().st_mtime for p in lists)

    def update(self) -> None:
        """Fetch the package indexes; apt-get exits 0 when a mirror is unreachable, so its
        warnings are kept in `update_failed` for the answers given from the old lists."""
        self._prepare()
        self._run("apt-get", ["update"])
        failed = [w for w in self.warnings if "Failed to fetch" in w or "failed to download" in w]
        self.update_failed = failed[0][2:].strip() if failed else None

    def staleness(self) -> str:
        """`; package lists from <date> (<age>)`, and why they were not updated if that failed:
        what an answer from the lists rests on (offline, old lists answer without a word from apt)."""
        age = self.indexes_age()
        if age is None:
            lists = "no package lists"
        else:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(time.time() - age))
            lists = f"package lists from {when} ({describe_age(age)})"
        failed = f": updating them failed ({self.update_failed[:120]})" if self.update_failed else ""
        return f"; {lists}{failed}"

    def ensure_indexes(self) -> None:
        age = self.indexes_age()
        if age is None or age > INDEX_MAX_AGE:
            self.update()

    def releases(self) -> Dict[str, KernelRelease]:
        """Every amd64 kernel ABI the reachable suites offer, with the packages that make it up."""
        names = self._run("apt-cache", ["pkgnames", "linux-image-"]).split()
        images: Dict[str, List[str]] = {}
        for name in names:
            m = _IMAGE_RE.match(name)
            if m:
                images.setdefault(m.group(1), []).append(name)
        releases = {}
        for abi, pkgs in images.items():
            # the unsigned build when there is one: same kernel, no signature wrapper
            pkgs.sort(key=lambda n: not n.endswith("-unsigned"))
            releases[abi] = KernelRelease(abi, (pkgs[0],))
        return releases

    def split_parts(self, package: str, abi: str) -> List[str]:
        """Packages a split (6.19+/7.x) image depends on: linux-base/-binary/-modules of the same ABI."""
        out = self._run("apt-cache", ["depends", "--no-recommends", "--no-suggests", package])
        parts = []
        for line in out.splitlines():
            dep = line.strip()
            if dep.startswith("Depends:"):
                name = dep.split(":", 1)[1].strip().strip("<>")
                if abi in name and name not in parts:
                    parts.append(name)
        # prefer the unsigned kernel image when Debian offers it
        unsigned = [p.replace("linux-binary-", "linux-binary-unsigned-") for p in parts
                    if p.startswith("linux-binary-") and "unsigned" not in p]
        if unsigned and self.exists(unsigned[0]):
            parts = [unsigned[0] if p.startswith("linux-binary-") else p for p in parts]
        return parts

    def exists(self, package: str) -> bool:
        """A real package with a downloadable version (not a name only other packages mention)."""
        proc = subprocess.run(["apt-cache", *self.options(), "show", "--no-all-versions", package],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        return proc.returncode == 0 and "\nFilename:" in "\n" + proc.stdout

    def download(self, packages: List[str], dest: Path) -> None:
        self._run("apt-get", ["download", *packages], cwd=dest)


def describe_age(seconds: float) -> str:
    """'3 days old', '5 hours old', '12 minutes old': an age a reader takes in at once."""
    unit, length = ("day", 86400) if seconds >= 86400 else ("hour", 3600) if seconds >= 3600 else ("minute", 60)
    count = int(seconds // length)
    return f"{count} {unit}{'' if count == 1 else 's'} old"


def cached_kernels() -> Dict[str, Path]:
    """ABI -> directory of kernels whose download completed (a manifest is written last)."""
    root = kernels_dir()
    if not root.is_dir():
        return {}
    return {d.name: d for d in root.iterdir() if (d / MANIFEST).is_file()}


def pick(abis: List[str], wanted: str) -> Optional[str]:
    """The newest ABI that a user's version string names."""
    hits = [abi for abi in abis if abi_matches(abi, wanted)]
    return max(hits, key=abi_sort_key) if hits else None


def fetch_kernel(wanted: str, refresh: bool = False, apt: Optional[PrivateApt] = None,
                 log=None) -> Path:
    """Directory holding the .deb files of the kernel named by `wanted`, downloading if needed.

    A kernel already in the cache that matches `wanted` is used without asking the
    mirror, so that reports and CI reruns are stable and work offline.
    """
    wanted = wanted.strip()
    if not re.match(r"^\d+\.\d+", wanted):
        raise UserError(f"{wanted!r} is not a kernel version (expected e.g. 5.10, 6.12, 6.1.0-50, 7.2.13+deb14)")
    cached = cached_kernels()
    hit = pick(list(cached), wanted)
    if hit and not refresh:
        return cached[hit]
    apt = apt or PrivateApt()
    apt.ensure_indexes()
    releases = apt.releases()
    abi = pick(list(releases), wanted)
    if abi is None and (apt.indexes_age() or 0) > 60:
        apt.update()
        releases = apt.releases()
        abi = pick(list(releases), wanted)
    if abi is None:
        known = sorted({".".join(a.split(".")[:2]) for a in releases}, key=abi_sort_key)
        raise UserError(f"no Debian amd64 kernel {wanted} in {', '.join(SUITES)} "
                        f"(available: {', '.join(known)}){apt.staleness()}")
    # backports indexes keep signed images of older ABIs whose modules packages are gone:
    # take the newest ABI whose every part can still be downloaded
    for abi in sorted((a for a in releases if abi_matches(a, wanted)), key=abi_sort_key, reverse=True):
        if abi in cached and not refresh:
            return cached[abi]
        image = releases[abi].packages[0]
        packages = [image] + apt.split_parts(image, abi)
        if all(apt.exists(p) for p in packages[1:]):
            break
        if log:
            log(f"skipping {abi}: some of {', '.join(packages[1:])} are no longer in the archive")
    else:
        raise UserError(f"no complete Debian amd64 kernel {wanted}: the archive lists images whose "
                        f"modules packages are gone{apt.staleness()}")
    dest = kernels_dir() / abi
    partial = kernels_dir() / f".{abi}.{os.getpid()}.partial"  # concurrent fetches do not collide
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    remove_partial = at_exit(lambda: shutil.rmtree(partial, ignore_errors=True))  # any failure from here on
    if log:
        log(f"downloading {', '.join(packages)} from {MIRROR}")
    apt.download(packages, partial)
    debs = sorted(p.name for p in partial.glob("*.deb"))
    (partial / MANIFEST).write_text(json.dumps({"abi": abi, "packages": packages, "debs": debs,
                                                "mirror": MIRROR}, indent=1) + "\n")
    if (dest / MANIFEST).is_file():  # another run finished the same kernel meanwhile
        shutil.rmtree(partial, ignore_errors=True)
        forget(remove_partial)
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    partial.rename(dest)
    forget(remove_partial)
    return dest

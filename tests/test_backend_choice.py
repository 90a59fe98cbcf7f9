"""--backend auto|core|bcc on this host's real facts (Debian 12: libbpf1 1.1, kernel BTF for
vmlinux, no NFS module loaded, no bcc in the venv) and on the lab kernels' releases: each
named check, the one --verbose line auto says, and the one-line error when nothing can run."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
from pathlib import Path
from typing import Any, Dict

import pytest

from discover.errors import UserError
from discover.profile import KernelProfile
from discover.spec import OPS, load_spec
from probes.backend_choice import bcc_check, btf_check, choose, kernel_check, libbpf_check, object_check
from probes.build_core import build
from probes.runtime import BTF_DIR
from probes.select import KernelFacts, select

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "probes" / "specs" / "nfs.toml"
FIXTURES = REPO / "tests" / "fixtures"


@pytest.fixture(scope="module")
def spec() -> Dict[str, Any]:
    return load_spec(SPEC)


@pytest.fixture(scope="module")
def nfs_modules(spec: Dict[str, Any]) -> Any:
    """The modules whose BTF the 6.1.0-50 lab kernel's choice of every NFS op needs."""
    profile = KernelProfile(json.loads(gzip.decompress((FIXTURES / "6.1.0-50-amd64" / "profile.json.gz").read_bytes())))
    return select(spec, KernelFacts.from_profile(profile), list(OPS)).btf_modules()


@pytest.fixture(scope="module")
def objects(spec: Dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding nfs.toml's object, as a wheel ships it."""
    out = tmp_path_factory.mktemp("objects")
    build(SPEC, out / "nfs.bpf.o")
    return out


def installed_libbpf() -> str:
    """libbpf1's version as dpkg has it (1:1.1.2-0+deb12u1 -> 1.1)."""
    version = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "libbpf1"], capture_output=True, text=True,
                             check=True).stdout
    return ".".join(version.split(":")[-1].split(".")[:2])


def test_libbpf_check_loads_the_installed_libbpf1() -> None:
    lib, said = libbpf_check()
    assert lib is not None and said == f"libbpf {installed_libbpf()}"


def test_libbpf_check_says_why_a_library_does_not_load() -> None:
    """Bullseye has libbpf.so.0 (0.3) only: a soname that is not there is one line."""
    assert not Path("/usr/lib/x86_64-linux-gnu/libbpf.so.0").exists()
    lib, said = libbpf_check("libbpf.so.0")
    assert lib is None and said.startswith("cannot load libbpf.so.0: ") and "\n" not in said


@pytest.mark.parametrize("kernel", sorted(p.name for p in FIXTURES.iterdir() if p.name[0].isdigit()))
def test_kernel_check_takes_5_15_and_later(kernel: str) -> None:
    """Of the lab kernels only 5.10 lacks bpf_task_pt_regs, which the object's programs use."""
    blocker = kernel_check(kernel, "x86_64")
    if kernel.startswith("5.10."):
        assert blocker == f"kernel {kernel} is older than 5.15 (bpf_task_pt_regs)"
    else:
        assert blocker is None
    assert kernel_check(os.uname().release, os.uname().machine) is None
    # Debian's arm64 kernels: the objects' kprobe programs read x86-64 registers
    assert kernel_check(kernel, "aarch64") == "the CO-RE objects are built for x86_64, this machine is aarch64"


def test_btf_check_needs_the_module_btf_of_the_chosen_points(nfs_modules: Any) -> None:
    assert btf_check(BTF_DIR, ()) is None  # this host's kernel has BTF
    absent = [m for m in nfs_modules if not (BTF_DIR / m).is_file()]
    assert nfs_modules and absent == nfs_modules  # no NFS module loaded on the host
    assert btf_check(BTF_DIR, nfs_modules) == f"no module BTF for {', '.join(nfs_modules)} ({BTF_DIR})"


def test_object_check_finds_the_shipped_object(spec: Dict[str, Any], objects: Path, tmp_path: Path) -> None:
    assert object_check(spec, objects) == (objects / "nfs.bpf.o", "")
    path, why = object_check(spec, tmp_path)
    assert path is None and why == f"no CO-RE object for nfs ({tmp_path / 'nfs.bpf.o'})"
    (tmp_path / "nfs.bpf.o").mkdir()  # there, but not a file to read
    assert object_check(spec, tmp_path)[0] is None


def test_auto_takes_core_where_every_check_passes(spec: Dict[str, Any], objects: Path) -> None:
    """The host's vmlinux BTF and libbpf 1.1, for a choice with no module point (a local fs on
    built-in code would be one): core, and the line says what allowed it."""
    choice = choose("auto", spec, os.uname().release, (), BTF_DIR, objects)
    assert choice.name == "core" and choice.object_path == objects / "nfs.bpf.o"
    assert choice.why == f"core (auto: libbpf {installed_libbpf()}; BTF: vmlinux; nfs.bpf.o)"
    assert choose("core", spec, os.uname().release, (), BTF_DIR, objects).why.startswith("core (libbpf ")


def test_auto_without_module_btf_falls_back_to_bcc_or_stops_in_one_line(spec: Dict[str, Any], objects: Path,
                                                                          nfs_modules: Any) -> None:
    why = f"no module BTF for {', '.join(nfs_modules)} ({BTF_DIR})"
    no_bcc = bcc_check()
    if no_bcc is None:
        choice = choose("auto", spec, os.uname().release, nfs_modules, BTF_DIR, objects)
        assert (choice.name, choice.why) == ("bcc", f"bcc (auto: {why})")
    else:  # this venv has no bcc: neither loader can run, said in one line
        with pytest.raises(UserError) as exc:
            choose("auto", spec, os.uname().release, nfs_modules, BTF_DIR, objects)
        assert str(exc.value) == f"no BPF loader here: core: {why}; bcc: {no_bcc}"
    with pytest.raises(UserError) as exc:
        choose("core", spec, os.uname().release, nfs_modules, BTF_DIR, objects)
    assert str(exc.value) == f"--backend core: {why}: use --backend bcc"
    assert choose("bcc", spec, os.uname().release, nfs_modules, BTF_DIR, objects).why == "bcc (--backend bcc)"


def test_5_10_says_bcc_in_one_line(spec: Dict[str, Any], objects: Path) -> None:
    """Debian 11's kernel, as its lab run recorded it: auto says bcc and why, first check first."""
    run = json.loads(gzip.decompress((FIXTURES / "5.10.0-32-amd64" / "probes" / "guest-run.json.gz").read_bytes()))
    release = run["main"]["data"]["kernel"]["release"]
    why = f"kernel {release} is older than 5.15 (bpf_task_pt_regs)"
    no_bcc = bcc_check()
    if no_bcc is None:
        assert choose("auto", spec, release, ["nfs"], BTF_DIR, objects).why == f"bcc (auto: {why})"
    else:
        with pytest.raises(UserError) as exc:
            choose("auto", spec, release, ["nfs"], BTF_DIR, objects)
        assert str(exc.value) == f"no BPF loader here: core: {why}; bcc: {no_bcc}"


def test_the_server_probe_is_in_the_nfsd_object_as_the_clients_in_nfs(tmp_path: Path) -> None:
    """nfsdtop's server probe is part of the one kernel side: nfsd.toml's object carries the
    request maps and programs, so auto takes core for it where the machine can run core."""
    nfsd = load_spec(SPEC.parent / "nfsd.toml")
    build(SPEC.parent / "nfsd.toml", tmp_path / "nfsd.bpf.o")
    assert choose("auto", nfsd, os.uname().release, (), BTF_DIR, tmp_path).name == "core"
    assert choose("core", nfsd, os.uname().release, (), BTF_DIR, tmp_path).name == "core"

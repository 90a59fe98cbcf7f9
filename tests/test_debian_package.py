"""The Debian package (scripts/build-deb) carries what a client installs: every command of
pyproject.toml but the lab's on PATH (the tracing tools in /usr/sbin, discover and probes in
/usr/bin) and resolving to its code in the private directory, each with its man page and a
--version that is the package's, the examples in /usr/share/doc/probekit/examples, no VM
lab (labs/ runs from a checkout: docs/install.md), the exporter's
unit reading /etc/default/nfs-exporter, the sysctl file shipped but not applied, the Prometheus
rules in /usr/share/probekit/prometheus/, the CO-RE objects, and Depends on Debian's packages of
every Python dependency. Built once from the working tree (about 30 s) and read back with
dpkg-deb; lintian, when installed, must find no error.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from labs.vm.images import KERNEL_SUITES, read_package_list
from needs import missing

REPO = Path(__file__).resolve().parent.parent
PRIVATE = "usr/lib/probekit"
BUILD_TOOLS = ("dpkg-buildpackage", "dh", "dh_python3", "pybuild")
#: commands of [project.scripts] the package leaves out: the lab's (packaging/debian/without-labs)
NOT_PACKAGED = ("labs",)
#: commands any user runs (files and kernel packages): /usr/bin; the tracing tools need root: /usr/sbin
USER_COMMANDS = ("discover", "probes")
#: lintian's tags for a command without a man page (none may be overridden)
MAN_PAGE_TAGS = ("no-manual-page", "binary-without-manpage")


def _project_section(name: str) -> str:
    """One [section] of pyproject.toml, as text."""
    return (REPO / "pyproject.toml").read_text().split(f"[{name}]", 1)[1].split("\n[", 1)[0]


def _dpkg_deb(*args: str) -> str:
    return subprocess.run(["dpkg-deb", *args], check=True, stdout=subprocess.PIPE,
                          universal_newlines=True).stdout


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The .deb built by the project script; its absence of tools is a skip on a contributor's
    machine and a failure in CI, which must run every test."""
    absent = [tool for tool in BUILD_TOOLS if shutil.which(tool, path="/usr/bin:/bin") is None]
    if absent:
        why = (f"building the Debian package needs {', '.join(absent)}: bash scripts/setup installs "
               "the build tools (scripts/apt-packages.txt)")
        missing(why)
    out = tmp_path_factory.mktemp("deb")
    res = subprocess.run(["bash", str(REPO / "scripts/build-deb"), str(out)], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, universal_newlines=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:]
    yield Path(res.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tree(deb: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package's files, unpacked."""
    root = tmp_path_factory.mktemp("root")
    _dpkg_deb("-x", str(deb), str(root))
    return root


def test_the_co_re_objects_are_the_wheels(tree: Path) -> None:
    """The package is built from the wheel (pybuild), whose build compiles one object per spec
    and the spec's parsed copy beside it: the same files, where the code looks for them
    (libbpf1 loads the objects: Depends)."""
    specs = sorted(p.stem for p in (REPO / "probes" / "specs").glob("*.toml"))
    objects = tree / PRIVATE / "probes" / "objects"
    assert sorted(p.name for p in objects.iterdir()) == sorted(f"{spec}.{kind}" for spec in specs
                                                               for kind in ("bpf.o", "spec.json"))
    assert all((objects / f"{spec}.bpf.o").read_bytes()[:4] == b"\x7fELF" for spec in specs)
    assert all(json.loads((objects / f"{spec}.spec.json").read_text()) for spec in specs)


def test_the_probe_source_and_both_loader_layers_are_shipped(tree: Path) -> None:
    """bcc compiles the probe on the client from the installed source and its bcc layer (a
    Debian 11 client has no prebuilt object to fall back on): both are the checkout's."""
    shipped = tree / PRIVATE / "bpf"
    for name in ("probe.bpf.c", "bcc.h", "core.h"):
        assert (shipped / name).read_bytes() == (REPO / "bpf" / name).read_bytes(), name


def _scripts() -> Dict[str, str]:
    """NAME -> entry point of every command the package installs."""
    return {name: target for name, target in
            re.findall(r'^([\w-]+) = "([\w.:]+)"$', _project_section("project.scripts"), re.M)
            if name not in NOT_PACKAGED}


def _bindir(name: str) -> str:
    return "usr/bin" if name in USER_COMMANDS else "usr/sbin"


def test_every_command_is_on_path_and_runs_from_the_private_directory(deb: Path, tree: Path, tmp_path: Path) -> None:
    """Each command where Debian's tracing tools put theirs, answering --help and --version (the
    package's own version, which the wheel's metadata carries) from the packaged code."""
    scripts = _scripts()
    version = _dpkg_deb("--field", str(deb), "Version").strip()
    assert re.fullmatch(r"\d+\.\d+\.\d+\+git\d+\.[0-9a-f]+", version), version
    assert sorted(p.name for p in (tree / "usr/bin").iterdir()) == sorted(USER_COMMANDS)
    assert sorted(p.name for p in (tree / "usr/sbin").iterdir()) == sorted(set(scripts) - set(USER_COMMANDS))
    (distinfo,) = (tree / PRIVATE).glob("probekit-*.dist-info")
    assert distinfo.name == f"probekit-{version}.dist-info"
    private = str(tree / PRIVATE)
    for name, target in scripts.items():
        script = tree / _bindir(name) / name
        assert os.access(script, os.X_OK), name
        text = script.read_text()
        assert f'sys.path.insert(0, "/{PRIVATE}")' in text, text
        # a tracing tool starts without site (its start's cost), Debian's dist-packages added by hand
        interpreter = text.splitlines()[0][2:].split()
        assert interpreter == (["/usr/bin/python3"] if name in USER_COMMANDS else ["/usr/bin/python3", "-S"]), text
        assert ('sys.path.append("/usr/lib/python3/dist-packages")' in text) == (name not in USER_COMMANDS), text
        # the script as installed, its private directory moved to where dpkg-deb unpacked it
        moved = tmp_path / name
        moved.write_text(text.replace(f'"/{PRIVATE}"', repr(private)))
        run = [sys.executable, *interpreter[1:], str(moved)]
        res = subprocess.run([*run, "--help"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, universal_newlines=True, cwd=tmp_path)
        assert res.returncode == 0 and f"Usage: {name} " in res.stdout, res.stdout
        res = subprocess.run([*run, "--version"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, universal_newlines=True, cwd=tmp_path)
        assert (res.returncode, res.stdout) == (0, f"{name} {version}\n"), res.stdout
    # and what they import is the packaged code, not this checkout's (the venv has it too)
    modules = sorted({target.split(":")[0] for target in scripts.values()})
    check = (f"import sys; sys.path.insert(0, {private!r}); import importlib; "
             f"print([m for m in {modules!r} if not importlib.import_module(m).__file__.startswith({private!r})])")
    res = subprocess.run([sys.executable, "-c", check], stdout=subprocess.PIPE, universal_newlines=True,
                         check=True, cwd=tmp_path)
    assert res.stdout.strip() == "[]"
    # the version read from the metadata beside the packages, without importlib.metadata (1.4 MiB)
    check = (f"import sys; sys.path.insert(0, {private!r}); from discover.version import probekit_version; "
             "print(probekit_version(), 'importlib.metadata' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", check], stdout=subprocess.PIPE, universal_newlines=True,
                         check=True, cwd=tmp_path)
    assert res.stdout.split() == [version, "False"]


def test_every_command_has_its_man_page(deb: Path, tree: Path) -> None:
    """A page per command, section 8 for /usr/sbin's and 1 for /usr/bin's, rendered from the
    command's --help at build time: its usage, its examples, the example run where
    docs/examples has one, and the package's version; man renders each without a warning."""
    version = _dpkg_deb("--field", str(deb), "Version").strip()
    for name in _scripts():
        section = 1 if name in USER_COMMANDS else 8
        page = tree / f"usr/share/man/man{section}/{name}.{section}.gz"
        assert page.is_file(), page
        env = dict(os.environ, MANWIDTH="80", LC_ALL="C.UTF-8")
        res = subprocess.run(["man", "--warnings", "-E", "UTF-8", "-l", "-Tutf8", str(page)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, universal_newlines=True, env=env)
        assert res.returncode == 0 and not res.stderr, (name, res.stderr)
        text = re.sub(r".\x08", "", res.stdout)
        assert f"probekit {version}" in text and "SYNOPSIS" in text and f"{name} [OPTIONS]" in text, name
        assert "--version" in text, name
        example = REPO / "docs" / "examples" / f"{name}_example.txt"
        if example.is_file():
            first_run = next(line for line in example.read_text().splitlines() if line.startswith("# "))
            assert first_run in text, (name, first_run)


def test_the_examples_are_installed(tree: Path) -> None:
    shipped = tree / "usr/share/doc/probekit/examples"
    examples = sorted((REPO / "docs" / "examples").glob("*_example.txt"))
    assert examples and sorted(p.name for p in shipped.iterdir()) == [p.name for p in examples]
    assert all((shipped / p.name).read_bytes() == p.read_bytes() for p in examples)
    # and what changed for users, as dh_installchangelogs names an upstream changelog
    assert (tree / "usr/share/doc/probekit/changelog.gz").is_file()


def test_the_autopkgtest_runs_every_command_and_a_trace() -> None:
    """debian/tests: the script the lab runs as root in a guest (docs/labs.md), declared with
    what it needs."""
    control = (REPO / "packaging/debian/tests/control").read_text()
    assert re.search(r"^Tests: commands$", control, re.M) and "needs-root" in control
    script = (REPO / "packaging/debian/tests/commands").read_text()
    assert os.access(REPO / "packaging/debian/tests/commands", os.X_OK)
    assert '"$name" --version' in script and "man -w" in script and "fsslower -t ext4" in script


def test_conflicts_with_the_tools_of_the_same_names(deb: Path) -> None:
    """libbpf-tools installs /usr/sbin/nfsslower, nfsdist, fsslower and fsdist too: one package
    has those names at a time (docs/install.md); bpfcc-tools' carry -bpfcc and do not clash."""
    assert _dpkg_deb("--field", str(deb), "Conflicts").strip() == "libbpf-tools"


def test_the_lab_is_not_in_the_package(deb: Path, tree: Path) -> None:
    """An NFS client gets the tools, not the VM lab: no labs/, no labs command, and no file of
    dpkg-deb's listing under either; the metadata left in the private directory agrees."""
    listed = [line.split()[-1] for line in _dpkg_deb("--contents", str(deb)).splitlines()]
    assert "./usr/sbin/nfsslower" in listed
    lab = [path for path in listed if path in ("./usr/bin/labs", "./usr/sbin/labs") or path.startswith(f"./{PRIVATE}/labs")]
    assert lab == []
    (distinfo,) = (tree / PRIVATE).glob("probekit-*.dist-info")
    assert (distinfo / "top_level.txt").read_text().split() == ["bpf", "discover", "probes"]
    assert not re.search(r"^labs\b", (distinfo / "entry_points.txt").read_text(), re.M)
    # RECORD names what is there, with its hash (pip's check of an install)
    for row in (distinfo / "RECORD").read_text().splitlines():
        path, digest, _ = row.rsplit(",", 2)
        assert not path.startswith("labs/") and path != "../scripts/labs", row
        if digest and not path.startswith("../"):
            data = (tree / PRIVATE / path).read_bytes()
            assert digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode(), row
    # and nothing suggests the lab's own tools (QEMU, Vagrant, mmdebstrap) to a client
    suggests = [s.strip() for s in _dpkg_deb("--field", str(deb), "Suggests").split(",")]
    assert sorted(suggests) == ["python3-bpfcc", "python3-zstandard"]


def test_exporter_unit_reads_its_options_file(deb: Path, tree: Path) -> None:
    unit = (tree / "lib/systemd/system/nfs-exporter.service").read_text()
    assert "EnvironmentFile=-/etc/default/nfs-exporter\n" in unit
    assert "ExecStart=/usr/sbin/nfs-exporter $NFS_EXPORTER_ARGS\n" in unit
    options = (tree / "etc/default/nfs-exporter").read_text()
    assert re.search(r'^NFS_EXPORTER_ARGS=""$', options, re.M)
    assert re.search(r'^#NFS_EXPORTER_ARGS="--address 0\.0\.0\.0"$', options, re.M)
    # an administrator's edits survive upgrades
    assert "/etc/default/nfs-exporter" in _dpkg_deb("--info", str(deb), "conffiles").split()
    # installed disabled: the postinst enables the unit only where it was enabled before (an
    # upgrade), debhelper's --no-enable snippet; an enabled unit is restarted on upgrade
    postinst = _dpkg_deb("--info", str(deb), "postinst")
    assert "if deb-systemd-helper debian-installed 'nfs-exporter.service'; then" in postinst
    assert "_dh_action=restart" in postinst


def test_the_options_file_lists_every_exporter_option_with_its_default() -> None:
    """packaging/nfs-exporter.default (/etc/default/nfs-exporter) against the exporter's own
    options: each one listed with the default the command has (a flag's is off)."""
    from probes.exporter import exporter_parser

    text = (REPO / "packaging/nfs-exporter.default").read_text()
    listed: Dict[str, str] = {}
    for block in re.split(r"\n#   (?=-)", text.split("\n#\n#   ", 1)[1].split("\n#\n", 1)[0]):
        names = re.findall(r"(?:^|, )(--?[\w-]+)", block.split("  ", 1)[0])
        default = re.search(r"\(default: ([^)]*)\)", block.replace("\n#", " "))
        assert default, block
        listed.update({name: re.sub(r"\s+", " ", default.group(1)) for name in names})
    options = [action for action in exporter_parser()._actions if not {"--help", "--version"} & set(action.option_strings)]
    assert sorted(listed) == sorted(name for action in options for name in action.option_strings)
    for action in options:
        flag = action.nargs == 0
        shown = "off" if flag else str(action.default)
        if flag or isinstance(action.default, (str, int, float)):  # else a default the help describes
            assert all(listed[name] == shown for name in action.option_strings), (action.option_strings,
                                                                                  listed[action.option_strings[0]])


def test_sysctl_file_is_shipped_not_applied(tree: Path) -> None:
    shipped = tree / PRIVATE / "60-probekit-perf.conf"
    assert shipped.read_text() == (REPO / "packaging/60-probekit-perf.conf").read_text()
    applied: List[Path] = [p for d in ("etc/sysctl.d", "usr/lib/sysctl.d", "lib/sysctl.d")
                           for p in (tree / d).glob("*")]
    assert not applied


def test_prometheus_rules_are_shipped(tree: Path) -> None:
    shipped = tree / "usr/share/probekit/prometheus/probekit-rules.yml"
    assert shipped.read_text() == (REPO / "packaging/prometheus/probekit-rules.yml").read_text()


def test_depends_on_debian_packages_of_every_dependency(deb: Path) -> None:
    depends = [d.strip() for d in _dpkg_deb("--field", str(deb), "Depends").split(",")]
    # a loader: libbpf1 for the CO-RE objects (Debian 12 and later), else bcc (Debian 11 has no
    # libbpf1: its libbpf0 is 0.3); bcc, LLVM and the headers are not needed beside libbpf1
    assert "libbpf1 | python3-bpfcc" in depends
    assert "python3-bpfcc" not in depends and not _dpkg_deb("--field", str(deb), "Recommends").strip()
    assert "python3-bpfcc" in [s.strip() for s in _dpkg_deb("--field", str(deb), "Suggests").split(",")]
    # each PyPI requirement of the wheel is Debian's python3-<name>, with the same minimum
    for name, minimum in re.findall(r'^\s*"([\w-]+)>=([\d.]+)"', _project_section("project"), re.M):
        debian = "python3-" + name.lower().replace("_", "-")
        assert f"{debian} (>= {minimum})" in depends, (debian, depends)
    # Python 3.9 and 3.10 read the TOML specs with python3-tomli or python3-toml
    assert "python3 (>= 3.11) | python3-tomli | python3-toml" in depends
    assert "python3:any (>= 3.9~)" in depends


def test_lintian_finds_no_error_or_warning(deb: Path) -> None:
    """Nor a missing man page, which no override may hide."""
    overrides = "".join(p.read_text() for p in (REPO / "packaging/debian").glob("*lintian-overrides"))
    assert not [tag for tag in MAN_PAGE_TAGS if tag in overrides]
    if shutil.which("lintian") is None:
        missing("lintian is not installed (scripts/apt-packages.txt lists it)")
    res = subprocess.run(["lintian", str(deb)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         universal_newlines=True)
    complaints = [line for line in res.stdout.splitlines() if line.startswith(("E:", "W:"))]
    assert not complaints, res.stdout


def test_every_lab_image_carries_what_the_package_depends_on(deb: Path) -> None:
    """The lab installs the package offline after boot (labs.install.install_tools): each
    Depends needs a package of each image's list (the versions are apt's to check, in the guest)."""
    groups = [[alt.split()[0].split(":")[0] for alt in group.split("|")]
              for group in _dpkg_deb("--field", str(deb), "Depends").split(",")]
    for suite in sorted(set(KERNEL_SUITES.values())):
        listed = set(read_package_list(suite))
        assert not [group for group in groups if not listed & set(group)], suite
    # Debian 11's Python is 3.9: its image carries the TOML module of the alternative
    assert "python3-toml" in read_package_list("bullseye")


def test_digest_follows_what_the_package_is_built_from(tmp_path: Path) -> None:
    """`build-deb --digest` keys the lab's cached build: the same tree gives the same digest, a
    changed packaged file another one, a file the package leaves out the same."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    shutil.copy(REPO / "scripts/build-deb", clone / "scripts/build-deb")  # this checkout's, committed or not

    def digest() -> str:
        return subprocess.run(["bash", str(clone / "scripts/build-deb"), "--digest"], check=True,
                              stdout=subprocess.PIPE, universal_newlines=True).stdout.strip()

    first = digest()
    assert re.fullmatch(r"[0-9a-f]{64}", first) and digest() == first
    (clone / "docs" / "install.md").write_text("not in the package\n")
    assert digest() == first
    with (clone / "probes" / "specs" / "nfs.toml").open("a") as spec:
        spec.write("\n")
    assert digest() != first

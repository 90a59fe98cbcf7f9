"""A non-editable install must carry the files the code opens at run time.

The generator reads bpf/probe.bpf.c, the tools default to probes/specs/nfs.toml and load
probes/objects/FS.bpf.o (compiled when the wheel is built), the labs copy provision and
guest scripts: in a checkout they are simply there, in a wheel only if
pyproject.toml names them. Built here from the working tree and read back.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from needs import missing

from labs.checks.shared import GUEST_SCRIPTS

REPO = Path(__file__).resolve().parent.parent
#: ELF e_machine of BPF objects
EM_BPF = 247
#: what building the CO-RE objects needs (probes/build_core.py), and what installs it
BUILD_TOOLS = "clang, llvm-strip and libbpf's headers (apt-get install clang llvm libbpf-dev)"


def build_wheel(out: Path) -> Path:
    """The wheel pip builds from this tree as a user would (build isolation: pip fetches
    setuptools into a fresh environment); what is missing for that is said in one line."""
    if not (shutil.which("clang") and shutil.which("llvm-strip") and Path("/usr/include/bpf/bpf_helpers.h").exists()):
        missing(f"building the wheel compiles the CO-RE objects and needs {BUILD_TOOLS}")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(REPO)],
                          cwd=out, capture_output=True, text=True)
    if done.returncode != 0 and "install build dependencies" in done.stdout + done.stderr:
        missing("building the wheel needs setuptools>=61 from a package index (network) or from a directory "
                "of wheels named by PIP_FIND_LINKS; pip found none")
    assert done.returncode == 0, f"pip wheel failed:\n{done.stderr}"
    return next(out.glob("probekit-*.whl"))


def test_wheel_carries_templates_specs_and_lab_scripts(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = {"bpf/probe.bpf.c", "probes/specs/nfs.toml", "discover/commands/callgraph.py",
              "labs/provision/node.sh", "labs/provision/packages.txt", *GUEST_SCRIPTS.values()}
    assert wanted <= names, f"missing from the wheel: {sorted(wanted - names)}"
    # one CO-RE object per spec, compiled by the build (setup.py), a BPF ELF (e_machine 247)
    specs = sorted(p.stem for p in (REPO / "probes" / "specs").glob("*.toml"))
    objects = sorted(n[len("probes/objects/"):-len(".bpf.o")] for n in names
                     if n.startswith("probes/objects/") and n.endswith(".bpf.o"))
    assert specs and objects == specs
    # and each spec parsed, which the tools read while it matches the TOML beside it
    compiled = sorted(n[len("probes/objects/"):-len(".spec.json")] for n in names
                      if n.startswith("probes/objects/") and n.endswith(".spec.json"))
    assert compiled == specs
    assert set(n for n in names if n.startswith("probes/objects/")) == \
        {f"probes/objects/{spec}{suffix}" for spec in specs for suffix in (".bpf.o", ".spec.json")}
    for spec in specs:
        head = zipfile.ZipFile(wheel).read(f"probes/objects/{spec}.bpf.o")[:20]
        assert head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == EM_BPF

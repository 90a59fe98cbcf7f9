"""A non-editable install must carry the files the code opens at run time.

The generator reads bpf/probe.bpf.c, the tools default to probes/specs/nfs.toml and load
probes/objects/FS.bpf.o (compiled when the wheel is built), the labs copy provision and
guest scripts: in a checkout they are simply there, in a wheel only if
pyproject.toml names them. Built here from the working tree and read back.
"""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: ELF e_machine of BPF objects
EM_BPF = 247


def test_wheel_carries_templates_specs_and_lab_scripts(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "-w", str(tmp_path), str(REPO)], check=True, cwd=tmp_path)
    wheel = next(tmp_path.glob("probekit-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = {"bpf/probe.bpf.c", "probes/specs/nfs.toml", "discover/commands/callgraph.py",
              "labs/guest/kill_check.py", "labs/provision/node.sh", "labs/provision/packages.txt"}
    assert wanted <= names, f"missing from the wheel: {sorted(wanted - names)}"
    # one CO-RE object per spec, compiled by the build (setup.py), a BPF ELF (e_machine 247)
    specs = sorted(p.stem for p in (REPO / "probes" / "specs").glob("*.toml"))
    objects = sorted(n[len("probes/objects/"):-len(".bpf.o")] for n in names if n.startswith("probes/objects/"))
    assert specs and objects == specs
    for spec in specs:
        head = zipfile.ZipFile(wheel).read(f"probes/objects/{spec}.bpf.o")[:20]
        assert head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == EM_BPF

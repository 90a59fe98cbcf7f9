"""Build the CO-RE objects: one per spec in probes/specs, as FS.bpf.o.

Why a build step: the client loads these with libbpf and has no compiler; clang runs where
the package is built. Building the wheel (and so the Debian package, which pybuild makes
from the same wheel) runs this through setup.py's build hook into the wheel's
probes/objects/; in a checkout `python -m probes.build_core [--out DIR] [SPEC...]` writes
probes/objects/ (default: every spec in probes/specs). Debug info and local labels are
stripped; the BTF CO-RE needs stays. Beside each object goes its spec, parsed
(FILE.spec.json): the tools read it instead of parsing the TOML while the two match.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List, Optional, Sequence

from discover.errors import UserError
from discover.spec import compile_spec, load_spec
from probes.objects import compiled_spec_path, object_path
from probes.generate_core import generate_core

SPECS_DIR = Path(__file__).resolve().parent / "specs"
#: x86-64 only: the kprobe register names in the template are x86-64's; a spec without
#: tracepoints leaves the template's tracepoint helpers unused
CLANG_FLAGS = ["-g", "-O2", "-target", "bpf", "-D__TARGET_ARCH_x86", "-Wall", "-Werror", "-Wno-unused-function",
               "-I/usr/include/x86_64-linux-gnu"]


def build(spec_path: Path, out: Optional[Path] = None, clang: str = "clang", strip: str = "llvm-strip") -> Path:
    """Compile one spec's object; returns where it was written."""
    spec = load_spec(spec_path)
    target = out or object_path(spec)
    for tool in (clang, strip):
        if shutil.which(tool) is None:
            raise UserError(f"{tool} not found: building the CO-RE objects needs clang and llvm "
                            "(apt-get install clang llvm libbpf-dev)")
    with tempfile.TemporaryDirectory(prefix="probekit-core-") as tmp:
        source = Path(tmp) / f"{spec['filesystem']}.bpf.c"
        source.write_text(generate_core(spec).c_text)
        built = Path(tmp) / "probe.o"
        result = subprocess.run([clang, *CLANG_FLAGS, "-c", str(source), "-o", str(built)],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise UserError(f"clang failed on {spec_path}:\n{result.stderr.strip()}")
        # without its branch labels too (LBB0_1...: 13,000 in nfs's): libbpf's open walks the
        # whole symbol table once per program section, 190 of them in nfs's object
        subprocess.run([strip, "-g", "--discard-all", str(built)], check=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, target)
    return target


def main(argv: Sequence[str]) -> None:
    args = list(argv)
    out: Optional[Path] = None
    if args[:1] == ["--out"]:
        if len(args) < 2:
            raise UserError("--out needs a directory")
        out, args = Path(args[1]), args[2:]
    specs: List[Path] = [Path(a) for a in args] or sorted(SPECS_DIR.glob("*.toml"))
    for spec in specs:
        target = object_path(load_spec(spec), out) if out is not None else None
        built = build(spec, target)
        compiled = compiled_spec_path(spec, built.parent)
        compiled.write_text(compile_spec(spec), encoding="utf-8")
        print(f"{spec} -> {built}, {compiled}")


if __name__ == "__main__":
    try:  # not discover.errors.run_cli: that needs click, which a package build does not have
        main(sys.argv[1:])
    except UserError as exc:
        sys.exit(f"build_core: error: {exc}")

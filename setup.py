"""setuptools' build hook: the CO-RE objects (probes/objects/FS.bpf.o) compiled into the wheel.

Why here: the wheel and the Debian package (pybuild builds and installs the same wheel) both
carry one object per spec, compiled with clang where the package is built, never on the
client (probes.build_core says what it needs). An editable install builds none: in a
checkout `python -m probes.build_core` writes them into probes/objects/.
"""
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithObjects(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        out = Path(self.build_lib).resolve() / "probes" / "objects"
        subprocess.run([sys.executable, "-m", "probes.build_core", "--out", str(out)], check=True,
                       cwd=Path(__file__).resolve().parent)


setup(cmdclass={"build_py": BuildPyWithObjects})

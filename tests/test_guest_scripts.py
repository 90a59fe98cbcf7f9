"""The guest scripts import each other and labs.checks.shared by package, once their own lines put
the project share on sys.path: a name one of them stops defining, or a path that no longer leads
to the share, breaks another only once a guest runs it, minutes into a lab job. Importing each
here as a guest's python3 does (by its path, from /, with no site packages: the guest has no
venv and its probekit package is private) finds that in a second. labs.checks.shared names every
guest script's path: each must be there, and each guest script of labs/checks/ in it."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from labs.checks.shared import GUEST_SCRIPTS

REPO = Path(__file__).resolve().parent.parent
#: a guest script imported, not run (its __name__ is not "__main__"); prints the project's
#: modules it loaded and where from
IMPORT = ("import json, runpy, sys; runpy.run_path(sys.argv[1], run_name='guest_import'); "
          "print(json.dumps({n: m.__file__ for n, m in sys.modules.items() "
          "if n.split('.')[0] in ('labs', 'discover', 'probes', 'bpf')}))")


@pytest.mark.parametrize("name", sorted(name for name, path in GUEST_SCRIPTS.items() if path.endswith(".py")))
def test_guest_script_imports_what_it_names(name: str) -> None:
    res = subprocess.run([sys.executable, "-I", "-S", "-c", IMPORT, str(REPO / GUEST_SCRIPTS[name])], cwd="/",
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    loaded = json.loads(res.stdout.strip().splitlines()[-1])
    assert all(Path(path).is_relative_to(REPO) for path in loaded.values()), loaded


def test_every_guest_script_is_named_once_where_it_is() -> None:
    assert all((REPO / path).is_file() for path in GUEST_SCRIPTS.values()), GUEST_SCRIPTS
    on_disk = {str(path.relative_to(REPO)) for path in (REPO / "labs" / "checks").rglob("*")
               if path.name == "guest.py" or path.suffix == ".sh"}
    assert on_disk == set(GUEST_SCRIPTS.values())
    assert len(set(GUEST_SCRIPTS.values())) == len(GUEST_SCRIPTS)

"""The guest scripts import each other by name (labs/guest is their sys.path[0] in the guest):
a name one of them stops defining breaks another only once a guest runs it, minutes into a
lab job. Importing each here, with the guest's path, finds that in a second."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

GUEST = Path(__file__).resolve().parent.parent / "labs" / "guest"


@pytest.mark.parametrize("script", sorted(p.stem for p in GUEST.glob("*.py")))
def test_guest_script_imports_what_it_names(script: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(GUEST))
    for name in [m for m in sys.modules if m in {p.stem for p in GUEST.glob("*.py")}]:
        monkeypatch.delitem(sys.modules, name)
    importlib.import_module(script)

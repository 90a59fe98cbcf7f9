"""Where the prebuilt CO-RE objects live and what a kernel needs to run them.

Why apart from the loader: every tool asks at start-up whether the object can run here
(probes.backend_choice) and reads the spec's parsed copy shipped beside it, long before it
knows which loader it takes; neither may import a loader (libbpf's bindings, the emitters).
"""
from __future__ import annotations

from pathlib import Path

TYPE_CHECKING = False  # typing's constant without typing (discover/records.py)
if TYPE_CHECKING:
    from typing import Any, Dict

#: where built objects are looked for: one per spec, named after its filesystem
OBJECTS_DIR = Path(__file__).resolve().parent / "objects"
#: BPF ring buffers (5.8), task storage for tracing (5.11), bpf_task_pt_regs (5.15)
MIN_KERNEL = (5, 15)


def object_path(spec: Dict[str, Any], objects_dir: Path = OBJECTS_DIR) -> Path:
    return objects_dir / f"{spec['filesystem']}.bpf.o"


def compiled_spec_path(spec_path: Path, objects_dir: Path = OBJECTS_DIR) -> Path:
    """Where the build puts the spec file `spec_path` parsed (discover.spec.compile_spec), beside
    the objects: load_spec takes it while it matches the file."""
    return objects_dir / f"{Path(spec_path).stem}.spec.json"

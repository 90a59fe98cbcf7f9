"""One kernel side: bcc's text and the CO-RE object run the same programs with the same settings.

Why without a lab: the probe's logic is one C source (bpf/probe.bpf.c) and its decisions one
model (probes.model); what could still drift is what each emitter makes of them. For every
spec on the kernel profiles the project keeps, with a real Debian kernel's BTF (vmlinux and
the modules the specs trace), and for each tool's settings, both emitters must give the same
ops, points and readers' facts, the same settings (bcc's `#define`s against the `struct cfg`
whose values the loader writes into the instructions), the same map sizes and key widths, and
for each point the same program bodies on the same attach ends. The lab then checks the two loaders count alike (labs/checks/probes/verdicts.py,
labs/checks/nfsdtop/verdicts.py).
"""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from debian_kernels import ABI_612, btf_dir
from discover.profile import KernelProfile
from discover.spec import load_spec
from generated_c import defines, formats_of
from probes.core_backend import CoreBackend
from probes.generate import generate
from probes.generate_core import cfg_format, core_table, generate_core
from probes.layout import KernelLayout
from probes.libbpf import Libbpf
from probes.model import CFG_FIELDS, Tool, map_flags, point_fields, spec_nkeys
from probes.runtime import fentry_can_attach
from probes.select import KernelFacts, select, select_context

REPO = Path(__file__).resolve().parent.parent
SPECS = REPO / "probes" / "specs"
FIXTURES = REPO / "tests" / "fixtures"
#: the object path of a backend that is only asked for its C, never opened
UNREAD = REPO / "probes" / "objects" / "unread.bpf.o"
#: (spec, the profile its filesystem was captured on)
CASES = (("nfs", "6.1.0-50-amd64/profile.json.gz"), ("nfs", "6.12.117+deb13-amd64/localfs/profile.json.gz"),
         ("nfsd", "6.12.117+deb13-amd64/nfsd/profile.json.gz"), ("ext4", "6.12.117+deb13-amd64/localfs/profile.json.gz"),
         ("xfs", "6.12.117+deb13-amd64/localfs/profile.json.gz"),
         ("btrfs", "6.12.117+deb13-amd64/localfs/profile.json.gz"), ("cifs", "6.12.117+deb13-amd64/cifs/profile.json.gz"))
#: each tool's kernel-side settings (probes.commands, probes.exporter)
TOOLS = {
    "slower": Tool(events=True, inflight=True, min_lat_ns=10**7, tgid=4242),
    "dist": Tool(dist=True, per_mount=True, mount_dev=57, cgroup_filter=True),
    "top": Tool(top=True, inflight=True, per_mount=True),
    "exporter": Tool(dist=True, inflight=True, dist_unit_ns=1, per_mount=True, lat_sum=True, cgroup_limit=8),
}
MODULES = ("nfs", "nfsv3", "nfsv4", "sunrpc", "nfsd", "ext4", "xfs", "btrfs", "cifs")
PROGRAM = re.compile(r'PROGRAM\((\w+), "([^"]+)", [^)]*\)\n\{\n    (.*?)\n    return 0;\n\}', re.S)


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> KernelLayout:
    """A Debian 6.12 kernel's BTF: vmlinux's and every traced filesystem's module's."""
    found = KernelLayout.live(btf_dir(ABI_612, MODULES, tmp_path_factory.mktemp("btf")), MODULES)
    assert found is not None and {"nfs", "nfsd", "xfs"} <= set(found.modules)
    return found


def profile_data(name: str) -> Dict[str, Any]:
    return json.loads(gzip.decompress((FIXTURES / name).read_bytes()))


def statements(body: str) -> List[Tuple[int, str]]:
    """A program body's statements by the point they run for, with that number taken out."""
    out = []
    for statement in re.split(r"\n    (?=if \(P\(|TIMED|REQUEST|CONTEXT|s64 ret)", body):
        numbers = set(re.findall(r"(?:\(|, )(\d+)[,)]", statement))
        assert len(numbers) <= 1, statement
        if numbers:
            out.append((int(numbers.pop()), re.sub(r"(\(|, )(\d+)([,)])", r"\1#\3", statement)))
    return out


def program_runs(text: str) -> Dict[Tuple[str, int], List[str]]:
    """(section, point number) -> the statements that section's program runs for that point."""
    out: Dict[Tuple[str, int], List[str]] = {}
    for _name, section, body in PROGRAM.findall(text):
        for point, statement in statements(body):
            out.setdefault((section, point), []).append(statement)
    return out


def cases(layout: KernelLayout) -> Any:
    """(case id, spec, chosen, tool, formats, fentry) for every spec, profile and tool."""
    for fs, profile in CASES:
        spec = load_spec(SPECS / f"{fs}.toml")
        data = profile_data(profile)
        facts = KernelFacts.from_profile(KernelProfile(data))
        if fs == "nfsd":
            chosen = select(spec, facts, ["rpc", "read", "write"]).chosen
            context = select_context(spec, facts, "rpc")
            assert context is not None
            tools = {"server": (Tool(server=True), chosen + [context])}
        else:
            chosen = select(spec, facts, list(spec["ops"])).chosen
            tools = {name: (tool, chosen) for name, tool in TOOLS.items()}
        assert chosen, (fs, profile)
        fentry = [p[end] for c in chosen if c.candidate["kind"] == "fentry" for p in c.points
                  for end in ("entry", "exit") if fentry_can_attach(p[end], layout) is None]
        for name, (tool, picked) in tools.items():
            for attach, functions in (("fentry", fentry), ("kprobes", [])):
                yield f"{fs}-{profile.split('/')[0]}-{name}-{attach}", spec, picked, tool, formats_of(data), functions


def test_both_emitters_give_the_same_probe(layout: KernelLayout) -> None:
    libbpf = Libbpf()
    sources = {}
    seen = 0
    for case, spec, chosen, tool, formats, fentry in cases(layout):
        bcc = generate(chosen, tool, layout, formats, ringbuf=True, task_storage=True, fentry=fentry,
                       nkeys=spec_nkeys(spec))
        backend = CoreBackend(spec, UNREAD, libbpf)
        core = backend.generate(chosen, tool, layout, formats, True, True, fentry)
        assert backend._plan is not None
        _probe, _programs, cfg, sizes = backend._plan
        # what the readers decode by
        for field in ("ops", "letters", "points", "mountless", "watched", "task_storage"):
            assert getattr(bcc, field) == getattr(core, field), (case, field)
        # the settings: bcc's constants are the bytes the loader writes
        table = core_table(spec)
        values = cfg_format(len(table.points), table.nkeys).unpack(cfg)
        constants = defines(bcc.c_text)
        assert {f"CFG_{name}": value for (name, _), value in zip(CFG_FIELDS, values)} == \
            {k: v for k, v in constants.items() if k.startswith("CFG_")}, case
        fields = point_fields(table.nkeys)
        core_of: Dict[int, int] = {}
        for number in range(len(table.points)):
            start = len(CFG_FIELDS) + number * len(fields)
            settings = dict(zip(fields, values[start:start + len(fields)]))
            if settings["on"]:
                core_of[settings["id"]] = number
                assert settings == {name: constants[f"P_{settings['id']}_{name}"] for name in fields}, case
        assert sorted(core_of) == [p.id for p in bcc.points], case
        assert constants["NKEYS"] == table.nkeys, case
        assert {f"FLAGS_{name}": flags for name, flags in map_flags(tool).items()} == \
            {k: v for k, v in constants.items() if k.startswith("FLAGS_")}, case
        assert {f"SIZE_{name}": size for name, size in sizes.items()} == \
            {k: v for k, v in constants.items() if k.startswith("SIZE_")}, case
        # the same programs per point, on the same attach ends
        if spec["filesystem"] not in sources:
            sources[spec["filesystem"]] = program_runs(generate_core(spec).c_text)
        in_object = sources[spec["filesystem"]]
        for (section, point), runs in program_runs(bcc.c_text).items():
            assert in_object.get((section, core_of[point])) == runs, (case, section, point)
        seen += 1
    assert seen == 2 * (len(CASES) - 1) * len(TOOLS) + 2


def test_the_loader_layers_share_no_logic() -> None:
    """What differs between the loaders lives in bpf/bcc.h and bpf/core.h; neither repeats four
    lines of the other or of the probe's one source (blank lines, braces and comments aside)."""
    def runs(path: Path) -> set:
        lines = [line.strip() for line in path.read_text().splitlines()]
        lines = [line for line in lines if line and line not in ("{", "}", "};") and not line.startswith(("/*", "*"))]
        return {tuple(lines[i:i + 4]) for i in range(len(lines) - 3)}
    bcc, core, source = (runs(REPO / "bpf" / name) for name in ("bcc.h", "core.h", "probe.bpf.c"))
    assert not bcc & core and not bcc & source and not core & source
    total = sum(len((REPO / "bpf" / name).read_text().splitlines()) for name in ("bcc.h", "core.h", "probe.bpf.c"))
    assert total < 1444  # the two templates they replace

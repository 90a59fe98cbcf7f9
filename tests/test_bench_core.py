"""bench/bench_core.py's table, on the JSON its 6.12 lab run printed (2026-12-04): every ratio is
of the medians of its rounds, a failed round is left out, passes alternate."""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import bench_attach  # noqa: E402
import bench_core  # noqa: E402

RUN = Path(__file__).parent / "fixtures" / "6.12.117+deb13-amd64" / "bench" / "bench_core.json"


def recorded() -> Dict[str, Any]:
    return json.loads(RUN.read_text())


def test_every_ratio_is_of_the_medians_of_its_rounds() -> None:
    res = recorded()
    rows = bench_core.summary(res)
    assert {(row["part"], row["measure"]) for row in rows} == {
        ("startup", "s"), ("startup", "hwm_kib"), ("exporter", "hwm_kib"), ("exporter", "median_s"),
        ("attach", "added_ns_per_read"), ("attach", "bpf_ns_per_run")}
    for row in rows:
        if row["part"] == "attach":  # bench_attach's own medians over its loops
            assert row["ratio"] == pytest.approx(row["medians"][0] / row["medians"][1])
            continue
        runs = res[row["part"]]["runs"]
        top, bottom = (statistics.median(record[row["measure"]] for record in runs[name]) for name in row["pair"])
        assert row["medians"] == [top, bottom]
        assert row["ratio"] == top / bottom
        assert row["met"] == (None if row["target"] is None else row["ratio"] <= row["target"])
        assert len(row["per_round"]) == res["rounds"]


def test_a_failed_round_is_left_out() -> None:
    res = recorded()
    bcc = res["startup"]["runs"]["bcc"]
    bcc[0] = {"error": "exited 1"}
    row = next(row for row in bench_core.summary(res)
               if row["part"] == "startup" and row["pair"] == ["core", "bcc"] and row["measure"] == "s")
    assert row["medians"][1] == statistics.median(record["s"] for record in bcc[1:])
    assert len(row["per_round"]) == res["rounds"] - 1
    assert "bcc: failed: exited 1" in bench_core.report(res)


def test_passes_alternate() -> None:
    assert bench_attach.order(["a", "b"]) == ["none", "a", "b", "none", "b", "a", "none"]
    for rounds in (2, 4):
        firsts = [names[0] for names in bench_core.alternated(["a", "b", "c"], rounds)]
        assert firsts.count("a") == firsts.count("c") == rounds // 2


def test_a_visit_is_measured_against_the_idle_visits_around_it() -> None:
    res = recorded()["attach"]
    visits = bench_attach.per_visit(res)
    assert {tool: len(values) for tool, values in visits.items()} == {"core": 3, "bcc": 3}
    slower = dict(res, seconds={state: [s + 0.01 for s in loops] for state, loops in res["seconds"].items()})
    for tool, values in bench_attach.per_visit(slower).items():  # a host slower throughout adds nothing
        assert values == pytest.approx(visits[tool])


def test_bad_options_stop_before_anything_runs(capsys: pytest.CaptureFixture) -> None:
    assert bench_core.main(["bench_core.py", "--parts", "startup,boot"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


STARTUP = RUN.parent / "bench_core_startup.json"


@pytest.mark.parametrize("name", [STARTUP.name, "bench_core_startup_before.json"])
def test_start_up_is_set_beside_libbpf_tools_for_each_tool(name: str) -> None:
    """The start-up part's runs (nfsslower, nfsdist and the exporter on core; fsslower and fsdist
    of libbpf-tools; 2026-12-06, the tree and main in one boot, --without-bcc): each tool
    beside its libbpf-tools peer, the target 2x, judged on medians."""
    res = json.loads((STARTUP.parent / name).read_text())
    assert "bcc" not in res["startup"]["runs"]  # --without-bcc
    rows = {(tuple(row["pair"]), row["measure"]): row for row in bench_core.summary(res)}
    for pair, measure in ((("core", "libbpf-tools"), "s"), (("core", "libbpf-tools"), "hwm_kib"),
                          (("nfsdist core", "fsdist libbpf-tools"), "s"),
                          (("nfsdist core", "fsdist libbpf-tools"), "hwm_kib"),
                          (("exporter core", "fsdist libbpf-tools"), "s")):
        row = rows[(pair, measure)]
        runs = res["startup"]["runs"]
        top, bottom = (statistics.median(record[measure] for record in runs[name]) for name in pair)
        assert row["ratio"] == top / bottom and row["target"] == 2.0
        assert row["met"] == (top / bottom <= 2.0)


def phases(name: str) -> Dict[str, Any]:
    return json.loads((STARTUP.parent / name).read_text())


#: one 6.12 boot, 2026-12-07 00:29-00:34 UTC: main's package (b709b0a), then the tree's with the
#: tools' command lines read by argparse (be513ca); a second boot at 00:35-00:39, discover.tracefs
#: imported without dataclasses, subprocess and difflib (85cbb18). startup_phases twice after each.
ARGPARSE_PHASES = ("startup_phases_argparse_before.json", "startup_phases_argparse.json",
                   "startup_phases_tracefs.json")
ARGPARSE_RUNS = ("bench_core_argparse_before.json", "bench_core_argparse.json", "bench_core_tracefs.json")


def by_phase(name: str) -> List[Dict[str, Dict[str, Any]]]:
    """Each start of a startup_phases fixture: its phases by their short name."""
    return [{row["name"].split(" (")[0]: row for row in run["phases"]} for run in phases(name)["nfsslower"]]


def test_start_up_phases_come_in_a_starts_order_with_the_peak_only_growing() -> None:
    """bench/startup_phases.py's runs in that boot (main's package, then the tree's): each
    nfsslower start's phases in the order a start makes them, VmHWM never falling (a peak)."""
    order = ["interpreter up", "import probes.commands", "KernelLayout.live", "KernelFacts.live", "select",
             "backend choice", "backend opened", "generate", "layout released", "module BTF objects found",
             "object opened", "fentry targets given", "fentry targets named", "heap trimmed", "bpf_object__load",
             "attach", "Session up"]
    for name in ("startup_phases_before.json", "startup_phases.json", "startup_phases_objects_before.json",
                 "startup_phases_objects.json", "startup_phases_trim.json", *ARGPARSE_PHASES):
        for run in phases(name)["nfsslower"]:
            names = [row["name"] for row in run["phases"]]
            assert [step for step in order if any(n.startswith(step) for n in names)] == [
                next(step for step in order if n.startswith(step)) for n in names]
            peaks = [row["hwm_mib"] for row in run["phases"]]
            assert peaks == sorted(peaks) and run["hwm_mib"] >= peaks[-1] - 0.1


def test_module_targets_by_btf_object_leave_the_module_btfs_out_of_the_start() -> None:
    """main's package named the module fentry targets MODULE:FUNCTION, and libbpf loaded vmlinux's
    and every module's BTF there (about 1 s a start in that boot); the tree gives each program its
    module's BTF object and type id: that phase is gone, what replaced it takes hundredths of a
    second, and the peak stays where it was: libbpf's parse of vmlinux's BTF, now made in
    bpf_object__load, is the peak, and the module BTFs had fitted under it."""
    before, after = phases("startup_phases_before.json"), phases("startup_phases.json")
    assert before["package"].endswith("ee3b324")
    for old, new in zip(before["nfsslower"], after["nfsslower"]):
        was = {row["name"].split(" (")[0]: row for row in old["phases"]}
        now = {row["name"].split(" (")[0]: row for row in new["phases"]}
        assert was["fentry targets named"]["s"] > 0.5 and "fentry targets named" not in now
        assert now["module BTF objects found by name"]["s"] + now["fentry targets given by BTF object and type id"]["s"] < 0.1
        assert abs(new["hwm_mib"] - old["hwm_mib"]) < 0.5
        assert now["bpf_object__load"]["hwm_mib"] - now["object opened"]["hwm_mib"] > 8  # vmlinux's BTF


#: one 6.12 boot, 2026-12-06 21:56-22:02 UTC: main's package (24ef070), then the tree's with the
#: object read at each open and opened without libbpf's printer (aa78023); a second boot at
#: 22:07-22:10, the heap trimmed before the load as well (22f4329); a third at 22:14-22:17, the
#: version read without importlib.metadata (2495ef9)
OBJECTS = ("bench_core_objects_before.json", "bench_core_objects.json", "bench_core_trim.json",
           "bench_core_version.json")


def medians_of(name: str, part: str, measure: str) -> Dict[str, float]:
    res = json.loads((STARTUP.parent / name).read_text())
    return {tool: value for tool, value in bench_core.medians(res[part]["runs"], measure).items() if value is not None}


@pytest.mark.parametrize("name", OBJECTS)
def test_the_floor_is_measured_beside_the_tools(name: str) -> None:
    """python3 up, alone and with click imported, in the same rounds as the tools: the part of a
    start and of its peak that is the interpreter's, and click's share of the rest."""
    start, peak = medians_of(name, "startup", "s"), medians_of(name, "startup", "hwm_kib")
    assert start["python3"] < start["python3 + click"] < start["core"]
    assert peak["python3"] < peak["libbpf-tools"] and peak["python3 + click"] - peak["python3"] > 4 * 1024
    assert start["python3 + click"] - start["python3"] > 0.3  # click's import: half of fsslower's whole start


def test_a_start_no_longer_holds_the_object_and_the_exporter_serves_under_40_mib() -> None:
    """The 3.2 MB object was held twice at the load (the backend's bytes and BpfObject's copy):
    each tool's peak fell by more than 3 MiB, the exporter's serving peak from 43 to under 40 MiB;
    the heap trimmed before the load took nfsslower's down by 2 MiB more."""
    before, after, trimmed, _version = (medians_of(name, "startup", "hwm_kib") for name in OBJECTS)
    for tool in ("core", "nfsdist core", "exporter core"):
        assert before[tool] - after[tool] > 3 * 1024, tool
    assert before["core"] / before["libbpf-tools"] > 3 > after["core"] / after["libbpf-tools"]
    assert after["core"] - trimmed["core"] > 2 * 1024
    serving_before, serving_after, _trimmed, serving_now = (medians_of(name, "exporter", "hwm_kib")["exporter core"]
                                                            for name in OBJECTS)
    assert serving_before > 40 * 1024 > serving_after
    assert serving_after - serving_now > 1.4 * 1024  # its first scrape no longer imports importlib.metadata


def test_the_object_opens_faster_and_the_load_peaks_lower() -> None:
    """startup_phases in the same boots: the open without the printer's calls into Python took
    under 0.1 s (0.12 before), the choice no longer reads the object, and bpf_object__load's
    peak fell with each change."""
    runs = [[{row["name"].split(" (")[0]: row for row in run["phases"]} for run in phases(name)["nfsslower"]]
            for name in ("startup_phases_objects_before.json", "startup_phases_objects.json", "startup_phases_trim.json")]
    before, after, trimmed = runs
    assert min(run["object opened"]["s"] for run in before) > 0.1 > max(run["object opened"]["s"] for run in after)
    assert max(run["backend choice"]["s"] for run in after) < 0.01
    loads = [statistics.median(run["bpf_object__load"]["hwm_mib"] for run in boot) for boot in runs]
    assert loads[0] - loads[1] > 3 and loads[1] - loads[2] > 2


def test_without_click_the_imports_take_less_time_and_memory() -> None:
    """argparse for the tools' command lines: importing nfsslower's code fell from 0.47-0.50 s to
    0.27-0.29 s and from 17.1-17.3 to 14.5-14.6 MiB held; discover.tracefs without dataclasses
    (inspect), subprocess and difflib took the kernel facts' own part (the layout's parse aside)
    from 0.14-0.16 s to under 0.03 s."""
    before, after, tracefs = (by_phase(name) for name in ARGPARSE_PHASES)
    for was, now in zip(before, after):
        assert was["import probes.commands"]["s"] - now["import probes.commands"]["s"] > 0.15
        assert was["import probes.commands"]["rss_mib"] - now["import probes.commands"]["rss_mib"] > 2.3
    facts = [[run["KernelFacts.live"]["s"] - run["KernelLayout.live"]["s"] for run in boot] for boot in (after, tracefs)]
    assert min(facts[0]) > 0.1 > 0.05 > max(facts[1])


def test_the_peak_is_libbpfs_parse_on_top_of_what_python_holds() -> None:
    """Where nfsslower's 29 MiB go: the heap trimmed, the load starts at the 19 MiB the process
    holds (the interpreter, the imports, the start's data, the opened object) and libbpf's parse
    of vmlinux's BTF adds 10 MiB, less than libbpf-tools' fsslower's whole peak (which makes the
    same parse): 2x that peak would need the load to start where the imports alone leave it."""
    fsslower = statistics.median(run["hwm_kib"] for run in json.loads(
        (STARTUP.parent / ARGPARSE_RUNS[2]).read_text())["startup"]["runs"]["libbpf-tools"]) / 1024
    for run in by_phase(ARGPARSE_PHASES[2]):
        held = run["heap trimmed"]["rss_mib"]
        added = run["bpf_object__load"]["hwm_mib"] - held
        assert run["heap trimmed"]["rss_in_mib"] - held > 2  # what Python had freed since its imports
        assert 8 < added < fsslower and run["bpf_object__load"]["hwm_mib"] == max(r["hwm_mib"] for r in run.values())
        assert held > 2 * fsslower - added > run["import probes.commands"]["rss_mib"] - 0.5


def test_the_terminal_tools_peak_fell_with_each_change_and_argparse_costs_a_third_of_click() -> None:
    """bench_core in those boots: nfsslower's and nfsdist's peaks 31.4 -> 30.5 -> 28.9 MiB (2.57 ->
    2.37 times libbpf-tools'); python3 with argparse imported is 1.6 MiB over python3 alone, where
    click was 4.8 (bench_core_version.json)."""
    peaks = [medians_of(name, "startup", "hwm_kib") for name in ARGPARSE_RUNS]
    for tool in ("core", "nfsdist core", "exporter core"):
        assert peaks[0][tool] > peaks[1][tool] > peaks[2][tool], tool
    assert peaks[0]["core"] / peaks[0]["libbpf-tools"] > 2.5 > 2.4 > peaks[2]["core"] / peaks[2]["libbpf-tools"]
    click = medians_of("bench_core_version.json", "startup", "hwm_kib")
    for run in peaks:
        assert run["python3 + argparse"] - run["python3"] < 2 * 1024 < 4 * 1024 < click["python3 + click"] - click["python3"]


def test_module_tables_from_bytes_and_fewer_imports_bring_the_starts_closer_to_libbpf_tools() -> None:
    """bench_core at 2338047 on a quiet host (2026-12-07 04:35-04:38 UTC: module BTF function
    tables walked from libbpf's bytes, six modules off the start path) against 85cbb18: each
    tool's start closer to libbpf-tools' (nfsslower 2.47 -> 2.38 times fsslower's, nfsdist
    3.34 -> 3.02, the exporter 3.62 -> 3.43), still above 2; python3 with argparse alone is half
    of fsslower's start."""
    def ratios(name: str) -> Dict[str, float]:
        start = medians_of(name, "startup", "s")
        return {"core": start["core"] / start["libbpf-tools"],
                **{tool: start[tool] / start["fsdist libbpf-tools"] for tool in ("nfsdist core", "exporter core")}}
    before, after = ratios(ARGPARSE_RUNS[2]), ratios("bench_core_lighter_starts.json")
    for tool in before:
        assert before[tool] > after[tool] > 2, tool
    start = medians_of("bench_core_lighter_starts.json", "startup", "s")
    assert start["python3 + argparse"] < start["libbpf-tools"] / 1.5


#: one 7.2.13+deb14 boot (sid: libbpf 1.7.0, python3 3.14), 2026-12-07 00:41-00:44 UTC: the tree
#: with the layout parsing vmlinux's BTF from the file (1924ff7); a second boot at 00:45-00:50,
#: through btf__load_vmlinux_btf (162ed7a). No libbpf-tools there (trixie's is what bench_core unpacks).
SID = STARTUP.parent.parent.parent / "7.2.13+deb14-amd64" / "bench"


def test_on_libbpf_1_7_the_kernels_btf_is_mapped_and_the_peak_falls_4_mib() -> None:
    """libbpf 1.6+ maps /sys/kernel/btf/vmlinux where the kernel lets it (7.2 does): its pages
    are the kernel's, not the process's. bpf_object__load already loaded it so and stayed under the
    peak; the layout parsed the file and copied it (11 MiB at its height) until it asked libbpf for
    the kernel's BTF the same way (2 MiB). nfsslower's peak: 30.1 -> 25.9 MiB."""
    copied, mapped = ([{row["name"].split(" (")[0]: row for row in run["phases"]}
                       for run in json.loads((SID / name).read_text())["nfsslower"]]
                      for name in ("startup_phases_copied_btf.json", "startup_phases_mapped_btf.json"))
    for run in copied:
        assert run["KernelLayout.live"]["hwm_mib"] - run["KernelLayout.live"]["rss_in_mib"] > 10
        assert run["bpf_object__load"]["hwm_mib"] <= run["KernelLayout.live"]["hwm_mib"]  # the load: mapped already
    for run in mapped:
        assert run["KernelLayout.live"]["hwm_mib"] - run["KernelLayout.live"]["rss_in_mib"] < 2
        assert run["bpf_object__load"]["hwm_mib"] - run["heap trimmed"]["rss_mib"] < 4
    peaks = [{tool: statistics.median(r["hwm_kib"] for r in runs) / 1024
              for tool, runs in json.loads((SID / name).read_text())["startup"]["runs"].items()}
             for name in ("bench_core_copied_btf.json", "bench_core_mapped_btf.json")]
    for tool in ("core", "nfsdist core", "exporter core"):
        assert peaks[0][tool] - peaks[1][tool] > 4, tool


#: one 6.12 boot, 2026-12-07 16:29-16:46 UTC, host quiet: 5ff7630's package and then the tree's
#: with typing off the start path (discover/records.py), the CO-RE objects without branch labels
#: and the tracing tools run by `python3 -S`, twice each, alternated; six starts per tool each
TYPING = ("bench_core_typing_before.json", "bench_core_typing.json")


def test_typing_off_the_start_path_shortens_the_imports_and_each_start() -> None:
    """The imports of nfsslower's code from 0.38-0.51 s to 0.25-0.35, the session (stripped objects,
    records built without typing's checks) a tenth of a second shorter, the peak 0.8 MiB lower;
    each tool's start closer to libbpf-tools' in the same rounds (nfsslower 2.13 -> 1.94 times
    fsslower's, nfsdist 2.83 -> 2.63, the exporter 3.01 -> 2.81): a boot where libbpf-tools, and
    so every ratio, moved from round to round by a fifth."""
    before, after = (by_phase(f"startup_phases_{name}.json") for name in ("typing_before", "typing"))
    imports = [sorted(run["import probes.commands"]["s"] for run in runs) for runs in (before, after)]
    assert max(imports[1]) < min(imports[0])
    session = [statistics.median(run["Session up"]["s"] for run in runs) for runs in (before, after)]
    assert session[0] - session[1] > 0.05
    peaks = [max(run["bpf_object__load"]["hwm_mib"] for run in runs) for runs in (before, after)]
    assert peaks[0] - peaks[1] > 0.5
    ratios = []
    for name in TYPING:
        start = medians_of(name, "startup", "s")
        ratios.append({"core": start["core"] / start["libbpf-tools"],
                       **{tool: start[tool] / start["fsdist libbpf-tools"] for tool in ("nfsdist core", "exporter core")}})
        assert json.loads((STARTUP.parent / name).read_text())["startup"]["commands"]["core"][3] == "PYTHONUNBUFFERED=1"
    for tool in ratios[0]:
        assert ratios[0][tool] > ratios[1][tool], tool
    assert ratios[1]["core"] < 2.0 < ratios[1]["nfsdist core"] < ratios[1]["exporter core"]

"""tracefs discovery, validation, the ftrace lock and restoration, on a tracefs-shaped directory."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import fake_tracefs
from discover.errors import UserError
from discover.tracefs import (FTRACE_LOCK, FilterFunctions, Host, Original, TraceSession, find_tracefs,
                              require_function_graph, require_root, restore_writes, thread_ids,
                              validate_functions)

SHARED_TRACEFS = fake_tracefs.SHARED / "tracefs"
LAB = fake_tracefs.REPO / "tests" / "fixtures" / "6.1.0-57-amd64"


@pytest.fixture
def host(tmp_path: Path) -> Host:
    fake_tracefs.build(tmp_path)
    return Host(sysroot=tmp_path, euid=0, release="6.1.0-57-amd64")


@pytest.fixture
def tracefs(host: Host) -> Path:
    return find_tracefs(host, mount=False)


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


# --- finding tracefs and the preconditions ---------------------------------

def test_finds_tracefs_then_debugfs_location(tmp_path: Path) -> None:
    host = Host(sysroot=tmp_path, euid=0)
    with pytest.raises(UserError) as exc:
        find_tracefs(host, mount=False)
    assert "mount -t tracefs" in one_line(exc)
    debug = tmp_path / "sys" / "kernel" / "debug" / "tracing"
    debug.mkdir(parents=True)
    shutil.copy(SHARED_TRACEFS / "available_tracers.txt", debug / "available_tracers")
    assert find_tracefs(host, mount=False) == debug


def test_tracefs_override_must_look_like_tracefs(tmp_path: Path, tracefs: Path) -> None:
    assert find_tracefs(Host(sysroot=tmp_path, tracefs_override=tracefs)) == tracefs
    with pytest.raises(UserError) as exc:
        find_tracefs(Host(sysroot=tmp_path, tracefs_override=tmp_path / "var"))
    assert "PROBEKIT_TRACEFS" in one_line(exc)


def test_from_env_reads_overrides(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PROBEKIT_TRACEFS", str(tmp_path / "t"))
    monkeypatch.setenv("PROBEKIT_SYSROOT", str(tmp_path))
    monkeypatch.setenv("PROBEKIT_EUID", "1000")
    host = Host.from_env()
    assert (host.tracefs_override, host.sysroot, host.euid) == (tmp_path / "t", tmp_path, 1000)
    assert not host.is_real


def test_not_root_is_one_line() -> None:
    with pytest.raises(UserError) as exc:
        require_root(Host(euid=1000))
    assert "root" in one_line(exc)
    require_root(Host(euid=0))


def rewrite(path: Path, text: str) -> None:
    """A read-only kernel file of the fake, as another kernel shows it (its shared copy is 0444,
    which only root could write over)."""
    path.chmod(0o644)
    path.write_text(text)


def test_missing_function_graph_names_the_config(tracefs: Path) -> None:
    require_function_graph(tracefs)
    tracers = (tracefs / "available_tracers").read_text().split()
    rewrite(tracefs / "available_tracers", " ".join(t for t in tracers if t != "function_graph") + "\n")
    with pytest.raises(UserError) as exc:
        require_function_graph(tracefs)
    assert "CONFIG_FUNCTION_GRAPH_TRACER" in one_line(exc)
    assert "blk mmiotrace function nop" in str(exc.value)


# --- function validation -----------------------------------------------------

def test_module_suffix_and_globs_resolve(tracefs: Path, host: Host) -> None:
    funcs = FilterFunctions.load(tracefs)
    assert funcs.modules["nfs_file_read"] == {"nfs"}
    assert funcs.modules["nfs4_file_open"] == {"nfsv4"}
    assert "nfs_file_read" in funcs.matching("nfs_file_*")
    assert validate_functions(["nfs_file_read", "nfs4_file_*"], tracefs, host) == ["nfs_file_read", "nfs4_file_*"]


def test_typo_names_close_matches(tracefs: Path, host: Host) -> None:
    with pytest.raises(UserError) as exc:
        validate_functions(["nfs_file_reed"], tracefs, host)
    msg = one_line(exc)
    assert "'nfs_file_reed'" in msg and "close matches: nfs_file_read" in msg


def test_glob_without_match(tracefs: Path, host: Host) -> None:
    with pytest.raises(UserError) as exc:
        validate_functions(["zzfs_*"], tracefs, host)
    assert "no traceable function matches 'zzfs_*'" in one_line(exc)


def test_not_a_function_name(tracefs: Path, host: Host) -> None:
    with pytest.raises(UserError) as exc:
        validate_functions(["vfs_read; reboot"], tracefs, host)
    assert "not a kernel function name" in one_line(exc)


def test_only_gcc_clones_traceable(tracefs: Path, host: Host) -> None:
    # Real: nfsd_cache_bucket_find exists only as nfsd_cache_bucket_find.isra.0 [nfsd].
    with pytest.raises(UserError) as exc:
        validate_functions(["nfsd_cache_bucket_find"], tracefs, host)
    msg = one_line(exc)
    assert "nfsd_cache_bucket_find.isra.0" in msg and "inlined or specialised" in msg


def test_module_not_loaded_says_which_modprobe(tmp_path: Path, host: Host, tracefs: Path) -> None:
    """The kernel as it is before `modprobe nfsv4`: no nfsv4 functions, nfsv4 not in /proc/modules."""
    aff = tracefs / "available_filter_functions"
    rewrite(aff, "".join(l for l in aff.read_text().splitlines(keepends=True) if "[nfsv4]" not in l))
    proc = tmp_path / "proc"
    proc.mkdir()
    lsmod = (SHARED_TRACEFS / "lsmod-nfs.txt").read_text().splitlines(keepends=True)
    (proc / "modules").write_text("".join(l for l in lsmod if not l.startswith("nfsv4 ")))
    moddir = tmp_path / "lib" / "modules" / host.release
    moddir.mkdir(parents=True)
    shutil.copy(LAB / "modules.order.nfs", moddir / "modules.order")
    with pytest.raises(UserError) as exc:
        validate_functions(["nfs4_file_open"], tracefs, host)
    msg = one_line(exc)
    assert "not loaded" in msg and "nfsv4" in msg and "modprobe" in msg


def test_notrace_and_kprobe_blacklisted(tmp_path: Path, host: Host, tracefs: Path) -> None:
    """A function the kernel has (kallsyms) that ftrace cannot trace, and one also kprobe-blacklisted."""
    proc = tmp_path / "proc"
    proc.mkdir()
    shutil.copy(LAB / "readback" / "kallsyms.sample", proc / "kallsyms")
    blacklist = tmp_path / "sys" / "kernel" / "debug" / "kprobes"
    blacklist.mkdir(parents=True)
    shutil.copy(LAB / "readback" / "kprobes-blacklist.sample", blacklist / "blacklist")
    notrace, listed = _kallsyms_only_functions(tracefs, LAB / "readback" / "kallsyms.sample", blacklist / "blacklist")
    with pytest.raises(UserError) as exc:
        validate_functions([notrace], tracefs, host)
    assert "ftrace cannot trace it" in one_line(exc)
    with pytest.raises(UserError) as exc:
        validate_functions([listed], tracefs, host)
    assert "kprobe-blacklisted" in one_line(exc)


def _kallsyms_only_functions(tracefs: Path, kallsyms: Path, blacklist: Path):
    traceable = FilterFunctions.load(tracefs).modules
    listed = {l.split()[-1] for l in blacklist.read_text().splitlines() if l.strip()}
    only = [l.split()[2] for l in kallsyms.read_text().splitlines()
            if l.split()[1] in "tT" and l.split()[2] not in traceable]
    return next(n for n in only if n not in listed), next(n for n in only if n in listed)


def test_thread_ids_cover_every_thread() -> None:
    real = Host()
    assert thread_ids(real, os.getpid()) == sorted(int(t) for t in os.listdir(f"/proc/{os.getpid()}/task"))
    with pytest.raises(UserError) as exc:
        thread_ids(real, 2 ** 22 + 12345)
    assert "no process with PID" in one_line(exc)


# --- the lock ----------------------------------------------------------------

def test_lock_refuses_second_session_and_is_removed(tracefs: Path, host: Host) -> None:
    lock = host.path(FTRACE_LOCK)
    with TraceSession(tracefs, host):
        assert lock.read_text() == f"{os.getpid()}\n"
        with pytest.raises(UserError) as exc:
            TraceSession(tracefs, host).open()
        assert f"in use by PID {os.getpid()}" in one_line(exc)
        assert lock.exists()
    assert not lock.exists()


def test_stale_lock_is_explained_not_stolen(tracefs: Path, host: Host) -> None:
    lock = host.path(FTRACE_LOCK)
    lock.write_text("4194000\n")
    (host.sysroot / "proc").mkdir()
    with pytest.raises(UserError) as exc:
        TraceSession(tracefs, host).open()
    assert "PID 4194000 is not running" in one_line(exc) and f"rm {lock}" in str(exc.value)
    assert lock.read_text() == "4194000\n"


def test_active_tracer_refused_without_force(tracefs: Path, host: Host) -> None:
    (tracefs / "current_tracer").write_text("function\n")
    with pytest.raises(UserError) as exc:
        TraceSession(tracefs, host).open()
    assert "current_tracer is function" in one_line(exc) and "--force" in str(exc.value)
    assert not host.path(FTRACE_LOCK).exists()
    with TraceSession(tracefs, host, force=True) as session:
        session.write("current_tracer", "function_graph")
    assert (tracefs / "current_tracer").read_text() == "function\n"


# --- recording and restoring -------------------------------------------------

def test_every_write_restored_in_reverse_order(tracefs: Path, host: Host,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import discover.tracefs as module
    before = fake_tracefs.snapshot(tracefs)
    writes = []
    with TraceSession(tracefs, host) as session:
        for name, value in (("tracing_on", "0"), ("buffer_size_kb", "8192"),
                            ("set_graph_function", "nfs_file_read nfs_file_write"),
                            ("set_ftrace_pid", "1 2"), ("max_graph_depth", "10"), ("tracing_thresh", "100"),
                            ("options/funcgraph-proc", "1"), ("current_tracer", "function_graph"),
                            ("tracing_on", "1")):
            session.write(name, value)
        first_writes = ["tracing_on", "buffer_size_kb", "set_graph_function", "set_ftrace_pid",
                        "max_graph_depth", "tracing_thresh", "options/funcgraph-proc", "current_tracer"]
        assert session.written == first_writes
        real_write = module._write_file
        monkeypatch.setattr(module, "_write_file",
                            lambda path, value: (writes.append(path.relative_to(tracefs).as_posix()),
                                                 real_write(path, value)))
        assert session.restore() == []
    assert writes == list(reversed(first_writes))
    fake_tracefs.assert_restored(before, tracefs)


def test_restore_after_exception(tracefs: Path, host: Host) -> None:
    before = fake_tracefs.snapshot(tracefs)
    with pytest.raises(RuntimeError):
        with TraceSession(tracefs, host) as session:
            session.write("set_graph_function", "nfs_file_read")
            session.write("current_tracer", "function_graph")
            raise RuntimeError("boom")
    fake_tracefs.assert_restored(before, tracefs)
    assert not host.path(FTRACE_LOCK).exists()


def test_failed_restore_is_one_line_and_the_rest_still_restored(tracefs: Path, host: Host) -> None:
    messages = []
    before = fake_tracefs.snapshot(tracefs)
    with TraceSession(tracefs, host, warn=messages.append) as session:
        session.write("max_graph_depth", "10")
        session.write("options/funcgraph-tail", "1")
        session.write("current_tracer", "function_graph")
        # the file vanishes and a directory takes its place: its restore must fail
        (tracefs / "options" / "funcgraph-tail").unlink()
        (tracefs / "options" / "funcgraph-tail").mkdir()
    assert len(messages) == 1 and "\n" not in messages[0]
    assert "could not restore" in messages[0] and "funcgraph-tail" in messages[0]
    (tracefs / "options" / "funcgraph-tail").rmdir()
    (tracefs / "options" / "funcgraph-tail").write_bytes(before["options/funcgraph-tail"])
    fake_tracefs.assert_restored(before, tracefs)


def test_events_enable_mixed_state_restored_per_event(tracefs: Path, host: Host) -> None:
    events = tracefs / "events" / "nfs"
    for name in sorted(p.name for p in (SHARED_TRACEFS / "events" / "nfs").iterdir())[:3]:
        (events / name).mkdir(parents=True)
        (events / name / "enable").write_bytes((fake_tracefs.DEFAULTS / "options" / "funcgraph-tail").read_bytes())
    first = sorted(events.iterdir())[0]
    (first / "enable").write_bytes((fake_tracefs.DEFAULTS / "options" / "funcgraph-cpu").read_bytes())
    (events / "enable").write_text("X\n")
    before = fake_tracefs.snapshot(tracefs)
    with TraceSession(tracefs, host) as session:
        session.write("events/nfs/enable", "1")
        for path in events.glob("*/enable"):
            path.write_text("1\n")  # what the kernel does to every event of the system
    after = fake_tracefs.snapshot(tracefs)
    for name, content in before.items():
        if name != "events/nfs/enable":  # 'X' is a summary the kernel computes, never written
            assert after[name] == content, name


# --- per-file write syntax, checked against what the real kernel accepted --------

@pytest.mark.parametrize("name", ["set_ftrace_filter", "set_graph_function", "set_ftrace_notrace",
                                  "set_graph_notrace", "set_ftrace_pid", "set_ftrace_notrace_pid"])
def test_empty_lists_restore_by_truncation(name: str) -> None:
    original = (fake_tracefs.DEFAULTS / name).read_text()
    assert restore_writes(Original(name, original)) == [(name, "")]


def test_module_entries_restore_in_writable_form() -> None:
    # Real read-backs (fixture README): 'nfs_file_read [nfs]' after writing nfs_file_read,
    # and writing 'vfs_read [nfs]' to set_graph_function is rejected (EINVAL).
    shown = (LAB / "readback" / "set_graph_function.nfs_file_read").read_text()
    assert restore_writes(Original("set_graph_function", shown)) == [("set_graph_function", "nfs_file_read")]
    shown = (LAB / "readback" / "set_ftrace_filter.nfs_file_read_mod_nfs").read_text()
    assert restore_writes(Original("set_ftrace_filter", shown)) == [("set_ftrace_filter", "nfs_file_read:mod:nfs")]


def test_trigger_lines_are_left_alone() -> None:
    shown = (LAB / "readback" / "set_ftrace_filter.schedule_traceoff").read_text()
    assert restore_writes(Original("set_ftrace_filter", shown)) == [("set_ftrace_filter", "")]


def test_buffer_size_restores_expanded_size() -> None:
    original = (fake_tracefs.DEFAULTS / "buffer_size_kb").read_text()
    assert original.startswith("7 (expanded: ")
    assert restore_writes(Original("buffer_size_kb", original)) == [("buffer_size_kb", "1408")]
    per_cpu = {"per_cpu/cpu0/buffer_size_kb": "1410\n", "per_cpu/cpu1/buffer_size_kb": "2051\n"}
    assert restore_writes(Original("buffer_size_kb", "X\n", per_cpu)) == [
        ("per_cpu/cpu0/buffer_size_kb", "1410"), ("per_cpu/cpu1/buffer_size_kb", "2051")]


def test_pid_list_restored() -> None:
    shown = (LAB / "readback" / "set_ftrace_pid.1_2").read_text()
    assert restore_writes(Original("set_ftrace_pid", shown)) == [("set_ftrace_pid", "1 2")]


def test_kernel_view_model_matches_real_readbacks() -> None:
    """The fake's rendering model reproduces what the real kernel showed."""
    readback = LAB / "readback"
    assert fake_tracefs.kernel_view("buffer_size_kb", b"2048") == (readback / "buffer_size_kb.2048").read_bytes()
    assert fake_tracefs.kernel_view("buffer_size_kb", b"1408") == (readback / "buffer_size_kb.1408").read_bytes()
    assert fake_tracefs.kernel_view("set_ftrace_pid", b"1 2") == (readback / "set_ftrace_pid.1_2").read_bytes()
    for name in ("set_ftrace_filter", "set_graph_function", "set_ftrace_notrace", "set_graph_notrace",
                 "set_ftrace_pid"):
        assert fake_tracefs.kernel_view(name, b"") == (fake_tracefs.DEFAULTS / name).read_bytes()

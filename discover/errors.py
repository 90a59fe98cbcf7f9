"""The error boundary of every console script: one line on stderr, a known exit code, nothing left behind.

Why one place: a user who types a wrong path, presses Ctrl-C or sends SIGTERM must get
the same answer from every command (one line, exit 1 / 2 / 130 / 143), and whatever a
command changed on the way (tracefs mounted, a child such as `dot` or `xz` started, a
half-written directory) must be undone on every one of those paths. Commands register
such undo steps here (`at_exit`, `run_child`, `spawn`); `run_cli` runs them. A bug is
still one line on the terminal; its traceback goes to a log file under the cache
directory. This module is imported by every layer, so it imports nothing of probekit.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path

TYPE_CHECKING = False  # typing's constant without typing (discover/records.py)
if TYPE_CHECKING:
    from typing import Any, Callable, Iterator, List, NoReturn, Optional, Sequence, Tuple, Union
    import subprocess

    import click

#: exit codes of the boundary: a user error, a command line that does not parse, Ctrl-C, SIGTERM
EXIT_ERROR, EXIT_USAGE, EXIT_SIGINT, EXIT_SIGTERM = 1, 2, 128 + signal.SIGINT, 128 + signal.SIGTERM
#: longest message printed; beyond this a (huge) input is cut, the line stays readable
MAX_LINE = 600
#: the signals that stop a command: Ctrl-C, and the two run_cli turns into Terminated
STOP_SIGNALS = frozenset((signal.SIGINT, signal.SIGTERM, signal.SIGHUP))


class UserError(Exception):
    """A problem the user can fix (bad input, missing privilege, absent kernel feature).

    Commands print it as one line on stderr and exit non-zero.
    """

    exit_code = EXIT_ERROR


class UsageError(UserError):
    """A command line that does not parse (an unknown option, a value out of its range): exit 2."""

    exit_code = EXIT_USAGE


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived: unwind like Ctrl-C (a BaseException, so `except Exception` cannot eat it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def cache_root() -> Path:
    """Where probekit caches downloads, images, lab state and logs (PROBEKIT_CACHE overrides)."""
    env = os.environ.get("PROBEKIT_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "probekit"


def _in_cache(filename: Any) -> bool:
    """Whether an OSError's file is in the cache, or a directory made on the way to it (~/.cache)."""
    if not isinstance(filename, (str, Path)):
        return False
    root, path = os.path.abspath(cache_root()), os.path.abspath(filename)
    return os.path.commonpath([root, path]) in (root, path)


def _cache_problem(exc: OSError) -> str:
    """Why the cache cannot be used, naming it and the variable that moves it: a HOME that is
    read-only, full or not a directory otherwise shows as a bare "Permission denied"."""
    moved = bool(os.environ.get("PROBEKIT_CACHE"))
    how = ("point PROBEKIT_CACHE at a writable directory" if moved
           else "set PROBEKIT_CACHE to a writable directory to move it")
    return (f"cannot use the cache directory {cache_root()}{' (PROBEKIT_CACHE)' if moved else ''}: "
            f"{exc.strerror or exc}: {exc.filename}; {how}")


def one_line(text: str) -> str:
    """`text` as one printable line: control characters (a newline in a file name) escaped, cut at MAX_LINE."""
    out = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)
    return out if len(out) <= MAX_LINE else out[:MAX_LINE - 3] + "..."


def short(value: Any, limit: int = 60) -> str:
    """repr() of a value for an error message, cut so a huge input gives a short line."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


# -- undo steps ------------------------------------------------------------------------

#: (step, the thread that registered it), in the order registered
_cleanups: List[Tuple[Callable[[], None], threading.Thread]] = []
_cleanups_lock = threading.Lock()


def at_exit(step: Callable[[], None]) -> Callable[[], None]:
    """Run `step` when the command ends, however it ends (last registered runs first)."""
    with _cleanups_lock:
        _cleanups.append((step, threading.current_thread()))
    return step


def forget(step: Callable[[], None]) -> None:
    """`step` was done (or is no longer needed) by the code that registered it."""
    with _cleanups_lock:
        _cleanups[:] = [entry for entry in _cleanups if entry[0] != step]


def _forked() -> None:
    """A forked child starts with no undo steps, and a lock no other thread holds: its
    parent's steps (a child's process group, a partial download) are the parent's to run."""
    global _cleanups_lock
    _cleanups_lock = threading.Lock()
    _cleanups.clear()


os.register_at_fork(after_in_child=_forked)


@contextlib.contextmanager
def stop_signals_blocked() -> Iterator[None]:
    """The stop signals held back, not lost, around a fork of worker processes: the child
    starts with them blocked, to unblock them once its own handlers are set (the parent's,
    inherited, would print a traceback from the worker), and the parent's handler cannot run
    inside a fork hook, where its exception is lost ("Exception ignored in ..."). One that
    came meanwhile is handled on the way out."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _next_cleanup() -> Optional[Callable[[], None]]:
    """The last step this thread registered, or a thread that ended without running its own."""
    me = threading.current_thread()
    with _cleanups_lock:
        for i in range(len(_cleanups) - 1, -1, -1):
            step, owner = _cleanups[i]
            if owner is me or not owner.is_alive():
                del _cleanups[i]
                return step
    return None


def run_cleanups() -> List[str]:
    """Run and drop the undo steps of this thread's command; one line per step that failed.
    Another live thread's steps are its own: a test process runs commands in-process while its
    lab threads fetch kernel packages (a command's end had ended their xz and download)."""
    failed = []
    step = _next_cleanup()
    while step is not None:
        try:
            step()
        except Exception as exc:  # one failed undo step must not skip the others
            failed.append(f"cleanup {getattr(step, '__name__', step)} failed: {exc}")
        step = _next_cleanup()
    return failed


def end_process_group(proc: "subprocess.Popen[Any]") -> int:
    """The child's exit status, after ending its whole process group if it still runs."""
    import subprocess  # where a child was started: the tracing tools start none, and skip its import

    if proc.poll() is None:
        for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
    return proc.wait()


def spawn(argv: Sequence[str], **kwargs: Any) -> "subprocess.Popen[Any]":
    """Start a child in its own process group, ended (with its children) when the command ends.

    Call `release(proc)` once the caller has waited for it normally.
    """
    import subprocess

    proc: "subprocess.Popen[Any]" = subprocess.Popen(list(argv), start_new_session=True, **kwargs)
    proc._probekit_end = at_exit(lambda: end_process_group(proc))  # type: ignore[attr-defined]
    return proc


def release(proc: "subprocess.Popen[Any]") -> int:
    """End a child started by `spawn` (if still running) and drop its undo step; its exit status."""
    status = end_process_group(proc)
    forget(getattr(proc, "_probekit_end", lambda: None))
    return status


def run_child(argv: Sequence[str], input: Optional[bytes] = None,
              timeout: Optional[float] = None, **kwargs: Any) -> "subprocess.CompletedProcess[Any]":
    """subprocess.run in its own process group: on Ctrl-C, SIGTERM or an error the group is ended too."""
    import subprocess

    proc = spawn(argv, stdin=subprocess.PIPE if input is not None else kwargs.pop("stdin", None), **kwargs)
    try:
        out, err = proc.communicate(input, timeout=timeout)
    finally:
        status = release(proc)
    return subprocess.CompletedProcess(list(argv), status, out, err)


def write_file(path: Union[str, Path], data: Union[str, bytes]) -> None:
    """Write a command's output file; any failure is one UserError naming the path.

    A regular file is written beside itself and renamed into place, so a full device or
    an interrupted write leaves the previous file whole and no partial one; a device or
    FIFO (/dev/stdout, /dev/full) is written directly."""
    path = Path(path)
    raw = data if isinstance(data, bytes) else data.encode("utf-8")
    if path.exists() and not path.is_file():
        try:
            with open(path, "wb") as fh:
                fh.write(raw)
        except OSError as exc:
            raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None
        return
    real = Path(os.path.realpath(path))  # through a symlink, as an in-place write would go
    tmp = real.with_name(f".{real.name}.{os.getpid()}.partial")
    try:
        try:
            with open(tmp, "wb") as fh:
                fh.write(raw)
            if real.exists():
                os.chmod(tmp, real.stat().st_mode & 0o7777)
            os.replace(tmp, real)
        finally:
            if tmp.exists():
                tmp.unlink()
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None


def same_file(a: Union[str, Path], b: Union[str, Path]) -> bool:
    """Whether two paths name one existing file (symlinks and hard links resolved)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _probe_device(path: Path, option: str) -> None:
    """Write nothing to a character device: a device that cannot take a write (/dev/full,
    one the user may not open) refuses even that, so it is refused before any work, while a
    terminal or /dev/null takes it (opened without blocking, as a serial line's open may).
    FIFOs are not opened: with no reader yet, that would block."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError as exc:
        raise UserError(f"{option} {path}: cannot write: {exc.strerror or exc}") from None
    try:
        os.write(fd, b"")
    except OSError as exc:
        raise UserError(f"{option} {path}: cannot write: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def check_output(path: Union[str, Path], inputs: Sequence[Union[str, Path]] = (), option: str = "-o",
                 make_parents: bool = False) -> None:
    """Refuse an output path before any work (a capture, a download, a long analysis) is done
    for it: one that names an input (it would be overwritten), a directory, a path under a
    regular file, a missing directory (unless make_parents), a directory the user cannot
    write in, a full device holding the file, or a character device that refuses a write
    (/dev/full). The checks a write itself would make, made first."""
    path = Path(path)
    for given in inputs:
        if same_file(path, given):
            raise UserError(f"{option} {path}: is the input {given} (it would be overwritten); write elsewhere")
    if path.is_dir():
        raise UserError(f"{option} {path}: is a directory; name a file")
    if path.exists() and not path.is_file():  # /dev/stdout, /dev/full, a FIFO: written as they are
        if path.is_char_device():
            _probe_device(path, option)
        return
    parent = path.parent
    existing = parent
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        what = "a file, not a directory" if existing.is_file() else "not a directory"
        raise UserError(f"{option} {path}: the parent {existing} is {what}")
    if existing != parent and not make_parents:
        raise UserError(f"{option} {path}: no directory {parent}; create it first")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{option} {path}: cannot write in {existing} (permission denied)")
    disk = os.statvfs(existing)
    if disk.f_blocks and (disk.f_bfree if os.geteuid() == 0 else disk.f_bavail) == 0:
        raise UserError(f"{option} {path}: no space left on the device holding {existing}")


# -- the boundary ----------------------------------------------------------------------

def log_dir() -> Path:
    return cache_root() / "logs"


def _write_log(prog: str, exc: BaseException) -> str:
    """Save the traceback of an unexpected exception; where it went (or why it could not be saved)."""
    import traceback  # for a bug's log only

    path = log_dir() / f"{prog}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.log"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        path.write_text(f"{prog} {' '.join(sys.argv[1:])}\n{text}", encoding="utf-8", errors="replace")
    except OSError as err:
        return f"no log written: {err.strerror or err}: {path}"
    return f"details in {path}"


def _raise_terminated(signum: int, _frame: Any) -> None:
    raise Terminated(signum)


def _message(exc: BaseException) -> tuple:
    """(exit code, message) for an exception reaching the boundary; None message = print nothing."""
    if isinstance(exc, UserError):
        return exc.exit_code, f"error: {exc}"
    # click only where a command imported it: the package build (probes.build_core) has no click,
    # and the tools parse their command lines with argparse (discover.arguments)
    click = sys.modules.get("click")
    if click is None:
        return _plain_message(exc)
    # click 8.2+ raises this for a group called without a command (older click printed the help itself)
    no_args_is_help = getattr(click.exceptions, "NoArgsIsHelpError", ())
    if isinstance(exc, click.exceptions.Exit):
        return exc.exit_code, None
    if isinstance(exc, no_args_is_help):  # a bare group: its help on stdout, the problem on stderr
        click.echo(exc.ctx.get_help())
        return exc.exit_code, f"error: missing command (see {exc.ctx.command_path} --help)"
    if isinstance(exc, click.UsageError) and exc.ctx is not None:
        return exc.exit_code, f"error: {exc.format_message()} (see {exc.ctx.command_path} --help)"
    if isinstance(exc, click.ClickException):
        return exc.exit_code, f"error: {exc.format_message()}"
    if isinstance(exc, click.exceptions.Abort):
        return EXIT_SIGINT, "interrupted (Ctrl-C); stopped and cleaned up"
    return _plain_message(exc)


def _plain_message(exc: BaseException) -> tuple:
    """(exit code, message) for the exceptions every command may raise, click or not."""
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_SIGINT, "interrupted (Ctrl-C); stopped and cleaned up"
    if isinstance(exc, Terminated):
        return 128 + exc.signum, f"terminated by {exc}; stopped and cleaned up"
    if isinstance(exc, UnicodeError):
        return EXIT_ERROR, f"error: {exc}"
    if isinstance(exc, OSError):  # e.g. an output path in a missing directory: say which file
        if _in_cache(exc.filename):
            return EXIT_ERROR, f"error: {_cache_problem(exc)}"
        path = f": {exc.filename}" if exc.filename is not None else ""
        return EXIT_ERROR, f"error: {exc.strerror or exc}{path}"
    return None, None


def run_cli(prog: str, entry: Union[click.Command, Callable[[], object]],
            args: Optional[List[str]] = None) -> NoReturn:
    """Run a command (a click command, or a plain callable) inside the boundary and exit.

    A click command is invoked without click's own main(): that one turns Ctrl-C into an
    Abort with a blank stderr line first, and lets other exceptions through as tracebacks.
    """
    click = sys.modules.get("click")
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _raise_terminated)
    for var in ("COLUMNS", "LINES"):  # COLUMNS=0 would make rich print nothing: use the terminal's size
        value = os.environ.get(var, "1")
        if not value.isdigit() or int(value) == 0:
            del os.environ[var]
    code: int = 0
    line: Optional[str] = None
    try:
        if click is not None and isinstance(entry, click.Command):
            argv = sys.argv[1:] if args is None else args
            with entry.make_context(prog, list(argv)) as ctx:
                entry.invoke(ctx)
        else:
            entry()
    except SystemExit as exc:  # a command's own exit code (e.g. `labs run` passes the guest's through)
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_ERROR)
        if exc.code is not None and not isinstance(exc.code, int):
            line = str(exc.code)
    except BrokenPipeError:  # `| head`: the reader is gone, nothing to report
        _silence_stdout()
    except BaseException as exc:  # the boundary: everything ends here as one line
        known, line = _message(exc)
        if known is None:
            code, line = EXIT_ERROR, f"internal error: {type(exc).__name__}: {exc} ({_write_log(prog, exc)})"
        else:
            code = known
        if line is not None:
            line = f"{prog}: {line}"
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # cleanup is not interrupted again
            signal.signal(signum, signal.SIG_IGN)
        problems = run_cleanups()
    if problems and line is None and code == 0:
        code = EXIT_ERROR
    if problems:
        line = f"{line}; " if line else f"{prog}: "
        line += "; ".join(problems)
    if line:
        try:
            print(one_line(line), file=sys.stderr, flush=True)
        except OSError:
            pass
    try:
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        _silence_stdout()
    except OSError as exc:  # e.g. stdout is /dev/full
        print(one_line(f"{prog}: error: cannot write standard output: {exc.strerror or exc}"), file=sys.stderr)
        _silence_stdout()
        code = code or EXIT_ERROR
    sys.exit(code)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not complain about a closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass

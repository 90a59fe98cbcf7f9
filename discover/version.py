"""probekit's version, decided in one place: the installed distribution's metadata.

scripts/build-deb writes the package's version (pyproject.toml's plus the build's git suffix,
0.1.0+gitN.HASH) into the copy of pyproject.toml the wheel is built from, so the Debian
package, `--version`, the exporter's probekit_build_info and the tools' `-v` all read the same
string. Run from a checkout that is not installed (a lab guest's source share), the version is
pyproject.toml's, marked as a checkout's.
"""
from __future__ import annotations

import re
from pathlib import Path

TYPE_CHECKING = False  # typing's constant without typing (discover/records.py)
if TYPE_CHECKING:
    from typing import Any, Callable

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def probekit_version() -> str:
    """The running probekit's version: the metadata installed beside its packages (the Debian
    package's /usr/lib/probekit, a wheel's site-packages), read as a file: importlib.metadata
    (which imports email) costs the exporter's first scrape and a tool's -v 1.4 MiB. Else the
    installed distribution importlib.metadata finds (an editable install), else the checkout's
    pyproject.toml's."""
    beside = list(PYPROJECT.parent.glob("probekit-*.dist-info/METADATA"))
    if len(beside) == 1:
        found = re.search(r"^Version: (\S+)$", beside[0].read_text(errors="replace"), re.M)
        if found:
            return found.group(1)
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("probekit")
    except PackageNotFoundError:
        match = re.search(r'^version = "([^"]+)"$', PYPROJECT.read_text(), re.M) if PYPROJECT.is_file() else None
        return f"{match.group(1)}+checkout" if match else "unknown"


def version_option(command: Callable[..., Any]) -> Any:
    """--version on a click command (the groups'): its name and probekit's version. click is
    imported here, by the commands that use it: the tools parse with argparse
    (discover.arguments) and do not pay for its import."""
    import click

    def print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
        if value and not ctx.resilient_parsing:
            click.echo(f"{ctx.info_name} {probekit_version()}")
            ctx.exit()

    return click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=print_version,
                        help="Print probekit's version and exit.")(command)

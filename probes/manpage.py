"""Man pages for probekit's commands, rendered from each command's own --help.

The Debian package's build (packaging/debian/rules) runs `python3 -m probes.manpage OUTDIR
EXAMPLES SBIN` in its installed tree: one page per console script of the installed distribution,
in section 8 for the commands it puts in SBIN (administration: root's tracing tools), else 1,
so a page says what `NAME --help` says, examples included (a group's page has each
subcommand's help too), followed by the real run of docs/examples/NAME_example.txt where there
is one. The text is kept as --help lays it out (no-fill blocks), only escaped for roff.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import sys
from importlib.metadata import distribution
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Tuple

from discover.version import probekit_version

#: where the package installs docs/examples (dh_installexamples)
EXAMPLES_INSTALLED = "/usr/share/doc/probekit/examples"
HELP_COLUMNS = "80"


def console_scripts() -> Dict[str, Callable[[], None]]:
    """NAME -> entry function, for every console script of the installed probekit."""
    return {ep.name: ep.load() for ep in distribution("probekit").entry_points if ep.group == "console_scripts"}


@contextlib.contextmanager
def kept_signals() -> Iterator[None]:
    """A command run in this process leaves SIGINT, SIGTERM and SIGHUP as it found them: its
    boundary ignores them on its way out, which a process going on, and every child it starts,
    would inherit."""
    dispositions = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, disposition in dispositions.items():
            signal.signal(sig, disposition)


def help_text(main: Callable[[], None], argv: List[str]) -> str:
    """What `argv --help` prints, run in this process through the command's own entry point."""
    out = io.StringIO()
    saved, os.environ["COLUMNS"] = (sys.argv, os.environ.get("COLUMNS")), HELP_COLUMNS
    sys.argv = [*argv, "--help"]
    try:
        with contextlib.redirect_stdout(out), kept_signals():
            main()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise RuntimeError(f"`{' '.join(argv)} --help` exited {exc.code}") from None
    finally:
        sys.argv = saved[0]
        if saved[1] is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved[1]
    return out.getvalue()


def split_help(text: str) -> Tuple[str, Dict[str, List[str]]]:
    """A command's help (click's, or discover.arguments' in the same layout) -> its usage line
    and its blocks: description, Arguments, Options, Commands, epilog (each dedented by two
    spaces)."""
    lines = text.rstrip("\n").splitlines()
    usage = lines[0].split(":", 1)[1].strip()
    blocks: Dict[str, List[str]] = {"description": [], "Arguments": [], "Options": [], "Commands": [], "epilog": []}
    current = "description"
    for line in lines[1:]:
        if line.strip() == "\b":  # click's no-rewrap marker, which some epilogs leave in --help
            continue
        if line in ("Arguments:", "Options:", "Commands:"):
            current = line[:-1]
            continue
        if current in ("Arguments", "Options", "Commands") and not line.strip():
            current = "epilog"
        blocks[current].append(line[2:] if line.startswith("  ") else line)
    return usage, {name: _trim(block) for name, block in blocks.items()}


def _trim(block: List[str]) -> List[str]:
    while block and not block[0].strip():
        block = block[1:]
    while block and not block[-1].strip():
        block = block[:-1]
    return block


def roff(text: str) -> str:
    """One line of text, escaped for roff: backslashes, minus signs, a leading control
    character, and anything outside ASCII as a named Unicode escape."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    text = "".join(ch if ord(ch) < 128 else f"\\[u{ord(ch):04X}]" for ch in text)
    return "\\&" + text if text.startswith((".", "'")) else text


def verbatim(lines: List[str]) -> List[str]:
    """Lines kept as they are laid out (no fill, no adjustment)."""
    return [".nf", *[roff(line) if line.strip() else "" for line in lines], ".fi"]


def summary(description: List[str]) -> str:
    """The NAME line's text: the description's first sentence, up to its first aside when long
    (whatis lists it on one line)."""
    first = description[:next((i for i, line in enumerate(description) if not line.strip()), len(description))]
    paragraph = ""
    for line in (line.strip() for line in first):
        paragraph += line if paragraph.endswith("-") or not paragraph else " " + line
    sentence = re.split(r"(?<=[a-z)])\. ", paragraph, maxsplit=1)[0].rstrip(".")
    if len(sentence) > 70:
        cut = re.search(r".{30,}?(?= \(|: |, with )", sentence)
        sentence = cut.group(0) if cut else sentence
    return sentence[0].lower() + sentence[1:] if sentence[:2].istitle() else sentence


def section(title: str, blocks: Dict[str, List[str]]) -> List[str]:
    """The description, options and epilog of one command's help, under one heading."""
    out = verbatim(blocks["description"]) if blocks["description"] else []
    for heading in ("Arguments", "Options", "Commands"):
        if blocks[heading]:
            out += [".PP", f"{heading}:", *verbatim(blocks[heading])]
    if blocks["epilog"]:
        out += [".PP", *verbatim(blocks["epilog"])]
    return [f".SH {title}", *out]


def page(name: str, main: Callable[[], None], examples: Path, sections: Dict[str, int]) -> str:
    """NAME.SECTION: the command's help, each subcommand's, the example run, and the other commands."""
    usage, blocks = split_help(help_text(main, [name]))
    lines = [f'.TH {roff(name.upper())} {sections[name]} "" "probekit {roff(probekit_version())}" "probekit"',
             ".SH NAME", f"{roff(name)} \\- {roff(summary(blocks['description']))}",
             ".SH SYNOPSIS", ".nf", roff(usage), ".fi"]
    lines += section("DESCRIPTION", blocks)
    if blocks["Commands"]:
        lines.append(".SH COMMANDS")
        for sub in (line.split()[0] for line in blocks["Commands"] if line and not line[0].isspace()):
            sub_usage, sub_blocks = split_help(help_text(main, [name, sub]))
            lines += [f".SS {roff(name)} {roff(sub)}", ".nf", roff(sub_usage), ".fi"]
            lines += section("", sub_blocks)[1:]
    example = examples / f"{name}_example.txt"
    if example.is_file():
        lines += [".SH EXAMPLE RUN", f"A real run, also installed as {roff(EXAMPLES_INSTALLED)}/{roff(example.name)}:",
                  ".PP", *verbatim(example.read_text().rstrip("\n").splitlines())]
    lines += [".SH SEE ALSO", ", ".join(f"\\fB{roff(other)}\\fR({section})" for other, section in sorted(sections.items())
                                        if other != name),
              ".PP", f"/usr/share/doc/probekit/ (README, changelog and {roff(EXAMPLES_INSTALLED)})"]
    return "\n".join(lines) + "\n"


def main() -> None:
    """python3 -m probes.manpage OUTDIR EXAMPLES_DIR SBIN_DIR: a page for every console script."""
    if len(sys.argv) != 4:
        sys.exit("usage: python3 -m probes.manpage OUTDIR EXAMPLES_DIR SBIN_DIR")
    out, examples, sbin = (Path(arg) for arg in sys.argv[1:])
    out.mkdir(parents=True, exist_ok=True)
    scripts = console_scripts()
    sections = {name: 8 if (sbin / name).exists() else 1 for name in scripts}
    for name, entry in sorted(scripts.items()):
        (out / f"{name}.{sections[name]}").write_text(page(name, entry, examples, sections))


if __name__ == "__main__":
    main()

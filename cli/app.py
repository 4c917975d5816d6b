"""The typer application, shared console and styles, and the error boundary."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer
from rich.console import Console

from .._version import __version__
from ..errors import PerfdiagError
from .signals import exit_interrupted

app = typer.Typer(
    name="perfdiag",
    help="Profile and diagnose LLM inference: capture runs, analyse them, follow the triage.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
out = Console()
STATUS_STYLE = {
    "ok": "green",
    "warn": "yellow",
    "missing": "red",
    "complete": "green",
    "running": "cyan",
    "interrupted": "yellow",
    "crashed": "red",
}


def _version(value: bool) -> None:
    if value:
        print(f"perfdiag {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """perfdiag: profiling and performance diagnosis for LLM inference."""


INTERNAL_ERROR = 70  # EX_SOFTWARE: a bug in perfdiag, not in what the user gave it


def _plain_help(command) -> None:
    """Escape rich markup in every help text: "[cpu]" or "[runs/<time>]" is a default
    to show, not a tag to swallow (rich read them as markup and printed "Run directory .")."""
    from rich.markup import escape

    if getattr(command, "help", None):
        command.help = escape(command.help)
    for param in getattr(command, "params", ()):
        if getattr(param, "help", None):
            param.help = escape(param.help)
    for sub in getattr(command, "commands", {}).values():
        _plain_help(sub)


def main(argv: list[str] | None = None) -> None:
    try:
        command = typer.main.get_command(app)
        _plain_help(command)
        command(args=argv, prog_name="perfdiag", standalone_mode=True)
    except PerfdiagError as e:
        print(f"perfdiag: error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        exit_interrupted()
    except Exception as e:  # a bug: one line for the user, the traceback kept for a report
        from ..traces.storage_errors import storage_error

        if (full := storage_error(None, e)) is not None:  # the machine's disk, not a bug
            print(f"perfdiag: error: {full}", file=sys.stderr)
            sys.exit(1)
        if isinstance(e, OSError) and e.filename is not None:
            # A path the user gave that the system refuses (too long, no access): theirs.
            print(f"perfdiag: error: {e.filename}: {e.strerror or e}", file=sys.stderr)
            sys.exit(1)
        if os.environ.get("PERFDIAG_DEBUG"):
            raise
        where = _save_traceback()
        first = (str(e).strip().splitlines() or [""])[0][:200]
        print(f"perfdiag: internal error: {type(e).__name__}: {first} (a bug in perfdiag; "
              f"traceback in {where}; PERFDIAG_DEBUG=1 shows it)", file=sys.stderr)  # fmt: skip
        sys.exit(INTERNAL_ERROR)


def _save_traceback() -> str:
    import tempfile
    import time
    import traceback

    path = os.path.join(tempfile.gettempdir(), f"perfdiag-crash-{time.strftime('%Y%m%d-%H%M%S')}"
                                               f"-{os.getpid()}.txt")  # fmt: skip
    try:
        with open(path, "w") as f:
            f.write(f"perfdiag {__version__}: {' '.join(sys.argv)}\n\n")
            f.write(traceback.format_exc())
    except OSError:
        return "(could not be saved)"
    return path

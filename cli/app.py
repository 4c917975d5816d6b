"""The typer application, shared console and styles, and the error boundary."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.console import Console

from .._version import __version__
from ..errors import PerfdiagError

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


def main(argv: list[str] | None = None) -> None:
    try:
        app(args=argv, prog_name="perfdiag", standalone_mode=True)
    except PerfdiagError as e:
        print(f"perfdiag: error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("perfdiag: interrupted", file=sys.stderr)
        sys.exit(130)

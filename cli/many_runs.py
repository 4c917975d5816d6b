"""Options `perfdiag sweep` and `perfdiag capacity` share: both make many runs from
`perfdiag run` flags, against engine_ref or an HTTP target."""

from __future__ import annotations

from typing import Annotated

import typer

Target = Annotated[
    str | None,
    typer.Option(
        help="Drive this OpenAI-compatible server instead of engine_ref.", show_default=False
    ),
]
ApiKey = Annotated[
    str | None,
    typer.Option(envvar="PERFDIAG_API_KEY", help="The target's key.", show_default=False),
]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No live progress.")]


def set_flags(what: str, example: str):
    """`--set FLAG=VALUE`, several: a `perfdiag run` flag every `what` shares."""
    return Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            metavar="FLAG=VALUE",
            help=f"A `perfdiag run` flag every {what} shares, e.g. {example}.",
            show_default=False,
        ),
    ]

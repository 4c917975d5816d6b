"""Every command's --help shows its texts whole: a default written "[cpu]" or a
placeholder "[runs/<time>-<workload>]" is text, not rich markup to be swallowed."""

from __future__ import annotations

import re

import typer
from click.testing import CliRunner

from perfdiag.cli import app
from perfdiag.cli.app import _plain_help


def test_bracketed_defaults_survive_in_every_help():
    command = typer.main.get_command(app)
    _plain_help(command)
    checked = 0
    for name, sub in command.commands.items():
        shown = CliRunner().invoke(
            command, [name, "--help"], terminal_width=400, env={"COLUMNS": "400"}
        )
        assert shown.exit_code == 0, (name, shown.output)
        text = re.sub(r"\s+", " ", re.sub(r"[│╭╮╰╯─]", " ", shown.output))
        for param in sub.params:
            for bracket in re.findall(r"\[[^\]]+\]", getattr(param, "help", None) or ""):
                assert bracket.replace("\\", "") in text, (name, param.name, bracket)
                checked += 1
    assert checked > 20  # run, serve, analyze … have many

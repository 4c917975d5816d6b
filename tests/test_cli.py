"""The command line itself: version, help on every command, doctor."""

import json

import pytest

from perfdiag import __version__
from perfdiag.cli import app

COMMANDS = sorted(c.name or c.callback.__name__ for c in app.registered_commands)


def test_version(cli):
    result = cli("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"perfdiag {__version__}"


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_on_every_command(cli, command):
    result = cli(*([command] if command else []), "--help")
    assert result.returncode == 0, result.stderr
    assert "Usage" in result.stdout


def test_doctor_reports_every_area_without_a_gpu(cli):
    result = cli("doctor", "--json")
    assert result.returncode == 0, result.stderr
    checks = {c["area"]: c for c in json.loads(result.stdout)}
    for area in (
        "python",
        "cpu",
        "torch",
        "triton",
        "nvml",
        "perfetto",
        "textual",
        "pandas",
        "pyarrow",
    ):
        assert area in checks, area
    assert checks["torch"]["status"] in ("ok", "warn")
    assert checks["perfetto"]["status"] == "ok"
    human = cli("doctor")
    assert human.returncode == 0 and "triton" in human.stdout


def test_unknown_command_is_a_usage_error(cli):
    result = cli("no-such-command")
    assert result.returncode == 2 and "Traceback" not in result.stderr

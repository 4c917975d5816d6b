"""`perfdiag CMD` imports CMD's module alone (issue 36: a process's start-up counts in the
import + timeline figure), and the trace commands never load torch: the command table in
perfdiag/cli/__init__.py matches what the modules register, and a real `import` and
`timeline` (fresh interpreters, through `main` as the console script calls it) load
neither torch, triton nor textual, nor any other command's module."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

KINETO = Path(__file__).resolve().parent / "data" / "kineto"
HEAVY = ("torch", "triton", "textual")

# What the command ran with, printed when the process exits (main ends in sys.exit).
PROBE = """
import atexit, json, sys
atexit.register(lambda: print("MODULES " + json.dumps(sorted(
    m for m in sys.modules if m.split(".")[0] in {heavy} or m.startswith("perfdiag.cli.")))))
from perfdiag.cli import main
main(sys.argv[1:])
"""


def _modules(*args: str) -> list[str]:
    code = PROBE.format(heavy=set(HEAVY))
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("MODULES "))
    return json.loads(line.removeprefix("MODULES "))


def test_the_command_table_matches_the_modules():
    from perfdiag.cli import COMMANDS, app

    registered = {
        (c.name or c.callback.__name__.replace("_", "-")): c.callback.__module__
        for c in app.registered_commands
    }
    assert registered == {name: f"perfdiag.cli.{m}" for name, m in COMMANDS.items()}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    out = tmp_path_factory.mktemp("lazy") / "run"
    loaded = _modules("import", str(KINETO / "a100_alexnet_cuda_sync.json.gz"), "-o", str(out))
    return out, loaded


def _commands(loaded: list[str]) -> set[str]:
    from perfdiag.cli import COMMANDS

    return {m.rsplit(".", 1)[1] for m in loaded} & set(COMMANDS.values())


def test_import_loads_its_module_alone_and_no_torch(imported):
    _, loaded = imported
    assert not [m for m in loaded if m.split(".")[0] in HEAVY]
    assert _commands(loaded) == {"import_trace"}


def test_timeline_loads_its_module_alone_and_no_torch(imported):
    run, _ = imported
    loaded = _modules("timeline", str(run))
    assert not [m for m in loaded if m.split(".")[0] in HEAVY]
    assert _commands(loaded) == {"timeline"}


def test_help_and_unknown_names_still_see_every_command():
    from perfdiag.cli import COMMANDS

    assert _commands(_modules("--help")) == set(COMMANDS.values())

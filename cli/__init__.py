"""The `perfdiag` command line. Commands only parse, call into the package and format.

One module per command; importing it registers the command on `app`. Any PerfdiagError
becomes one line on stderr and exit code 1; Ctrl-C exits 130.

`main` imports only the module of the command it runs (all of them for `--help` or a
name it does not know): `perfdiag import` and `perfdiag timeline` no longer pay for every
other command's imports (pandas for `import`, the triage and serving analyzers for both:
~0.3 s and ~40 MB a process). `perfdiag.cli.app` has every command.
"""

from .signals import exit_interrupted, handle_signals_early

handle_signals_early()  # before the imports below: they take a second or two

# command name -> the module that registers it (tests/test_cli_lazy.py checks the table)
COMMANDS = {
    "analyze": "analyze",
    "calibrate": "calibrate",
    "capacity": "capacity",
    "compare": "compare",
    "doctor": "doctor",
    "export": "export",
    "import": "import_trace",
    "inspect": "inspect",
    "join": "http_join",
    "report": "report",
    "run": "run",
    "serve": "serve",
    "sweep": "sweep",
    "timeline": "timeline",
    "tui": "tui",
}

try:
    from . import app as _app_module
except KeyboardInterrupt:
    exit_interrupted()
del app  # noqa: F821  (the submodule's name: `perfdiag.cli.app` is the Typer app, below)


def register(names=None) -> None:
    """Import the modules of these commands (every command's when None)."""
    from importlib import import_module

    for name in COMMANDS if names is None else names:
        import_module(f"{__name__}.{COMMANDS[name]}")


def main(argv: list[str] | None = None) -> None:
    import sys

    args = sys.argv[1:] if argv is None else argv
    command = next((a for a in args if not a.startswith("-")), None)
    if command is None and "--version" in args and "--help" not in args:
        wanted = []  # the version alone needs no command
    else:
        wanted = [command] if command in COMMANDS else None
    try:
        register(wanted)
    except KeyboardInterrupt:
        exit_interrupted()
    _app_module.main(argv)


def __getattr__(name: str):
    if name == "app":  # the whole application, every command registered
        try:
            register()
        except KeyboardInterrupt:
            exit_interrupted()
        return _app_module.app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["app", "main"]

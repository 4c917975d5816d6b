"""The `perfdiag` command line. Commands only parse, call into the package and format.

One module per command; importing it registers the command on `app`. Any PerfdiagError
becomes one line on stderr and exit code 1; Ctrl-C exits 130.
"""

from .signals import exit_interrupted, handle_signals_early

handle_signals_early()  # before the imports below: they take a second or two
try:
    from . import (  # noqa: F401  (registers the commands)
        analyze,
        calibrate,
        capacity,
        compare,
        doctor,
        export,
        http_join,
        import_trace,
        inspect,
        report,
        run,
        serve,
        sweep,
        timeline,
        tui,
    )
    from .app import app, main
except KeyboardInterrupt:
    exit_interrupted()

__all__ = ["app", "main"]

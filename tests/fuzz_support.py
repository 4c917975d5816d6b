"""What the fault and fuzz suites share: the CLI called in-process (fast enough to try
hundreds of inputs), the one verdict every case must meet, and the example budgets.

`make test` tries a few examples per property; `make fuzz` (HYPOTHESIS_PROFILE=fuzz) many.
"""

from __future__ import annotations

import contextlib
import io
import os
import traceback
from dataclasses import dataclass

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=6, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)  # fmt: skip
settings.register_profile(
    "fuzz", max_examples=100, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)  # fmt: skip
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str
    crash: str | None  # the traceback of an exception that escaped the CLI


def call_cli(*args: str) -> Outcome:
    """`perfdiag ARGS` in this process: its exit code, output, and any escaped exception."""
    from perfdiag.cli import main

    out, err = io.StringIO(), io.StringIO()
    code, crash = 0, None
    debug = os.environ.get("PERFDIAG_DEBUG")
    os.environ["PERFDIAG_DEBUG"] = "1"  # a bug escapes as itself, with its traceback
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in args])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # what a user would see as a traceback
            crash = traceback.format_exc()
            code = -1
        finally:
            if debug is None:
                os.environ.pop("PERFDIAG_DEBUG", None)
            else:
                os.environ["PERFDIAG_DEBUG"] = debug
    return Outcome(code, out.getvalue(), err.getvalue(), crash)


def assert_clean(outcome: Outcome, *, allowed=(0, 1, 2)) -> None:
    """Exit 0 (a result), 1 (one line saying what is wrong) or 2 (a usage error, Typer's
    convention), and never a traceback."""
    assert outcome.crash is None, outcome.crash
    assert outcome.code in allowed, (outcome.code, outcome.stderr[-2000:])
    assert "Traceback" not in outcome.stdout + outcome.stderr, outcome.stderr[-3000:]
    if outcome.code == 1:
        lines = [line for line in outcome.stderr.strip().splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("perfdiag: error: "), outcome.stderr

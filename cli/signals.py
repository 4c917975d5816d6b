"""SIGTERM ends a recording the way Ctrl-C does: the engine stops after its step in
flight, an open profiler window closes on its own thread, the run is compacted and marked
`interrupted`. A process manager's SIGTERM (systemd, Kubernetes, `timeout`) is no crash."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from typing import NoReturn


class Terminated:
    """Whether a SIGTERM arrived while `sigterm_as_interrupt` was active."""

    received = False


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[type[Terminated]]:
    def on_term(signum, frame) -> None:
        Terminated.received = True
        # As SIGINT's handler: under asyncio.run that cancels the main task (a graceful
        # stop), elsewhere it raises KeyboardInterrupt where the program is. Called, not
        # re-raised as SIGINT: a shell's background job ignores SIGINT.
        on_int = signal.getsignal(signal.SIGINT)
        if callable(on_int):
            on_int(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, on_term)
    except ValueError:  # not the main thread: leave signals alone
        yield Terminated
        return
    try:
        yield Terminated
    finally:
        signal.signal(signal.SIGTERM, previous)


def handle_signals_early() -> None:
    """From the CLI's first import on, SIGTERM stops perfdiag as Ctrl-C does, with a
    message, instead of the silent default death (imports take a second or two)."""
    if threading.current_thread() is not threading.main_thread():
        return
    with contextlib.suppress(ValueError, OSError):
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:  # keep an embedder's own
            signal.signal(signal.SIGTERM, _terminate)


def _terminate(signum, frame) -> None:
    Terminated.received = True
    raise KeyboardInterrupt


def exit_interrupted() -> NoReturn:
    """The one line and exit code of a perfdiag stopped by Ctrl-C (130) or SIGTERM (143)."""
    word = "terminated" if Terminated.received else "interrupted"
    print(f"perfdiag: {word}", file=sys.stderr)
    sys.exit(143 if Terminated.received else 130)

"""Hold Ctrl-C and SIGTERM over a short section that must not stop halfway (the run's
manifest and its lock), then deliver them: the interrupt still happens, just after.

Python runs signal handlers in the main thread only, whatever thread the OS picks, so
blocking the signal (pthread_sigmask) in one thread defers nothing: the Python-level
handlers are swapped for one that only notes the signal, and the first noted signal is
raised again once the previous handlers are back. Elsewhere than the main thread no
KeyboardInterrupt can arrive, and handlers cannot be changed: nothing to do.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

HELD = (signal.SIGINT, signal.SIGTERM)


class Held:
    """The signals that arrived while held (a long step inside may poll `arrived` to
    stop early, keeping what it must)."""

    def __init__(self) -> None:
        self.noted: list[int] = []

    @property
    def arrived(self) -> bool:
        return bool(self.noted)


@contextlib.contextmanager
def signals_held() -> Iterator[Held]:
    held = Held()
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    previous = {}
    try:
        for signum in HELD:
            previous[signum] = signal.signal(signum, lambda s, _frame: held.noted.append(s))
    except (ValueError, OSError):  # an embedding that owns signals: leave them alone
        _restore(previous)
        yield held
        return
    try:
        yield held
    finally:
        _restore(previous)
        if held.noted:
            signal.raise_signal(held.noted[0])  # its own handler runs now: an interrupt


def _restore(previous: dict) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler if handler is not None else signal.SIG_DFL)

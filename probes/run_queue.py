"""The time a thread spent runnable but waiting for a CPU (Linux's schedstat `run_delay`).

This is the direct measure of CPU contention: a step's thread that waited 3 ms on a run
queue took about 3 ms longer, whatever made the queue (other processes, the engine's own
threads outnumbering the cores). The other host evidence (CPU time per second of step,
involuntary switches) only implies it against a reference the run may not have — a
neighbour present for the whole run leaves no unstarved step to compare with.

`/proc/thread-self/schedstat` holds three numbers: CPU time (ns), run-queue wait (ns),
timeslices. A file descriptor kept open re-reads it with one pread (~2 µs); it names the
thread that opened it, so a reader is per thread. Kernels built without schedstat
accounting report 0 forever: a reading is then indistinguishable from "no wait", and the
analysis treats a run with zero total wait beside involuntary switches as not measured.
"""

from __future__ import annotations

import contextlib
import os
import threading

_PATH = "/proc/thread-self/schedstat"


class ThreadRunDelay:
    """Cumulative run-queue wait of the calling thread, in ns (None: not available).
    `tid` is the thread the last reading was of: two readings are comparable only when it
    did not change between them."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self.tid: int | None = None
        self._failed = False

    def __call__(self) -> int | None:
        if self._failed:
            return None
        tid = threading.get_native_id()
        try:
            if self._fd is None or tid != self.tid:
                self.close()
                self._fd, self.tid = os.open(_PATH, os.O_RDONLY), tid
            return int(os.pread(self._fd, 96, 0).split()[1])
        except (OSError, ValueError, IndexError):
            self._failed = True
            self.close()
            return None

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

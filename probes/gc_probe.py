"""Garbage-collection pauses as spans: a collection stops every Python thread holding the
GIL, so a step it lands in is slower for no reason its batch explains.

`gc.callbacks` calls us at the start and end of each collection (on the thread that
triggered it); each becomes a span of category `gc` named `gc gen<N>` with the objects
collected in its args. Cost: two clock reads and a list append per collection.
"""

from __future__ import annotations

import gc
import json
import os
import threading
import time
from collections.abc import Callable


class GcProbe:
    def __init__(self, append: Callable[[tuple], None]) -> None:
        self._append = append
        self._pid = os.getpid()
        self._started: dict[int, int] = {}  # thread → start of the collection in progress
        self.collections = 0

    def attach(self) -> GcProbe:
        gc.callbacks.append(self._callback)
        return self

    def detach(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        tid = threading.get_native_id()
        now = time.monotonic_ns()
        if phase == "start":
            self._started[tid] = now
            return
        start = self._started.pop(tid, None)
        if start is None:
            return
        gen = info.get("generation", -1)
        args = json.dumps({"generation": gen, "collected": info.get("collected", 0)})
        self._append((f"gc gen{gen}", "gc", start, now - start, self._pid, tid, None, None,
                      None, None, None, None, None, args))  # fmt: skip
        self.collections += 1

"""The one path every Triton launch of engine_ref takes, and the probe's hook on it.

`launch()` checks one module-level name: with no observer attached it launches and returns
(no clock read, no shape walk, no cost model evaluated). An observer (the Triton probe)
receives the kernel, grid, arguments, compile-time meta-parameters and a callable that
evaluates the kernel's cost model, and performs the launch itself so it can time it.
This module imports neither torch nor triton: the engine knows the probe only through it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

Cost = Callable[[], tuple[int, int]]  # () -> (flops, bytes), evaluated only when observed


class LaunchObserver(Protocol):
    def on_launch(self, kernel: Any, grid: tuple, args: tuple, meta: dict, cost: Cost) -> None:
        """Launch `kernel[grid](*args, **meta)` (exactly once) and record it."""

    def on_graph_replay(self, batch_size: int, graph_size: int, start_ns: int, end_ns: int):
        """A decode step ran as a CUDA graph: its launches happened without Python."""


_observer: LaunchObserver | None = None


def launch(kernel: Any, grid: tuple, args: tuple, meta: dict, cost: Cost) -> None:
    obs = _observer
    if obs is None:
        kernel[grid](*args, **meta)
    else:
        obs.on_launch(kernel, grid, args, meta, cost)


def set_observer(observer: LaunchObserver | None) -> LaunchObserver | None:
    """Attach `observer` (None detaches); returns the one attached before."""
    global _observer
    previous, _observer = _observer, observer
    return previous


def observer() -> LaunchObserver | None:
    return _observer


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """No observer inside (CUDA-graph capture: launches are recorded, not run, so there
    is nothing to time, and events must not be recorded into the graph)."""
    previous = set_observer(None)
    try:
        yield
    finally:
        set_observer(previous)

"""What the layout hands to a format writer: tracks, slices, counters, instants, flows.

The layout (`layout.py`) decides what goes where once; a sink only encodes it. Promises
the layout keeps, which the sinks rely on:
- a track is declared before anything is put on it;
- the slices of one track arrive sorted by (start, -end) and nest (lanes.py sees to it);
- the counter samples of one track arrive in time order;
- a flow id appears once in some slice's `flows_out` and once in another's `flows_in`,
  and the `flows_out` slice starts first (on a tie, it was written first).
All times are integer nanoseconds on the run's clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from .tracks import Track

Value = int | float | str | bool
Args = Sequence[tuple[str, Value]]

# Flow ids carry their kind in the bits above 40, so both ends (and Chrome's s/f pair,
# which must agree on a name) can tell it without a lookup.
FLOW_KIND_SHIFT = 40
FLOW_REQUEST_STEP, FLOW_STEP_KERNEL, FLOW_LAUNCH, FLOW_COLLECTIVE = 0, 1, 2, 3
FLOW_NAMES = {
    FLOW_REQUEST_STEP: "request-step",
    FLOW_STEP_KERNEL: "step-kernel",
    FLOW_LAUNCH: "ac2g",
    FLOW_COLLECTIVE: "collective",  # one collective, from rank to rank in entry order
}  # (ac2g: Kineto's name for launch → GPU op)


def flow_id(kind: int, n: int) -> int:
    return (kind << FLOW_KIND_SHIFT) | (n + 1)  # never 0: some readers treat 0 as unset


def flow_kind(fid: int) -> int:
    return fid >> FLOW_KIND_SHIFT


@dataclass(frozen=True)
class TraceInfo:
    run_id: str
    source: str  # perfdiag, kineto, …
    first_ns: int | None  # the earliest timestamp in the run (None: an empty run)
    monotonic_ns: int | None  # the manifest's clock origin: this instant on the run clock…
    wall_ns: int | None  # …is this Unix time in ns
    metadata: dict = field(default_factory=dict)  # small JSON-able facts for the header

    def wall_at(self, t: int) -> int | None:
        if self.monotonic_ns is None or self.wall_ns is None:
            return None
        return t - self.monotonic_ns + self.wall_ns


class Sink(Protocol):
    def begin(self, info: TraceInfo) -> None: ...

    def declare(self, track: Track) -> None: ...

    def slice(
        self,
        track: Track,
        start: int,
        dur: int,
        name: str,
        cat: str,
        args: Args | None = None,
        raw_args: str | None = None,
        flows_out: Sequence[int] = (),
        flows_in: Sequence[int] = (),
    ) -> None: ...

    def counter(self, track: Track, ts: int, value: float) -> None: ...

    def instant(
        self, track: Track, ts: int, name: str, cat: str, args: Args | None = None
    ) -> None: ...

    def close(self) -> None: ...

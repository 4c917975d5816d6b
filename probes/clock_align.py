"""A remote process's monotonic clock against this one's, from a few round trips.

Each probe reads this clock (t0), asks the other side for its clock (t_remote), reads this
clock again (t1). If the remote read happened anywhere inside [t0, t1], its offset is
t_remote − (t0 + t1) / 2 within ± (t1 − t0) / 2; the probe with the smallest round trip
bounds it best (NTP's min-RTT filter: queueing only ever lengthens a round trip). Measured
at a shard's start and again at its end, the two estimates also bound the clocks' drift
over the run: a timestamp converted with the start offset is off by at most
max(start ± , end ±, |end − start|).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

PROBES = 9  # round trips per estimate; the fastest one is kept


@dataclass(frozen=True)
class OffsetEstimate:
    offset_ns: int  # remote clock − local clock
    uncertainty_ns: int  # half the fastest round trip
    rtt_ns: int  # the fastest round trip
    probes: int


def estimate_offset(read_remote_ns: Callable[[], int], probes: int = PROBES) -> OffsetEstimate:
    """The remote clock's offset from `time.monotonic_ns()`, by `probes` round trips of
    `read_remote_ns` (a blocking call that returns the remote monotonic clock)."""
    if probes < 1:
        raise ValueError("probes must be at least 1")
    best: tuple[int, int] | None = None  # (rtt, offset)
    for _ in range(probes):
        t0 = time.monotonic_ns()
        remote = int(read_remote_ns())
        t1 = time.monotonic_ns()
        rtt = t1 - t0
        if best is None or rtt < best[0]:
            best = (rtt, remote - (t0 + t1) // 2)
    rtt, offset = best
    return OffsetEstimate(offset, (rtt + 1) // 2, rtt, probes)


@dataclass(frozen=True)
class ClockAlignment:
    """One shard's clock against the driver's, at its start and its end."""

    start: OffsetEstimate
    end: OffsetEstimate | None  # None: the shard did not answer at the end (it died)

    @property
    def offset_ns(self) -> int:
        """What to subtract from the shard's timestamps to put them on the driver's clock."""
        return self.start.offset_ns

    @property
    def drift_ns(self) -> int | None:
        return None if self.end is None else self.end.offset_ns - self.start.offset_ns

    @property
    def uncertainty_ns(self) -> int:
        """How far a converted timestamp may be off, anywhere in the run."""
        parts = [self.start.uncertainty_ns]
        if self.end is not None:
            parts += [self.end.uncertainty_ns, abs(self.drift_ns)]
        return max(parts)

    def record(self) -> dict:
        """For the manifest."""
        return {
            "offset_ns": self.offset_ns,
            "uncertainty_ns": self.uncertainty_ns,
            "drift_ns": self.drift_ns,
            "start": asdict(self.start),
            "end": None if self.end is None else asdict(self.end),
        }

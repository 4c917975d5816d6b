"""How far a capacity search has got, and about how long it has left.

The number of levels is not known in advance: the search brackets (doubling or halving)
until one level meets and a higher one misses, then bisects geometrically until the two
are within the tolerance. Once bracketed, each bisection halves log(high / low), so the
levels left are ceil(log2(log(high / low) / log(1 + tolerance))); each takes at least
`min_repeats` runs, of the mean duration of the runs so far. While bracketing, no
estimate is honest: the line says so.
"""

from __future__ import annotations

import math

from .capacity import MEETS, MISSES, Level, SearchSettings


class CapacityProgress:
    def __init__(self, settings: SearchSettings) -> None:
        self.settings = settings
        self.run_seconds: list[float] = []
        self.levels: list[Level] = []

    def run_done(self, seconds: float) -> None:
        self.run_seconds.append(seconds)

    def level_done(self, level: Level) -> None:
        self.levels.append(level)

    def levels_left(self) -> int | None:
        """Levels the bisection has left, or None while the search still brackets."""
        meets = [v.x for v in self.levels if v.decision == MEETS]
        if not meets:
            return None
        low = max(meets)
        above = [v.x for v in self.levels if v.decision == MISSES and v.x > low]
        if not above:
            return None
        ratio, step = min(above) / low, 1 + self.settings.tolerance
        if ratio <= step:
            return 0
        return math.ceil(math.log2(math.log(ratio) / math.log(step)))

    def eta_s(self) -> float | None:
        left = self.levels_left()
        if left is None or not self.run_seconds:
            return None
        mean = sum(self.run_seconds) / len(self.run_seconds)
        return left * self.settings.min_repeats * mean

    def line(self) -> str:
        """'4 runs in 48 s; ~72 s left (3 levels, at least 2 runs each)'."""
        if not self.run_seconds:
            return "estimating…"
        n = len(self.run_seconds)
        done = f"{n} run{'s' * (n != 1)} in {duration(sum(self.run_seconds))}"
        left, eta = self.levels_left(), self.eta_s()
        if left is None or eta is None:
            return f"{done}; bracketing the capacity (no estimate yet)"
        if left == 0:
            return f"{done}; finishing"
        return (f"{done}; ~{duration(eta)} left ({left} level{'s' * (left != 1)}, "
                f"at least {self.settings.min_repeats} runs each)")  # fmt: skip


def duration(s: float) -> str:
    return f"{s / 60:.0f} min" if s >= 90 else f"{s:.0f} s"

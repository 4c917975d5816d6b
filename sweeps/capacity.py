"""The highest load that meets an SLO at a given attainment, found despite noise.

A level (a request rate, or a concurrency) is judged from its repeats' requests pooled:
the attainment's one-sided Clopper–Pearson bounds at the stated confidence decide it.

- meets: the lower bound reaches the target attainment, and no repeat on its own
  falls short of it (requests inside one run are not independent: a run that queues
  makes many misses at once, so one bad repeat is not outvoted by the pool);
- misses: the upper bound is below the target, or every repeat (at least
  `min_repeats`) falls short;
- otherwise unsure: another repeat, up to `max_repeats`; a level still unsure then
  counts as missing (a capacity is only claimed with confidence) and is reported so.

The search brackets first — from a starting upper level (e.g. the saturation
throughput of a closed loop: an open loop above it cannot be served), doubling while it
meets and halving the lower end while it misses — then bisects geometrically until the
highest meeting level and the lowest missing one are within `tolerance` of each other.
It assumes attainment falls as load rises; a level that meets above one that missed is
reported as non-monotone.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

MEETS, MISSES, UNSURE = "meets", "misses", "unsure"


@dataclass(frozen=True)
class Sample:
    """One repeat at one level."""

    judged: int  # requests judged against the SLO
    good: int  # of which met every target
    run: str = ""  # the run directory, when one was recorded
    cause: str = ""  # its triage's top cause (check id), "none" when healthy
    cause_title: str = ""
    misses: str = ""  # which SLO target the misses missed and what that latency was
    qualifier: str = ""  # a data-trust or host finding that qualifies the run

    @property
    def attainment(self) -> float:
        return self.good / self.judged if self.judged else float("nan")


@dataclass
class Level:
    x: float
    samples: list[Sample] = field(default_factory=list)
    decision: str = UNSURE
    forced: bool = False  # still unsure after max_repeats: counted as missing

    @property
    def judged(self) -> int:
        return sum(s.judged for s in self.samples)

    @property
    def good(self) -> int:
        return sum(s.good for s in self.samples)

    @property
    def attainment(self) -> float:
        return self.good / self.judged if self.judged else float("nan")

    def bounds(self, confidence: float) -> tuple[float, float]:
        """One-sided Clopper–Pearson bounds on the attainment (each at `confidence`)."""
        from scipy.stats import beta

        n, k, a = self.judged, self.good, 1 - confidence
        if n == 0:
            return 0.0, 1.0
        lo = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
        hi = 1.0 if k == n else float(beta.ppf(1 - a, k + 1, n - k))
        return lo, hi

    def causes(self, short_of: float | None = None) -> list[tuple[str, str, int]]:
        """(check, title, repeats) by how many repeats name it, most first; with
        `short_of`, only the repeats whose attainment fell below it (when any did)."""
        samples = self.samples
        if short_of is not None:
            samples = [s for s in samples if s.attainment < short_of] or samples
        counts: dict[str, list] = {}
        for s in samples:
            entry = counts.setdefault(s.cause or "none", [s.cause_title, 0])
            entry[1] += 1
        return sorted(((c, t, n) for c, (t, n) in counts.items()), key=lambda e: -e[2])


@dataclass(frozen=True)
class SearchSettings:
    attainment: float = 0.9
    confidence: float = 0.9
    tolerance: float = 0.1  # stop when lowest missing / highest meeting <= 1 + tolerance
    min_repeats: int = 2
    max_repeats: int = 4
    max_expansions: int = 4  # doublings above, halvings below the first bracket
    integer: bool = False  # a concurrency: whole levels only

    def __post_init__(self) -> None:
        from ..errors import ConfigError

        if not 0 < self.attainment <= 1:
            raise ConfigError(f"attainment must be within (0, 1], got {self.attainment}")
        if not 0.5 <= self.confidence < 1:
            raise ConfigError(f"confidence must be within [0.5, 1), got {self.confidence}")
        if not 0.01 <= self.tolerance <= 1:
            raise ConfigError(f"tolerance must be within [0.01, 1], got {self.tolerance}")
        if not 1 <= self.min_repeats <= self.max_repeats <= 100:
            raise ConfigError("need 1 <= min repeats <= max repeats <= 100")


@dataclass
class CapacityResult:
    capacity: Level | None  # the highest level that meets (None: none did)
    above: Level | None  # the lowest level that misses (None: none did)
    levels: list[Level]  # every level tried, in the order tried
    settings: SearchSettings
    verdict: str  # found | below-floor | above-ceiling
    non_monotone: bool = False


def decide(level: Level, s: SearchSettings) -> str:
    lo, hi = level.bounds(s.confidence)
    each = [x.attainment for x in level.samples if x.judged]
    if lo >= s.attainment and all(a >= s.attainment for a in each):
        return MEETS
    if hi < s.attainment:
        return MISSES
    if len(each) >= s.min_repeats and all(a < s.attainment for a in each):
        return MISSES
    return UNSURE


def search(
    measure: Callable[[float, int], Sample],
    start: float,
    settings: SearchSettings | None = None,
    floor: float | None = None,
    on_level: Callable[[Level], None] | None = None,
) -> CapacityResult:
    """`measure(x, repeat)` runs one repeat at level x. `start` is the first upper
    level tried; `floor` the first lower one (start / 4 unless given)."""
    s = settings or SearchSettings()
    levels: dict[float, Level] = {}

    def judge(x: float) -> Level:
        x = _level(x, s)
        if x in levels:
            return levels[x]
        level = Level(x)
        levels[x] = level
        while len(level.samples) < s.max_repeats:
            level.samples.append(measure(x, len(level.samples)))
            if len(level.samples) < s.min_repeats:
                continue
            level.decision = decide(level, s)
            if level.decision != UNSURE:
                break
        if level.decision == UNSURE:
            level.decision, level.forced = MISSES, True
        if on_level is not None:
            on_level(level)
        return level

    hi = judge(start)
    verdict = "found"
    n = 0
    while hi.decision == MEETS and n < s.max_expansions:
        lo, hi, n = hi, judge(hi.x * 2), n + 1
    if hi.decision == MEETS:
        return _result(levels, hi, None, s, "above-ceiling")
    lo = judge(floor if floor is not None else hi.x / 4) if n == 0 else lo
    n = 0
    while lo.decision == MISSES and n < s.max_expansions and _level(lo.x / 2, s) < lo.x:
        hi, lo, n = lo, judge(lo.x / 2), n + 1
    if lo.decision == MISSES:
        return _result(levels, None, lo, s, "below-floor")
    while hi.x / lo.x > 1 + s.tolerance:
        mid = _level(math.sqrt(lo.x * hi.x), s)
        if mid in (lo.x, hi.x):  # whole levels: nothing left between them
            break
        level = judge(mid)
        if level.decision == MEETS:
            lo = level
        else:
            hi = level
    return _result(levels, lo, hi, s, verdict)


def _level(x: float, s: SearchSettings) -> float:
    if s.integer:
        return float(max(1, round(x)))
    return float(f"{x:.4g}")  # levels people can type again


def _result(levels: dict[float, Level], lo, hi, s: SearchSettings, verdict: str):
    ordered = list(levels.values())
    by_x = sorted(ordered, key=lambda v: v.x)
    first_miss = next((v.x for v in by_x if v.decision == MISSES), math.inf)
    non_monotone = any(v.decision == MEETS and v.x > first_miss for v in by_x)
    return CapacityResult(lo, hi, ordered, s, verdict, non_monotone)

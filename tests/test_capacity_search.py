"""The capacity search on a simulated target whose capacity is known: fast and
deterministic. Attainment falls with load as a logistic curve; each repeat draws its
good requests from a binomial, with run-to-run noise on the load it effectively sees."""

from __future__ import annotations

import math

import numpy as np
import pytest

from perfdiag.errors import ConfigError
from perfdiag.sweeps.capacity import (
    MEETS,
    MISSES,
    UNSURE,
    Level,
    Sample,
    SearchSettings,
    decide,
    search,
)


class Simulated:
    """Expected attainment p(x) = 1 / (1 + exp((x - m) / w)), with p(capacity) = target."""

    def __init__(self, capacity: float, target: float = 0.9, width: float = 0.05,
                 requests: int = 200, run_noise: float = 0.02):  # fmt: skip
        self.capacity, self.width, self.requests, self.run_noise = (
            capacity,
            width,
            requests,
            run_noise,
        )
        self.mid = capacity - width * capacity * math.log((1 - target) / target)
        self.calls: list[tuple[float, int]] = []

    def p(self, x: float) -> float:
        z = (x - self.mid) / (self.width * self.capacity)
        return 1 / (1 + math.exp(min(z, 700.0)))

    def __call__(self, x: float, repeat: int) -> Sample:
        self.calls.append((x, repeat))
        rng = np.random.default_rng([int(x * 1000), repeat])
        seen = x * (1 + rng.normal(0, self.run_noise))
        good = int(rng.binomial(self.requests, self.p(seen)))
        return Sample(self.requests, good, cause="queue" if good < self.requests * 0.9 else "none")


@pytest.mark.parametrize("capacity", [3.7, 42.0, 950.0])
def test_finds_the_known_capacity_within_the_tolerance(capacity):
    target = Simulated(capacity)
    settings = SearchSettings(attainment=0.9, confidence=0.9, tolerance=0.1)
    result = search(target, start=capacity * 2.5, settings=settings)
    assert result.verdict == "found"
    found, above = result.capacity, result.above
    assert found.decision == MEETS and above.decision == MISSES
    assert above.x <= found.x * 1.1 + 1e-9  # bracketed to the tolerance
    assert capacity / 1.25 <= found.x <= capacity * 1.05  # a confident claim: not above it
    assert target.p(found.x * 1.2) < 0.9  # 20 % more load truly misses
    assert all(len(v.samples) >= 2 for v in result.levels)  # every level repeated
    assert not result.non_monotone


def test_the_same_target_gives_the_same_search():
    a = search(Simulated(10.0), start=40.0)
    b = search(Simulated(10.0), start=40.0)
    assert [(v.x, v.decision, v.good) for v in a.levels] == [
        (v.x, v.decision, v.good) for v in b.levels
    ]


def test_repeats_grow_only_near_the_boundary():
    target = Simulated(10.0, requests=60, run_noise=0.0)
    result = search(target, start=40.0, settings=SearchSettings(max_repeats=6))
    far = [v for v in result.levels if abs(v.x / 10.0 - 1) > 0.5]
    assert far and all(len(v.samples) == 2 for v in far)
    near = max(result.levels, key=lambda v: len(v.samples))
    assert abs(near.x / 10.0 - 1) < 0.3


def test_below_the_floor_and_above_the_ceiling_are_said():
    low = search(Simulated(1.0), start=400.0, settings=SearchSettings(max_expansions=2))
    assert low.verdict == "below-floor" and low.capacity is None
    assert low.above.x == pytest.approx(25.0)  # 400 / 4, halved twice
    high = search(Simulated(1000.0), start=10.0, settings=SearchSettings(max_expansions=2))
    assert high.verdict == "above-ceiling" and high.above is None
    assert high.capacity.x == pytest.approx(40.0)


def test_whole_levels_for_a_concurrency():
    result = search(Simulated(13.0), start=64, settings=SearchSettings(integer=True))
    assert all(v.x == int(v.x) for v in result.levels)
    assert result.above.x - result.capacity.x >= 1


def _level(*repeats: tuple[int, int]) -> Level:
    return Level(1.0, [Sample(n, k) for n, k in repeats])


def test_decisions_use_bounds_and_every_repeat():
    s = SearchSettings(attainment=0.9, confidence=0.9, min_repeats=2)
    assert decide(_level((200, 196), (200, 195)), s) == MEETS
    assert decide(_level((200, 150), (200, 160)), s) == MISSES
    # pooled well above the target, but one repeat on its own misses it: not a pass
    assert decide(_level((400, 399), (100, 85)), s) == UNSURE
    assert decide(_level((20, 18), (20, 19)), s) == UNSURE  # too few requests to tell
    lo, hi = _level((100, 90)).bounds(0.9)
    assert lo < 0.9 < hi


def test_an_unsure_level_counts_as_missing_and_says_so():
    def coin(x, repeat):
        return Sample(40, 36)  # exactly at the target: never confidently either way

    result = search(coin, start=8.0, settings=SearchSettings(max_repeats=3, max_expansions=1))
    assert all(v.forced and v.decision == MISSES for v in result.levels)
    assert all(len(v.samples) == 3 for v in result.levels)
    assert result.verdict == "below-floor"


def test_settings_are_checked():
    with pytest.raises(ConfigError, match="attainment"):
        SearchSettings(attainment=1.5)
    with pytest.raises(ConfigError, match="repeats"):
        SearchSettings(min_repeats=3, max_repeats=2)

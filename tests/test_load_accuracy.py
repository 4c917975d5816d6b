"""The lateness accounting of benchmarks/http_client.py (analyzers/load_accuracy.py)."""

import numpy as np
import pytest

from perfdiag.analyzers.load_accuracy import schedule_accuracy


def test_perfect_schedule_rebuilt_with_a_constant_delay():
    t = 5_000_000 + np.arange(100) * 10_000_000  # 100 req/s, offset by 5 ms
    acc = schedule_accuracy(t, 100.0)
    assert acc.basis == "rebuilt"
    assert acc.ratio == pytest.approx(1.0)
    assert acc.lateness_p99_s == pytest.approx(0.0, abs=1e-12)
    assert not acc.fell_behind


def test_known_schedule_gives_lateness_per_request():
    due = np.arange(200) * 5_000_000  # 200 req/s
    late = np.zeros(200, dtype=np.int64)
    late[::50] = 3_000_000  # four sends 3 ms late
    acc = schedule_accuracy(due + late, 200.0, due_ns=due)
    assert acc.basis == "schedule"
    assert acc.lateness_max_s == pytest.approx(0.003)
    assert acc.lateness_p50_s == 0.0
    assert not acc.fell_behind


def test_a_generator_that_falls_behind_says_so():
    t = np.arange(300) * 2_000_000  # asked for 600 req/s, sent 500
    due = np.arange(300) * (1e9 / 600)
    acc = schedule_accuracy(t, 600.0, due_ns=due.astype(np.int64))
    assert acc.ratio == pytest.approx(500 / 600, rel=1e-3)
    assert acc.fell_behind
    assert acc.drift_s > 0.05
    rebuilt = schedule_accuracy(t, 600.0)
    assert rebuilt.fell_behind and rebuilt.lateness_max_s > 0.08


def test_jitter_is_not_falling_behind():
    rng = np.random.default_rng(0)
    due = np.arange(1000) * 1_666_667
    acc = schedule_accuracy(due + rng.integers(0, 1_000_000, 1000), 600.0, due_ns=due)
    assert not acc.fell_behind and acc.lateness_p99_s < 0.001


def test_bad_input():
    with pytest.raises(ValueError):
        schedule_accuracy([1], 10.0)
    with pytest.raises(ValueError):
        schedule_accuracy([1, 2], 0.0)
    with pytest.raises(ValueError):
        schedule_accuracy([1, 2], 1.0, due_ns=[1])

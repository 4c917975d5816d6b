"""The knee and the summary on tables whose shape is known: a hockey stick bends where
it bends, a flat curve has no knee, a knob sweep names the metric that moved, and the
causes either side of the knee come from those points' own triage."""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfdiag.sweeps.knee import find_knee, knee_metric
from perfdiag.sweeps.spec import Axis, SweepSpec
from perfdiag.sweeps.summary import summarise
from perfdiag.sweeps.table import two_level_bootstrap


def _table(axis: str, x, **metrics) -> pd.DataFrame:
    t = pd.DataFrame({axis: x, "repeats": 2})
    for name, (y, half) in metrics.items():
        y = np.asarray(y, float)
        t[name], t[f"{name}_lo"], t[f"{name}_hi"] = y, y - half, y + half
    return t


def test_a_hockey_stick_bends_where_queueing_starts():
    x = [1, 2, 4, 6, 8, 12]
    t = _table("rate", x, ttft_p99_ms=([50, 52, 60, 90, 400, 1500], 5))
    t["cause"] = ["none", "none", "none", "none", "queue-dominates-ttft", "queue-dominates-ttft"]
    t["cause_title"] = ["", "", "", "", "Queue wait is 80% of TTFT", "Queue wait is 91% of TTFT"]
    t["cause_agree"] = "2/2"
    spec = SweepSpec({"preset": "tiny"}, (Axis("rate", tuple(map(float, x))),))
    [s] = summarise(spec, t)
    assert s.metric == "ttft_p99_ms" and s.knee == "6" and s.shape == "convex, increasing"
    assert s.before.cause == "none" and s.after.cause == "queue-dominates-ttft"
    assert "bends at rate=6" in s.text and "Above it (rate=8): queue-dominates-ttft" in s.text
    assert {m.metric: m.real for m in s.moves}["ttft_p99_ms"]


def test_a_curve_within_its_noise_has_no_knee():
    t = _table("rate", [1, 2, 4, 8], ttft_p99_ms=([50, 58, 47, 55], 10))
    t["cause"], t["cause_agree"] = "none", "1/1"
    [s] = summarise(SweepSpec({}, (Axis("rate", (1.0, 2.0, 4.0, 8.0)),)), t)
    assert s.knee is None and "stays within noise" in s.text


def test_a_knob_sweep_names_the_metric_that_moved_beyond_noise():
    t = _table(
        "chunk_size",
        [32, 64, 128, 256, 512],
        ttft_p99_ms=([900, 520, 330, 300, 290], 20),  # falls 3x
        itl_p99_ms=([10, 12, 30, 60, 61], 1),  # rises 6x
        ttft_p50_ms=([100, 100, 100, 100, 100], 1),
        tpot_p50_ms=([5, 5, 5, 5, 5], 1),
        e2e_p50_s=([1, 1, 1, 1, 1], 0.1),
    )
    assert knee_metric(t, is_load=False, has_slo=False) == "itl_p99_ms"
    assert knee_metric(t, is_load=True, has_slo=False) == "ttft_p99_ms"
    t["attainment"], t["attainment_lo"], t["attainment_hi"] = 1.0, 0.97, 1.0
    assert knee_metric(t, is_load=True, has_slo=True) == "ttft_p99_ms"  # the SLO never broke
    t["attainment"] = [1.0, 1.0, 0.98, 0.7, 0.4]
    t["attainment_lo"], t["attainment_hi"] = t["attainment"] - 0.03, t["attainment"] + 0.02
    assert knee_metric(t, is_load=True, has_slo=True) == "attainment"


def test_falling_attainment_bends_before_the_drop():
    assert find_knee(np.arange(1.0, 6.0), np.array([1, 0.99, 0.97, 0.6, 0.2])) == (
        2, "concave, decreasing",
    )  # fmt: skip


def test_the_two_level_bootstrap_counts_run_to_run_noise():
    rng = np.random.default_rng(0)
    same = [(rng.normal(100, 5, 200), np.arange(200)) for _ in range(3)]
    shifted = [(rng.normal(100 + 20 * k, 5, 200), np.arange(200)) for k in range(3)]
    width_same = np.ptp(
        np.percentile(two_level_bootstrap(same, 50, np.random.default_rng(1)), [2.5, 97.5])
    )
    width_shift = np.ptp(
        np.percentile(two_level_bootstrap(shifted, 50, np.random.default_rng(1)), [2.5, 97.5])
    )
    assert width_shift > 5 * width_same  # repeats that disagree widen the interval
    pooled = np.concatenate([v for v, _ in same])
    lo, hi = np.percentile(two_level_bootstrap(same, 50, np.random.default_rng(2)), [2.5, 97.5])
    assert lo <= np.percentile(pooled, 50) <= hi

"""Impact as what the advice is predicted to achieve (analyzers/impact.predicted_impact),
judged on the metric the advice targets, and the stall metric (each request's longest
gap) that prefill interference is judged on."""

import numpy as np
import pandas as pd

from perfdiag.analyzers.impact import impact_of, predicted_impact
from perfdiag.playbooks.facts import stall_predicted


def test_severity_follows_the_predicted_gain_on_the_targeted_statistic():
    rng = np.random.default_rng(3)
    v = rng.exponential(0.1, 2000)
    halved = predicted_impact(v, v / 2, "ttft.p50")
    assert abs(halved.target_gain - 0.5) < 1e-9 and halved.max_severity == "critical"
    small = predicted_impact(v, v * 0.05, "ttft.p50")
    assert small.max_severity == "info"  # removal would be critical; the advice gains 5 %
    assert impact_of(v, v).max_severity == "critical"
    low, high = small.target_gain_ci
    assert low <= small.target_gain <= high


def test_an_advice_that_costs_more_than_it_saves_has_a_negative_gain():
    v = np.full(100, 0.1)
    worse = predicted_impact(v, np.full(100, -0.02), "ttft.p50")
    assert worse.target_gain < 0 and worse.max_severity == "info"


def test_the_statistic_is_the_targets():
    v = np.r_[np.full(95, 0.01), np.full(5, 1.0)]  # 5 % of values are spikes
    saved = np.where(v > 0.5, 0.9, 0.0)  # the advice cuts only the spikes
    assert predicted_impact(v, saved, "ttft.p50").target_gain == 0.0
    assert predicted_impact(v, saved, "ttft.p99").target_gain > 0.8


def test_rare_spikes_reach_most_streams_and_the_stall_metric_sees_them():
    """40 requests of 100 gaps of 10 ms; 30 of them once wait 300 ms behind a prompt's
    prefill (0.75 % of gaps: ITL p99 does not see it). An advice that leaves at most a
    60 ms slice in a gap cuts the stall 1 in 10 requests see from 300 to ~70 ms."""
    rows = []
    for code in range(40):
        for k in range(100):
            spike = code < 30 and k == 50
            rows.append((code, 0.3 if spike else 0.01, 0.29 if spike else 0.0))
    gaps = pd.DataFrame(rows, columns=["code", "gap_s", "interference_s"])
    assert np.percentile(gaps["gap_s"], 99) == 0.01
    saved = np.maximum(gaps["interference_s"] - 0.06, 0.0)
    stall = stall_predicted(gaps.assign(saved_s=saved), "saved_s", "stall.p90")
    assert abs(stall.target_gain - (1 - 0.07 / 0.3)) < 1e-9
    assert stall.max_severity == "critical"
    gap_p99 = predicted_impact(gaps["gap_s"].to_numpy(), saved.to_numpy(), "itl.p99")
    assert gap_p99.target_gain == 0.0

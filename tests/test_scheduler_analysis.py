"""Batch composition, the step-cost model, binding limits, preemption cost, cache hits by
tier and fairness, on hand-built runs (tests/data/serving_runs.py) and synthetic step
tables with known costs."""

import numpy as np
import pandas as pd
import pytest
import serving_runs as runs

from perfdiag import load_run
from perfdiag.analyzers.cache import cache_hits
from perfdiag.analyzers.fairness import fairness, hotness
from perfdiag.analyzers.lifecycle import build_lifecycle
from perfdiag.analyzers.scheduler import binding_limits, composition, preemptions
from perfdiag.analyzers.step_cost import fit_step_cost
from perfdiag.analyzers.steptime import StepParts, StepTimeline, WorkWeights
from perfdiag.analyzers.ttft import decompose_ttft

MS, US = 1e-3, 1e-6
# the synthetic engine: 1 ms per step, 20 µs per prefill token, 100 µs per decode
# sequence, 0.05 µs per context token, 10 µs of noise; three steps stalled by 40 ms
COST = (1 * MS, 20 * US, 100 * US, 0.05 * US)
STALLED = (17, 90, 151)


def load(path):
    run = load_run(path)
    lc = build_lifecycle(run)
    return run, lc, StepTimeline.from_run(run, lc.origin_ns)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    rng = np.random.default_rng(7)
    rows, t = [], 0.0
    for i in range(200):
        p = int(rng.choice([0, 0, 0, rng.integers(1, 512)]))
        d = int(rng.integers(0, 32))
        c = int(rng.integers(0, 20000))
        dur = COST[0] + COST[1] * p + COST[2] * d + COST[3] * c + rng.normal(0, 10 * US)
        dur += 40 * MS * (i in STALLED)
        rows.append(runs.step(i, t / MS, (t + dur) / MS, pf_seqs=int(p > 0), pf_tokens=p,
                              decode=d, context=c))  # fmt: skip
        t += dur + 0.2 * MS
    path = runs.write(tmp_path_factory.mktemp("sched") / "synthetic", [], [], rows)
    return StepTimeline.from_run(load_run(path), runs.T0)


def test_the_cost_model_recovers_known_costs_and_flags_stalled_steps(synthetic):
    cost = fit_step_cost(synthetic)
    assert cost.fixed_s == pytest.approx(COST[0], rel=0.05)
    assert cost.per_prefill_token_s == pytest.approx(COST[1], rel=0.05)
    assert cost.per_decode_seq_s == pytest.approx(COST[2], rel=0.05)
    assert cost.per_context_token_s == pytest.approx(COST[3], rel=0.1)
    assert cost.r2 > 0.99 and cost.trusted and cost.median_rel_error < 0.01
    assert sorted(cost.outlier_steps["step_id"]) == list(STALLED)
    assert cost.outliers == 3 and cost.steps_fitted > 150
    assert cost.outlier_steps["residual_s"].min() > 35 * MS
    assert cost.inflated_s == pytest.approx(3 * 40 * MS, rel=0.01)
    assert cost.weights() == WorkWeights(cost.per_prefill_token_s, cost.per_decode_seq_s)


def synthetic_steps(path, rng, n, cost, noise, stalls, stall_ms=(50, 300)):
    """`n` steps of random batches costing `cost` (fixed, per prefill token, per decode
    sequence, per context token) with multiplicative Gaussian `noise` and a share
    `stalls` of steps slowed by a uniform stall: what a contended machine looks like."""
    rows, t, stalled = [], 0.0, []
    for i in range(n):
        p = int(rng.choice([0, 0, rng.integers(16, 512)]))
        d = int(rng.integers(1, 24))
        c = d * int(rng.integers(32, 1024))
        dur = (cost[0] + cost[1] * p + cost[2] * d + cost[3] * c) * (1 + rng.normal(0, noise))
        if rng.random() < stalls:
            dur += rng.uniform(*stall_ms) * MS
            stalled.append(i)
        rows.append(runs.step(i, t / MS, (t + dur) / MS, pf_seqs=int(p > 0), pf_tokens=p,
                              decode=d, context=c))  # fmt: skip
        t += dur + 0.1 * MS
    run = load_run(runs.write(path, [], [], rows))
    return StepTimeline.from_run(run, runs.T0), set(stalled)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_robust_fit_holds_with_noise_and_many_outliers(tmp_path, seed):
    # 5 % noise and one step in ten stalled by 50–300 ms (steps cost 10–60 ms): a least-
    # squares fit would be dragged far off; the Huber fit stays within 10 % (fixed cost,
    # prefill) and 15 % (decode), and finds nearly every stalled step.
    cost = (8 * MS, 60 * US, 400 * US, 0.02 * US)
    steps, stalled = synthetic_steps(tmp_path / "s", np.random.default_rng(seed), 400, cost,
                                     0.05, 0.1)  # fmt: skip
    m = fit_step_cost(steps)
    assert m.fixed_s == pytest.approx(cost[0], rel=0.1)
    assert m.per_prefill_token_s == pytest.approx(cost[1], rel=0.1)
    assert m.per_decode_seq_s == pytest.approx(cost[2], rel=0.15)
    found = set(m.outlier_steps["step_id"])
    assert len(found & stalled) >= 0.9 * len(stalled) and len(found - stalled) <= 4
    assert m.trusted


def test_parts_of_steps_add_up_and_keep_the_residual_out_of_prefill(synthetic):
    cost = fit_step_cost(synthetic)
    parts = StepParts.from_model(synthetic, cost)
    dur = synthetic.end - synthetic.start
    total = parts.fixed + parts.prefill + parts.decode + parts.residual
    assert np.allclose(total, dur, rtol=1e-9)
    stalled = np.isin(synthetic.step_id, STALLED)
    assert (parts.residual[stalled] > 35 * MS * 1e6).all() and (parts.residual[~stalled] == 0).all()
    # a stalled step's prefill is its tokens at the marginal cost, not its 40 ms stall
    i = np.flatnonzero(stalled)[0]
    assert parts.prefill[i] == pytest.approx(
        synthetic.prefill_tokens[i] * cost.per_prefill_token_s * 1e9, rel=1e-6
    )
    window = parts.between(np.array([synthetic.start[0]]), np.array([synthetic.end[-1]]))
    assert sum(v[0] for v in window.values()) == pytest.approx(dur.sum(), rel=1e-9)


def test_a_negative_coefficient_drops_its_term(tmp_path):
    # context tokens that cost nothing, with noise that would give them a negative price
    steps, _ = synthetic_steps(tmp_path / "s", np.random.default_rng(4), 200,
                               (5 * MS, 50 * US, 300 * US, 0.0), 0.05, 0.0)  # fmt: skip
    m = fit_step_cost(steps)
    assert m.per_context_token_s >= 0
    assert "context_tokens" not in m.terms or m.per_context_token_s > 0


def test_too_few_steps_give_no_model(tmp_path):
    _, _, steps = load(runs.basic(tmp_path / "basic"))
    assert fit_step_cost(steps) is None


def test_binding_limits_recorded_by_the_engine_and_inferred():
    steps = pd.DataFrame(
        {
            "step_id": range(6),
            "start_ns": range(0, 60, 10),
            "end_ns": range(9, 69, 10),
            "num_prefill_tokens": [64, 64, 0, 0, 0, 0],
            "num_decode_seqs": [2, 4, 4, 4, 4, 0],
            "num_waiting": [3, 3, 2, 0, 1, 0],
            "num_running": [4, 4, 4, 4, 4, 0],
            "kv_blocks_used": [10, 12, 12, 12, 95, 0],
            "kv_blocks_free": [90, 88, 88, 88, 5, 100],
            "blocked_by": pd.Categorical(
                ["max_num_seqs", "max_num_seqs", "token_budget"] + [None] * 3
            ),
        }
    )
    got = binding_limits(steps, cap=4, budget=68)
    assert got.source == "engine" and got.steps_with_queue == 4
    assert got.shares["max_num_seqs"] == 0.5 and got.shares["token_budget"] == 0.25
    assert got.shares["none"] == 0.25 and got.binding == "max_num_seqs"
    assert got.kv_peak_share == pytest.approx(0.95)
    inferred = binding_limits(steps.drop(columns="blocked_by"), cap=8, budget=68)
    assert inferred.source == "inferred"
    # step 0: 66 tokens < 68, step 1: 68 = budget, step 2: none, step 4: KV 95 % full
    expected = {"max_num_seqs": 0, "token_budget": 0.25, "kv_blocks": 0.25, "preemption": 0,
                "swapped": 0, "none": 0.5}  # fmt: skip
    assert inferred.shares == pytest.approx(expected)


def test_batch_composition(tmp_path):
    _, _, steps = load(runs.basic(tmp_path / "basic"))
    c = composition(steps)
    assert (c.steps, c.prefill_only, c.mixed, c.decode_only) == (4, 1, 1, 2)
    assert c.mean_batch_seqs == pytest.approx((1 + 2 + 2 + 2) / 4)
    assert c.mean_prefill_tokens == pytest.approx((10 + 3) / 2)
    assert c.busy_s == pytest.approx((8 + 3 + 2 + 2) * MS)
    assert list(c.per_step["kind"]) == ["prefill", "mixed", "decode", "decode"]


def test_preemptions_and_what_they_cost(tmp_path, synthetic):
    _, lc, steps = load(runs.preempt(tmp_path / "pre"))
    cost = fit_step_cost(synthetic)
    p = preemptions(lc, steps, cost)
    assert (p.count, p.recompute, p.swap) == (2, 1, 1)
    # D had computed 33 tokens; 32 were still cached when it came back: 1 recomputed
    assert p.recomputed_tokens == 1
    assert p.recompute_cost_s == pytest.approx(cost.per_prefill_token_s)
    assert p.swapped_tokens == 4  # F's first chunk, copied out and back
    assert p.waiting_s == pytest.approx(2 * 1.9 * MS)  # both preempted at 8.1, back at 10
    row = p.per_preemption.set_index("request_id").loc["D"]
    assert row["cache_hits_on_return"] == 32 and row["mode"] == "recompute"


def test_cache_hits_by_tier_and_the_compute_they_saved(tmp_path, synthetic):
    _, lc, _ = load(runs.preempt(tmp_path / "pre"))
    cost = fit_step_cost(synthetic)
    c = cache_hits(lc, cost, busy_s=7 * MS)
    tiers = {t.tier: t for t in c.tiers}
    assert tiers["device"].hit_tokens == 32 and tiers["device"].events == 1
    assert tiers["swap"].hit_tokens == 4 and tiers["swap"].events == 1
    assert c.first_admission_hit_tokens == 0 and c.recompute_hit_tokens == 32
    assert c.prompt_tokens == 40 and c.hit_rate == 0
    assert c.saved_s == pytest.approx(36 * cost.per_prefill_token_s)
    assert c.saved_share == pytest.approx(c.saved_s / (7 * MS + c.saved_s))
    assert np.isnan(cache_hits(lc, None, 7 * MS).saved_s)  # no model, no price


def test_hotness_classes():
    groups = np.array([0, 0, 0, 0, 1, 1, 2, 3, np.nan])
    # group 0 alone holds half of the grouped requests: hot; the rest cold
    assert list(hotness(groups)) == ["hot"] * 4 + ["cold"] * 4 + ["none"]


def test_fairness_compares_queue_waits_of_hot_and_cold_prefixes(tmp_path):
    # four requests tokenised at 0; each admitted by its own step: hot ones by steps
    # starting at 1, 2, 3 ms, the cold one by a step starting at 10 ms
    requests, events, steps = [], [], []
    for i, (rid, group, start) in enumerate([("h1", 0, 1), ("h2", 0, 2), ("h3", 0, 3),
                                             ("c1", 1, 10)]):  # fmt: skip
        requests.append(runs.Request(rid, 4, 1, 0, "stop", prefix_group=group))
        events += [
            runs.client(rid, "sent", 0), runs.engine(rid, "tokenize_end", 0),
            runs.engine(rid, "scheduled", start + 0.1, step=i, tokens=4, cached=0),
            runs.engine(rid, "prefill_chunk", start + 0.5, step=i, tokens=4),
            runs.engine(rid, "first_token", start + 0.5, step=i, tokens=1),
            runs.client(rid, "first_token", start + 1), runs.client(rid, "chunk", start + 1, 1),
            runs.client(rid, "done", start + 1, 1),
        ]  # fmt: skip
        steps.append(runs.step(i, start, start + 0.6, pf_seqs=1, pf_tokens=4, context=4))
    _, lc, st = load(runs.write(tmp_path / "fair", requests, events, steps))
    select = np.ones(len(lc.requests), dtype=bool)
    f = fairness(lc, decompose_ttft(lc, st, select).per_request, select)
    classes = {c.hotness: c for c in f.classes}
    assert classes["hot"].requests == 3 and classes["hot"].groups == 1
    assert classes["hot"].queue_wait_s.p50 == pytest.approx(2 * MS)
    assert classes["cold"].queue_wait_s.max == pytest.approx(10 * MS)
    assert f.cold_over_hot_p50 == pytest.approx(5.0)
    assert list(f.longest["request_id"]) == ["c1", "h3", "h2", "h1"]

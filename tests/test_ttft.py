"""TTFT critical path on hand-built runs (timelines in tests/data/serving_runs.py, ms)."""

import shutil

import numpy as np
import pytest
import serving_runs as runs

from perfdiag import load_run
from perfdiag.analyzers.lifecycle import build_lifecycle
from perfdiag.analyzers.steptime import StepParts, StepTimeline, WorkWeights
from perfdiag.analyzers.ttft import PARTS, decompose_ttft
from perfdiag.traces.layout import parquet_path

MS = 1e-3


def decompose(path, weights=None):
    run = load_run(path)
    lc = build_lifecycle(run)
    steps = StepTimeline.from_run(run, lc.origin_ns)
    select = ~lc.requests["is_warmup"].to_numpy()
    parts = StepParts.by_weights(steps, weights) if weights is not None else None
    return decompose_ttft(lc, steps, select, parts)


def parts_ms(d, rid):
    row = d.per_request.set_index("request_id").loc[rid]
    return {k: pytest.approx(row[k] / MS, abs=1e-9) for k in ("ttft_s", "client_wait_s", *PARTS)}


def expect(**ms):
    base = {k: 0.0 for k in ("client_wait_s", *PARTS)}
    return base | {f"{k}_s": v for k, v in ms.items()}


@pytest.fixture(scope="module")
def basic(tmp_path_factory):
    return decompose(runs.basic(tmp_path_factory.mktemp("ttft") / "basic"))


def test_a_request_that_waits_30_ms_has_a_30_ms_queue_part(basic):
    # A: sent 1, tokenised 2 (input 1); step 0 starts at 32 (queue 30); alone in the step
    # until sampling at 39 (own 7); at the client at 41 (sampling and return 2)
    assert parts_ms(basic, "A") == expect(
        ttft=40, client_wait=1, input=1, queue=30, prefill_own=7, sample_return=2
    )


def test_a_shared_step_splits_into_own_and_others_work(basic):
    # B: input 40→40.5, queue 40.5→42; step 1 [42, 44.5 sampling] holds B's 3 prefill
    # tokens and A's decode: B's share is 3/4 of 2.5 ms; returned at 45.5
    assert parts_ms(basic, "B") == expect(
        ttft=5.5, input=0.5, queue=1.5, prefill_own=1.875, prefill_others=0.625, sample_return=1
    )


def test_without_engine_events_everything_is_remainder(basic):
    # C has client events only: nothing explains its 3 ms
    assert parts_ms(basic, "C") == expect(ttft=3, remainder=3)
    assert not np.isnan(basic.remainder_share)
    assert basic.remainder_share == pytest.approx(3 / (40 + 5.5 + 3))


def test_aggregates_at_p50_and_p99_show_what_makes_the_tail(basic):
    # TTFTs 3, 5.5, 40: the p45–p55 band holds B, the ≥ p99 band holds A
    assert basic.p50.requests == 1 and basic.p50.ttft_s == pytest.approx(5.5 * MS)
    assert basic.p50.queue_s == pytest.approx(1.5 * MS)
    assert basic.p99.requests == 1 and basic.p99.queue_s == pytest.approx(30 * MS)
    assert basic.mean.requests == 3
    assert basic.mean.queue_s == pytest.approx((30 + 1.5) / 3 * MS)


def test_parts_and_remainder_always_add_up_to_ttft(basic):
    f = basic.per_request
    assert np.allclose(f[list(PARTS)].sum(axis=1), f["ttft_s"], rtol=1e-9, atol=1e-12)
    assert basic.max_sum_error < 1e-9


def test_swap_in_preemption_and_host_gaps_before_the_first_token(tmp_path):
    d = decompose(runs.preempt(tmp_path / "pre"))
    # F: input 0.2→0.6; queue 0.6→6 (step 1), then again from its swap-out at 8.1 to the
    # start of step 3 at 10 (1.9); steps: 1 [6, 7] own 4/5, others 1/5; step 2 [8, 8.1]
    # before the swap-out, others 0.1; step 3: swap-in copy 10→10.6 (cache load 0.6),
    # then own 4/6 and D's recompute 2/6 of 10.6→11.5; host gap 7→8; returned 11.5→12.4
    assert parts_ms(d, "F") == expect(
        ttft=12.2, input=0.4, queue=5.4 + 1.9, cache_load=0.6, prefill_own=0.8 + 0.6,
        prefill_others=0.2 + 0.1 + 0.3, host_gap=1.0, sample_return=0.9,
    )  # fmt: skip
    assert parts_ms(d, "D") == expect(ttft=5.5, input=0.5, queue=0.5, prefill_own=3.5,
                                      sample_return=1.0)  # fmt: skip


def test_work_weights_change_the_split_of_a_shared_step(tmp_path):
    # a prefill token weighing 1/3 of a decode: B's 3 tokens are half of step 1's work
    d = decompose(runs.basic(tmp_path / "b"), WorkWeights(prefill_weight=1, decode_weight=3))
    got = parts_ms(d, "B")
    assert got["prefill_own_s"] == pytest.approx(1.25) and got["prefill_others_s"] == 1.25


def test_without_steps_the_prefill_split_becomes_remainder(tmp_path):
    path = runs.basic(tmp_path / "nosteps")
    parquet_path(path, "steps").unlink()
    run = load_run(path)
    assert "steps" in run.missing_tables
    lc = build_lifecycle(run)
    select = ~lc.requests["is_warmup"].to_numpy()
    d = decompose_ttft(lc, StepTimeline.from_run(run, lc.origin_ns), select)
    assert not d.step_timeline
    # A: the milestones still hold (input 1, queue from tokenised to the admitting event
    # at 32.2, return from the first token sampled at 39.5); the rest is unexplained
    got = parts_ms(d, "A")
    assert got["queue_s"] == pytest.approx(30.2) and got["remainder_s"] == pytest.approx(7.3)
    assert got["sample_return_s"] == pytest.approx(1.5)
    shutil.rmtree(path)

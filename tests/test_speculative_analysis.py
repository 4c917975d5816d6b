"""analyzers/speculative.py on hand-made runs (tests/spec_runs.py) whose acceptance is
drawn i.i.d. with a known α and whose phases cost known times: the counters read back per
verify, α and the tokens per forward against Leviathan et al.'s expectation, the cost
ratio c from the draft phase, the plain forward from a baseline or from the verify fit,
and the best K."""

from __future__ import annotations

import numpy as np
import pytest
from spec_runs import plain_run, spec_run

from perfdiag.analyzers import speculative as spec


def test_counters_read_back_one_row_per_verified_request_per_step():
    run = spec_run(steps=30, batch=(2, 3))
    v = spec.verifies(run)
    assert list(v.columns) == spec.VERIFY_COLUMNS
    assert len(v) == 15 * 2 + 15 * 3
    assert (v["emitted"] == v["accepted"] + 1).all()
    assert v["step_id"].between(0, 29).all() and (v["drafted"] == 4).all()


def test_a_run_without_the_counters_has_no_speculation():
    run = plain_run(steps=10)
    assert not spec.has_speculation(run)
    assert spec.summarize(run) is None and len(spec.verifies(run)) == 0


def test_expected_tokens_and_speedup_follow_leviathan():
    # α = 0.5, K = 2: 1 + 0.5 + 0.25 = 1.75 tokens per forward; c = 0.1: 1.75 / 1.2.
    assert spec.expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert spec.expected_tokens(1.0, 4) == 5.0
    assert spec.predicted_speedup(0.5, 2, 0.1) == pytest.approx(1.75 / 1.2)
    # Other host work o dilutes both sides: (1 + o) / (1 + o + K c).
    assert spec.predicted_speedup(0.5, 2, 0.1, 0.0, 1.0) == pytest.approx(1.75 * 2 / 2.2)


def test_alpha_is_the_per_position_estimate_and_acceptance_vllms_ratio():
    s = spec.summarize(spec_run(alpha=0.7, k=4, steps=600))
    assert s.alpha == pytest.approx(0.7, abs=0.03)
    # accepted / drafted counts the positions after a rejection as drafted: lower.
    e = spec.expected_tokens(0.7, 4)
    assert s.acceptance == pytest.approx((e - 1) / 4, abs=0.03) and s.acceptance < s.alpha
    assert s.tokens_per_forward == pytest.approx(e, abs=0.1)
    assert s.expected_tokens == pytest.approx(e, abs=0.1)
    assert s.mean_accepted == pytest.approx(s.tokens_per_forward - 1)
    assert s.draft_fill == 1.0 and s.k == 4 and s.method == "ngram"
    # i.i.d. by construction: position i is reached and accepted with α^(i+1) (vLLM's
    # per-position figure: accepted at i over drafts that had an i).
    assert np.allclose(s.position_acceptance, 0.7 ** np.arange(1, 5), atol=0.04)


def test_c_is_draft_time_per_position_over_the_plain_forward_given_by_a_baseline():
    # Plain forward at batch 2, 3, 4: 5, 5.5, 6 ms (mean 5.5); the draft phase 2 ms per
    # step of 4 positions: c = 0.5 / 5.5. The verify costs 0.3 ms per drafted token more.
    run = spec_run(draft_ms=2.0, per_draft_ms=0.3, steps=300)
    s = spec.summarize(run, baseline=plain_run())
    assert s.plain_source.startswith("the baseline run")
    assert s.plain_forward_ms == pytest.approx(5.5, rel=0.01)
    assert s.c == pytest.approx(0.5 / 5.5, rel=0.01)
    # 4 × 3 drafts per step on average × 0.3 ms, per position, over the plain forward.
    assert s.v == pytest.approx(0.3 * 3 / 5.5, rel=0.02)
    assert s.draft_ms == pytest.approx(2.0, rel=0.01)


def test_without_a_baseline_the_plain_forward_comes_from_the_verify_fit():
    # Drafts of varying length (fill 0.5) separate the drafted tokens' cost from the
    # batch's: the fit at zero drafts is the plain forward.
    run = spec_run(draft_ms=2.0, per_draft_ms=0.3, fill=0.5, steps=300)
    s = spec.summarize(run)
    assert s.plain_source.startswith("a fit of the verify forwards")
    assert s.plain_forward_ms == pytest.approx(5.5, rel=0.02)


def test_without_baseline_or_variation_leviathans_assumption_is_said():
    s = spec.summarize(spec_run(draft_ms=2.0, per_draft_ms=0.3, fill=1.0))
    assert "Leviathan" in s.plain_source and s.v == 0.0
    assert s.plain_forward_ms == pytest.approx(s.verify_ms)


def test_the_best_k_is_the_argmax_of_the_predicted_speedup():
    s = spec.summarize(spec_run(alpha=0.9, k=2, draft_ms=0.2, steps=400), baseline=plain_run())
    ks = np.arange(1, 17)
    curve = spec.predicted_speedup(s.alpha, ks, s.c, s.v, s.o)
    assert s.best_k == int(ks[np.argmax(curve)]) and s.best_k > 2
    assert s.best_gain == pytest.approx(curve.max() / curve[1] - 1)
    assert s.best_gain > 0.1


def test_a_slow_draft_predicts_and_shows_a_slowdown():
    s = spec.summarize(spec_run(alpha=0.7, k=4, draft_ms=30.0), baseline=plain_run())
    assert s.alpha > 0.6  # acceptance looks fine
    assert s.predicted_speedup < 1 and s.modelled_speedup < 1 and s.leviathan_speedup < 1
    assert s.c * s.k > 1  # the drafts cost more than a target forward


SPEC_PAGE = """\
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} %(drafts)s
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} %(tokens)s
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} %(accepted)s
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} %(p0)s
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} %(p1)s
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} %(p2)s
"""


def _server_run(tmp_path, before, after):
    from perfdiag.probes.metrics_scrape import parse_exposition
    from perfdiag.traces.reader import load_run
    from perfdiag.traces.schema import Counter
    from perfdiag.traces.writer import RunWriter

    with RunWriter(tmp_path / "run", command=["t"], config={},
                   environment_info={"test": True}) as w:  # fmt: skip
        for ts, values in ((1_000_000_000, before), (5_000_000_000, after)):
            samples, _ = parse_exposition(SPEC_PAGE % values)
            w.table("counters").extend(Counter(n, ts, v, "target") for n, v in samples)
    return load_run(tmp_path / "run")


def test_vllm_counters_give_the_same_acceptance_figures(tmp_path):
    from perfdiag.analyzers.server_metrics import server_metrics

    zero = dict(drafts=10, tokens=30, accepted=5, p0=3, p1=1, p2=1)
    # Over the run: 100 drafts of K = 3, 300 draft tokens; position 0 accepted 80 times,
    # position 1 56, position 2 39: 175 accepted, 61 drafts rejected somewhere.
    after = dict(drafts=110, tokens=330, accepted=180, p0=83, p1=57, p2=40)
    sm = server_metrics(_server_run(tmp_path, zero, after), 2_000_000_000, 4_000_000_000)
    assert sm.counters["spec_drafts"] == 100 and sm.counters["spec_draft_tokens"] == 300
    assert sm.by_label["spec_accepted_by_position"] == {"0": 80.0, "1": 56.0, "2": 39.0}
    assert "per_pos" in sm.source("spec_accepted_by_position")
    s = spec.from_server(sm)
    assert s.k == 3 and s.verifies == 100
    assert s.acceptance == pytest.approx(175 / 300)
    assert s.mean_accepted == pytest.approx(1.75) and s.tokens_per_forward == pytest.approx(2.75)
    assert s.position_acceptance == pytest.approx([0.80, 0.56, 0.39])
    assert s.alpha == pytest.approx(175 / (175 + 61))
    assert s.c != s.c  # no costs in the counters: nothing priced


def test_a_server_without_speculation_gives_no_figures(tmp_path):
    from perfdiag.analyzers.server_metrics import server_metrics

    page = dict(drafts=0, tokens=0, accepted=0, p0=0, p1=0, p2=0)
    sm = server_metrics(_server_run(tmp_path, page, page), 2_000_000_000, 4_000_000_000)
    assert spec.from_server(sm) is None

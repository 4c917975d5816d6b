"""Serving metrics on hand-built runs (tests/data/serving_runs.py): every figure below
is computed by hand from the timelines documented there (times in ms)."""

import numpy as np
import pandas as pd
import pytest
import serving_runs as runs

from perfdiag import load_run
from perfdiag.analyzers.lifecycle import build_lifecycle
from perfdiag.analyzers.metrics import serving_metrics
from perfdiag.analyzers.slo import Slo, load_slo_file, parse_slo
from perfdiag.analyzers.steady_state import find_window
from perfdiag.errors import ConfigError

MS = 1e-3


def approx(x):
    return pytest.approx(x, rel=1e-9, abs=1e-12)


def metrics_of(path, slo=None, steady=False):
    lc = build_lifecycle(load_run(path))
    return serving_metrics(lc, find_window(lc.requests, lc.origin_ns, steady=steady), slo)


@pytest.fixture(scope="module")
def basic(tmp_path_factory):
    return runs.basic(tmp_path_factory.mktemp("serving") / "basic")


def test_per_request_ttft_tpot_e2e_and_itl(basic):
    pr = metrics_of(basic).per_request.set_index("request_id")
    # A: sent 1, first token 41, done 52.5, 4 tokens; B: sent 40, first 45.5, done 51.2
    assert pr.loc["A", "ttft_s"] == approx(40 * MS)
    assert pr.loc["A", "e2e_s"] == approx(51.5 * MS)
    assert pr.loc["A", "tpot_s"] == approx((51.5 - 40) / 3 * MS)
    assert pr.loc["A", "max_itl_s"] == approx(6 * MS)  # gaps 41→46, 46→52
    assert pr.loc["B", "ttft_s"] == approx(5.5 * MS)
    assert pr.loc["B", "tpot_s"] == approx((11.2 - 5.5) / 2 * MS)
    assert pr.loc["A", "client_wait_s"] == approx(1 * MS)  # created 0, sent 1
    # C was cancelled: a TTFT, but no TPOT or E2E (it did not end on its own)
    assert pr.loc["C", "ttft_s"] == approx(3 * MS)
    assert np.isnan(pr.loc["C", "tpot_s"]) and np.isnan(pr.loc["C", "e2e_s"])
    assert pr.loc["A", "output_tokens"] == 4 and pr.loc["A", "n_chunks"] == 3


def test_distributions_exclude_warmup_and_count_chunks_and_tokens(basic):
    m = metrics_of(basic)
    assert m.ttft_s.count == 3  # A, B, C; the warm-up W is not there
    assert m.ttft_s.mean == approx((40 + 5.5 + 3) / 3 * MS)
    assert m.ttft_s.p50 == approx(5.5 * MS) and m.ttft_s.max == approx(40 * MS)
    assert m.tpot_s.count == 2 and m.e2e_s.mean == approx((51.5 + 11.2) / 2 * MS)
    # per chunk: A 5, 6; B 2.7, 2.8; C 1
    assert m.itl_per_chunk_s.count == 5
    assert m.itl_per_chunk_s.mean == approx((5 + 6 + 2.7 + 2.8 + 1) / 5 * MS)
    assert m.itl_per_chunk_s.max == approx(6 * MS)
    # per token: A's 2-token chunk after 6 ms is two 3 ms gaps
    assert m.itl_per_token_s.count == 6
    assert m.itl_per_token_s.mean == approx((5 + 3 + 3 + 2.7 + 2.8 + 1) / 6 * MS)
    assert m.itl_per_token_s.max == approx(5 * MS)
    assert m.tokens_per_chunk.count == 8 and m.tokens_per_chunk.max == 2
    assert m.tokens_per_chunk.mean == approx(9 / 8)


def test_outcomes_rates_and_throughput(basic):
    m = metrics_of(basic)
    o = m.outcomes
    assert (o.requests, o.ok, o.cancelled, o.rejected, o.error) == (5, 2, 1, 1, 1)
    assert o.warmup_excluded == 1
    assert m.rates.error_rate == approx(0.2) and m.rates.rejection_rate == approx(0.2)
    assert m.rates.cancellation_rate == approx(0.2) and m.rates.timeout_rate == 0
    tp = m.throughput
    # the whole-run window: first measured send (A, 1) → last measured done (A, 52.5)
    assert tp.window_s == approx(51.5 * MS)
    assert tp.output_tokens == 9  # A 4 + B 3 + C 2 (W is warm-up)
    assert tp.input_tokens == 18  # prompts of A, B, C (first token inside the window)
    assert tp.completed == 2
    assert tp.output_tokens_per_s == approx(9 / (51.5 * MS))
    assert tp.total_tokens_per_s == approx(27 / (51.5 * MS))
    assert tp.requests_per_s == approx(2 / (51.5 * MS))


def test_goodput_counts_failures_and_rejections_as_misses(basic, tmp_path):
    g = metrics_of(basic, Slo(ttft_s=10 * MS)).goodput
    # judged: A, B, R, E (C was cancelled by the client); good: B only
    assert (g.judged, g.good) == (4, 1)
    assert g.attainment == approx(0.25)
    assert (g.missed_failed, g.missed_ttft) == (2, 1)
    assert g.requests_per_s == approx(1 / (51.5 * MS))
    assert g.output_tokens_per_s == approx(3 / (51.5 * MS))
    without = metrics_of(runs.basic(tmp_path / "norej", with_rejection=False), Slo(ttft_s=0.01))
    assert without.goodput.attainment == approx(1 / 3)  # the rejection lowered it to 1/4


@pytest.mark.parametrize(
    ("slo", "good", "missed"),
    [
        (Slo(tpot_s=3 * MS), 1, "missed_tpot"),  # A's TPOT 3.83 ms, B's 2.85 ms
        (Slo(itl_s=5.5 * MS), 1, "missed_itl"),  # A stalled 6 ms once
        (Slo(e2e_s=50 * MS), 1, "missed_e2e"),  # A took 51.5 ms
        (Slo(ttft_s=1.0, tpot_s=1.0, itl_s=1.0, e2e_s=1.0), 2, None),
    ],
)
def test_each_slo_target(basic, slo, good, missed):
    g = metrics_of(basic, slo).goodput
    assert g.good == good
    if missed:
        assert getattr(g, missed) == 1


def test_steady_state_excludes_ramp_up_and_drain(tmp_path):
    # a request every 10 ms, each in flight 50 ms; the first five are warm-up
    lc = build_lifecycle(load_run(runs.steady(tmp_path / "steady")))
    w = find_window(lc.requests, lc.origin_ns)
    assert w.steady and w.reason == "steady"
    assert w.level == 5
    assert w.start_ns == runs.ns(50)  # five in flight from 40 ms, first measured send at 50
    assert w.end_ns == runs.ns(590)  # the last send: after it, only draining
    assert w.ramp_up_s == approx(50 * MS) and w.drain_s == approx(50 * MS)
    m = serving_metrics(lc, w)
    assert m.outcomes.requests == 55 and m.ttft_s.mean == approx(50 * MS)
    # 55 measured requests in flight for 50 ms each; deliveries at 100 … 590 in the window
    assert m.throughput.output_tokens == 50


def test_a_window_too_short_falls_back_to_the_whole_run(tmp_path):
    lc = build_lifecycle(load_run(runs.steady(tmp_path / "short", n=6, warmup=1)))
    w = find_window(lc.requests, lc.origin_ns)
    assert not w.steady and w.reason in ("too-short", "too-few-requests")
    assert w.start_ns == runs.ns(10) and w.end_ns == runs.ns(100)


def test_engine_only_run_uses_the_engine_view(tmp_path):
    # drop the client events: latencies come from the engine's own timestamps
    run = load_run(runs.basic(tmp_path / "b"))
    ev = run.request_events
    engine_only = [e for e in ev.itertuples(index=False) if e.side == "engine"]
    rows = [runs.RequestEvent(*(None if pd.isna(v) else v for v in e)) for e in engine_only]
    path = runs.write(tmp_path / "engine", [], rows)
    lc = build_lifecycle(load_run(path))
    assert lc.basis == "engine"
    m = serving_metrics(lc, find_window(lc.requests, lc.origin_ns, steady=False))
    pr = m.per_request.set_index("request_id")
    assert pr.loc["A", "ttft_s"] == approx((39.5 - 1.5) * MS)  # arrival → first token sampled


def test_slo_parsing(tmp_path):
    assert parse_slo("ttft=0.5,tpot=50ms") == Slo(ttft_s=0.5, tpot_s=0.05)
    assert parse_slo(" itl = 200us , e2e=2s ") == Slo(itl_s=200e-6, e2e_s=2.0)
    path = tmp_path / "slo.yaml"
    path.write_text("ttft_s: 0.25\nE2E: 3\n")
    assert load_slo_file(path) == Slo(ttft_s=0.25, e2e_s=3.0)
    for bad in ("ttft", "ttft=-1", "ttft=soon", "speed=1", ""):
        with pytest.raises(ConfigError):
            parse_slo(bad)
    path.write_text("- ttft\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_slo_file(path)

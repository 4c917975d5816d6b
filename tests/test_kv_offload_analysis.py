"""The host tier's analysis (analyzers/kv_offload.py, playbooks/facts_offload.py) on
hand-made runs in the engine's record format: restores slower than the recompute they
replace name offload-restore-slower with the break-even length and an action that turns
the tier off; cheap restores raise nothing; blocks written and evicted unused name
offload-thrash; step 5's cache hits split device and host tiers with time saved per tier;
vLLM's kv_offload / external_prefix_cache counters give the same figures for a --target
run; a run without any of these is not evaluated."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from test_speculative_checks import finding

from perfdiag.analyzers import kv_offload as ko
from perfdiag.analyzers.cache import CacheAnalysis, TierHits
from perfdiag.analyzers.lifecycle import Missing
from perfdiag.playbooks.facts import TriageContext, Unavailable, evaluate_fact

US = 1_000
PRICE = 2e-6  # seconds per prefill token


def offload_run(restores, offloaded=0, evicted_unused=0, mb=4.0, device_tokens=16):
    """`restores`: (host tokens, restore µs) per admission; one step per admission."""
    rows = []
    for i, (tokens, us) in enumerate(restores):
        ts, rid = i * 1_000_000, f"r{i}"
        rows += [
            ("kv_hit_device_tokens", ts, float(device_tokens), rid),
            ("kv_hit_host_tokens", ts, float(tokens), rid),
            ("kv_restore_bytes", ts, tokens * 1024.0, rid),
            ("kv_restore_ns", ts, us * US, rid),
        ]
    if offloaded:
        rows += [
            ("kv_offload_blocks", 0, float(offloaded), "host"),
            ("kv_offload_ns", 0, offloaded * 20.0 * US, "host"),
            ("kv_offload_evicted_unused", 0, float(evicted_unused), "host"),
            ("kv_offload_blocks_used", 0, 64.0, "host"),
        ]
    counters = pd.DataFrame(rows, columns=["name", "ts_ns", "value", "scope"])
    config = {"run_options": {"engine": {"kv_offload_mb": mb}}}
    return SimpleNamespace(counters=counters, manifest=SimpleNamespace(config=config))


def ctx_of(run, price=PRICE, cache=None) -> TriageContext:
    cost = SimpleNamespace(
        prefill_token_cost_s=price,
        per_prefill_token_s=price,
        trusted=math.isfinite(price),
        chosen="additive",
        priced_by="the additive model",
    )
    serving = SimpleNamespace(
        step_cost=cost,
        metrics=Missing("metrics", ("test",)),
        cache=cache if cache is not None else Missing("cache", ("t",)),
    )
    run.manifest.run_id, run.path = "t", "t"
    return TriageContext(run, serving)


def test_restores_slower_than_recompute_name_the_check_with_a_break_even():
    # 16-token prefixes restored in 100 µs; recomputing them costs 32 µs.
    run = offload_run([(16, 100.0)] * 10 + [(32, 110.0)] * 10)
    f = finding(ctx_of(run), "offload-restore-slower")
    assert f is not None and f.severity == "critical"
    ev = {e.name: e.value for e in f.evidence}
    # restore = 90 µs + 0.625 µs/token; recompute 2 µs/token: break-even 90/1.375 = 65
    assert ev["break_even"] == "65 tokens"
    assert ev["restore_ms"] == pytest.approx(2.1) and ev["recompute_ms"] == pytest.approx(0.96)
    assert "break-even 65 tokens" in f.title
    setting = f.action.settings[0]
    assert setting.option == "engine.kv_offload_mb" and setting.to == 0.0
    assert "--kv-offload-mb 0" in f.recommendations[0]


def test_cheap_restores_raise_nothing():
    run = offload_run([(64, 20.0)] * 10)  # 20 µs against 128 µs of prefill
    assert finding(ctx_of(run), "offload-restore-slower") is None


def test_no_price_no_verdict():
    run = offload_run([(16, 100.0)] * 3)
    assert isinstance(
        evaluate_fact("offload_restore_slower", ctx_of(run, math.nan), {}), Unavailable
    )


def test_break_even_arithmetic():
    assert ko.break_even(100e-6, 1e-6, 2e-6) == pytest.approx(100.0)
    assert math.isinf(ko.break_even(0.0, 3e-6, 2e-6))  # a restored token dearer: never
    assert math.isnan(ko.break_even(0.0, 1e-6, math.nan))
    fixed, per = ko.fit_restore_cost(np.array([16.0, 32.0, 64.0]), np.array([30, 46, 78]) * 1e-6)
    assert fixed == pytest.approx(14e-6) and per == pytest.approx(1e-6)


def test_blocks_written_and_evicted_unused_name_thrash():
    run = offload_run([(16, 10.0)], offloaded=100, evicted_unused=90)
    f = finding(ctx_of(run), "offload-thrash")
    assert f is not None and f.severity == "warning"
    assert "90 of 100 blocks" in f.title
    assert "raise --kv-offload-mb from 4 to 8" in f.recommendations[0]
    assert f.action.settings[0].to == 8.0


def test_thrash_with_nothing_restored_advises_turning_it_off():
    run = offload_run([], offloaded=50, evicted_unused=50)
    f = finding(ctx_of(run), "offload-thrash")
    assert f is not None and "turn the host tier off" in f.recommendations[0]
    assert f.action.settings[0].to == 0.0


def test_a_run_without_a_host_tier_is_not_evaluated():
    run = offload_run([])
    for check in ("offload-restore-slower", "offload-thrash"):
        assert isinstance(finding(ctx_of(run), check), Unavailable)


def test_cache_hits_split_by_tier_with_time_saved_per_tier():
    # The scheduler's record counts host restores among the admission hits.
    cache = CacheAnalysis(
        prompt_tokens=1000,
        first_admission_hit_tokens=400,
        hit_rate=0.4,
        requests_with_hits=10,
        recompute_hit_tokens=0,
        tiers=(TierHits("device", 400, 10, 400 * PRICE), TierHits("swap", 0, 0, 0.0)),
        saved_s=400 * PRICE,
        saved_share=0.1,
        cost_per_prefill_token_s=PRICE,
    )
    run = offload_run([(32, 10.0)] * 5, device_tokens=48)  # 160 host tokens, 50 µs restores
    f = finding(ctx_of(run, cache=cache), "cache-hits")
    ev = {e.name: e.value for e in f.evidence}
    assert ev["device_tokens"] == 240 and ev["host_tokens"] == 160
    assert ev["host_saved_ms"] == pytest.approx(160 * PRICE * 1e3 - 0.05)
    assert ev["device_saved_ms"] == pytest.approx(240 * PRICE * 1e3)
    assert "host 160 (0 ms saved net of restores)" in f.title


def test_a_run_without_a_host_tier_keeps_the_old_cache_hits_title():
    cache = CacheAnalysis(
        1000,
        400,
        0.4,
        10,
        0,
        (TierHits("device", 400, 10, 0.0008), TierHits("swap", 0, 0, 0.0)),
        0.0008,
        0.1,
        PRICE,
    )
    f = finding(ctx_of(offload_run([]), cache=cache), "cache-hits")
    assert "device 400 (1 ms saved), swap 0 tokens" in f.title and "host" not in f.title


def test_vllm_offload_counters_give_the_restore_figures():
    sm = SimpleNamespace(
        counters={
            "external_prefix_hits": 1000.0,
            "offload_load_s": 0.004,
            "offload_load_bytes": 2**20,
            "prefix_hits": 500.0,
        }
    )
    s = ko.from_server(sm, PRICE)
    assert s.host_tokens == 1000 and s.restore_s == 0.004 and s.recompute_s == pytest.approx(2e-3)
    assert math.isinf(s.break_even_tokens)  # 4 µs a restored token against 2 µs recomputed
    assert ko.from_server(SimpleNamespace(counters={}), PRICE) is None


def test_vllm_names_map_to_the_offload_concepts():
    from perfdiag.analyzers.server_metrics import COUNTERS

    assert COUNTERS["external_prefix_hits"][0][0] == "vllm:external_prefix_cache_hits_total"
    assert COUNTERS["offload_load_s"][0][0] == "vllm:kv_offload_load_time_total"
    assert COUNTERS["offload_load_s"][1] == (
        "vllm:kv_offload_total_time_total",
        {"transfer_type": "CPU_to_GPU"},
    )

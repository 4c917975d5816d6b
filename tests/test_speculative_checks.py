"""The speculative-decoding and KV-quantisation checks of triage.yaml on hand-made runs
(tests/spec_runs.py): spec-no-speedup names what eats the gain with its numbers,
spec-k-mismatch advises the K the measured α and c favour as a re-runnable action,
spec-acceptance reports the figures, and a run without the spec_* counters gets none of
them; kv-quant-tradeoff prices int8 KV from the bytes per block when the pool is full."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pandas as pd
import pytest
from spec_runs import plain_run, spec_run

from perfdiag.analyzers.lifecycle import Missing
from perfdiag.playbooks.evaluate import _finding
from perfdiag.playbooks.facts import Fact, TriageContext, Unavailable, evaluate_fact
from perfdiag.playbooks.schema import load_playbook

SERVING = ("metrics", "preemptions", "step_cost", "limits")


def _ctx(run, baseline=None) -> TriageContext:
    serving = SimpleNamespace(**{n: Missing(n, ("test",)) for n in SERVING})
    run.manifest.run_id, run.path = "t", "t"
    base = TriageContext(baseline, serving) if baseline is not None else None
    return TriageContext(run, serving, baseline=base)


def finding(ctx, check_id):
    """The check's finding on `ctx` (None: it did not fire), or the Unavailable."""
    book = load_playbook()
    for step in book.steps:
        for check in step.checks:
            if check.id == check_id:
                fact = evaluate_fact(check.fact, ctx, dict(check.params))
                if isinstance(fact, Unavailable):
                    return fact
                severity = check.condition.severity(fact.value)
                return None if severity is None else _finding(check, step.step, "", severity, fact)
    raise KeyError(check_id)


def test_a_slow_draft_is_named_as_what_eats_the_gain_with_numbers():
    # α 0.8 is fine; the proposer's 30 ms per step against a 5.5 ms forward is not.
    f = finding(_ctx(spec_run(alpha=0.8, draft_ms=30.0), plain_run()), "spec-no-speedup")
    assert isinstance(f, object) and f is not None and f.severity == "critical"
    assert "draft time eats it: 30.00 ms per step" in f.title
    assert re.search(r"with \d+% of drafts accepted", f.title)
    ev = {e.name: e.value for e in f.evidence}
    assert ev["speedup"] < 1 and ev["eaten_by"] == "draft time"
    assert ev["plain_source"].startswith("the baseline run")
    assert "ngram:1" in f.recommendations[0] or "without --speculative" in f.recommendations[0]


def test_a_costly_verify_is_named_as_what_eats_the_gain():
    # A cheap proposer but 3 ms per drafted token in the verify forward (a CPU's
    # compute-bound verify): the drafts are free, the verification is not.
    run = spec_run(alpha=0.5, draft_ms=0.1, per_draft_ms=3.0, fill=0.5, steps=300)
    f = finding(_ctx(run), "spec-no-speedup")
    assert f is not None and "verify time eats it" in f.title
    assert {e.name: e.value for e in f.evidence}["plain_source"].startswith("a fit")


def test_speculation_that_pays_raises_no_slowdown():
    f = finding(_ctx(spec_run(alpha=0.8, draft_ms=0.2), plain_run()), "spec-no-speedup")
    assert f is None


def test_k_far_from_the_best_is_advised_as_a_rerun_with_the_better_k():
    # α 0.9 with nearly free drafts: K = 1 leaves most accepted tokens on the table.
    ctx = _ctx(spec_run(alpha=0.9, k=1, draft_ms=0.05, steps=400), plain_run())
    f = finding(ctx, "spec-k-mismatch")
    assert f is not None and f.severity in ("warning", "critical")
    best = int(re.search(r"K = (\d+) is predicted", f.title).group(1))
    assert best > 1
    assert f.recommendations[0].startswith(f"Set --speculative ngram:{best} (now ngram:1)")
    assert f'"num_speculative_tokens": {best}' in f.recommendations[0]
    a = f.action
    assert a.target == "throughput.output" and a.flags == f"--speculative ngram:{best}"


def test_the_best_k_already_in_use_raises_nothing():
    s = spec_run(alpha=0.9, k=4, draft_ms=0.05, steps=400)
    from perfdiag.analyzers import speculative

    best = speculative.summarize(s, baseline=plain_run()).best_k
    ctx = _ctx(spec_run(alpha=0.9, k=best, draft_ms=0.05 * best / 4, steps=400), plain_run())
    assert finding(ctx, "spec-k-mismatch") is None


def test_acceptance_is_reported_with_its_source():
    f = finding(_ctx(spec_run(alpha=0.7)), "spec-acceptance")
    assert f is not None and f.severity == "info"
    assert re.match(
        r"Speculative decoding \(ngram, K = 4\): \d+% of draft tokens accepted", f.title
    )
    assert "spec_drafted" in {e.name: e.value for e in f.evidence}["source"]


def test_a_run_without_spec_counters_shows_nothing_about_speculation():
    ctx = _ctx(plain_run())
    for check in ("spec-no-speedup", "spec-k-mismatch", "spec-acceptance"):
        got = finding(ctx, check)
        assert isinstance(got, Unavailable) and "no speculative" in got.reason


def _kv_run(kv_dtype="auto", full=True, blocks=None):
    run = plain_run(steps=20)
    st = run.steps
    st["kv_blocks_used"] = 95 if full else 10
    st["kv_blocks_free"] = 5 if full else 90
    st["num_waiting"] = 3
    model = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
             "head_dim": 16}  # fmt: skip
    cache = {"kv_dtype": kv_dtype, "block_size": 16}
    if blocks:
        cache["num_gpu_blocks"] = blocks
    run.manifest.config = {"engine_config": {"model": model, "cache": cache,
                                             "dtype": "float32"}}  # fmt: skip
    st["num_running"], st["num_swapped"] = 4, 0
    run.requests = pd.DataFrame({"prompt_tokens": [100] * 5, "output_tokens": [50] * 5})
    return run


def test_kv_quantisation_is_priced_from_the_bytes_per_block_when_the_pool_is_full():
    f = finding(_ctx(_kv_run()), "kv-quant-tradeoff")
    assert f is not None and f.severity == "warning"
    ev = {e.name: e.value for e in f.evidence}
    # float32, head_dim 16: 64 bytes per head and token; int8 16 + a 4-byte scale = 20.
    assert ev["bytes_now"] == 2 * 2 * 16 * 2 * 64 and ev["bytes_quant"] == 2 * 2 * 16 * 2 * 20
    assert ev["ratio"] == pytest.approx(3.2) and ev["blocks_then"] == 320
    assert "--kv-dtype int8 holds 320 blocks" in f.recommendations[0]
    assert "--kv-cache-dtype fp8" in f.recommendations[0]
    assert f.action.flags == "--kv-dtype int8" and f.action.target == "e2e.p50"


def test_a_pool_that_is_not_the_problem_gets_no_kv_advice():
    assert isinstance(finding(_ctx(_kv_run(full=False)), "kv-quant-tradeoff"), Unavailable)


def test_a_quantised_kv_cache_says_what_it_bought():
    f = finding(_ctx(_kv_run(kv_dtype="int8")), "kv-quant-tradeoff")
    assert f is not None and f.severity == "info"
    assert "int8 KV holds 3.20× the blocks of float32" in f.title


def test_every_new_fact_returns_a_fact_or_a_reason():
    ctx = _ctx(spec_run())
    for name in ("spec_acceptance", "spec_no_speedup", "spec_k_gain"):
        assert isinstance(evaluate_fact(name, ctx, {}), Fact | Unavailable)


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_the_bytes_per_block_agree_with_the_engines_pool(preset):
    import dataclasses

    from perfdiag.engine_ref.config import ModelConfig
    from perfdiag.engine_ref.kv_cache import bytes_per_block
    from perfdiag.playbooks.facts_speculative import block_bytes

    m = ModelConfig.preset(preset)
    for kv in ("auto", "int8", "fp8"):
        for dtype in ("float32", "bfloat16"):
            got = block_bytes(dataclasses.asdict(m), 16, dtype, kv)
            assert got == bytes_per_block(m, 16, dtype, kv), (kv, dtype)


def test_a_target_runs_vllm_counters_give_the_acceptance_finding(tmp_path):
    from spec_runs import write_run
    from test_speculative_analysis import SPEC_PAGE

    from perfdiag import load_run
    from perfdiag.analyzers.serving import analyze_serving
    from perfdiag.probes.metrics_scrape import parse_exposition

    run = plain_run(steps=60)
    end = int(run.steps["end_ns"].max()) + 10**9
    rows = []
    for ts, v in (
        (0, dict(drafts=0, tokens=0, accepted=0, p0=0, p1=0, p2=0)),
        (end, dict(drafts=100, tokens=300, accepted=175, p0=80, p1=56, p2=39)),
    ):
        samples, _ = parse_exposition(SPEC_PAGE % v)
        rows += [(n, ts, x, "target") for n, x in samples]
    run.counters = pd.DataFrame(rows, columns=["name", "ts_ns", "value", "scope"])
    loaded = load_run(write_run(tmp_path / "t", run, client=True))
    f = finding(TriageContext(loaded, analyze_serving(loaded)), "spec-acceptance")
    assert (
        f is not None and "58% of draft tokens accepted, 2.75 tokens per target forward" in f.title
    )
    ev = {e.name: e.value for e in f.evidence}
    assert ev["source"].startswith("server metrics (vllm:spec_decode_num_drafts_total")
    assert ev["by_position"] == "80%, 56%, 39%"


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_host_share_shows_the_draft_phase_and_leaves_it_to_the_spec_checks(tmp_path, method):
    from spec_runs import write_run

    from perfdiag import load_run

    write_run(tmp_path / "r", spec_run(draft_ms=3.0, method=method))
    fact = evaluate_fact("host_share", TriageContext(load_run(tmp_path / "r")), {})
    got = {e.name: e.value for e in fact.evidence}
    assert got["draft_ms"] == pytest.approx(3.0, rel=0.01)
    # schedule + post_process = 1 ms a step; a slow draft is spec-no-speedup's to name.
    assert got["host_ms"] - got["gap_ms"] == pytest.approx(1.0, rel=0.05)

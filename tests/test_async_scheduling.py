"""Overlapped scheduling (--async-scheduling, engine_ref/async_step.py): token for token
the plain engine's output, under chunking, prefix hits, preemption (recompute and swap),
staggered arrivals, stop tokens, seeded sampling and aborts; and the step records say
which host work ran ahead."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from perfdiag.engine_ref import CacheConfig, LLMEngine, RecordingObserver, SamplingParams
from perfdiag.engine_ref import RequestEventKind as K
from perfdiag.engine_ref.hooks import StepPhase
from perfdiag.engine_ref.testing import run, tiny_config, workload
from perfdiag.errors import ConfigError
from tests.test_engine_correctness import MAX_LEN, SCENARIOS

ITEMS = workload(n=24, seed=0)


def _pair(name: str, items=ITEMS):
    kw = dict(SCENARIOS[name])
    per_step = kw.pop("per_step", None)
    backend = kw.pop("attention_backend", "sdpa")
    cfg = replace(tiny_config(max_model_len=MAX_LEN, **kw), attention_backend=backend)
    plain = run(LLMEngine(cfg), items, per_step=per_step)
    obs = RecordingObserver()
    engine = LLMEngine(replace(cfg, async_scheduling=True), observer=obs)
    overlapped = run(engine, items, per_step=per_step)
    assert engine.is_drained()
    return plain, overlapped, obs


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_overlapped_equals_plain(name):
    plain, overlapped, obs = _pair(name)
    assert overlapped.tokens == plain.tokens
    assert overlapped.finish == plain.finish
    for rid, lps in plain.logprobs.items():
        assert overlapped.logprobs[rid] == pytest.approx(lps, abs=1e-4)
    ahead = [p for p in obs.phases if p.phase == StepPhase.SCHEDULE_AHEAD]
    assert len(ahead) >= len(obs.steps) - 2  # every step but the first (and last) looked ahead
    if name.startswith("preempt"):
        assert any(e.kind == K.PREEMPTED for e in obs.requests)


def _stop_items():
    """Greedy requests whose stop token is one the plain engine emits mid-output: they
    finish on a step after which the look-ahead had already scheduled them."""
    probe = run(LLMEngine(tiny_config(max_model_len=MAX_LEN)), ITEMS)
    items = []
    for i, it in enumerate(ITEMS):
        toks = probe.tokens[f"r{i}"]
        stop = (toks[len(toks) // 2],) if len(toks) > 3 else ()
        items.append(replace(it, params=replace(it.params, stop_token_ids=stop)))
    return items


def test_stop_tokens_finish_on_time():
    items = _stop_items()
    plain, overlapped, obs = _pair("chunk_16", items)
    assert overlapped.tokens == plain.tokens
    assert sum(r == "stop" for r in plain.finish.values()) >= 5
    # A request that stopped got nothing after its FINISHED event.
    for rid in plain.tokens:
        evs = obs.of(rid)
        done = next(i for i, e in enumerate(evs) if e.kind == K.FINISHED)
        assert not [e for e in evs[done:] if e.kind in (K.TOKEN, K.FIRST_TOKEN)]


def test_seeded_sampling_identical():
    items = [replace(it, params=SamplingParams(temperature=0.8, top_p=0.9, seed=100 + i,
                                               max_tokens=it.params.max_tokens))
             for i, it in enumerate(ITEMS)]  # fmt: skip
    for name in ("chunk_16", "preempt_swap"):
        plain, overlapped, _ = _pair(name, items)
        assert overlapped.tokens == plain.tokens, name


def _with_aborts(cfg, every: int = 3):
    """Steps the engine, aborting request r{k} after its 2nd token for k % every == 0."""
    engine = LLMEngine(cfg)
    for i, it in enumerate(ITEMS[:15]):
        engine.add_request(it.prompt, replace(it.params, max_tokens=40),
                           request_id=f"r{i}")  # fmt: skip
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(15)}
    aborted = set()
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id].extend(out.new_token_ids)
            k = int(out.request_id[1:])
            due = k % every == 0 and len(tokens[out.request_id]) >= 2 and not out.finished
            if due and out.request_id not in aborted:
                aborted.add(out.request_id)
                engine.abort(out.request_id)
    assert engine.is_drained()
    return tokens, aborted


@pytest.mark.parametrize("name", ["chunk_16", "preempt_recompute"])
def test_aborts_between_steps(name):
    cfg = tiny_config(max_model_len=MAX_LEN, **SCENARIOS[name])
    plain, aborted = _with_aborts(cfg)
    overlapped, aborted2 = _with_aborts(replace(cfg, async_scheduling=True))
    assert aborted == aborted2 and len(aborted) >= 4
    assert overlapped == plain
    for rid in aborted:  # nothing after the abort: the look-ahead's slot was discarded
        assert len(plain[rid]) == 2


def test_step_records_mark_the_overlapped_host_work():
    obs = RecordingObserver()
    run(LLMEngine(replace(tiny_config(max_model_len=MAX_LEN), async_scheduling=True), obs),
        ITEMS)  # fmt: skip
    names = {p.phase for p in obs.phases}
    assert {StepPhase.SCHEDULE_AHEAD, StepPhase.PREPARE_AHEAD} <= names
    assert StepPhase.HOST_HIDDEN not in names  # the CPU forward hides nothing
    # Phases of a step stay inside it and do not overlap one another.
    steps = {s.step_id: s for s in obs.steps}
    by_step: dict[int, list] = {}
    for p in obs.phases:
        by_step.setdefault(p.step_id, []).append(p)
    for sid, ps in by_step.items():
        ps.sort(key=lambda p: p.start_ns)
        assert steps[sid].start_ns <= ps[0].start_ns and ps[-1].end_ns <= steps[sid].end_ns
        assert all(a.end_ns <= b.start_ns for a, b in itertools.pairwise(ps))


def test_refuses_speculative_and_tp_in_one_line():
    from perfdiag.engine_ref.speculative.spec_config import parse_speculative

    cfg = tiny_config(max_model_len=MAX_LEN)
    with pytest.raises(ConfigError, match="--async-scheduling does not combine"):
        replace(cfg, async_scheduling=True, speculative=parse_speculative("ngram:4"))


def test_refuses_pipeline_parallelism_in_one_line():
    cfg = tiny_config(max_model_len=MAX_LEN)
    with pytest.raises(ConfigError, match="without --tp or --pp"):
        replace(cfg, async_scheduling=True, pipeline_parallel_size=2)


def test_overlapped_equals_plain_with_the_host_prefix_tier():
    """Prefix blocks evicted to the host tier and restored on later hits (--kv-offload-mb):
    the look-ahead's admissions restore them too, and outputs stay the plain engine's."""
    cache = CacheConfig(block_size=4, num_gpu_blocks=40, watermark=0.0, check_ownership=True,
                        kv_offload_bytes=4 << 20)  # fmt: skip
    cfg = tiny_config(max_model_len=MAX_LEN, cache=cache)
    plain = run(LLMEngine(cfg), ITEMS, per_step=2)
    engine = LLMEngine(replace(cfg, async_scheduling=True))
    overlapped = run(engine, ITEMS, per_step=2)
    assert overlapped.tokens == plain.tokens
    assert engine.block_manager.host_tier.total_restored > 0

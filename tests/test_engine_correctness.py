"""Token for token: the batched, paged engine against the dense reference.

Every scenario runs the same 24 requests (mixed prompt and output lengths, shared
prefixes) and must reproduce, exactly, the greedy tokens of a dense reference that
recomputes everything for one request at a time. Each scenario also asserts that the
mechanism it claims to exercise really happened (chunks, prefix hits, preemptions, swaps).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from perfdiag.engine_ref import (
    CacheConfig,
    DenseReference,
    LLMEngine,
    RecordingObserver,
    SchedulerConfig,
)
from perfdiag.engine_ref import RequestEventKind as K
from perfdiag.engine_ref.testing import paged_logits, run, tiny_config, workload

MAX_LEN = 128
ITEMS = workload(n=24, seed=0)


@pytest.fixture(scope="module")
def reference():
    engine = LLMEngine(tiny_config(max_model_len=MAX_LEN))
    ref = DenseReference(engine.model)
    outs = {
        f"r{i}": ref.greedy(it.prompt, it.params.max_tokens, (257,), max_model_len=MAX_LEN)
        for i, it in enumerate(ITEMS)
    }
    return outs


def test_reference_choices_are_well_separated(reference):
    # fp32 paged-vs-dense logit differences are ~1e-6 (test below); a top-2 gap far above
    # that makes exact token equality a fair demand rather than luck.
    assert min(o.min_margin for o in reference.values()) > 1e-4


def test_paged_logits_match_dense_logits():
    engine = LLMEngine(tiny_config(max_model_len=MAX_LEN))
    tokens = ITEMS[5].prompt + ITEMS[6].prompt
    dense = DenseReference(engine.model).logits(tokens)
    for chunk in (1, 3, len(tokens)):
        paged = paged_logits(engine, tokens, chunk)
        assert (paged - dense).abs().max().item() < 2e-5
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


SCENARIOS = {
    "chunked_prefill_off": dict(
        scheduler=SchedulerConfig(enable_chunked_prefill=False, max_num_batched_tokens=MAX_LEN)
    ),
    "chunk_16": dict(scheduler=SchedulerConfig(chunk_size=16, max_num_batched_tokens=64)),
    "chunk_5": dict(scheduler=SchedulerConfig(chunk_size=5, max_num_batched_tokens=24)),
    "prefix_cache_off": dict(
        cache=CacheConfig(
            block_size=4, num_gpu_blocks=256, enable_prefix_caching=False, check_ownership=True
        ),
    ),
    "preempt_recompute": dict(
        cache=CacheConfig(block_size=4, num_gpu_blocks=40, watermark=0.0, check_ownership=True),
        scheduler=SchedulerConfig(
            chunk_size=16,
            max_num_batched_tokens=64,
            decode_reserve_tokens=0,
            preemption_mode="recompute",
        ),
    ),
    "preempt_swap": dict(
        cache=CacheConfig(
            block_size=4, num_gpu_blocks=40, num_cpu_blocks=200, watermark=0.0, check_ownership=True
        ),
        scheduler=SchedulerConfig(
            chunk_size=16,
            max_num_batched_tokens=64,
            decode_reserve_tokens=0,
            preemption_mode="swap",
        ),
    ),
    "staggered_arrivals": dict(per_step=2),
    "naive_attention_backend": dict(attention_backend="naive"),
    "prefix_policy_small_batches": dict(
        scheduler=SchedulerConfig(
            chunk_size=8,
            max_num_batched_tokens=32,
            max_num_seqs=3,
            policy="prefix",
            max_wait_ms=None,
        ),
    ),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_engine_equals_dense_reference(name, reference):
    kw = dict(SCENARIOS[name])
    per_step = kw.pop("per_step", None)
    backend = kw.pop("attention_backend", "sdpa")
    cfg = replace(tiny_config(max_model_len=MAX_LEN, **kw), attention_backend=backend)
    obs = RecordingObserver()
    engine = LLMEngine(cfg, observer=obs)
    res = run(engine, ITEMS, per_step=per_step)

    for rid, ref in reference.items():
        assert res.tokens[rid] == ref.token_ids, f"{name}: {rid} differs"
        assert res.finish[rid] == ref.finish_reason
        assert res.logprobs[rid] == pytest.approx(ref.logprobs, abs=1e-4)
    assert engine.is_drained()

    # The scenario exercised what it names.
    chunks = [e for e in obs.requests if e.kind == K.PREFILL_CHUNK]
    hits = sum(e.num_cached_tokens for e in obs.requests if e.kind == K.SCHEDULED)
    preempted = [e for e in obs.requests if e.kind == K.PREEMPTED]
    longest = max(range(len(ITEMS)), key=lambda i: len(ITEMS[i].prompt))
    chunks_of_longest = [e for e in chunks if e.request_id == f"r{longest}"]
    if name == "chunked_prefill_off":
        assert len(chunks_of_longest) == 1
    if name in ("chunk_16", "chunk_5"):
        size = cfg.scheduler.chunk_size
        assert len(chunks_of_longest) >= len(ITEMS[longest].prompt) // size
        assert max(e.num_tokens for e in chunks) <= size
        # mixed steps: prefill tokens and decodes in the same batch
        assert any(s.num_prefill_seqs and s.num_decode_seqs for s in obs.steps)
    if name == "prefix_cache_off":
        assert hits == 0
    elif not preempted:
        assert hits > 0
    if name == "preempt_recompute":
        assert preempted and all(e.detail == "recompute" for e in preempted)
    if name == "preempt_swap":
        assert any(e.detail == "swap" for e in preempted)
        assert any(e.kind == K.RESUMED and e.detail == "swap" for e in obs.requests)
    if name == "staggered_arrivals":
        first_sched = {e.request_id: e.step_id for e in obs.requests if e.kind == K.SCHEDULED}
        assert first_sched["r23"] > first_sched["r0"]


def test_admission_reserve_prevents_preemption(reference):
    """The same tight pool: admitting on "free now" preempts; reserving each running
    request's decode growth (up to its max_tokens) does not."""
    counts = {}
    for reserve in (0, 40):
        cfg = tiny_config(
            max_model_len=MAX_LEN,
            cache=CacheConfig(block_size=4, num_gpu_blocks=40, watermark=0.0, check_ownership=True),
            scheduler=SchedulerConfig(
                chunk_size=16, max_num_batched_tokens=64, decode_reserve_tokens=reserve
            ),
        )
        obs = RecordingObserver()
        res = run(LLMEngine(cfg, observer=obs), ITEMS)
        assert all(res.tokens[r] == reference[r].token_ids for r in reference)
        counts[reserve] = sum(s.num_preemptions for s in obs.steps)
    assert counts[0] > 0
    assert counts[40] == 0

"""Speculative decoding inside the engine (n-gram drafts): greedy output token-identical to
the engine without it, in continuous batching with prefill chunks in the same steps, under
preemption (recompute and swap) and cancellation, with every block free at the end; stops
inside an accepted run cut it there; the spec records add up."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from itertools import pairwise

import pytest

from perfdiag.engine_ref.config import CacheConfig, SchedulerConfig, SpeculativeConfig
from perfdiag.engine_ref.engine import LLMEngine
from perfdiag.engine_ref.hooks import RecordingObserver, RequestEventKind, StepPhase
from perfdiag.engine_ref.request import SamplingParams
from perfdiag.engine_ref.speculative.proposer import Proposal
from perfdiag.engine_ref.testing import BOS, WorkItem, run, tiny_config, workload

NGRAM4 = SpeculativeConfig("ngram", 4)
TOKEN_KINDS = (RequestEventKind.FIRST_TOKEN, RequestEventKind.TOKEN)


def repetitive(n: int = 8, seed: int = 0) -> list[WorkItem]:
    """Prompts that repeat themselves (n-gram drafts find matches), mixed output lengths."""
    items = []
    for i in range(n):
        unit = [(31 * i + 7 * j + seed) % 256 for j in range(3 + i % 4)]
        prompt = [BOS] + unit * (2 + i % 3) + unit[: i % 3]
        max_tokens = (3, 9, 17, 30)[i % 4]
        items.append(WorkItem(prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens)))
    return items


def engine(spec=None, cache=None, scheduler=None, observer=None) -> LLMEngine:
    cfg = replace(tiny_config(cache, scheduler), speculative=spec)
    return checked(LLMEngine(cfg, observer))


def checked(eng: LLMEngine) -> LLMEngine:
    """After every step each running request holds exactly the blocks of its computed
    tokens: the slots of drafts not proposed or rejected went back to the pool."""
    step, bm = eng.step, eng.block_manager

    def step_and_check():
        outputs = step()
        for r in eng.scheduler.running:
            assert len(r.block_table) == bm.blocks_for(r.num_computed_tokens), r.request_id
        return outputs

    eng.step = step_and_check
    return eng


def both(items, per_step=None, **kw):
    """(plain result, speculative result, speculative engine's observer, engine)."""
    plain = run(engine(**kw), items, per_step)
    obs = RecordingObserver()
    spec_engine = engine(NGRAM4, observer=obs, **kw)
    return plain, run(spec_engine, items, per_step), obs, spec_engine


def accepted(obs: RecordingObserver) -> int:
    return sum(e.accepted for e in obs.spec)


@pytest.mark.parametrize("per_step", [None, 2])
def test_greedy_identical_with_prefill_chunks_in_the_same_steps(per_step):
    items = repetitive(9) + workload(6, seed=3)
    plain, spec, obs, eng = both(items, per_step)
    assert spec.tokens == plain.tokens and spec.finish == plain.finish
    for rid in plain.logprobs:  # verified positions: the same raw logprobs, other layout
        assert spec.logprobs[rid] == pytest.approx(plain.logprobs[rid], abs=1e-4)
    assert accepted(obs) > 0 and spec.steps < plain.steps
    spec_steps = {e.step_id for e in obs.spec}
    assert any(s.num_prefill_tokens and s.step_id in spec_steps for s in obs.steps)
    assert eng.is_drained()


class OracleProposer:
    """Drafts the plain engine's own continuation (a perfect draft), wrong from draft
    `wrong_at` on when set: any Proposer plugs into the engine."""

    name = "oracle"

    def __init__(self, truth: dict[tuple[int, ...], list[int]], wrong_at: int | None = None):
        self.truth, self.wrong_at = truth, wrong_at
        self.released: list[str] = []

    def propose(self, requests, k):
        out = []
        for r in requests:
            full = self.truth[r.prompt_token_ids]
            draft = full[r.num_tokens : r.num_tokens + k]
            if self.wrong_at is not None:
                draft = [t if i < self.wrong_at else (t + 1) % 256 for i, t in enumerate(draft)]
            out.append(Proposal(draft))
        return out

    def accepted(self, request):
        pass

    def release(self, request_id):
        self.released.append(request_id)


def oracle_run(items, plain, wrong_at=None, observer=None, cache=None, scheduler=None):
    truth = {tuple(it.prompt): it.prompt + plain.tokens[f"r{i}"] for i, it in enumerate(items)}
    proposer = OracleProposer(truth, wrong_at)
    cfg = replace(tiny_config(cache, scheduler), speculative=NGRAM4)
    eng = checked(LLMEngine(cfg, observer, proposer=proposer))
    return run(eng, items), eng, proposer


@pytest.mark.parametrize("kv_dtype", ["int8", "fp8"])
def test_greedy_identical_on_a_quantised_kv_cache(kv_dtype):
    # Verify slices write and read the quantised cache as decodes do.
    cache = CacheConfig(block_size=4, num_gpu_blocks=256, check_ownership=True,
                        kv_dtype=kv_dtype)  # fmt: skip
    plain, spec, obs, eng = both(repetitive(9) + workload(6, seed=3), cache=cache)
    assert spec.tokens == plain.tokens and accepted(obs) > 0 and eng.is_drained()


def test_stop_tokens_inside_an_accepted_run_cut_it_there():
    items = repetitive(8)
    plain = run(engine(), items)
    # Stop on each request's first new token after its 6th: perfect drafts carry it
    # inside a run of accepted drafts.
    stopped = []
    for i, it in enumerate(items):
        out = plain.tokens[f"r{i}"]
        stop = next((t for j, t in enumerate(out) if j >= 6 and t not in out[:j]), None)
        stopped.append(WorkItem(it.prompt, replace(it.params, stop_token_ids=(stop,)))
                       if stop is not None else it)  # fmt: skip
    plain = run(engine(), stopped)
    assert "stop" in plain.finish.values()
    obs = RecordingObserver()
    spec, eng, proposer = oracle_run(stopped, plain, observer=obs)
    assert spec.tokens == plain.tokens and spec.finish == plain.finish
    assert any(e.emitted < e.accepted + 1 for e in obs.spec)  # a run was cut by a stop
    assert sorted(proposer.released) == sorted(spec.tokens)  # each released once, finished
    assert eng.is_drained()


def test_rejection_mid_draft_rolls_back_across_blocks():
    items = repetitive(8, seed=2)
    plain = run(engine(), items)
    obs = RecordingObserver()
    spec, eng, _ = oracle_run(items, plain, wrong_at=2, observer=obs)  # block size 4
    assert spec.tokens == plain.tokens
    assert {e.accepted for e in obs.spec if e.drafted > 2} == {2}
    assert eng.is_drained()


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_rollback_under_preemption(mode):
    # 20 blocks of 4 tokens for 8 requests of up to ~60 tokens: draft slots preempt.
    cache = CacheConfig(block_size=4, num_gpu_blocks=20, num_cpu_blocks=64,
                        check_ownership=True)  # fmt: skip
    sched = SchedulerConfig(max_num_batched_tokens=64, chunk_size=16, preemption_mode=mode,
                            decode_reserve_tokens=0)  # fmt: skip
    items = repetitive(8, seed=1)
    plain = run(engine(), items)  # an ample pool: no preemption at all
    obs = RecordingObserver()
    eng = engine(NGRAM4, cache, sched, obs)
    spec = run(eng, items)
    assert spec.tokens == plain.tokens
    preempted = [e for e in obs.requests if e.kind == RequestEventKind.PREEMPTED]
    spec_rids = {e.request_id for e in obs.spec}
    assert any(e.request_id in spec_rids and e.detail == mode for e in preempted)
    assert accepted(obs) > 0 and eng.is_drained()


def test_cancellation_mid_speculation():
    items = repetitive(6)
    plain = run(engine(), items)
    obs = RecordingObserver()
    eng = engine(NGRAM4, observer=obs)
    for i, it in enumerate(items):
        eng.add_request(it.prompt, it.params, request_id=f"r{i}")
    got: dict[str, list[int]] = {f"r{i}": [] for i in range(len(items))}
    victim = "r3"  # 30 tokens to make: aborted after its first verified step
    while eng.has_unfinished_requests():
        for out in eng.step():
            got[out.request_id].extend(out.new_token_ids)
        if victim in eng.requests and any(e.request_id == victim for e in obs.spec):
            eng.abort(victim)
    assert got[victim] == plain.tokens[victim][: len(got[victim])]
    assert len(got[victim]) < len(plain.tokens[victim])
    assert {r: t for r, t in got.items() if r != victim} == {
        r: t for r, t in plain.tokens.items() if r != victim
    }
    assert eng.is_drained()


def test_seeded_sampled_requests_reproduce():
    items = [WorkItem(it.prompt, SamplingParams(temperature=0.8, top_p=0.9, seed=i,
                                                max_tokens=12))
             for i, it in enumerate(repetitive(5))]  # fmt: skip
    first = run(engine(NGRAM4), items)
    again = run(engine(NGRAM4), items, per_step=1)  # other batches, same seeds
    assert first.tokens == again.tokens


def test_records_add_up():
    items = repetitive(8) + workload(6, seed=5)
    _, spec, obs, _ = both(items, per_step=3)
    spec_steps = {e.step_id for e in obs.spec}
    draft_steps = {p.step_id for p in obs.phases if p.phase == StepPhase.DRAFT}
    assert spec_steps and spec_steps <= draft_steps
    for step in draft_steps:  # contiguous phases; the draft right after scheduling
        phases = sorted((p for p in obs.phases if p.step_id == step), key=lambda p: p.start_ns)
        assert [p.phase for p in phases][:3] == [StepPhase.SCHEDULE, StepPhase.DRAFT,
                                                 StepPhase.PREPARE]  # fmt: skip
        assert all(a.end_ns == b.start_ns for a, b in pairwise(phases))
    emitted = Counter()
    verified = set()
    for e in obs.spec:
        assert 1 <= e.drafted <= NGRAM4.num_tokens and 0 <= e.accepted <= e.drafted
        assert 1 <= e.emitted <= e.accepted + 1
        emitted[e.request_id] += e.emitted
        verified.add((e.request_id, e.step_id))
    for rid, tokens in spec.tokens.items():
        events = [e for e in obs.of(rid) if e.kind in TOKEN_KINDS]
        assert len(events) == len(tokens)  # one TOKEN event per emitted token
        plain_steps = {e.step_id for e in events if (rid, e.step_id) not in verified}
        assert emitted[rid] == len(tokens) - len(plain_steps)


def test_draft_model_proposer_plugs_in():
    # The same random-weight preset as the target drafts: a perfect draft, greedy.
    items = repetitive(6) + workload(4, seed=7)
    plain = run(engine(), items)
    obs = RecordingObserver()
    eng = engine(SpeculativeConfig("draft", 3, "tiny"), observer=obs)
    spec = run(eng, items)
    assert spec.tokens == plain.tokens
    assert obs.spec and all(e.accepted == e.drafted for e in obs.spec)
    draft_pool = eng.proposer.block_manager  # the draft's own KV went back too
    assert eng.is_drained() and draft_pool.num_free_blocks == draft_pool.num_blocks
    # Sampled requests verify against the draft's own distributions (q not one-hot).
    sampled = [WorkItem(it.prompt, SamplingParams(temperature=1.0, seed=i, max_tokens=12))
               for i, it in enumerate(items)]  # fmt: skip
    first = run(engine(SpeculativeConfig("draft", 3, "tiny")), sampled)
    again = run(engine(SpeculativeConfig("draft", 3, "tiny")), sampled, per_step=2)
    assert first.tokens == again.tokens


# The real model: a few prompts that invite copying (n-gram drafts get accepted).
REAL_PROMPTS = [
    "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):",
]


@pytest.mark.slow  # two real-model engines: ~10 s alone, more on a busy machine
def test_greedy_identical_on_smollm2():
    from smollm2_model import smollm2_path

    from perfdiag.engine_ref.config import EngineConfig
    from perfdiag.engine_ref.gguf_loader import read_gguf_config

    path = smollm2_path()
    cfg = EngineConfig(model=read_gguf_config(path), model_path=str(path), max_model_len=256,
                       cache=CacheConfig(block_size=16, num_gpu_blocks=64))  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=16)
    plain = LLMEngine(cfg).generate(REAL_PROMPTS, params)
    obs = RecordingObserver()
    spec_engine = LLMEngine(replace(cfg, speculative=NGRAM4), obs)
    spec = spec_engine.generate(REAL_PROMPTS, params)
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
    assert accepted(obs) > 0
    assert spec_engine.is_drained()

"""The hook interface: what an observer receives, in what order, with which counts."""

from __future__ import annotations

import itertools
import types

from perfdiag.engine_ref import (
    CacheConfig,
    EngineObserver,
    LLMEngine,
    RecordingObserver,
    SamplingParams,
    SchedulerConfig,
    StepPhase,
    engine_intake,
    engine_records,
)
from perfdiag.engine_ref import RequestEventKind as K
from perfdiag.engine_ref import engine as engine_mod
from perfdiag.engine_ref.testing import run, tiny_config, workload

PHASES = [
    StepPhase.SCHEDULE,
    StepPhase.PREPARE,
    StepPhase.FORWARD,
    StepPhase.SAMPLE,
    StepPhase.POSTPROCESS,
]


def recorded_run(cfg=None, items=None):
    obs = RecordingObserver()
    engine = LLMEngine(cfg or tiny_config(), observer=obs)
    res = run(engine, items or workload(n=12, seed=3), per_step=3)
    return engine, obs, res


def test_request_lifecycle_order():
    _, obs, res = recorded_run()
    for rid, tokens in res.tokens.items():
        kinds = [e.kind for e in obs.of(rid)]
        assert kinds[:4] == [K.ARRIVED, K.TOKENIZED, K.QUEUED, K.SCHEDULED]
        assert kinds[-1] == K.FINISHED
        assert kinds.count(K.FIRST_TOKEN) == 1
        assert kinds.count(K.FIRST_TOKEN) + kinds.count(K.TOKEN) == len(tokens)
        assert kinds.index(K.PREFILL_CHUNK) < kinds.index(K.FIRST_TOKEN)
        tok_events = [e for e in obs.of(rid) if e.kind in (K.FIRST_TOKEN, K.TOKEN)]
        assert [e.num_tokens for e in tok_events] == list(range(1, len(tokens) + 1))
        fin = obs.of(rid)[-1]
        assert fin.detail == res.finish[rid] and fin.num_tokens == len(tokens)
        prefill = sum(e.num_tokens for e in obs.of(rid) if e.kind == K.PREFILL_CHUNK)
        sched = next(e for e in obs.of(rid) if e.kind == K.SCHEDULED)
        assert prefill + sched.num_cached_tokens == obs.of(rid)[1].num_tokens  # the prompt


def test_timestamps_are_monotonic_ints():
    _, obs, _ = recorded_run()
    stamps = [e.ts_ns for e in obs.requests]
    stamps += [t for s in obs.steps for t in (s.start_ns, s.end_ns)]
    stamps += [t for p in obs.phases for t in (p.start_ns, p.end_ns)]
    assert all(type(t) is int for t in stamps)
    for s in obs.steps:
        phases = [p for p in obs.phases if p.step_id == s.step_id]
        assert [p.phase for p in phases] == PHASES
        assert phases[0].start_ns == s.start_ns and phases[-1].end_ns == s.end_ns
        assert all(a.end_ns == b.start_ns for a, b in itertools.pairwise(phases))  # contiguous
        assert all(p.start_ns <= p.end_ns for p in phases)
    assert [s.step_id for s in obs.steps] == list(range(len(obs.steps)))
    assert [b.step_id for b in obs.step_begins] == [s.step_id for s in obs.steps]
    for rid in {e.request_id for e in obs.requests}:
        ts = [e.ts_ns for e in obs.of(rid)]
        assert ts == sorted(ts)


def test_step_composition_matches_request_events():
    engine, obs, _ = recorded_run(
        tiny_config(
            cache=CacheConfig(block_size=4, num_gpu_blocks=40, watermark=0.0, check_ownership=True),
            scheduler=SchedulerConfig(
                chunk_size=8, max_num_batched_tokens=32, decode_reserve_tokens=0
            ),
        )
    )
    total = engine.block_manager.num_blocks
    for s in obs.steps:
        ev = [e for e in obs.requests if e.step_id == s.step_id]
        chunks = [e for e in ev if e.kind == K.PREFILL_CHUNK]
        assert s.num_prefill_tokens == sum(e.num_tokens for e in chunks)
        assert s.num_prefill_seqs == len(chunks)
        sampled = [e for e in ev if e.kind in (K.FIRST_TOKEN, K.TOKEN)]
        assert s.num_decode_seqs == sum(e.kind == K.TOKEN for e in sampled) - sum(
            1
            for e in sampled
            if e.kind == K.TOKEN and any(c.request_id == e.request_id for c in chunks)
        )
        assert s.num_preemptions == sum(e.kind == K.PREEMPTED for e in ev)
        assert s.num_cached_tokens == sum(e.num_cached_tokens for e in ev if e.kind == K.SCHEDULED)
        assert s.kv_blocks_used + s.kv_blocks_free == total
        assert 0 < s.num_running <= 64
        assert s.num_context_tokens >= s.num_prefill_tokens + s.num_decode_seqs
    assert sum(s.num_preemptions for s in obs.steps) > 0  # the pool was tight on purpose


def test_aborted_request_events():
    obs = RecordingObserver()
    engine = LLMEngine(tiny_config(), observer=obs)
    rid = engine.add_request([256, 1, 2, 3], SamplingParams(max_tokens=50))
    engine.step()
    engine.step()
    assert engine.abort(rid)
    assert not engine.abort(rid)  # already finished
    kinds = [e.kind for e in obs.of(rid)]
    assert kinds[-2:] == [K.ABORTED, K.FINISHED]
    assert obs.of(rid)[-1].detail == "abort" and obs.of(rid)[-1].num_tokens == 2
    outs = engine.step()
    assert [(o.request_id, o.finished, o.finish_reason) for o in outs] == [(rid, True, "abort")]


def test_no_observer_costs_no_clock_reads(monkeypatch):
    """Without an observer the engine reads the clock once per request (its arrival) and
    once per step (the scheduler's fairness clock), never per hook site."""
    calls = [0]

    def monotonic_ns() -> int:
        calls[0] += 1
        return 10**12 + calls[0]

    for mod in (engine_mod, engine_intake, engine_records):  # each reads the engine's clock
        monkeypatch.setattr(mod, "time", types.SimpleNamespace(monotonic_ns=monotonic_ns))
    engine = LLMEngine(tiny_config())
    items = workload(n=6, seed=1)
    res = run(engine, items)
    assert calls[0] == len(items) + res.steps

    calls[0] = 0
    observed = LLMEngine(tiny_config(), observer=EngineObserver())
    res = run(observed, items)
    assert calls[0] > 5 * (len(items) + res.steps)  # the hooks do read it when observed

"""Fairness: cache-friendly ordering may favour hot prefixes, but a request waiting longer
than `max_wait_ms` goes first."""

from __future__ import annotations

import types

import pytest

from perfdiag.engine_ref import (
    CacheConfig,
    LLMEngine,
    RecordingObserver,
    SamplingParams,
    SchedulerConfig,
    engine_intake,
    engine_records,
)
from perfdiag.engine_ref import RequestEventKind as K
from perfdiag.engine_ref import engine as engine_mod
from perfdiag.engine_ref.testing import tiny_config

HOT = [256, *range(100, 132)]  # a 32-token prefix every hot request shares
COLD = [256, *range(200, 230)]
HOT_MAX_TOKENS = 3


def make_engine(policy: str, max_wait_ms: float | None) -> tuple[LLMEngine, RecordingObserver]:
    cfg = tiny_config(
        num_layers=1,
        cache=CacheConfig(block_size=4, num_gpu_blocks=256, check_ownership=True),
        scheduler=SchedulerConfig(
            max_num_seqs=3,
            max_num_batched_tokens=64,
            chunk_size=64,
            policy=policy,
            max_wait_ms=max_wait_ms,
        ),
    )
    obs = RecordingObserver()
    return LLMEngine(cfg, observer=obs), obs


def stream(engine: LLMEngine, steps: int, cold_at: int) -> None:
    """One hot-prefix request arrives per step, exactly what three seats of three-token
    requests serve, so a hot request is always waiting when a seat frees; the cold one
    arrives at step `cold_at`."""
    params = SamplingParams(temperature=0.0, max_tokens=HOT_MAX_TOKENS, ignore_eos=True)
    for step in range(steps):
        engine.add_request([*HOT, step % 256], params)
        if step == cold_at:
            engine.add_request(COLD, params, request_id="cold")
        engine.step()


@pytest.fixture
def fake_clock(monkeypatch):
    """The engine's clock advances 1 ms per step (deterministic waiting times)."""
    now = [10**12]

    def monotonic_ns() -> int:
        return now[0]

    for mod in (engine_mod, engine_intake, engine_records):  # each reads the engine's clock
        monkeypatch.setattr(mod, "time", types.SimpleNamespace(monotonic_ns=monotonic_ns))
    return now


def scheduled_step(obs: RecordingObserver, rid: str) -> int | None:
    return next(
        (e.step_id for e in obs.requests if e.request_id == rid and e.kind == K.SCHEDULED), None
    )


def test_cold_prefix_starves_without_a_bound(fake_clock):
    """The control: under cache-friendly ordering and no bound, the cold request waits as
    long as hot requests keep coming. (So the next test can fail.)"""
    engine, obs = make_engine("prefix", None)
    orig = engine.step

    def step():
        fake_clock[0] += 1_000_000
        return orig()

    engine.step = step
    stream(engine, steps=120, cold_at=5)
    assert scheduled_step(obs, "cold") is None


@pytest.mark.parametrize("bound_ms", [10, 40])
def test_cold_prefix_is_scheduled_within_the_bound(fake_clock, bound_ms):
    engine, obs = make_engine("prefix", float(bound_ms))
    orig = engine.step

    def step():
        fake_clock[0] += 1_000_000
        return orig()

    engine.step = step
    stream(engine, steps=120, cold_at=5)
    arrived = next(e for e in obs.requests if e.request_id == "cold" and e.kind == K.ARRIVED)
    sched = next(e for e in obs.requests if e.request_id == "cold" and e.kind == K.SCHEDULED)
    starts = {s.step_id: s.start_ns for s in obs.steps}
    overdue_step = min(i for i, t in starts.items() if t - arrived.ts_ns >= bound_ms * 1_000_000)
    # It goes first once overdue; at worst it waits for a seat, which frees within a hot
    # request's lifetime (prefill + HOT_MAX_TOKENS - 1 decodes).
    assert overdue_step <= sched.step_id <= overdue_step + HOT_MAX_TOKENS
    # Before it was overdue, hot requests were preferred (cache-friendly ordering).
    assert sched.step_id > 5 + bound_ms // 2
    hits = [e.num_cached_tokens for e in obs.requests if e.kind == K.SCHEDULED]
    assert sum(h > 0 for h in hits) > len(hits) // 2


def test_fcfs_serves_in_arrival_order(fake_clock):
    engine, obs = make_engine("fcfs", None)
    stream(engine, steps=40, cold_at=5)
    order = [e.request_id for e in obs.requests if e.kind == K.SCHEDULED]
    queued = [e.request_id for e in obs.requests if e.kind == K.QUEUED]
    assert order == queued[: len(order)]


def test_bound_holds_on_the_real_clock():
    """The same with time.monotonic_ns: scheduled no later than the bound plus the steps
    it had to wait for a seat."""
    bound_ms = 30.0
    engine, obs = make_engine("prefix", bound_ms)
    stream(engine, steps=150, cold_at=3)
    arrived = next(e for e in obs.requests if e.request_id == "cold" and e.kind == K.ARRIVED)
    sched = next(e for e in obs.requests if e.request_id == "cold" and e.kind == K.SCHEDULED)
    limit = arrived.ts_ns + int(bound_ms * 1e6)
    overdue = [s for s in obs.steps if s.start_ns >= limit]
    assert overdue, "the stream ended before the bound elapsed"
    first = overdue[0].step_id
    assert sched.step_id <= first + HOT_MAX_TOKENS
    assert sched.ts_ns <= overdue[min(HOT_MAX_TOKENS, len(overdue) - 1)].end_ns

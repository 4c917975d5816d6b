"""Cancellation storms: abort random requests at random points, in every state.

The engine runs with ownership checks on: the block manager records each block's owners,
the model runner vets every block a step reads or writes, and freeing a block that the step
in flight still uses raises. Aborts land between steps and in the middle of steps (from the
observer, as another thread would), against queued, prefilling, decoding and swapped
requests. Afterwards the pool is whole, the queues are empty, every request finished exactly
once, and every request that was not aborted produced the dense reference's tokens.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfdiag.engine_ref import (
    CacheConfig,
    DenseReference,
    EngineObserver,
    LLMEngine,
    RecordingObserver,
    RequestStatus,
    SamplingParams,
    SchedulerConfig,
)
from perfdiag.engine_ref import RequestEventKind as K
from perfdiag.engine_ref.block_manager import OwnershipError
from perfdiag.engine_ref.testing import tiny_config

POINTS = ["between", "step_begin", "schedule", "prepare_inputs", "forward", "sample"]
TARGETS = ["index", "waiting", "prefilling", "decoding", "swapped"]


@pytest.fixture(scope="module")
def model_and_reference():
    engine = LLMEngine(tiny_config(num_layers=1))
    return engine.model, DenseReference(engine.model)


class AbortingObserver(RecordingObserver):
    """Fires planned aborts when the engine reaches a point inside a step."""

    def __init__(self, fire) -> None:
        super().__init__()
        self.fire = fire

    def on_step_begin(self, event):
        super().on_step_begin(event)
        self.fire(event.step_id, "step_begin")

    def on_phase(self, event):
        super().on_phase(event)
        self.fire(event.step_id, event.phase.value)


def pick(engine: LLMEngine, target: str, index: int, ids: list[str]) -> str | None:
    if target == "index":
        return ids[index % len(ids)] if ids else None
    live = list(engine.requests.values())
    if target == "waiting":
        live = [r for r in live if r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)]
    elif target == "prefilling":
        live = [r for r in live if r.status == RequestStatus.RUNNING and not r.output_token_ids]
    elif target == "decoding":
        live = [r for r in live if r.status == RequestStatus.RUNNING and r.output_token_ids]
    else:
        live = [r for r in live if r.status == RequestStatus.SWAPPED]
    return live[index % len(live)].request_id if live else None


requests_st = st.lists(
    st.tuples(
        st.integers(0, 2),  # shared prefix (0: none)
        st.integers(1, 24),  # own prompt tokens
        st.integers(1, 24),  # max_tokens
        st.integers(0, 4),  # arrival step
    ),
    min_size=3,
    max_size=12,
)
aborts_st = st.lists(
    st.tuples(
        st.integers(0, 12),  # step
        st.sampled_from(POINTS),
        st.sampled_from(TARGETS),
        st.integers(0, 50),
    ),
    max_size=10,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    requests=requests_st,
    aborts=aborts_st,
    mode=st.sampled_from(["recompute", "swap"]),
    chunk=st.sampled_from([3, 8, 64]),
    prefix_caching=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_cancellation_storm(
    model_and_reference, requests, aborts, mode, chunk, prefix_caching, seed
):
    model, ref = model_and_reference
    cfg = tiny_config(
        num_layers=1,
        max_model_len=64,
        cache=CacheConfig(
            block_size=4,
            num_gpu_blocks=16,
            num_cpu_blocks=12,
            watermark=0.0,
            enable_prefix_caching=prefix_caching,
            check_ownership=True,
        ),
        scheduler=SchedulerConfig(
            chunk_size=chunk,
            max_num_batched_tokens=24,
            max_num_seqs=6,
            preemption_mode=mode,
            decode_reserve_tokens=0,
        ),
    )
    ids: list[str] = []
    aborted: set[str] = set()
    plan: dict[tuple[int, str], list[tuple[str, int]]] = {}
    for step, point, target, index in aborts:
        plan.setdefault((step, point), []).append((target, index))
    engine: LLMEngine

    def fire(step_id: int, point: str) -> None:
        for target, index in plan.pop((step_id, point), []):
            rid = pick(engine, target, index, ids)
            if rid is None:  # nobody in that state yet: try again at the next step
                plan.setdefault((step_id + 1, point), []).append((target, index))
            elif engine.abort(rid):
                aborted.add(rid)

    obs = AbortingObserver(fire)
    engine = LLMEngine(cfg, observer=obs)
    engine.model.load_state_dict(model.state_dict())
    prefixes = {1: [256, *range(10, 19)], 2: [256, *range(30, 43)]}
    prompts: dict[str, list[int]] = {}
    params: dict[str, SamplingParams] = {}
    tokens: dict[str, list[int]] = {}
    step = 0
    while step < 400:
        for i, (pre, own, max_tokens, arrival) in enumerate(requests):
            if arrival == step:
                rid = f"q{i}"
                own_tokens = [(seed + 7 * i + j) % 256 for j in range(own)]
                prompts[rid] = prefixes.get(pre, [256]) + own_tokens
                params[rid] = SamplingParams(temperature=0.0, max_tokens=max_tokens)
                engine.add_request(prompts[rid], params[rid], request_id=rid)
                ids.append(rid)
        fire(step, "between")  # no step in flight: released at once
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        step += 1
        if step > 6 and not engine.has_unfinished_requests():
            break
    assert not engine.has_unfinished_requests(), "engine did not drain"
    assert engine.is_drained()
    bm, sched = engine.block_manager, engine.scheduler
    assert bm.num_free_blocks == bm.num_blocks and bm.num_free_cpu_blocks == bm.num_cpu_blocks
    assert not (sched.waiting or sched.running or sched.swapped)
    assert all(b.ref_count == 0 for b in bm.blocks) and not any(bm.owners)

    finished = {}
    for e in obs.requests:
        if e.kind == K.FINISHED:
            assert e.request_id not in finished, f"{e.request_id} finished twice"
            finished[e.request_id] = e.detail
    assert set(finished) == set(ids)
    for rid in ids:
        if finished[rid] == "abort":
            assert rid in aborted
            continue
        want = ref.greedy(prompts[rid], params[rid].max_tokens, (257,), max_model_len=64)
        assert tokens.get(rid, []) == want.token_ids, f"{rid} corrupted"


def test_guard_catches_a_foreign_block():
    """The ownership check has teeth: a forged block table is caught before the forward."""
    engine = LLMEngine(tiny_config())
    a = engine.add_request([256, *range(20)], SamplingParams(max_tokens=4), request_id="a")
    b = engine.add_request([256, *range(50, 70)], SamplingParams(max_tokens=4), request_id="b")
    engine.step()
    ra, rb = engine.requests[a], engine.requests[b]
    ra.block_table[0] = rb.block_table[0]
    with pytest.raises(OwnershipError, match="does not own"):
        engine.step()


def test_guard_catches_freeing_a_block_in_flight():
    engine = LLMEngine(tiny_config())
    rid = engine.add_request([256, 1, 2, 3, 4, 5], SamplingParams(max_tokens=4))
    engine.step()
    req = engine.requests[rid]
    engine.runner.prepare([(req, 1)])  # pins the blocks the step will use
    with pytest.raises(OwnershipError, match="in flight"):
        engine.block_manager.free(req)


def test_abort_mid_step_is_deferred_until_the_step_ends():
    events = []

    class Obs(EngineObserver):
        def on_phase(self, event):
            if event.phase.value == "forward" and event.step_id == 1:
                events.append(("abort", engine.abort("x"), engine.requests["x"].block_table[:]))

        def on_request(self, event):
            if event.kind == K.FINISHED:
                events.append(("finished", event.step_id, event.detail))

    cfg = tiny_config()
    engine = LLMEngine(cfg, observer=Obs())
    engine.add_request([256, *range(30)], SamplingParams(max_tokens=20), request_id="x")
    engine.step()
    engine.step()  # the abort fires during this step's forward
    assert events[0][0] == "abort" and events[0][1] is True and events[0][2]
    assert events[1] == ("finished", 1, "abort")
    assert "x" not in engine.requests
    assert engine.is_drained() is False or engine.block_manager.num_used_blocks == 0
    assert engine.block_manager.num_used_blocks == 0


IN_STATE = {
    "waiting": lambda r: r.status == RequestStatus.WAITING,
    "prefilling": lambda r: (
        r.status == RequestStatus.RUNNING
        and r.num_computed_tokens > 0
        and r.num_computed_tokens < r.num_prompt_tokens
    ),
    "decoding": lambda r: r.status == RequestStatus.RUNNING and r.num_output_tokens >= 2,
    "swapped": lambda r: r.status == RequestStatus.SWAPPED,
    "preempted": lambda r: r.status == RequestStatus.PREEMPTED,
}


@pytest.mark.parametrize("state", list(IN_STATE))
@pytest.mark.parametrize("mid_step", [False, True])
def test_abort_in_each_state(model_and_reference, state, mid_step):
    """Deterministically: abort one request in `state` (between steps, or from inside a
    step), then check the pool, the queues and everyone else's tokens."""
    _, ref = model_and_reference
    mode = "recompute" if state == "preempted" else "swap"
    cfg = tiny_config(
        num_layers=1,
        max_model_len=64,
        cache=CacheConfig(
            block_size=4, num_gpu_blocks=20, num_cpu_blocks=40, watermark=0.0, check_ownership=True
        ),
        scheduler=SchedulerConfig(
            chunk_size=4,
            max_num_batched_tokens=12,
            max_num_seqs=4,
            preemption_mode=mode,
            decode_reserve_tokens=0,
        ),
    )
    victim: list[str] = []

    class Obs(RecordingObserver):
        def on_phase(self, event):
            super().on_phase(event)
            if mid_step and not victim and event.phase.value == "forward":
                try_abort()

    def try_abort():
        for r in list(engine.requests.values()):
            if IN_STATE[state](r) and engine.abort(r.request_id):
                victim.append(r.request_id)
                return

    obs = Obs()
    engine = LLMEngine(cfg, observer=obs)
    prompts = {f"s{i}": [256, *[(11 * i + j) % 256 for j in range(14 + i)]] for i in range(6)}
    params = SamplingParams(temperature=0.0, max_tokens=24)
    for rid, p in prompts.items():
        engine.add_request(p, params, request_id=rid)
    tokens: dict[str, list[int]] = {}
    for _ in range(500):
        if not victim and not mid_step:
            try_abort()
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert victim, f"no request was ever {state}"
    assert engine.is_drained()
    fin = [e for e in obs.requests if e.kind == K.FINISHED]
    assert sorted(e.request_id for e in fin) == sorted(prompts)
    assert next(e for e in fin if e.request_id == victim[0]).detail == "abort"
    for rid, p in prompts.items():
        if rid != victim[0]:
            assert tokens[rid] == ref.greedy(p, 24, (257,), max_model_len=64).token_ids

"""Pipeline parallelism (engine_ref/pipeline.py): PP = 2 equals PP = 1 token for token
(greedy, seeded sampling, preemption by recompute and by swap, any micro-batch count),
every stage records its compute, sends and receives per micro-batch, and no stage process
outlives its engine."""

from __future__ import annotations

import os
import signal
import time

import pytest

from perfdiag.engine_ref import EngineConfig, LLMEngine, ModelConfig, SamplingParams
from perfdiag.engine_ref.config import CacheConfig, SchedulerConfig
from perfdiag.engine_ref.hooks import EngineObserver
from perfdiag.errors import ConfigError

PROMPTS = ["Hello world", "The quick brown fox jumps over", "abc", "pipeline stage " * 5]


class Records(EngineObserver):
    def __init__(self) -> None:
        self.stages, self.steps = [], []

    def on_pipeline_stages(self, events) -> None:
        self.stages += events

    def on_step(self, event) -> None:
        self.steps.append(event)


def _generate(engine: LLMEngine, params: SamplingParams, prompts=PROMPTS):
    return [o.token_ids for o in engine.generate(prompts, params)]


GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
SEEDED = SamplingParams(temperature=0.9, top_p=0.9, seed=7, max_tokens=16, ignore_eos=True)


@pytest.mark.parametrize(("params", "m"), [(GREEDY, 0), (GREEDY, 3), (SEEDED, 1)],
                         ids=["greedy-m2", "greedy-m3", "seeded-m1"])  # fmt: skip
def test_pp2_equals_pp1_tokens(params, m):
    kw = dict(model=ModelConfig.preset("tiny"), scheduler=SchedulerConfig(chunk_size=8))
    want = _generate(LLMEngine(EngineConfig(**kw)), params)
    rec = Records()
    cfg = EngineConfig(**kw, pipeline_parallel_size=2, pipeline_microbatches=m)
    with LLMEngine(cfg, observer=rec) as two:
        got = _generate(two, params)
    assert got == want
    # every stage computes every micro-batch of every step; stage 1 received each one
    # from stage 0, with the [tokens, hidden] fp32 activations' bytes
    hidden = cfg.model.hidden_size
    by = {(e.stage, e.step_id, e.microbatch, e.kind): e for e in rec.stages}
    steps = {e.step_id for e in rec.stages}
    assert steps == {s.step_id for s in rec.steps}
    for (stage, step, mb, kind), e in by.items():
        assert e.end_ns >= e.start_ns
        if kind == "compute":
            assert (1 - stage, step, mb, "compute") in by
        if kind == "recv" and stage == 1:
            assert e.nbytes == e.num_tokens * hidden * 4
            assert by[(0, step, mb, "send")].nbytes == e.nbytes
    per_step = {}
    for e in rec.stages:
        per_step.setdefault(e.step_id, set()).add(e.microbatch)
    most = max(len(v) for v in per_step.values())
    assert most == (m or 2)  # 4 prompts: as many micro-batches as asked, at most


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_pp2_preemption_matches(mode):
    """Preempted requests (recomputed, or swapped out and in on every stage's pool) come
    back with the same tokens."""
    cache = CacheConfig(block_size=4, num_gpu_blocks=36, num_cpu_blocks=200, watermark=0.0)
    sched = SchedulerConfig(chunk_size=16, max_num_batched_tokens=64, decode_reserve_tokens=0,
                            preemption_mode=mode)  # fmt: skip
    kw = dict(model=ModelConfig.preset("tiny"), cache=cache, scheduler=sched)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    want = _generate(LLMEngine(EngineConfig(**kw)), params)
    rec = Records()
    with LLMEngine(EngineConfig(**kw, pipeline_parallel_size=2), observer=rec) as two:
        got = _generate(two, params)
    assert got == want
    assert sum(s.num_preemptions for s in rec.steps) > 0
    if mode == "swap":
        assert any(s.cpu_blocks_used for s in rec.steps)


def test_uneven_layer_split_matches():
    """An explicit, uneven split (the small preset's 8 layers as 3 + 5): the same tokens."""
    kw = dict(model=ModelConfig.preset("small"), scheduler=SchedulerConfig(chunk_size=16))
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    want = _generate(LLMEngine(EngineConfig(**kw)), params, PROMPTS[:2])
    cfg = EngineConfig(**kw, pipeline_parallel_size=2, pipeline_layers=(3, 5))
    with LLMEngine(cfg) as two:
        assert two.tp.info()["stage_layers"] == [[0, 3], [3, 8]]
        assert _generate(two, params, PROMPTS[:2]) == want


def test_pp_refuses_what_it_cannot_run():
    tiny = ModelConfig.preset("tiny")
    with pytest.raises(ConfigError, match="at least 3 layers"):
        EngineConfig(model=tiny, pipeline_parallel_size=3)
    with pytest.raises(ConfigError, match="--pp with --tp"):
        EngineConfig(model=tiny, pipeline_parallel_size=2, tensor_parallel_size=2)
    with pytest.raises(ConfigError, match="--pp-layers 2,1"):
        EngineConfig(model=tiny, pipeline_parallel_size=2, pipeline_layers=(2, 1))
    with pytest.raises(ConfigError, match="float weights"):
        EngineConfig(model=tiny, pipeline_parallel_size=2, weight_format="q8_0")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ", 1)[1][0] != "Z"


def test_close_stops_stages_and_a_dead_stage_fails_the_step():
    engine = LLMEngine(EngineConfig(model=ModelConfig.preset("tiny"), pipeline_parallel_size=2))
    pids = engine.tp.pids
    os.kill(pids[0], signal.SIGKILL)
    deadline = time.monotonic() + 15
    while _alive(pids[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(RuntimeError, match="pipeline rank 1"):
        engine.generate(["Hello"], SamplingParams(max_tokens=4))
    engine.close()
    with LLMEngine(EngineConfig(model=ModelConfig.preset("tiny"),
                                pipeline_parallel_size=2)) as again:  # fmt: skip
        pids = again.tp.pids
        assert again.generate(["Hi"], SamplingParams(max_tokens=2))[0].token_ids
    deadline = time.monotonic() + 15
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)

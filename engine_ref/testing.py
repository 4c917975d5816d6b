"""Helpers shared by engine_ref's tests and benchmark (not needed to serve).

Workloads are deterministic from a seed; `run` drives an engine the way a server would
(optional staggered arrivals) and collects each request's tokens; `paged_logits` computes
every position's logits through the paged cache, chunk by chunk.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

import torch

from .config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from .engine import LLMEngine
from .request import Request, SamplingParams

BOS = 256


def tiny_config(
    cache: CacheConfig | None = None,
    scheduler: SchedulerConfig | None = None,
    max_model_len: int = 128,
    **model_overrides,
) -> EngineConfig:
    """The tiny preset with ownership checks on, small enough for milliseconds per step."""
    return EngineConfig(
        model=ModelConfig.preset("tiny", **model_overrides),
        cache=cache or CacheConfig(block_size=4, num_gpu_blocks=256, check_ownership=True),
        scheduler=scheduler or SchedulerConfig(max_num_batched_tokens=64, chunk_size=16),
        max_model_len=max_model_len,
    )


@dataclass
class WorkItem:
    prompt: list[int]
    params: SamplingParams


def workload(n: int = 24, seed: int = 0, max_prompt: int = 60) -> list[WorkItem]:
    """Mixed prompt and output lengths; two of every three prompts extend one of three
    shared prefixes (of 9, 14 and 22 tokens: block-aligned or not)."""
    rng = random.Random(seed)
    prefixes = [[BOS] + [rng.randrange(256) for _ in range(k)] for k in (8, 13, 21)]
    items = []
    for i in range(n):
        if i == 0:
            prompt = [BOS]  # a one-token prompt
        elif i % 3 == 0:
            prompt = [BOS] + [rng.randrange(256) for _ in range(rng.randrange(1, max_prompt))]
        else:
            prompt = prefixes[i % 3] + [rng.randrange(256) for _ in range(rng.randrange(0, 25))]
        max_tokens = rng.choice([1, 2, 5, 12, 25, 40])
        items.append(WorkItem(prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens)))
    return items


@dataclass
class RunResult:
    tokens: dict[str, list[int]] = field(default_factory=dict)
    logprobs: dict[str, list[float]] = field(default_factory=dict)
    finish: dict[str, str | None] = field(default_factory=dict)
    steps: int = 0


def run(
    engine: LLMEngine,
    items: list[WorkItem],
    per_step: int | None = None,
    max_steps: int = 100_000,
) -> RunResult:
    """Add every item (all at once, or `per_step` per step: staggered arrivals), step until
    all finish. Request ids are "r0", "r1", ... in item order."""
    res = RunResult()
    pending = list(enumerate(items))
    while pending or engine.has_unfinished_requests():
        take = len(pending) if per_step is None else per_step
        for i, item in pending[:take]:
            engine.add_request(item.prompt, item.params, request_id=f"r{i}")
            res.tokens[f"r{i}"], res.logprobs[f"r{i}"] = [], []
        pending = pending[take:]
        for out in engine.step():
            res.tokens[out.request_id].extend(out.new_token_ids)
            res.logprobs[out.request_id].extend(out.new_logprobs)
            if out.finished:
                res.finish[out.request_id] = out.finish_reason
        res.steps += 1
        if res.steps > max_steps:
            raise RuntimeError(f"not finished after {max_steps} steps")
    return res


@torch.inference_mode()
def paged_logits(engine: LLMEngine, token_ids: list[int], chunk: int) -> torch.Tensor:
    """fp32 logits [T, vocab] of every position, computed through the engine's paged cache
    `chunk` tokens at a time (each chunk attends to the previous ones' cached K/V)."""
    req = Request("paged-logits", tuple(token_ids), SamplingParams(), 0, len(token_ids))
    bm, out = engine.block_manager, []
    try:
        while req.num_computed_tokens < len(token_ids):
            n = min(chunk, len(token_ids) - req.num_computed_tokens)
            bm.append_slots(req, n)
            inp = engine.runner.prepare([(req, n)])
            out.append(engine.runner.forward(inp, all_logits=True))
            engine.runner.release()
            req.num_computed_tokens += n
    finally:
        bm.free(req)
    return torch.cat(out)


def with_scheduler(cfg: EngineConfig, **kw) -> EngineConfig:
    return replace(cfg, scheduler=replace(cfg.scheduler, **kw))


def with_cache(cfg: EngineConfig, **kw) -> EngineConfig:
    return replace(cfg, cache=replace(cfg.cache, **kw))

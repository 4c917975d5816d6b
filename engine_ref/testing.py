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


# A small hand-written Llama checkpoint (config.json + model.safetensors), for loader tests.
LLAMA_CONFIG = dict(
    model_type="llama",
    vocab_size=50,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


def llama_tensors(cfg: dict = LLAMA_CONFIG, drop: str = "") -> dict[str, torch.Tensor]:
    """Random tensors under Hugging Face Llama names for `cfg` (minus `drop`)."""
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = h // nh
    gen = torch.Generator().manual_seed(0)
    t = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h)}
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        t |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (nh * d, h),
            p + "self_attn.k_proj.weight": (nkv * d, h),
            p + "self_attn.v_proj.weight": (nkv * d, h),
            p + "self_attn.o_proj.weight": (h, nh * d),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
        }
    return {k: torch.randn(s, generator=gen) for k, s in t.items() if k != drop}


def write_checkpoint(
    path, config: dict | None = None, tensors: dict | None = None, raw_config: str | None = None
):
    """Write config.json (a dict, or raw text) and model.safetensors (unless `tensors` is
    empty) into the directory `path`; returns it."""
    import json
    from pathlib import Path

    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    text = raw_config if raw_config is not None else json.dumps(config or LLAMA_CONFIG)
    (path / "config.json").write_text(text)
    tensors = llama_tensors(config or LLAMA_CONFIG) if tensors is None else tensors
    if tensors:
        save_file(tensors, str(path / "model.safetensors"))
    return path

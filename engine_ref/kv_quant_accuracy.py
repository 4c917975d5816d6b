"""How far a quantised KV cache moves a model's outputs from float KV (tests and
benchmarks/kv_quant.py share it; nothing here serves).

Per prompt, greedy generation under both caches, and:
- free-running agreement: the fraction of positions where the two outputs hold the same
  token, and the first position where they differ (after it, the contexts differ and
  so do most later tokens: one near-tie decides the rest);
- teacher-forced figures over the float output: the quantised engine reads the prompt and
  the float tokens through its own paged cache (chunked, so prefill chunks attend to
  quantised context), and we compare the log-probability it gives each float token with
  the float engine's (max and mean |Δ|), and how often its top-1 is that token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .request import SamplingParams
from .testing import paged_logits

CHUNK = 8  # teacher-forced tokens per forward


@dataclass(frozen=True)
class PromptAccuracy:
    tokens: int
    agree: float  # free-running: fraction of positions with the same token
    first_divergence: int | None  # None: identical outputs
    max_abs_dlogprob: float  # teacher-forced, over the float output's tokens
    mean_abs_dlogprob: float
    top1_agree: float  # teacher-forced: quantised argmax == the float token


@dataclass(frozen=True)
class FloatOutputs:
    prompts: list[list[int]]
    tokens: list[list[int]]
    logprobs: list[list[float]]


def greedy(engine, prompts: list[list[int]], max_tokens: int) -> FloatOutputs:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outs = engine.generate(prompts, params)
    return FloatOutputs(prompts, [o.token_ids for o in outs], [o.logprobs for o in outs])


def compare(quant_engine, base: FloatOutputs) -> list[PromptAccuracy]:
    """The quantised engine against the float engine's greedy outputs `base`."""
    mine = greedy(quant_engine, base.prompts, max(len(t) for t in base.tokens))
    rows = []
    for prompt, want, want_lp, got in zip(base.prompts, base.tokens, base.logprobs,
                                          mine.tokens, strict=True):  # fmt: skip
        same = [a == b for a, b in zip(want, got, strict=True)]
        logits = paged_logits(quant_engine, prompt + want, CHUNK)[len(prompt) - 1 : -1]
        ids = torch.tensor(want)
        lp = logits.float().log_softmax(-1).gather(-1, ids[:, None])[:, 0]
        d = (lp - torch.tensor(want_lp)).abs()
        rows.append(
            PromptAccuracy(
                tokens=len(want),
                agree=sum(same) / len(same),
                first_divergence=None if all(same) else same.index(False),
                max_abs_dlogprob=float(d.max()),
                mean_abs_dlogprob=float(d.mean()),
                top1_agree=float((logits.argmax(-1) == ids).float().mean()),
            )
        )
    return rows

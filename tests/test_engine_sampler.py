"""Sampling: greedy, temperature, top-k, top-p, seeds, logprobs, and the stop rules."""

from __future__ import annotations

import math

import pytest
import torch

from perfdiag.engine_ref import DenseReference, LLMEngine, SamplingParams
from perfdiag.engine_ref.sampler import Sampler, apply_top_k_top_p
from perfdiag.engine_ref.testing import tiny_config

CPU = torch.device("cpu")


def test_greedy_and_logprobs():
    logits = torch.tensor([[0.1, 2.0, -1.0, 1.9], [3.0, 0.0, 0.0, 0.0]])
    toks, lps = Sampler(CPU)(logits, [SamplingParams(temperature=0.0)] * 2, [None, None])
    assert toks == [1, 0]
    want = logits.log_softmax(-1)
    assert lps == pytest.approx([want[0, 1].item(), want[1, 0].item()])


def test_top_k_top_p_masks():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.5, 0.3, 0.15, 0.05]]))
    out = apply_top_k_top_p(logits, torch.tensor([2, 0]), torch.tensor([1.0, 0.7]))
    assert torch.isfinite(out[0]).tolist() == [True, True, False, False]
    # nucleus 0.7: 0.5 (< 0.7 before it) and 0.3 (0.5 before it) kept, 0.15 (0.8 before) not
    assert torch.isfinite(out[1]).tolist() == [True, True, False, False]
    one = apply_top_k_top_p(logits[:1], torch.tensor([0]), torch.tensor([0.01]))
    assert torch.isfinite(one[0]).tolist() == [True, False, False, False]


@pytest.mark.parametrize("params", [SamplingParams(top_k=1), SamplingParams(top_p=1e-6)])
def test_degenerate_filters_are_greedy(params):
    logits = torch.randn(16, 50, generator=torch.Generator().manual_seed(0))
    toks, _ = Sampler(CPU, seed=3)(logits, [params] * 16, [None] * 16)
    assert toks == logits.argmax(-1).tolist()


def test_temperature_sampling_follows_the_distribution():
    logits = torch.tensor([1.0, 0.0, -1.0, 0.5])
    temp = 0.7
    n = 4000
    sampler = Sampler(CPU, seed=123)
    toks, _ = sampler(
        logits.expand(n, 4).clone(), [SamplingParams(temperature=temp)] * n, [None] * n
    )
    p = (logits / temp).softmax(-1)
    counts = torch.bincount(torch.tensor(toks), minlength=4).float()
    for k in range(4):
        sigma = math.sqrt(n * p[k] * (1 - p[k]))
        assert abs(counts[k] - n * p[k]) < 4 * sigma


def test_top_p_sampling_stays_in_the_nucleus():
    logits = torch.log(torch.tensor([0.45, 0.35, 0.15, 0.05])).expand(500, 4).clone()
    toks, _ = Sampler(CPU, seed=1)(logits, [SamplingParams(top_p=0.6)] * 500, [None] * 500)
    assert set(toks) == {0, 1}


def test_seeded_requests_are_reproducible_and_batch_invariant():
    params = SamplingParams(temperature=1.0, top_k=20, seed=42, max_tokens=16)
    prompt = [256, 10, 20, 30]
    alone = LLMEngine(tiny_config()).generate([prompt], params)[0].token_ids
    other = SamplingParams(temperature=1.0, max_tokens=16)
    batched = (
        LLMEngine(
            tiny_config(),
        )
        .generate([[256, 1], prompt, [256, 99, 98]], [other, params, other])[1]
        .token_ids
    )
    assert alone == batched
    unseeded = LLMEngine(tiny_config()).generate([prompt] * 4, SamplingParams(max_tokens=16))
    assert len({tuple(o.token_ids) for o in unseeded}) > 1  # not all the same draw


def test_stop_rules():
    cfg = tiny_config()
    engine = LLMEngine(cfg)
    prompt = [256, 3, 1, 4, 1, 5, 9, 2, 6]
    ref = DenseReference(engine.model).greedy(prompt, 20, (), ignore_eos=True)
    stop = ref.token_ids[2]
    first = ref.token_ids.index(stop)
    out = engine.generate(
        [prompt], SamplingParams(temperature=0, max_tokens=20, stop_token_ids=(stop,))
    )[0]
    assert out.token_ids == ref.token_ids[: first + 1] and out.finish_reason == "stop"

    # the same token as the model's EOS: stops, unless ignore_eos
    eos_engine = LLMEngine(tiny_config(eos_token_ids=(stop,)))
    out = eos_engine.generate([prompt], SamplingParams(temperature=0, max_tokens=20))[0]
    assert out.token_ids == ref.token_ids[: first + 1] and out.finish_reason == "stop"
    out = eos_engine.generate(
        [prompt], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    )[0]
    assert out.token_ids == ref.token_ids and out.finish_reason == "length"


def test_max_model_len_caps_generation():
    engine = LLMEngine(tiny_config(max_model_len=16))
    out = engine.generate(
        [[256, *range(10)]], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
    )[0]
    assert len(out.token_ids) == 16 - 11 and out.finish_reason == "length"

"""On CUDA (skipped without one): fp32 greedy equals the CPU dense reference; bf16 serves."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from perfdiag.engine_ref import DenseReference, LLMEngine, SamplingParams
from perfdiag.engine_ref.testing import run, tiny_config, workload

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_cuda_fp32_matches_the_cpu_reference():
    items = workload(n=12, seed=2)
    cfg = replace(tiny_config(), device="cuda")
    res = run(LLMEngine(cfg), items, per_step=4)
    ref = DenseReference(LLMEngine(tiny_config()).model)
    for i, it in enumerate(items):
        want = ref.greedy(it.prompt, it.params.max_tokens, (257,), max_model_len=128)
        assert res.tokens[f"r{i}"] == want.token_ids


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_cuda_half_precision_serves(dtype):
    cfg = replace(tiny_config(), device="cuda", dtype=dtype)
    engine = LLMEngine(cfg)
    outs = engine.generate(
        [[256, 1, 2, 3], [256, *range(40)]], SamplingParams(temperature=0.8, seed=1, max_tokens=16)
    )
    assert all(len(o.token_ids) >= 1 for o in outs)
    assert engine.is_drained()

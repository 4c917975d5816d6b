"""On CUDA (skipped without one): the host tier's copies between the device pool and
pinned host memory keep greedy output token-identical to the engine without the tier,
for a float and an fp8 pool (values as raw bytes, scales beside them)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from test_kv_offload_engine import BLOCK, Offloads, hot_prefixes

from perfdiag.engine_ref.config import CacheConfig
from perfdiag.engine_ref.engine import LLMEngine
from perfdiag.engine_ref.testing import run, tiny_config

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("kv_dtype", ["auto", "fp8"])
def test_cuda_host_tier_is_token_identical(kv_dtype):
    items = hot_prefixes(seed=6)

    def make(offload_bytes, obs=None):
        cache = CacheConfig(block_size=BLOCK, num_gpu_blocks=24, kv_dtype=kv_dtype,
                            kv_offload_bytes=offload_bytes, check_ownership=True)  # fmt: skip
        return LLMEngine(replace(tiny_config(cache), device="cuda"), obs)

    plain = run(make(0), items, 1)
    obs = Offloads()
    eng = make(2**20, obs)
    assert eng.block_manager.host_tier.host[0].is_pinned()
    res = run(eng, items, 1)
    assert res.tokens == plain.tokens
    assert obs.host_tokens() > 0 and eng.is_drained()

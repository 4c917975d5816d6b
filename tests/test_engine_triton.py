"""The engine with kernel_backend="triton" (Triton's interpreter on the CPU): the same
greedy tokens as the PyTorch path on the tiny preset, through chunked prefill, prefix
hits, mixed prefill/decode steps and staggered arrivals; and the backend's selection."""

from __future__ import annotations

from dataclasses import replace

import pytest

from perfdiag.engine_ref import EngineConfig, LLMEngine, RecordingObserver
from perfdiag.engine_ref import RequestEventKind as K
from perfdiag.engine_ref.testing import run, tiny_config, workload
from perfdiag.errors import ConfigError

ITEMS = workload(n=8, seed=3, max_prompt=24)


def test_triton_backend_greedy_tokens_equal_the_torch_backend():
    torch_cfg = tiny_config()
    assert torch_cfg.resolved_kernel_backend == "torch"  # the CPU default
    want = run(LLMEngine(torch_cfg), ITEMS, per_step=3)
    obs = RecordingObserver()
    engine = LLMEngine(replace(torch_cfg, kernel_backend="triton"), observer=obs)
    assert engine.model.kernel_backend == "triton"
    got = run(engine, ITEMS, per_step=3)
    assert got.tokens == want.tokens
    assert got.finish == want.finish
    # the mechanisms the kernels must get right really happened
    steps = obs.steps
    assert any(s.num_prefill_seqs and s.num_decode_seqs for s in steps)  # mixed batches
    assert any(e.kind == K.SCHEDULED and e.num_cached_tokens for e in obs.requests)  # hits
    chunks = [e for e in obs.requests if e.kind == K.PREFILL_CHUNK]
    assert len(chunks) > len({e.request_id for e in chunks})  # some prompt in several chunks
    assert engine.is_drained()


def test_kernel_backend_selection_and_validation():
    assert EngineConfig(device="cpu").resolved_kernel_backend == "torch"
    assert EngineConfig(device="cuda").resolved_kernel_backend == "triton"
    assert EngineConfig(device="cuda", kernel_backend="torch").resolved_kernel_backend == "torch"
    with pytest.raises(ConfigError, match="kernel_backend"):
        EngineConfig(kernel_backend="cuda")
    with pytest.raises(ConfigError, match="cuda_graphs needs device"):
        EngineConfig(cuda_graphs=True)
    with pytest.raises(ConfigError, match="cuda_graphs needs kernel_backend"):
        EngineConfig(device="cuda", kernel_backend="torch", cuda_graphs=True)
    with pytest.raises(ConfigError, match="cuda_graph_batch_sizes"):
        EngineConfig(cuda_graph_batch_sizes=(0, 2))
    assert EngineConfig(cuda_graph_batch_sizes=(8, 1, 8)).cuda_graph_batch_sizes == (1, 8)

"""The engine with kernel_backend="triton" (Triton's interpreter on the CPU): the same
greedy tokens as the PyTorch path on the tiny preset, through chunked prefill, prefix
hits, mixed prefill/decode steps and staggered arrivals; and the backend's selection."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from perfdiag.engine_ref import DenseReference, EngineConfig, LLMEngine, RecordingObserver
from perfdiag.engine_ref import RequestEventKind as K
from perfdiag.engine_ref.kernels._common import interpreting
from perfdiag.engine_ref.testing import paged_logits, run, tiny_config, workload
from perfdiag.errors import ConfigError

ITEMS = workload(n=8, seed=3, max_prompt=24)


@pytest.mark.skipif(not interpreting(), reason="needs TRITON_INTERPRET=1")
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


@pytest.mark.gpu
@pytest.mark.skipif(
    interpreting() or not torch.cuda.is_available(), reason="needs CUDA, not interpreted"
)
def test_cuda_bf16_triton_engine_stays_near_the_fp32_reference():
    """bf16 cannot promise fp32's tokens (many top-2 margins of the tiny preset are below
    bf16's rounding), so its logits are held to the fp32 dense reference's within 3× the
    error PyTorch's own bf16 path shows on the CPU (0.05), and to that path on CUDA."""
    ref = DenseReference(LLMEngine(tiny_config()).model)
    bf16 = dict(device="cuda", dtype="bfloat16")
    kernels = LLMEngine(replace(tiny_config(), kernel_backend="triton", **bf16))
    plain = LLMEngine(replace(tiny_config(), kernel_backend="torch", **bf16))
    for it in ITEMS[:4]:
        want = ref.greedy(it.prompt, it.params.max_tokens, (257,), max_model_len=128)
        tokens = it.prompt + want.token_ids
        dense = ref.logits(tokens)
        got = paged_logits(kernels, tokens, 5).cpu()
        assert (got - dense).abs().max().item() < 0.15
        assert (got - paged_logits(plain, tokens, 5).cpu()).abs().max().item() < 0.1

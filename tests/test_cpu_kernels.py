"""The fused CPU kernels (`kernel_backend="numba"`, engine_ref/cpu_kernels.py) against
plain PyTorch: each kernel on odd shapes (GQA 3:1 and 5:1, head dims 24 and 40, scattered
block tables, a context of one token), then the engine's batch-1 decode steps against its
PyTorch path, token for token."""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("numba", reason="kernel_backend 'numba' needs the cpu extra")

from perfdiag.engine_ref import (
    EngineConfig,
    LLMEngine,
    ModelConfig,
    SamplingParams,
)
from perfdiag.engine_ref import cpu_kernels as k
from perfdiag.engine_ref.model import RotaryEmbedding, apply_rope
from perfdiag.errors import ConfigError

EPS = 1e-5


def _randn(*shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def test_rms_norm_and_its_residual_add():
    x, h, w = _randn(3, 96), _randn(3, 96, seed=1), _randn(96, seed=2)
    out = torch.empty(3, 96)
    k.rms_norm(x.numpy(), w.numpy(), EPS, out.numpy())
    torch.testing.assert_close(out, F.rms_norm(x, (96,), w, EPS))
    residual = x.clone()
    k.add_rms_norm(residual.numpy(), h.numpy(), w.numpy(), EPS, out.numpy())
    assert torch.equal(residual, x + h)  # one rounding, as `x + h`
    torch.testing.assert_close(out, F.rms_norm(x + h, (96,), w, EPS))


def test_silu_mul():
    gu, out = _randn(2, 2 * 40) * 4, torch.empty(2, 40)
    k.silu_mul(gu.numpy(), out.numpy())
    torch.testing.assert_close(out, F.silu(gu[:, :40]) * gu[:, 40:])


def _reference_attention(q, kc, vc, table, n, scale):
    """One query [H, D] over the first n positions of a paged cache, plain softmax."""
    bs, hkv = kc.shape[1], kc.shape[2]
    blocks = table[: -(-n // bs)]
    kk = kc[blocks].flatten(0, 1)[:n].repeat_interleave(q.shape[0] // hkv, dim=1)
    vv = vc[blocks].flatten(0, 1)[:n].repeat_interleave(q.shape[0] // hkv, dim=1)
    p = (torch.einsum("hd,nhd->hn", q, kk) * scale).softmax(-1)
    return torch.einsum("hn,nhd->hd", p, vv)


@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(6, 2, 24), (5, 1, 40), (4, 4, 16)])
def test_decode_attention_stores_rotated_kv_and_attends_through_block_tables(heads, kv_heads, dim):
    block_size, num_blocks = 4, 48
    lens = [1, 18, 71, 5]  # a first token (context of itself), mid-block ends
    cfg = ModelConfig(vocab_size=8, hidden_size=heads * dim, intermediate_size=8, num_layers=1,
                      num_heads=heads, num_kv_heads=kv_heads, head_dim=dim,
                      max_position_embeddings=128)  # fmt: skip
    rotary = RotaryEmbedding(cfg)
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(3))
    need = [-(-n // block_size) for n in lens]
    width, at, rows = max(need), 0, []
    for n in need:  # every sequence's blocks distinct and scattered; padding: other blocks
        rows.append(perm[at : at + n].tolist() + perm[-(width - n) :].tolist()[: width - n])
        at += n
    tables = torch.tensor(rows)
    positions = torch.tensor(lens) - 1
    slots = tables.gather(1, (positions // block_size)[:, None])[:, 0] * block_size + (
        positions % block_size
    )
    kv = _randn(2, num_blocks, block_size, kv_heads, dim, seed=4)
    qkv = _randn(len(lens), (heads + 2 * kv_heads) * dim, seed=5)

    want_k, want_v = kv[0].clone(), kv[1].clone()
    cos, sin = rotary.cos[positions][:, None], rotary.sin_signed[positions][:, None]
    q, kk, v = qkv.view(len(lens), -1, dim).split([heads, kv_heads, kv_heads], dim=1)
    q, kk = apply_rope(q, cos, sin), apply_rope(kk, cos, sin)
    want_k.view(-1, kv_heads, dim)[slots] = kk
    want_v.view(-1, kv_heads, dim)[slots] = v
    scale = dim**-0.5
    want = torch.stack([
        _reference_attention(q[b], want_k, want_v, tables[b], n, scale)
        for b, n in enumerate(lens)
    ])  # fmt: skip

    got = torch.empty(len(lens), heads * dim)
    k.decode_attention(qkv.numpy(), positions.numpy(), rotary.cos.numpy(),
                       rotary.sin_signed.numpy(), kv[0].numpy(), kv[1].numpy(), tables.numpy(),
                       slots.numpy(), heads, scale, got.numpy())  # fmt: skip
    torch.testing.assert_close(kv[0], want_k)
    assert torch.equal(kv[1], want_v)
    torch.testing.assert_close(got.view(len(lens), heads, dim), want)


def _greedy(cfg: EngineConfig, prompts, lengths=(24,)):
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
    out = LLMEngine(cfg).generate(prompts, params)
    return [(o.token_ids, torch.tensor(o.logprobs)) for o in out]


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_batch1_decode_matches_the_pytorch_path(qkv_bias):
    model = replace(ModelConfig.preset("small"), qkv_bias=qkv_bias, seed=3)
    for prompt in ([7, 8, 9], list(range(5, 75))):  # a prompt within a block, one of many
        torch_run = _greedy(EngineConfig(model=model, kernel_backend="torch"), [prompt])
        numba_run = _greedy(EngineConfig(model=model, kernel_backend="numba"), [prompt])
        (t_ids, t_lp), (n_ids, n_lp) = torch_run[0], numba_run[0]
        assert n_ids == t_ids
        torch.testing.assert_close(n_lp, t_lp, atol=1e-4, rtol=0)


def test_batched_then_lone_decodes_agree_with_the_pytorch_path():
    # Batched steps run PyTorch; once two requests finish, the third decodes alone (fused).
    model = ModelConfig.preset("small")
    prompts, lengths = [[5, 6, 7], list(range(20, 61)), list(range(90, 100))], (4, 9, 20)
    want = _greedy(EngineConfig(model=model, kernel_backend="torch"), prompts, lengths)
    got = _greedy(EngineConfig(model=model, kernel_backend="numba"), prompts, lengths)
    assert [ids for ids, _ in got] == [ids for ids, _ in want]
    torch.testing.assert_close(got[2][1], want[2][1], atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "change", [{"dtype": "bfloat16"}, {"weight_format": "q8_0"}, {"device": "cuda"}]
)
def test_numba_backend_refuses_what_it_does_not_run(change):
    with pytest.raises(ConfigError, match="numba"):
        EngineConfig(kernel_backend="numba", **change)


def test_without_numba_the_engine_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "numba", None)  # `import numba` raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'perfdiag\[cpu\]'"):
        LLMEngine(EngineConfig(kernel_backend="numba"))


def test_the_fused_step_is_compiled_when_the_engine_is_built():
    # Loading it (~1 s from Numba's cache) would otherwise land in the run's first step.
    engine = LLMEngine(EngineConfig(kernel_backend="numba"))
    assert k.decode_step.signatures and k.gemv.signatures
    assert engine.runner.model._numba_caches is None  # the warm-up's scratch cache let go

"""Paged decode and prefill attention against their PyTorch references: odd GQA ratios,
head dimensions that are not powers of two, scattered block tables, prefixes ending
mid-block, mixed query lengths, splits along the sequence (some of them empty), and the
engine's own mixed prefill/decode batch through the Triton backend against the PyTorch
backend."""

from __future__ import annotations

import pytest
import torch

from perfdiag.engine_ref.attention import naive_attention
from perfdiag.engine_ref.kernels import decode_attention as dec
from perfdiag.engine_ref.kernels import prefill_attention as pre
from perfdiag.engine_ref.kernels.testing import (
    assert_close,
    device_cases,
    paged_cache,
    scattered_tables,
)

CASES = device_cases()
# (query heads, KV heads, head dim): GQA 3:1 with D=24, GQA 5:1 with D=40, MHA with D=16
SHAPES = [(6, 2, 24), (5, 1, 40), (2, 2, 16)]


def _q(tokens, heads, dim, dtype, device, seed=5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn((tokens, heads, dim), generator=g).to(device=device, dtype=dtype)


@pytest.mark.parametrize(("device", "dtype"), CASES)
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), SHAPES)
@pytest.mark.parametrize("splits", [1, 3])
def test_decode_attention(device, dtype, heads, kv_heads, dim, splits):
    block_size, blocks = 4, 48
    lens = [1, 18, 0, 71, 5]  # a lone token, mid-block ends, a padding row (length 0)
    kc, vc = paged_cache(blocks, block_size, kv_heads, dim, dtype, device)
    tables = scattered_tables(lens, block_size, blocks, width=20).to(device)
    lens_t = torch.tensor(lens, dtype=torch.int32, device=device)
    q = _q(len(lens), heads, dim, dtype, device)
    got = dec.decode_attention(q, kc, vc, tables, lens_t, dim**-0.5, num_splits=splits)
    assert_close(got, dec.ref_decode_attention(q, kc, vc, tables, lens_t, dim**-0.5))
    assert torch.equal(got[2], torch.zeros_like(got[2]))  # length 0: zeros, not NaN


@pytest.mark.parametrize(("device", "dtype"), CASES)
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), SHAPES)
def test_prefill_attention_with_cached_prefixes(device, dtype, heads, kv_heads, dim):
    block_size, blocks = 4, 48
    # (new tokens, context after the step): no prefix; a prefix ending mid-block (5 of a
    # 4-token block size); a one-token query (a decode in the same launch); a chunk longer
    # than one query tile after a block-aligned prefix
    seqs = [(7, 7), (6, 11), (1, 30), (21, 29)]
    q_lens, ctx = [n for n, _ in seqs], [c for _, c in seqs]
    kc, vc = paged_cache(blocks, block_size, kv_heads, dim, dtype, device, seed=1)
    tables = scattered_tables(ctx, block_size, blocks, seed=2).to(device)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    cu, lens = cu.to(device), torch.tensor(ctx, dtype=torch.int32, device=device)
    q = _q(sum(q_lens), heads, dim, dtype, device)
    got = pre.prefill_attention(q, kc, vc, tables, cu, lens, dim**-0.5, max(q_lens))
    assert_close(got, pre.ref_prefill_attention(q, kc, vc, tables, cu, lens, dim**-0.5))


def test_references_agree_with_each_other_on_decodes():
    """A one-token prefill is a decode: the two references meet (guards the references)."""
    kc, vc = paged_cache(16, 4, 2, 24, torch.float32, "cpu")
    lens = torch.tensor([9, 3], dtype=torch.int32)
    tables = scattered_tables([9, 3], 4, 16)
    q = _q(2, 6, 24, torch.float32, "cpu")
    a = dec.ref_decode_attention(q, kc, vc, tables, lens, 0.2)
    b = pre.ref_prefill_attention(q, kc, vc, tables, torch.tensor([0, 1, 2]), lens, 0.2)
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize(("device", "dtype"), CASES)
def test_engine_backend_on_a_mixed_batch(device, dtype):
    """The runner's real metadata for decodes and prefill chunks in one step (a cached
    context ending mid-block included: 5 tokens, block size 4): the Triton backend against
    the PyTorch backend."""
    from dataclasses import replace

    from perfdiag.engine_ref import LLMEngine, SamplingParams
    from perfdiag.engine_ref.kernels.backend import triton_attention
    from perfdiag.engine_ref.request import Request
    from perfdiag.engine_ref.testing import tiny_config

    cfg = replace(tiny_config(), kernel_backend="triton", device=device,
                  dtype=str(dtype).removeprefix("torch."))  # fmt: skip
    engine = LLMEngine(cfg)
    bm = engine.block_manager
    reqs = []
    for i, (n, done) in enumerate([(9, 8), (14, 13), (11, 5), (7, 0)]):
        r = Request(f"r{i}", tuple(range(1, n + 1)), SamplingParams(), 0, n + 4)
        bm.append_slots(r, done)
        r.num_computed_tokens = done
        reqs.append(r)
    sched = []
    for r in reqs:  # the first two decode their last prompt token; the others prefill
        n = r.num_tokens - r.num_computed_tokens
        bm.append_slots(r, n)
        sched.append((r, n))
    inp = engine.runner.prepare(sched)
    meta = inp.meta
    assert meta.num_decode == 2 and len(meta.prefills) == 2 and inp.input_ids.shape[0] == 15
    mc = cfg.model
    t, kv = inp.input_ids.shape[0], engine.kv_cache
    q = _q(t, mc.num_heads, mc.head_dim, dtype, device)
    k = _q(t, mc.num_kv_heads, mc.head_dim, dtype, device, seed=6)
    v = _q(t, mc.num_kv_heads, mc.head_dim, dtype, device, seed=7)
    k_cache, v_cache = kv.layers[0]
    g = torch.Generator().manual_seed(8)
    k_cache.copy_(torch.randn(k_cache.shape, generator=g).to(dtype))  # earlier tokens' K/V
    v_cache.copy_(torch.randn(v_cache.shape, generator=g).to(dtype))
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    want = naive_attention(q, k, v, ref_k, ref_v, meta, mc.head_dim**-0.5)
    got = triton_attention(q, k, v, k_cache, v_cache, meta, mc.head_dim**-0.5)
    assert_close(got, want)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)  # same slots written
    engine.runner.release()

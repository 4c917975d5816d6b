"""RMSNorm (+ residual), RoPE, SiLU-and-multiply and the KV store against their PyTorch
references, on awkward shapes: widths that are not powers of two, strided views of the
fused projections, a residual updated in place, negative (padding) slots."""

from __future__ import annotations

import pytest
import torch

from perfdiag.engine_ref.config import ModelConfig, RopeConfig
from perfdiag.engine_ref.kernels import kv_store, rms_norm, rope, silu_mul
from perfdiag.engine_ref.kernels.testing import assert_close, device_cases
from perfdiag.engine_ref.model import RotaryEmbedding, apply_rope

CASES = device_cases()


def _randn(*shape, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(device=device, dtype=dtype)


@pytest.mark.parametrize(("device", "dtype"), CASES)
@pytest.mark.parametrize("residual", [False, True])
def test_rms_norm(device, dtype, residual):
    tokens, hidden = 37, 72  # a hidden size that is not a power of two, rows spill a tile
    x = _randn(tokens, hidden, dtype=dtype, device=device)
    w = _randn(hidden, dtype=dtype, device=device, seed=1)
    r = _randn(tokens, hidden, dtype=dtype, device=device, seed=2) if residual else None
    want, want_r = rms_norm.ref_rms_norm(x, w, 1e-5, r)
    r_in = None if r is None else r.clone()
    got = rms_norm.rms_norm(x, w, 1e-5, residual=r_in)
    assert_close(got, want)
    if residual:
        assert_close(r_in, want_r)  # the sum, written back in place for the next layer


@pytest.mark.parametrize(("device", "dtype"), CASES)
def test_rope_on_a_strided_view_of_qkv(device, dtype):
    tokens, heads, kv_heads, dim = 9, 5, 1, 24  # 6 rotated heads, D/2 = 12 lanes
    cfg = ModelConfig.preset("tiny", head_dim=dim, rope=RopeConfig(theta=500.0))
    rot = RotaryEmbedding(cfg).to(device)
    qkv = _randn(tokens, (heads + 2 * kv_heads) * dim, dtype=dtype, device=device)
    qk = qkv[:, : (heads + kv_heads) * dim].view(tokens, -1, dim)  # strided rows
    positions = torch.tensor([0, 7, 3, 3, 100, 511, 1, 2, 64], device=device)
    before_v = qkv[:, (heads + kv_heads) * dim :].clone()
    want = rope.ref_rope(qk, positions, rot.cos, rot.sin_signed)
    rope.rope_(qk, positions, rot.cos, rot.sin_signed)
    assert_close(qk, want)
    assert torch.equal(qkv[:, (heads + kv_heads) * dim :], before_v)  # v untouched


def test_rope_reference_is_the_models_rope():
    """The reference the kernel is held to computes what the PyTorch path computes."""
    cfg = ModelConfig.preset("tiny", head_dim=24)
    rot = RotaryEmbedding(cfg)
    x = _randn(6, 3, 24, dtype=torch.float32, device="cpu")
    pos = torch.tensor([0, 1, 5, 9, 200, 3])
    cos, sin = rot(pos, torch.float32)
    torch.testing.assert_close(rope.ref_rope(x, pos, rot.cos, rot.sin_signed),
                               apply_rope(x, cos, sin), atol=1e-6, rtol=1e-6)  # fmt: skip


@pytest.mark.parametrize(("device", "dtype"), CASES)
def test_silu_mul(device, dtype):
    x = _randn(11, 2 * 84, dtype=dtype, device=device) * 3  # wide enough to saturate SiLU
    assert_close(silu_mul.silu_mul(x), silu_mul.ref_silu_mul(x))


@pytest.mark.parametrize(("device", "dtype"), CASES)
def test_kv_store_skips_negative_slots(device, dtype):
    blocks, block_size, kv_heads, dim = 7, 4, 3, 20
    kv = _randn(6, 2 * kv_heads * dim, dtype=dtype, device=device)  # views of a projection
    k = kv[:, : kv_heads * dim].view(6, kv_heads, dim)
    v = kv[:, kv_heads * dim :].view(6, kv_heads, dim)
    caches = _randn(2, blocks, block_size, kv_heads, dim, dtype=dtype, device=device, seed=3)
    want = caches.clone()
    slots = torch.tensor([27, -1, 5, 0, 13, -1], device=device)
    kv_store.ref_store_kv(k, v, want[0], want[1], slots)
    kv_store.store_kv(k, v, caches[0], caches[1], slots)
    assert torch.equal(caches, want)  # a copy: bit-exact, and nothing else written
    assert torch.equal(caches[0].view(-1, kv_heads, dim)[27], k[0])

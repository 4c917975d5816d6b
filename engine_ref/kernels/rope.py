"""Rotary position embedding (rotate-half form), applied in place to q and k heads.

The tables are the model's: `cos` [positions, D] and `sin_signed` [positions, D] whose
first half carries rotate-half's minus sign, so with x = (x1, x2) the result is
(x1·cos − x2·sin, x2·cos + x1·sin). Each token's row is looked up by its position, so
the q and k heads of one token are rotated together (they are adjacent heads of the fused
qkv projection; the view passed in may be strided).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import elem_bytes, pow2
from .launch import launch


def ref_rope(x, positions, cos, sin_signed):
    """x [T, heads, D] → a new rotated tensor; fp32 arithmetic, rounded once."""
    half = x.shape[-1] // 2
    c = cos[positions, :half].float()[:, None, :]
    s = sin_signed[positions, half:].float()[:, None, :]
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1).to(x.dtype)


def flops(num_tokens: int, heads: int, head_dim: int) -> int:
    """3 per element (two multiplies, one add), as analyzers/model_flops.py counts RoPE."""
    return 3 * num_tokens * heads * head_dim


def bytes_moved(num_tokens: int, heads: int, head_dim: int, elem: int, table_elem: int) -> int:
    """Heads read and written once; per token its position (8 bytes) and half a row of
    each table."""
    return 2 * num_tokens * heads * head_dim * elem + num_tokens * (8 + head_dim * table_elem)


@triton.jit
def _rope_kernel(x_ptr, pos_ptr, cos_ptr, sin_ptr, n_rows, n_heads, half, stride_xt, stride_xh,
                 stride_cos, stride_sin, ROWS: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    # A row is one (token, head) pair: rows of one token share its position.
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    t = r // n_heads
    h = r % n_heads
    d = tl.arange(0, BLOCK_D)
    rmask = r < n_rows
    mask = rmask[:, None] & (d[None, :] < half)
    pos = tl.load(pos_ptr + t, mask=rmask, other=0)
    c = tl.load(cos_ptr + pos[:, None] * stride_cos + d[None, :], mask=mask, other=0.0)
    s = tl.load(sin_ptr + pos[:, None] * stride_sin + half + d[None, :], mask=mask, other=0.0)
    c = c.to(tl.float32)
    s = s.to(tl.float32)
    p1 = x_ptr + t[:, None] * stride_xt + h[:, None] * stride_xh + d[None, :]
    x1 = tl.load(p1, mask=mask, other=0.0)
    x2 = tl.load(p1 + half, mask=mask, other=0.0)
    dt = x1.dtype
    x1 = x1.to(tl.float32)
    x2 = x2.to(tl.float32)
    tl.store(p1, (x1 * c - x2 * s).to(dt), mask=mask)
    tl.store(p1 + half, (x2 * c + x1 * s).to(dt), mask=mask)


def rope_(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor):
    """Rotate x [T, heads, D] (last dim contiguous) in place; returns x."""
    t, heads, dim = x.shape
    assert x.stride(2) == 1 and cos.stride(1) == 1 and sin_signed.stride(1) == 1
    half = dim // 2
    n_rows = t * heads
    block_d = pow2(half)
    rows = pow2(min(n_rows, max(1, 1024 // block_d)))
    args = (x, positions, cos, sin_signed, n_rows, heads, half, x.stride(0), x.stride(1),
            cos.stride(0), sin_signed.stride(0))  # fmt: skip
    meta = {"ROWS": rows, "BLOCK_D": block_d, "num_warps": 4}
    e, te = elem_bytes(x.dtype), elem_bytes(cos.dtype)
    launch(_rope_kernel, (triton.cdiv(n_rows, rows),), args, meta,
           lambda: (flops(t, heads, dim), bytes_moved(t, heads, dim, e, te)))  # fmt: skip
    return x

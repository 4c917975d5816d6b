"""SiLU-and-multiply: `silu(gate) · up` of the fused gate/up projection [T, 2·I] → [T, I].

As PyTorch computes it for half types: SiLU in fp32 rounded to the dtype, then the
product rounded again.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ._common import elem_bytes, pow2
from .launch import launch


def ref_silu_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def flops(num_tokens: int, inter: int) -> int:
    """5 per output element, as analyzers/model_flops.py counts SiLU-and-multiply."""
    return 5 * num_tokens * inter


def bytes_moved(num_tokens: int, inter: int, elem: int) -> int:
    return 3 * num_tokens * inter * elem  # gate and up read, the product written


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, n_rows, inter, stride_x, stride_o, ROWS: tl.constexpr,
                     BLOCK: tl.constexpr):  # fmt: skip
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < inter)
    g_ptrs = x_ptr + rows[:, None] * stride_x + cols[None, :]
    g = tl.load(g_ptrs, mask=mask, other=0.0)
    u = tl.load(g_ptrs + inter, mask=mask, other=0.0)
    g32 = g.to(tl.float32)
    s = (g32 / (1.0 + tl.exp(-g32))).to(g.dtype)
    out = (s.to(tl.float32) * u.to(tl.float32)).to(g.dtype)
    tl.store(out_ptr + rows[:, None] * stride_o + cols[None, :], out, mask=mask)


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    t, two_i = x.shape
    assert two_i % 2 == 0 and x.stride(1) == 1
    inter = two_i // 2
    out = torch.empty((t, inter), dtype=x.dtype, device=x.device)
    block = min(pow2(inter), 1024)
    rows = pow2(min(t, max(1, 1024 // block)))
    grid = (triton.cdiv(t, rows), triton.cdiv(inter, block))
    args = (x, out, t, inter, x.stride(0), out.stride(0))
    e = elem_bytes(x.dtype)
    launch(
        _silu_mul_kernel,
        grid,
        args,
        {"ROWS": rows, "BLOCK": block, "num_warps": 4},
        lambda: (flops(t, inter), bytes_moved(t, inter, e)),
    )
    return out

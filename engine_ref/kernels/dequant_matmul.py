"""Dequant-GEMM/GEMV: `y = x·Wᵀ` with W in GGUF's Q4_1 or Q8_0 blocks (engine_ref/quant.py),
dequantised in registers tile by tile, so the weight crosses memory packed.

x [M, K] (fp32/fp16/bf16), W packed [N, K] → y [M, N] in x's dtype, accumulated in fp32.
Each program owns a BLOCK_M × BLOCK_N tile of y and walks K in steps of BLOCK_K (a multiple
of the 32-weight quantisation block): it loads the tile's codes and per-block scales
(and minima), forms w = d·q (+ m) in fp32, rounds it to x's dtype, and accumulates
`x_tile · w_tileᵀ`. The reference is `ref_dequant_matmul` (dequantise, then one GEMM).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..quant import BLOCK, BYTES_PER_WEIGHT, PackedWeight, dequantize
from ._common import dot_precision, elem_bytes
from .launch import launch


def ref_dequant_matmul(x: torch.Tensor, w: PackedWeight) -> torch.Tensor:
    return x @ dequantize(w, x.dtype).T


def row_tile(m: int) -> int:
    """BLOCK_M for M rows: one 16-row tile covers a decode batch; prefill takes 32."""
    return 16 if m <= 16 else 32


def flops(m: int, n: int, k: int, block_m: int = 16) -> int:
    """2·M·N·K for the product, plus 2 per weight (d·q + m) each time an M tile
    dequantises it: decode (one tile) pays 2·N·K, a prefill of M rows ⌈M/BLOCK_M⌉ times."""
    return 2 * m * n * k + 2 * n * k * triton.cdiv(max(m, 1), block_m)


def bytes_moved(m: int, n: int, k: int, fmt: str, elem: int) -> int:
    """Ideal traffic: the packed weight once, x read and y written once."""
    return int(n * k * BYTES_PER_WEIGHT[fmt]) + (m * k + m * n) * elem


@triton.jit
def _dequant_mm_kernel(x_ptr, qs_ptr, d_ptr, m_ptr, y_ptr, M, N, K, stride_xm, stride_ym,
                       IS_Q4: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < M, cols < N
    groups = K // 32
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        x = tl.load(x_ptr + rows[:, None] * stride_xm + ks[None, :],
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)  # fmt: skip
        w_ok = col_ok[:, None] & k_ok[None, :]
        g = ks // 32
        d = tl.load(d_ptr + cols[:, None] * groups + g[None, :], mask=w_ok, other=0.0)
        if IS_Q4:
            # A block's 16 bytes hold weights j (low nibble) and j + 16 (high nibble).
            within = ks % 32
            byte = g * 16 + within % 16
            packed = tl.load(qs_ptr + cols[:, None] * (K // 2) + byte[None, :], mask=w_ok,
                             other=0)  # fmt: skip
            q = (packed >> ((within // 16) * 4)[None, :]) & 15
            mn = tl.load(m_ptr + cols[:, None] * groups + g[None, :], mask=w_ok, other=0.0)
            w = q.to(tl.float32) * d.to(tl.float32) + mn.to(tl.float32)
        else:
            q = tl.load(qs_ptr + cols[:, None] * K + ks[None, :], mask=w_ok, other=0)
            w = q.to(tl.float32) * d.to(tl.float32)
        acc += tl.dot(x, tl.trans(w.to(x.dtype)), input_precision=PRECISION)
    y = acc.to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], y,
             mask=row_ok[:, None] & col_ok[None, :])  # fmt: skip


def dequant_matmul(x: torch.Tensor, w: PackedWeight) -> torch.Tensor:
    """x [M, K] · dequant(W)ᵀ → [M, N]."""
    m, k = x.shape
    assert k == w.k and k % BLOCK == 0 and x.stride(1) == 1
    y = torch.empty((m, w.n), dtype=x.dtype, device=x.device)
    block_m = row_tile(m)
    block_n, block_k = 64, 64 if k % 64 == 0 else 32
    grid = (triton.cdiv(m, block_m), triton.cdiv(w.n, block_n))
    m_arg = w.m if w.m is not None else w.d  # unread for Q8_0
    args = (x, w.qs, w.d, m_arg, y, m, w.n, k, x.stride(0), y.stride(0))
    meta = {"IS_Q4": w.fmt == "q4_1", "BLOCK_M": block_m, "BLOCK_N": block_n,
            "BLOCK_K": block_k, "PRECISION": dot_precision(x.dtype), "num_warps": 4}  # fmt: skip
    e = elem_bytes(x.dtype)
    launch(_dequant_mm_kernel, grid, args, meta,
           lambda: (flops(m, w.n, k, block_m), bytes_moved(m, w.n, k, w.fmt, e)))  # fmt: skip
    return y

"""RMSNorm, optionally fused with the residual add before it.

`rms_norm(x, w, eps, residual=r)` does what the decoder spells as `r = x + r; out =
norm(r)` in one pass: it writes the sum back into `residual` (in place, as the next
layer's residual) and returns the normalised rows. The arithmetic follows the PyTorch
path (Hugging Face's order): the add rounds to the tensor's dtype, the statistics are
fp32, the normalised value rounds to the dtype before the weight multiplies it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import elem_bytes, pow2
from .launch import launch


def ref_rms_norm(x, weight, eps: float, residual=None):
    """(out, new_residual or None); inputs untouched."""
    if residual is not None:
        x = x + residual
        residual = x
    x32 = x.float()
    y = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return weight * y, residual


def flops(num_tokens: int, hidden: int, residual: bool) -> int:
    """4 per element (square, sum, scale, weight), +1 for the residual add."""
    return (4 + int(residual)) * num_tokens * hidden


def bytes_moved(num_tokens: int, hidden: int, elem: int, residual: bool) -> int:
    """Rows read and written once (the residual read and written back too), the weight
    read once."""
    rows = num_tokens * hidden * elem
    return (4 if residual else 2) * rows + hidden * elem


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, n_rows, n_cols, stride_x, stride_r,
                     stride_o, eps, HAS_RES: tl.constexpr, ROWS: tl.constexpr,
                     BLOCK: tl.constexpr):  # fmt: skip
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    if HAS_RES:
        r_ptrs = res_ptr + rows[:, None] * stride_r + cols[None, :]
        r = tl.load(r_ptrs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(r.dtype)  # rounded like torch's add
        tl.store(r_ptrs, x, mask=mask)
    x = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / n_cols + eps)
    y = (x * rstd[:, None]).to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    out = (y * w[None, :]).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + rows[:, None] * stride_o + cols[None, :], out, mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual=None) -> torch.Tensor:
    """x [T, hidden] (rows may be strided, columns contiguous); returns a new [T, hidden]."""
    t, h = x.shape
    assert x.stride(1) == 1 and weight.is_contiguous()
    out = torch.empty((t, h), dtype=x.dtype, device=x.device)
    block = pow2(h)
    rows = pow2(min(t, max(1, 2048 // block)))  # several short rows per program
    has_res = residual is not None
    if has_res:
        assert residual.shape == x.shape and residual.stride(1) == 1
    res = residual if has_res else x
    grid = (triton.cdiv(t, rows),)
    args = (x, res, weight, out, t, h, x.stride(0), res.stride(0), out.stride(0), eps)
    meta = {
        "HAS_RES": has_res,
        "ROWS": rows,
        "BLOCK": block,
        "num_warps": 4 if block >= 1024 else 2,
    }
    e = elem_bytes(x.dtype)
    launch(
        _rms_norm_kernel,
        grid,
        args,
        meta,
        lambda: (flops(t, h, has_res), bytes_moved(t, h, e, has_res)),
    )
    return out

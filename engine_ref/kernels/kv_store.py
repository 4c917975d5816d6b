"""New K/V into the paged cache: token i goes to slot `slot_mapping[i]` (block · block_size
+ offset). A negative slot is skipped: CUDA-graph batches are padded with slot −1, so the
padding writes nowhere. Caches are one layer's [blocks, block_size, kv_heads, D].

A quantised cache (`kv_quant.QuantKV`) takes one program per (token tile, KV head): the
head's scale is its absolute maximum over the format's largest value, computed from the
values being written (kv_quant.py says why per token and head), and stored beside them.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..kv_quant import QMAX, QuantKV, kernel_operands
from ..kv_quant import store as store_quantized
from ._common import elem_bytes, pow2
from .launch import launch


def ref_store_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    keep = slot_mapping >= 0
    if isinstance(k_cache, QuantKV):
        store_quantized(k[keep], k_cache, slot_mapping[keep])
        store_quantized(v[keep], v_cache, slot_mapping[keep])
        return
    heads, dim = k_cache.shape[-2:]
    k_cache.view(-1, heads, dim)[slot_mapping[keep]] = k[keep]
    v_cache.view(-1, heads, dim)[slot_mapping[keep]] = v[keep]


def flops(num_tokens: int) -> int:
    return 0  # a copy


def bytes_moved(num_tokens: int, kv_heads: int, head_dim: int, elem: int,
                stored_elem: float | None = None) -> int:  # fmt: skip
    """K and V read and written once (written as stored: `stored_elem` bytes per element,
    scales included, when quantised), and each token's slot (8 bytes)."""
    stored = elem if stored_elem is None else stored_elem
    return int(2 * num_tokens * kv_heads * head_dim * (elem + stored)) + 8 * num_tokens


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, n_tokens, row_len, block_size,
                     stride_kt, stride_vt, stride_cb, stride_cs, BLOCK_T: tl.constexpr,
                     BLOCK: tl.constexpr):  # fmt: skip
    # One token's K (or V) heads are `row_len` contiguous elements in the projection and in
    # a cache slot alike, so a tile is tokens × that row.
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    j = tl.arange(0, BLOCK)
    slot = tl.load(slot_ptr + t, mask=t < n_tokens, other=-1)
    mask = (slot >= 0)[:, None] & (j[None, :] < row_len)
    src_k = tl.load(k_ptr + t[:, None] * stride_kt + j[None, :], mask=mask)
    src_v = tl.load(v_ptr + t[:, None] * stride_vt + j[None, :], mask=mask)
    # Caches share one layout (they are halves of one tensor), hence one set of strides.
    dst = (slot // block_size) * stride_cb + (slot % block_size) * stride_cs
    tl.store(kc_ptr + dst[:, None] + j[None, :], src_k, mask=mask)
    tl.store(vc_ptr + dst[:, None] + j[None, :], src_v, mask=mask)


@triton.jit
def _round_to_e4m3(y):
    """y (fp32, |y| <= 448) rounded to the nearest fp8 e4m3 value, ties to even, in fp32:
    adding and removing 1.5·2^(e+20) leaves a multiple of the format's step 2^(e−3) at
    y's binade e (e >= −6: subnormals share the step 2^−9). The cast after it is then
    exact, whichever rounding the cast itself does (Triton's interpreter rounds ties up
    and loses the carry at the top of a binade)."""
    e = ((tl.abs(y).to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    e = tl.maximum(e, -6)
    magic = (((e + 20 + 127) << 23) | (1 << 22)).to(tl.float32, bitcast=True)
    return (y + magic) - magic


@triton.jit
def _quantize_rows(src_ptr, c_ptr, s_ptr, src_off, dst, sdst, mask, keep, QMAX: tl.constexpr,
                   IS_INT8: tl.constexpr):  # fmt: skip
    x = tl.load(src_ptr + src_off, mask=mask, other=0.0).to(tl.float32)
    # IEEE divisions (div_rn), as torch's: `/` compiles to an approximate one on CUDA, and
    # a scale or a value one ulp off could round to another integer than the reference.
    amax = tl.max(tl.abs(x), axis=1)
    scale = tl.maximum(tl.div_rn(amax, tl.full(amax.shape, QMAX, tl.float32)), 1e-12)
    y = tl.div_rn(x, tl.broadcast_to(scale[:, None], x.shape))
    if IS_INT8:  # round half away from zero, as kv_quant.quantize
        y = tl.clamp(y + tl.where(y >= 0, 0.5, -0.5), -QMAX, QMAX)
    else:
        y = _round_to_e4m3(tl.clamp(y, -QMAX, QMAX))
    tl.store(c_ptr + dst, y.to(c_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + sdst, scale, mask=keep)


@triton.jit
def _store_kv_quant_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, slot_ptr, n_tokens,
                           head_dim, block_size, stride_kt, stride_vt, stride_cb, stride_cs,
                           stride_ch, stride_sb, stride_ss, QMAX: tl.constexpr,
                           IS_INT8: tl.constexpr, BLOCK_T: tl.constexpr,
                           BLOCK_D: tl.constexpr):  # fmt: skip
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    h = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    slot = tl.load(slot_ptr + t, mask=t < n_tokens, other=-1)
    keep = slot >= 0
    mask = keep[:, None] & (d[None, :] < head_dim)
    dst = (slot // block_size) * stride_cb + (slot % block_size) * stride_cs + h * stride_ch
    sdst = (slot // block_size) * stride_sb + (slot % block_size) * stride_ss + h
    off = dst[:, None] + d[None, :]
    row = h * head_dim + d[None, :]
    _quantize_rows(k_ptr, kc_ptr, ks_ptr, t[:, None] * stride_kt + row, off, sdst, mask, keep,
                   QMAX, IS_INT8)  # fmt: skip
    _quantize_rows(v_ptr, vc_ptr, vs_ptr, t[:, None] * stride_vt + row, off, sdst, mask, keep,
                   QMAX, IS_INT8)  # fmt: skip


def _store_quantized(k, v, k_cache: QuantKV, v_cache: QuantKV, slot_mapping) -> None:
    t, heads, dim = k.shape
    kd, ks, ssb, sss, _ = kernel_operands(k_cache)
    vd, vs, _, _, _ = kernel_operands(v_cache)
    assert kd.stride() == vd.stride() and ks.stride() == vs.stride() and kd.stride(3) == 1
    block_d = pow2(dim)
    rows = pow2(min(t, max(1, 1024 // block_d)))
    args = (k, v, kd, vd, ks, vs, slot_mapping, t, dim, kd.shape[1], k.stride(0), v.stride(0),
            kd.stride(0), kd.stride(1), kd.stride(2), ssb, sss)  # fmt: skip
    kind = k_cache.kv_dtype
    meta = {"QMAX": QMAX[kind], "IS_INT8": kind == "int8", "BLOCK_T": rows, "BLOCK_D": block_d,
            "num_warps": 2}  # fmt: skip
    e, stored = elem_bytes(k.dtype), 1 + ks.element_size() / dim
    launch(_store_kv_quant_kernel, (triton.cdiv(t, rows), heads), args, meta,
           lambda: (flops(t), bytes_moved(t, heads, dim, e, stored)))  # fmt: skip


def store_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    """k, v [T, kv_heads, D] (heads and dims contiguous) into the caches at `slot_mapping`
    (float caches, or `QuantKV` ones: quantised on the way in)."""
    t, heads, dim = k.shape
    assert k.stride(2) == 1 and k.stride(1) == dim and v.stride(2) == 1 and v.stride(1) == dim
    if isinstance(k_cache, QuantKV):
        if t:
            _store_quantized(k, v, k_cache, v_cache, slot_mapping)
        return
    assert k_cache.stride() == v_cache.stride() and k_cache[0, 0].is_contiguous()
    if t == 0:
        return
    row = heads * dim
    block = pow2(row)
    rows = pow2(min(t, max(1, 2048 // block)))
    args = (k, v, k_cache, v_cache, slot_mapping, t, row, k_cache.shape[1], k.stride(0),
            v.stride(0), k_cache.stride(0), k_cache.stride(1))  # fmt: skip
    meta = {"BLOCK_T": rows, "BLOCK": block, "num_warps": 2}
    e = elem_bytes(k.dtype)
    launch(_store_kv_kernel, (triton.cdiv(t, rows),), args, meta,
           lambda: (flops(t), bytes_moved(t, heads, dim, e)))  # fmt: skip

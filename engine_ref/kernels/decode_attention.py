"""Paged decode attention: one query token per sequence over its cached K/V.

Grid (sequence, KV head, split). A program loads the query heads of one GQA group
together, so each K/V tile is read once for the whole group, walks the sequence's
context through its block table in tiles of `BLOCK_N` tokens with an online softmax
(exp2, fp32 statistics), and either writes the output (one split) or a partial output and
its log-sum-exp for `_combine_kernel` (split along the sequence, "flash-decoding": more
programs when the batch alone cannot fill the GPU). Each sequence's context is cut into
`num_splits` ranges of whole tiles from its own length, so one launch serves mixed
lengths and a CUDA graph captured once serves any lengths. A sequence of length 0 (graph
padding) yields zeros. A quantised cache (`kv_quant.QuantKV`) is dequantised tile by
tile (values × their per-token, per-head scales, to the query's dtype) as it is loaded.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..kv_quant import QuantKV, dequantize, kernel_operands
from ._common import dot_precision, elem_bytes, pow2
from .launch import launch


def dense_cache(cache, dtype) -> torch.Tensor:
    """A float cache as is; a QuantKV dequantised to `dtype` (what the kernels read)."""
    if isinstance(cache, QuantKV):
        return dequantize(cache.data, cache.scale, dtype)
    return cache


def ref_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale):
    """q [B, H, D]; caches [blocks, block_size, Hkv, D] (or QuantKV); block_tables [B, W];
    context_lens [B]. Plain fp32 softmax per sequence, one at a time."""
    k_cache, v_cache = dense_cache(k_cache, q.dtype), dense_cache(v_cache, q.dtype)
    b, h, _ = q.shape
    bs, hkv = k_cache.shape[1], k_cache.shape[2]
    out = torch.zeros_like(q)
    for i in range(b):
        n = int(context_lens[i])
        if n == 0:
            continue
        blocks = block_tables[i, : -(-n // bs)].long()
        k = k_cache[blocks].flatten(0, 1)[:n].float().repeat_interleave(h // hkv, dim=1)
        v = v_cache[blocks].flatten(0, 1)[:n].float().repeat_interleave(h // hkv, dim=1)
        p = (torch.einsum("hd,nhd->hn", q[i].float(), k) * scale).softmax(-1)
        out[i] = torch.einsum("hn,nhd->hd", p, v).to(q.dtype)
    return out


def flops(total_context: int, heads: int, head_dim: int) -> int:
    """QKᵀ and PV: 4·H·D per (query, key) pair, one query per sequence (the convention of
    analyzers/model_flops.py: softmax, scale and mask are not counted)."""
    return 4 * heads * head_dim * total_context


def bytes_moved(batch, heads, kv_heads, head_dim, total_context, elem, table_width,
                num_splits=1, kv_elem=None) -> int:  # fmt: skip
    """q read and output written once, each sequence's K/V read once per KV head (the group
    shares the tile) as stored (`kv_elem` bytes per element, scales included; default
    `elem`), block tables and lengths (int32) read once; with splits, the fp32 partial
    outputs and log-sum-exps are written (the combine reads them)."""
    kv_elem = elem if kv_elem is None else kv_elem
    n = 2 * batch * heads * head_dim * elem
    n += int(2 * total_context * kv_heads * head_dim * kv_elem)
    n += 4 * batch * (table_width + 1)
    if num_splits > 1:
        n += 4 * batch * heads * num_splits * (head_dim + 1) - batch * heads * head_dim * elem
    return n


def combine_flops(batch, heads, head_dim, num_splits) -> int:
    return 2 * batch * heads * num_splits * head_dim  # the weighted sum of partial outputs


def combine_bytes(batch, heads, head_dim, num_splits, elem) -> int:
    return 4 * batch * heads * num_splits * (head_dim + 1) + batch * heads * head_dim * elem


@triton.jit
def _decode_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, bt_ptr, len_ptr, o_ptr, lse_ptr,
                   stride_qb, stride_qh, stride_cb, stride_cs, stride_ch, stride_sb, stride_ss,
                   stride_bt, stride_ob, stride_oh, stride_os, scale, head_dim, block_size,
                   GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, PRECISION: tl.constexpr,
                   QUANT: tl.constexpr):  # fmt: skip
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(len_ptr + b)
    per_split = tl.cdiv(tl.cdiv(ctx, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * per_split
    end = tl.minimum(start + per_split, ctx)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    heads = kvh * GROUP + g
    gmask = g < GROUP
    dmask = d < head_dim
    q_ptrs = q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptrs, mask=gmask[:, None] & dmask[None, :], other=0.0)
    qk_scale = scale * 1.4426950408889634  # log2(e): exp2 instead of exp

    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        pmask = pos < end
        blk = tl.load(bt_ptr + b * stride_bt + pos // block_size, mask=pmask, other=0)
        kv_off = blk.to(tl.int64) * stride_cb + (pos % block_size) * stride_cs + kvh * stride_ch
        kv_mask = pmask[:, None] & dmask[None, :]
        k = tl.load(k_ptr + kv_off[:, None] + d[None, :], mask=kv_mask, other=0.0)
        if QUANT:  # values × their (token, head) scale, in the query's dtype
            s_off = blk.to(tl.int64) * stride_sb + (pos % block_size) * stride_ss + kvh
            k_scale = tl.load(ks_ptr + s_off, mask=pmask, other=0.0)
            k = (k.to(tl.float32) * k_scale[:, None]).to(q.dtype)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        s = tl.where(pmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_sum = l_sum * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + kv_off[:, None] + d[None, :], mask=kv_mask, other=0.0)
        if QUANT:
            v_scale = tl.load(vs_ptr + s_off, mask=pmask, other=0.0)
            v = (v.to(tl.float32) * v_scale[:, None]).to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new

    has = l_sum > 0
    out = acc / tl.where(has, l_sum, 1.0)[:, None]
    o_ptrs = o_ptr + b * stride_ob + heads[:, None] * stride_oh + split * stride_os + d[None, :]
    omask = gmask[:, None] & dmask[None, :]
    if NUM_SPLITS == 1:
        tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=omask)
    else:
        tl.store(o_ptrs, out, mask=omask)
        lse = tl.where(has, m + tl.log2(tl.where(has, l_sum, 1.0)), float("-inf"))
        tl.store(
            lse_ptr + (b * GROUP * tl.num_programs(1) + heads) * NUM_SPLITS + split, lse, mask=gmask
        )


@triton.jit
def _combine_kernel(part_ptr, lse_ptr, o_ptr, head_dim, stride_pb, stride_ph, stride_ps,
                    stride_ob, stride_oh, NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
                    BLOCK_D: tl.constexpr):  # fmt: skip
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    smask = s < NUM_SPLITS
    lse = tl.load(
        lse_ptr + (b * tl.num_programs(1) + h) * NUM_SPLITS + s, mask=smask, other=float("-inf")
    )
    top = tl.max(lse, axis=0)
    live = lse > float("-inf")
    w = tl.where(live, tl.exp2(lse - tl.where(live, top, 0.0)), 0.0)
    total = tl.sum(w, axis=0)
    part_ptrs = part_ptr + b * stride_pb + h * stride_ph + s[:, None] * stride_ps + d[None, :]
    part = tl.load(part_ptrs, mask=live[:, None] & (d[None, :] < head_dim), other=0.0)
    out = tl.sum(w[:, None] * part, axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(
        o_ptr + b * stride_ob + h * stride_oh + d, out.to(o_ptr.dtype.element_ty), mask=d < head_dim
    )


def choose_num_splits(batch: int, kv_heads: int, max_context: int, num_sms: int) -> int:
    """Enough programs for about two waves of the GPU's multiprocessors, never a split
    shorter than 256 tokens, at most 16; 1 in the interpreter (num_sms 0)."""
    if num_sms <= 0:
        return 1
    want = triton.cdiv(2 * num_sms, max(1, batch * kv_heads))
    return max(1, min(want, triton.cdiv(max_context, 256), 16))


def decode_attention(
    q,
    k_cache,
    v_cache,
    block_tables,
    context_lens,
    scale: float,
    num_splits: int = 1,
    total_context: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [B, H, D] (last dim contiguous) → [B, H, D] (into `out` when given). Caches are
    float tensors or `QuantKV`. `total_context` (the sum of `context_lens`, known on the
    host) feeds the cost model; None reads it back from the device when a probe asks."""
    k_cache, k_scale, stride_sb, stride_ss, quant = kernel_operands(k_cache)
    v_cache, v_scale, _, _, _ = kernel_operands(v_cache)
    b, h, dim = q.shape
    hkv, block_size = k_cache.shape[2], k_cache.shape[1]
    group = h // hkv
    assert q.stride(2) == 1 and k_cache.stride() == v_cache.stride() and k_cache.stride(3) == 1
    out = torch.empty((b, h, dim), dtype=q.dtype, device=q.device) if out is None else out
    if b == 0:
        return out
    block_n = 64  # whole blocks of the usual sizes (16, 32, 64) per tile
    block_d = pow2(dim, 16)
    s_count = max(1, int(num_splits))
    if s_count == 1:
        dest, lse, so = out, out, (out.stride(0), out.stride(1), 0)
    else:
        dest = torch.empty((b, h, s_count, dim), dtype=torch.float32, device=q.device)
        lse = torch.empty((b, h, s_count), dtype=torch.float32, device=q.device)
        so = (dest.stride(0), dest.stride(1), dest.stride(2))
    args = (
        q,
        k_cache,
        v_cache,
        k_scale,
        v_scale,
        block_tables,
        context_lens,
        dest,
        lse,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        stride_sb,
        stride_ss,
        block_tables.stride(0),
        *so,
        scale,
        dim,
        block_size,
    )
    meta = {
        "GROUP": group,
        "BLOCK_G": pow2(group, 16),
        "BLOCK_D": block_d,
        "BLOCK_N": block_n,
        "NUM_SPLITS": s_count,
        "PRECISION": dot_precision(q.dtype),
        "QUANT": quant,
        "num_warps": 4,
    }
    e, width = elem_bytes(q.dtype), block_tables.shape[1]
    kv_e = k_cache.element_size() + (k_scale.element_size() / dim if quant else 0)

    def cost():
        total = int(context_lens.sum()) if total_context is None else total_context
        return flops(total, h, dim), bytes_moved(b, h, hkv, dim, total, e, width, s_count, kv_e)

    launch(_decode_kernel, (b, hkv, s_count), args, meta, cost)
    if s_count > 1:
        args = (dest, lse, out, dim, *so, out.stride(0), out.stride(1))
        meta = {"NUM_SPLITS": s_count, "BLOCK_S": pow2(s_count), "BLOCK_D": block_d}
        launch(
            _combine_kernel,
            (b, h),
            args,
            meta,
            lambda: (combine_flops(b, h, dim, s_count), combine_bytes(b, h, dim, s_count, e)),
        )
    return out

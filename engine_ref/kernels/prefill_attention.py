"""Prefill attention over paged KV with a cached prefix: flash-style, causal, variable
lengths.

Sequence i computes queries `q[cu_q[i]:cu_q[i+1]]` (n tokens) whose K/V are already in
the cache (the backend stores them first) after `context_lens[i] − n` cached ones, so its
queries sit at positions `c .. c+n−1` and query j attends keys `0 .. c+j`. A prefix may end
anywhere in a block. Grid (query tile, sequence, KV head): each program keeps one tile of
`BLOCK_M` rows (query tokens × the query heads of one GQA group) in registers, walks K/V
tiles through the block table up to its last query's position with an online softmax,
and never writes the score matrix.
Sequences of one token (decodes) are just n = 1. A quantised cache (`kv_quant.QuantKV`)
is dequantised tile by tile as it is loaded, as in decode_attention.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..kv_quant import kernel_operands
from ._common import dot_precision, elem_bytes, pow2
from .decode_attention import dense_cache
from .launch import launch


def ref_prefill_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale):
    """q [T, H, D]; caches [blocks, block_size, Hkv, D]; block_tables [S, W]; cu_seqlens_q
    [S+1]; context_lens [S] (cached + new). Plain fp32 masked softmax per sequence.
    Caches may be QuantKV (read dequantised to q's dtype)."""
    k_cache, v_cache = dense_cache(k_cache, q.dtype), dense_cache(v_cache, q.dtype)
    h, bs, hkv = q.shape[1], k_cache.shape[1], k_cache.shape[2]
    out = torch.zeros_like(q)
    for i in range(len(context_lens)):
        a, b, ctx = int(cu_seqlens_q[i]), int(cu_seqlens_q[i + 1]), int(context_lens[i])
        blocks = block_tables[i, : -(-ctx // bs)].long()
        k = k_cache[blocks].flatten(0, 1)[:ctx].float().repeat_interleave(h // hkv, dim=1)
        v = v_cache[blocks].flatten(0, 1)[:ctx].float().repeat_interleave(h // hkv, dim=1)
        s = torch.einsum("qhd,khd->hqk", q[a:b].float(), k) * scale
        qpos = torch.arange(ctx - (b - a), ctx, device=q.device)[:, None]
        s = s.masked_fill(torch.arange(ctx, device=q.device)[None, :] > qpos, float("-inf"))
        out[a:b] = torch.einsum("hqk,khd->qhd", s.softmax(-1), v).to(q.dtype)
    return out


def causal_pairs(query_lens, context_lens) -> int:
    """(query, key) pairs a causal mask keeps: n·c + n(n+1)/2 per sequence, c = cached."""
    return sum(
        n * (c - n) + n * (n + 1) // 2 for n, c in zip(query_lens, context_lens, strict=True)
    )


def flops(pairs: int, heads: int, head_dim: int) -> int:
    """QKᵀ and PV over the kept pairs: 4·H·D each (analyzers/model_flops.py, causal exact)."""
    return 4 * heads * head_dim * pairs


def bytes_moved(num_tokens, heads, kv_heads, head_dim, total_context, num_seqs, elem,
                table_width, kv_elem=None) -> int:  # fmt: skip
    """Ideal traffic, as analyzers/model_flops.py counts it: q read and output written once,
    each sequence's K/V read once per KV head as stored (`kv_elem` bytes per element,
    scales included; default `elem`), tables, lengths and query offsets (int32).
    The kernel re-reads K/V per query tile and per head of a group (from cache, mostly)."""
    kv_elem = elem if kv_elem is None else kv_elem
    n = 2 * num_tokens * heads * head_dim * elem
    n += int(2 * total_context * kv_heads * head_dim * kv_elem)
    return n + 4 * num_seqs * (table_width + 2) + 4


@triton.jit
def _prefill_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, bt_ptr, cu_ptr, len_ptr, o_ptr,
                    stride_qt, stride_qh, stride_cb, stride_cs, stride_ch, stride_sb, stride_ss,
                    stride_bt, stride_ot, stride_oh, scale, head_dim, block_size,
                    GROUP: tl.constexpr, TOK: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
                    QUANT: tl.constexpr):  # fmt: skip
    tile = tl.program_id(0)
    seq = tl.program_id(1)
    kvh = tl.program_id(2)
    q_start = tl.load(cu_ptr + seq)
    n_q = tl.load(cu_ptr + seq + 1) - q_start
    ctx = tl.load(len_ptr + seq)
    cached = ctx - n_q
    # A tile's rows are TOK tokens × the GROUP query heads sharing this KV head, so each
    # K/V tile is loaded once for the whole group.
    r = tl.arange(0, BLOCK_M)
    tok = tile * TOK + r // GROUP
    head = kvh * GROUP + r % GROUP
    rmask = (r < TOK * GROUP) & (tok < n_q)
    d = tl.arange(0, BLOCK_D)
    dmask = d < head_dim
    q_ptrs = q_ptr + (q_start + tok)[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptrs, mask=rmask[:, None] & dmask[None, :], other=0.0)
    qpos = cached + tok
    qk_scale = scale * 1.4426950408889634  # log2(e): exp2 instead of exp

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # Keys up to the tile's last query (0 iterations for a tile past the sequence's end).
    kv_end = tl.where(tile * TOK < n_q, tl.minimum(ctx, cached + (tile + 1) * TOK), 0)
    for n0 in range(0, kv_end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        pmask = pos < kv_end
        blk = tl.load(bt_ptr + seq * stride_bt + pos // block_size, mask=pmask, other=0)
        kv_off = blk.to(tl.int64) * stride_cb + (pos % block_size) * stride_cs + kvh * stride_ch
        kv_mask = pmask[:, None] & dmask[None, :]
        k = tl.load(k_ptr + kv_off[:, None] + d[None, :], mask=kv_mask, other=0.0)
        if QUANT:  # values × their (token, head) scale, in the query's dtype
            s_off = blk.to(tl.int64) * stride_sb + (pos % block_size) * stride_ss + kvh
            k_scale = tl.load(ks_ptr + s_off, mask=pmask, other=0.0)
            k = (k.to(tl.float32) * k_scale[:, None]).to(q.dtype)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        keep = pmask[None, :] & (pos[None, :] <= qpos[:, None])
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)  # a row with no key yet
        alpha = tl.exp2(m - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_sum = l_sum * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + kv_off[:, None] + d[None, :], mask=kv_mask, other=0.0)
        if QUANT:
            v_scale = tl.load(vs_ptr + s_off, mask=pmask, other=0.0)
            v = (v.to(tl.float32) * v_scale[:, None]).to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new

    out = acc / tl.where(l_sum > 0, l_sum, 1.0)[:, None]
    o_ptrs = o_ptr + (q_start + tok)[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :]
    tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=rmask[:, None] & dmask[None, :])


def prefill_attention(
    q,
    k_cache,
    v_cache,
    block_tables,
    cu_seqlens_q,
    context_lens,
    scale: float,
    max_query_len: int,
    pairs: int | None = None,
    total_context: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [T, H, D] (last dim contiguous) → [T, H, D] (into `out` when given). `pairs` and
    `total_context` (host-side sums) feed the cost model; None reads them back from the
    device when a probe asks."""
    k_cache, k_scale, stride_sb, stride_ss, quant = kernel_operands(k_cache)
    v_cache, v_scale, _, _, _ = kernel_operands(v_cache)
    t, h, dim = q.shape
    num_seqs = context_lens.shape[0]
    hkv, block_size = k_cache.shape[2], k_cache.shape[1]
    assert q.stride(2) == 1 and k_cache.stride() == v_cache.stride() and k_cache.stride(3) == 1
    out = torch.empty((t, h, dim), dtype=q.dtype, device=q.device) if out is None else out
    if num_seqs == 0:
        return out
    group = h // hkv
    block_m = pow2(min(max_query_len * group, 64), max(16, pow2(group)))
    tok = block_m // group  # query tokens per tile
    block_n = 32 if max_query_len > 16 else 16
    grid = (triton.cdiv(max_query_len, tok), num_seqs, hkv)
    args = (
        q,
        k_cache,
        v_cache,
        k_scale,
        v_scale,
        block_tables,
        cu_seqlens_q,
        context_lens,
        out,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        stride_sb,
        stride_ss,
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        scale,
        dim,
        block_size,
    )
    meta = {
        "GROUP": group,
        "TOK": tok,
        "BLOCK_M": block_m,
        "BLOCK_N": block_n,
        "BLOCK_D": pow2(dim, 16),
        "PRECISION": dot_precision(q.dtype),
        "QUANT": quant,
        "num_warps": 4,
    }
    e, width = elem_bytes(q.dtype), block_tables.shape[1]
    kv_e = k_cache.element_size() + (k_scale.element_size() / dim if quant else 0)

    def cost():
        lens = context_lens.tolist() if pairs is None or total_context is None else None
        n_q = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).tolist() if lens else None
        p = causal_pairs(n_q, lens) if pairs is None else pairs
        c = sum(lens) if total_context is None else total_context
        return flops(p, h, dim), bytes_moved(t, h, hkv, dim, c, num_seqs, e, width, kv_e)

    launch(_prefill_kernel, grid, args, meta, cost)
    return out

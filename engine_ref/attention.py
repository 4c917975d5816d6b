"""Attention over the paged KV cache, in PyTorch.

A backend is one function `(q, k, v, k_cache, v_cache, meta, scale) -> out` that first stores
this step's K/V at `meta.slot_mapping`, then attends each query over its sequence's context
gathered through the block table. `BACKENDS` is the seam where a Triton backend plugs in
later. Shapes: q [T, H, D], k/v [T, Hkv, D], caches [num_blocks, block_size, Hkv, D].

The runner orders a batch so that single-token queries (decodes) come first: they run as
one padded, masked batch; longer queries (prefill chunks) run one sequence at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class PrefillSlice:
    start: int  # token range [start, end) of this sequence in the batch
    end: int
    context_len: int  # tokens of context after this step (cached + new)
    block_ids: torch.Tensor  # [ceil(context_len / block_size)] long
    mask: torch.Tensor | None  # [q, context] bool; None when there is no cached context


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] long: cache slot of each new token
    num_decode: int  # the first num_decode tokens are single-token queries, one per sequence
    decode_block_tables: torch.Tensor | None  # [Bd, max_blocks] long (padded with block 0)
    decode_mask: torch.Tensor | None  # [Bd, max_blocks * block_size] bool: position < context
    prefills: list[PrefillSlice]


def store_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    kv_heads, dim = k_cache.shape[-2:]
    k_cache.view(-1, kv_heads, dim).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, kv_heads, dim).index_copy_(0, slot_mapping, v)


def _gather(cache: torch.Tensor, block_ids: torch.Tensor, length: int) -> torch.Tensor:
    """Context [length, Hkv, D] of one sequence, read through its block table."""
    return cache.index_select(0, block_ids).flatten(0, 1)[:length]


def _gather_batch(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """[B, max_blocks * block_size, Hkv, D]; padded positions are masked by the caller."""
    b, n = block_tables.shape
    return cache.index_select(0, block_tables.view(-1)).view(
        b, n * cache.shape[1], *cache.shape[2:]
    )


def sdpa_attention(q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float):
    store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
    out = torch.empty_like(q)
    nd = meta.num_decode
    if nd:
        kk = _gather_batch(k_cache, meta.decode_block_tables).transpose(1, 2)
        vv = _gather_batch(v_cache, meta.decode_block_tables).transpose(1, 2)
        mask = meta.decode_mask[:, None, None, :]
        o = F.scaled_dot_product_attention(
            q[:nd, :, None, :], kk, vv, attn_mask=mask, scale=scale, enable_gqa=True
        )
        if not meta.prefills:  # decode-only step: no scatter into `out`
            return o[:, :, 0, :]
        out[:nd] = o[:, :, 0, :]
    for p in meta.prefills:
        qs = q[p.start : p.end].transpose(0, 1)
        if p.mask is None:  # no cached context: this chunk's own K/V is the whole context
            kk, vv = k[p.start : p.end], v[p.start : p.end]
        else:
            kk = _gather(k_cache, p.block_ids, p.context_len)
            vv = _gather(v_cache, p.block_ids, p.context_len)
        o = F.scaled_dot_product_attention(
            qs,
            kk.transpose(0, 1),
            vv.transpose(0, 1),
            attn_mask=p.mask,
            is_causal=p.mask is None,
            scale=scale,
            enable_gqa=True,
        )
        out[p.start : p.end] = o.transpose(0, 1)
    return out


def _naive(q, kk, vv, mask, scale):
    """Plain softmax attention in fp32. q [B, H, Q, D], kk/vv [B, Hkv, S, D], mask [.., Q, S]."""
    group = q.shape[1] // kk.shape[1]
    kk = kk.repeat_interleave(group, dim=1).float()
    vv = vv.repeat_interleave(group, dim=1).float()
    scores = (q.float() @ kk.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    return (scores.softmax(-1) @ vv).to(q.dtype)


def naive_attention(q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float):
    store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
    out = torch.empty_like(q)
    nd = meta.num_decode
    if nd:
        kk = _gather_batch(k_cache, meta.decode_block_tables).transpose(1, 2)
        vv = _gather_batch(v_cache, meta.decode_block_tables).transpose(1, 2)
        o = _naive(q[:nd, :, None, :], kk, vv, meta.decode_mask[:, None, None, :], scale)
        out[:nd] = o[:, :, 0, :]
    for p in meta.prefills:
        n = p.end - p.start
        if p.mask is None:
            kk, vv = k[p.start : p.end], v[p.start : p.end]
            mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        else:
            kk = _gather(k_cache, p.block_ids, p.context_len)
            vv = _gather(v_cache, p.block_ids, p.context_len)
            mask = p.mask
        o = _naive(
            q[p.start : p.end].transpose(0, 1)[None],
            kk.transpose(0, 1)[None],
            vv.transpose(0, 1)[None],
            mask,
            scale,
        )
        out[p.start : p.end] = o[0].transpose(0, 1)
    return out


AttentionBackend = Callable[..., torch.Tensor]
BACKENDS: dict[str, AttentionBackend] = {"sdpa": sdpa_attention, "naive": naive_attention}

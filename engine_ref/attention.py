"""Attention over the paged KV cache, in PyTorch.

A backend is one function `(q, k, v, k_cache, v_cache, meta, scale) -> out` that first stores
this step's K/V at `meta.slot_mapping`, then attends each query over its sequence's context
gathered through the block table. `BACKENDS` is the seam where a Triton backend plugs in
later. Shapes: q [T, H, D], k/v [T, Hkv, D], caches [num_blocks, block_size, Hkv, D].

The runner orders a batch so that single-token queries (decodes) come first: they run as
one batch over contexts padded to the longest (masked; no mask when all are equal); longer
queries (prefill chunks) run one sequence at a time with a causal mask offset by their
cached context. Both PyTorch backends share that paging and differ in the softmax kernel.

A quantised cache (`kv_quant.QuantKV`, `--kv-dtype int8|fp8`) is quantised on write and
its blocks dequantised to the query's dtype on read; every query then reads its context
from the cache, a first prefill chunk's own K/V too, so each token's K/V is seen the same
way by every query (as the Triton kernels, which always read the cache, see it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .kv_quant import QuantKV, read_blocks
from .kv_quant import store as store_quantized


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
    decode_block_tables: torch.Tensor | None  # [Bd, max_blocks] long (padded: own last block)
    # [Bd, max_blocks * block_size] bool, position < context; None when every decode has the
    # same context length (the gathered context is then cut to it and needs no mask)
    decode_mask: torch.Tensor | None
    decode_context_len: int  # the longest decode context
    prefills: list[PrefillSlice]
    kernel: Any = None  # kernels.backend.KernelMeta when the Triton kernels run the step


# attend(q [B, H, Q, D], k [B, Hkv, S, D], v, mask [B|1, 1, Q, S] bool | None, causal, scale)
Kernel = Callable[..., torch.Tensor]


def _sdpa(q, k, v, mask, causal: bool, scale: float) -> torch.Tensor:
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True
    )


def _softmax(q, k, v, mask, causal: bool, scale: float) -> torch.Tensor:
    """Plain softmax attention, computed in fp32."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1).float()
    v = v.repeat_interleave(group, dim=1).float()
    scores = (q.float() @ k.transpose(-1, -2)) * scale
    if causal:
        n = q.shape[-2]
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return (scores.softmax(-1) @ v).to(q.dtype)


def store_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    if isinstance(k_cache, QuantKV):
        store_quantized(k, k_cache, slot_mapping)
        store_quantized(v, v_cache, slot_mapping)
        return
    kv_heads, dim = k_cache.shape[-2:]
    k_cache.view(-1, kv_heads, dim).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, kv_heads, dim).index_copy_(0, slot_mapping, v)


def _gather(cache, block_ids: torch.Tensor, length: int, dtype) -> torch.Tensor:
    """Context [Hkv, length, D] of one sequence, read through its block table."""
    return read_blocks(cache, block_ids, dtype).flatten(0, 1)[:length].transpose(0, 1)


def _gather_decodes(cache, meta: AttentionMetadata, dtype) -> torch.Tensor:
    """Contexts [Bd, Hkv, S, D] of the decodes."""
    b, n = meta.decode_block_tables.shape
    g = read_blocks(cache, meta.decode_block_tables.view(-1), dtype)
    g = g.view(b, n * cache.shape[1], *cache.shape[2:])
    if meta.decode_mask is None:
        g = g[:, : meta.decode_context_len]
    return g.transpose(1, 2)


def paged_attention(q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale, attend: Kernel):
    store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
    nd = meta.num_decode
    if nd:
        mask = None if meta.decode_mask is None else meta.decode_mask[:, None, None, :]
        kk, vv = _gather_decodes(k_cache, meta, q.dtype), _gather_decodes(v_cache, meta, q.dtype)
        o = attend(q[:nd, :, None, :], kk, vv, mask, False, scale)[:, :, 0, :]
        if not meta.prefills:  # a decode-only step: no scatter into a fresh output
            return o
    out = torch.empty_like(q)
    if nd:
        out[:nd] = o
    quant = isinstance(k_cache, QuantKV)
    for p in meta.prefills:
        qs = q[p.start : p.end].transpose(0, 1)[None]
        if p.mask is None and not quant:  # no cached context: this chunk's own K/V is all
            kk, vv = k[p.start : p.end].transpose(0, 1), v[p.start : p.end].transpose(0, 1)
        else:
            kk = _gather(k_cache, p.block_ids, p.context_len, q.dtype)
            vv = _gather(v_cache, p.block_ids, p.context_len, q.dtype)
        o = attend(qs, kk[None], vv[None], p.mask, p.mask is None, scale)
        out[p.start : p.end] = o[0].transpose(0, 1)
    return out


def sdpa_attention(q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float):
    return paged_attention(q, k, v, k_cache, v_cache, meta, scale, _sdpa)


def naive_attention(q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float):
    return paged_attention(q, k, v, k_cache, v_cache, meta, scale, _softmax)


AttentionBackend = Callable[..., torch.Tensor]
BACKENDS: dict[str, AttentionBackend] = {"sdpa": sdpa_attention, "naive": naive_attention}

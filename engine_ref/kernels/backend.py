"""The engine's attention over the Triton kernels, and the per-step metadata they need.

The batch is the runner's: decodes (one query token each) first, prefill chunks after.
A step stores its new K/V in the cache first (`kv_store`), then decodes run through
`decode_attention` and prefill chunks through `prefill_attention`, both reading every key
from the paged cache. `KernelMeta` holds the int32 block tables, lengths and query
offsets the kernels read, built once per step from the runner's host-side lists, and the
host-side sums the cost models need (so a probe never reads the device for them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .decode_attention import choose_num_splits, decode_attention
from .kv_store import store_kv
from .prefill_attention import causal_pairs, prefill_attention


@dataclass
class KernelMeta:
    decode_block_tables: torch.Tensor | None  # [Bd, W] int32
    decode_context_lens: torch.Tensor | None  # [Bd] int32
    decode_context_total: int | None  # Σ decode context lengths (None: unknown on the host)
    num_splits: int
    prefill_block_tables: torch.Tensor | None  # [P, W] int32
    prefill_cu_q: torch.Tensor | None  # [P+1] int32, offsets from the first prefill token
    prefill_context_lens: torch.Tensor | None  # [P] int32, cached + new
    prefill_max_q: int = 0
    prefill_pairs: int = 0  # causal (query, key) pairs kept
    prefill_context_total: int = 0


def _table(rows: list[list[int]], device) -> torch.Tensor:
    width = max(len(r) for r in rows)
    # Short rows are padded with their own last block: never read (past the length).
    return torch.tensor([r + [r[-1]] * (width - len(r)) for r in rows], dtype=torch.int32,
                        device=device)  # fmt: skip


def build_kernel_meta(
    decode_tables: list[list[int]],
    decode_ctx: list[int],
    prefill_tables: list[list[int]],
    prefill_q: list[int],
    prefill_ctx: list[int],
    device: torch.device,
    kv_heads: int,
    num_sms: int = 0,
) -> KernelMeta:
    """From the runner's lists: per decode its blocks and context length, per prefill
    chunk its blocks, query tokens and context length (cached + new). `num_sms` 0 (the
    CPU) never splits decodes along the sequence."""
    dt = dl = pt = cu = pl = None
    splits = 1
    if decode_tables:
        dt = _table(decode_tables, device)
        dl = torch.tensor(decode_ctx, dtype=torch.int32, device=device)
        splits = choose_num_splits(len(decode_ctx), kv_heads, max(decode_ctx), num_sms)
    if prefill_tables:
        pt = _table(prefill_tables, device)
        offsets = [0]
        for n in prefill_q:
            offsets.append(offsets[-1] + n)
        cu = torch.tensor(offsets, dtype=torch.int32, device=device)
        pl = torch.tensor(prefill_ctx, dtype=torch.int32, device=device)
    return KernelMeta(
        dt, dl, sum(decode_ctx), splits, pt, cu, pl, max(prefill_q, default=0),
        causal_pairs(prefill_q, prefill_ctx), sum(prefill_ctx),
    )  # fmt: skip


def triton_attention(q, k, v, k_cache, v_cache, meta, scale: float) -> torch.Tensor:
    """The `attention.BACKENDS` signature; `meta.kernel` is a KernelMeta."""
    km: KernelMeta = meta.kernel
    store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
    t, h, d = q.shape
    out = torch.empty((t, h, d), dtype=q.dtype, device=q.device)
    nd = meta.num_decode
    if nd:
        decode_attention(q[:nd], k_cache, v_cache, km.decode_block_tables,
                         km.decode_context_lens, scale, km.num_splits, km.decode_context_total,
                         out=out[:nd])  # fmt: skip
    if nd < t:
        prefill_attention(q[nd:], k_cache, v_cache, km.prefill_block_tables, km.prefill_cu_q,
                          km.prefill_context_lens, scale, km.prefill_max_q, km.prefill_pairs,
                          km.prefill_context_total, out=out[nd:])  # fmt: skip
    return out

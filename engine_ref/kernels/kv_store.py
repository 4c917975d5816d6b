"""New K/V into the paged cache: token i goes to slot `slot_mapping[i]` (block · block_size
+ offset). A negative slot is skipped: CUDA-graph batches are padded with slot −1, so the
padding writes nowhere. Caches are one layer's [blocks, block_size, kv_heads, D].
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import elem_bytes, pow2
from .launch import launch


def ref_store_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    keep = slot_mapping >= 0
    heads, dim = k_cache.shape[-2:]
    k_cache.view(-1, heads, dim)[slot_mapping[keep]] = k[keep]
    v_cache.view(-1, heads, dim)[slot_mapping[keep]] = v[keep]


def flops(num_tokens: int) -> int:
    return 0  # a copy


def bytes_moved(num_tokens: int, kv_heads: int, head_dim: int, elem: int) -> int:
    """K and V read and written once, and each token's slot (8 bytes)."""
    return 4 * num_tokens * kv_heads * head_dim * elem + 8 * num_tokens


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


def store_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    """k, v [T, kv_heads, D] (heads and dims contiguous) into the caches at `slot_mapping`."""
    t, heads, dim = k.shape
    assert k_cache.stride() == v_cache.stride() and k_cache[0, 0].is_contiguous()
    assert k.stride(2) == 1 and k.stride(1) == dim and v.stride(2) == 1 and v.stride(1) == dim
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

"""Fused CPU kernels for decode steps, compiled by Numba (`kernel_backend="numba"`).

Why: a batch-1 decode on a CPU is a chain of GEMVs (at memory bandwidth) with ~35 small
PyTorch ops per layer between them. Each small op costs 10-20 µs of dispatch, and 50-90 µs
right after a GEMV has streamed megabytes of weights through the caches (the dispatcher's
code and data are evicted: measured on SmolLM2-135M, 14 ms of a 40 ms step). These kernels
do the work between two GEMVs: residual add + RMSNorm, RoPE + KV store + paged attention,
SiLU-and-multiply, each on one thread, accumulating in fp32 like the PyTorch path (only the
order of the sums differs). `decode_step` runs a whole decode step in one call, its GEMVs
through BLAS (np.dot: SciPy's OpenBLAS, on the threads torch is given), so no Python or
PyTorch dispatch sits between two GEMVs.

Arrays: activations [T, width] float32 C-contiguous; caches [blocks, block_size, kv_heads,
head_dim]; rope tables [positions, head_dim] (the sin table carries rotate-half's sign, as
`model.RotaryEmbedding` builds it).
"""

from __future__ import annotations

import numpy as np
from numba import njit

# Reassociation lets LLVM vectorise the reductions; no finite-math flags: -inf is a value
# the softmax relies on.
_FAST = {"reassoc", "contract", "arcp", "nsz"}


@njit(cache=True, fastmath=_FAST)
def rms_norm(x, weight, eps, out):
    """out = x / sqrt(mean(x²) + eps) · weight, row by row."""
    rows, width = x.shape
    for t in range(rows):
        ss = np.float32(0.0)
        for i in range(width):
            ss += x[t, i] * x[t, i]
        r = np.float32(1.0) / np.sqrt(ss / np.float32(width) + eps)
        for i in range(width):
            out[t, i] = x[t, i] * r * weight[i]


@njit(cache=True, fastmath=_FAST)
def add_rms_norm(residual, h, weight, eps, out):
    """residual += h (in place, the residual stream); out = rms_norm(residual)."""
    rows, width = residual.shape
    for t in range(rows):
        for i in range(width):
            residual[t, i] += h[t, i]
    rms_norm(residual, weight, eps, out)


@njit(cache=True, fastmath=_FAST)
def silu_mul(gate_up, out):
    """out = silu(gate) · up, gate and up being the two halves of each row."""
    rows, both = gate_up.shape
    n = both // 2
    for t in range(rows):
        for i in range(n):
            g = gate_up[t, i]
            out[t, i] = g / (np.float32(1.0) + np.exp(-g)) * gate_up[t, n + i]


@njit(cache=True, fastmath=_FAST)
def decode_attention(
    qkv, positions, cos, sin_signed, k_cache, v_cache, block_tables, slots, num_heads, scale, out
):
    """One query token per sequence: RoPE on its q and k heads, K/V stored at its slot, then
    attention over its context (positions 0..position, read through its block table).

    qkv [B, (H + 2·Hkv)·D] (q heads, k heads, v heads); out [B, H·D].
    """
    batch = qkv.shape[0]
    block_size, kv_heads, dim = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    half = dim // 2
    group = num_heads // kv_heads
    q = np.empty((num_heads, dim), np.float32)
    for b in range(batch):
        pos = positions[b]
        slot = slots[b]
        sb, so = slot // block_size, slot % block_size
        for hh in range(num_heads + kv_heads):  # RoPE: x·cos + rotate_half(x)·sin
            base = hh * dim
            for i in range(dim):
                j = i + half if i < half else i - half
                v = qkv[b, base + i] * cos[pos, i] + qkv[b, base + j] * sin_signed[pos, i]
                if hh < num_heads:
                    q[hh, i] = v
                else:
                    k_cache[sb, so, hh - num_heads, i] = v
        vbase = (num_heads + kv_heads) * dim
        for g in range(kv_heads):
            for i in range(dim):
                v_cache[sb, so, g, i] = qkv[b, vbase + g * dim + i]
        # Each K and V row is read once for the `group` query heads that share it.
        n = pos + 1
        scores = np.empty((group, n), np.float32)
        for g in range(kv_heads):
            h0 = g * group
            for p in range(n):
                blk, off = block_tables[b, p // block_size], p % block_size
                for j in range(group):
                    s = np.float32(0.0)
                    for i in range(dim):
                        s += q[h0 + j, i] * k_cache[blk, off, g, i]
                    scores[j, p] = s * scale
            for j in range(group):
                top = np.float32(-np.inf)
                for p in range(n):
                    top = max(top, scores[j, p])
                total = np.float32(0.0)
                for p in range(n):
                    e = np.exp(scores[j, p] - top)
                    scores[j, p] = e
                    total += e
                for p in range(n):
                    scores[j, p] /= total
            o = out[b, h0 * dim : (h0 + group) * dim]
            o[:] = 0.0
            for p in range(n):
                blk, off = block_tables[b, p // block_size], p % block_size
                for j in range(group):
                    w = scores[j, p]
                    for i in range(dim):
                        o[j * dim + i] += w * v_cache[blk, off, g, i]


@njit(cache=True, nogil=True)
def gemv(x, w, bias):
    """x [1, in] @ w[out, in]ᵀ (+ bias) -> [1, out]: one GEMV, reading the weight once."""
    y = np.dot(w, x[0]).reshape(1, w.shape[0])
    if bias.shape[0]:
        y += bias
    return y


@njit(cache=True, nogil=True)  # --dp replicas step on threads of one process
def decode_step(
    residual, positions, slots, block_tables, cos, sin_signed, input_norms, post_norms,
    final_norm, qkv_w, qkv_b, o_w, o_b, gate_up_w, down_w, k_caches, v_caches, num_heads, eps,
    scale, out,
):  # fmt: skip
    """Every layer of a one-token decode step in one call: GEMVs through BLAS, the rest
    fused. residual [1, hidden] is the embedded token (updated in place); out [1, hidden]
    gets the final normed hidden state. Per-layer weights come as lists (bias lists hold
    empty arrays when the model has none)."""
    no_bias = np.empty(0, np.float32)
    rms_norm(residual, input_norms[0], eps, out)
    for i in range(len(qkv_w)):
        qkv = gemv(out, qkv_w[i], qkv_b[i])
        attn = np.empty((qkv.shape[0], o_w[i].shape[1]), np.float32)
        decode_attention(qkv, positions, cos, sin_signed, k_caches[i], v_caches[i],
                         block_tables, slots, num_heads, scale, attn)  # fmt: skip
        add_rms_norm(residual, gemv(attn, o_w[i], o_b[i]), post_norms[i], eps, out)
        gate_up = gemv(out, gate_up_w[i], no_bias)
        act = np.empty((gate_up.shape[0], gate_up.shape[1] // 2), np.float32)
        silu_mul(gate_up, act)
        nxt = input_norms[i + 1] if i + 1 < len(qkv_w) else final_norm
        add_rms_norm(residual, gemv(act, down_w[i], no_bias), nxt, eps, out)

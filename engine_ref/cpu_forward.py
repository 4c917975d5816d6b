"""The decoder's forward pass through the fused CPU kernels (`kernel_backend="numba"`).

A step that decodes one token (batch-1 decode: the latency case) runs as one compiled call,
`cpu_kernels.decode_step`: every layer's GEMVs through BLAS (at memory bandwidth) and one
fused kernel between each pair, with no Python or PyTorch dispatch in between, and its
logits through the same BLAS. Every other step runs the PyTorch path: for a batch, MKL's
GEMMs read each weight once for all rows (OpenBLAS packs the weight: 2 rows cost 2-3× one)
and its attention runs on every core. The weights are the model's own tensors, seen as
NumPy arrays (no copy).
"""

from __future__ import annotations

import os
import sys

# OpenBLAS's idle threads spin 2^28 cycles (~0.1 s) after each call, taking cores from the
# PyTorch step that follows (-c 1 serving: TTFT p50 +15-30 % with prefill after decode);
# 2^20 cycles (~0.4 ms) still spans the gaps between one step's GEMVs. OpenBLAS reads it
# when it loads: only if nothing has imported scipy.linalg yet (else set it yourself).
if "scipy.linalg" not in sys.modules:
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")

import numpy as np
import scipy.linalg.cython_blas  # noqa: F401  the BLAS Numba calls, loaded for threadpoolctl
import torch
from numba.typed import List

from . import cpu_kernels as k
from .attention import AttentionMetadata

_blas_threads = [0]  # the thread count last given to that BLAS (process-wide, like torch's)


def numba_forward(model, input_ids, positions, kv_caches, meta) -> torch.Tensor:
    """Final hidden states [T, hidden] of every token in the batch."""
    if meta.prefills or meta.num_decode != 1:
        return model.torch_forward(input_ids, positions, kv_caches, meta)
    cfg = model.config
    _follow_torch_threads()
    weights = _weights(model)
    k_caches, v_caches = _caches(model, kv_caches)
    residual = model.embed_tokens.forward(input_ids).numpy()  # a fresh tensor: ours to update
    out = torch.empty(input_ids.shape[0], cfg.hidden_size)
    k.decode_step(
        residual, positions.numpy(), meta.slot_mapping.numpy(), meta.decode_block_tables.numpy(),
        model.rotary.cos.numpy(), model.rotary.sin_signed.numpy(), *weights, k_caches,
        v_caches, cfg.num_heads, np.float32(cfg.rms_norm_eps),
        np.float32(model.layers[0].self_attn.scale), out.numpy(),
    )  # fmt: skip
    return out


@torch.inference_mode()
def warm_up(model) -> None:
    """Compile (or load from Numba's cache: ~1 s) the fused step and the logits GEMV with
    the argument types of a real step, on a one-slot scratch cache, so that the first decode
    step of a run is not that much slower than the rest."""
    cfg = model.config
    shape = (1, 1, cfg.num_kv_heads, cfg.head_dim)
    scratch = [(torch.zeros(shape), torch.zeros(shape)) for _ in model.layers]
    zero = torch.zeros(1, dtype=torch.long)  # one token at position 0, in slot 0 of block 0
    meta = AttentionMetadata(slot_mapping=zero, num_decode=1, decode_block_tables=zero[None],
                             decode_mask=None, decode_context_len=1, prefills=[])  # fmt: skip
    hidden = numba_forward(model, zero, zero, scratch, meta)
    numba_logits(model, hidden)
    model._numba_caches = None  # the scratch cache's lists: not kept


def numba_logits(model, hidden: torch.Tensor) -> torch.Tensor | None:
    """fp32 logits of one row through the same BLAS as the fused steps (PyTorch's and
    Numba's thread pools would otherwise take turns spinning on each other's cores);
    None for more rows."""
    if hidden.shape[0] != 1:
        return None
    _follow_torch_threads()
    w = model.lm_head_weight.detach().numpy()
    return torch.from_numpy(k.gemv(np.ascontiguousarray(hidden.numpy()), w, _np(None)))


def _follow_torch_threads() -> None:
    """Numba's BLAS (SciPy's OpenBLAS) uses as many threads as torch is told to (--dp
    splits the cores between replicas; a user may set fewer)."""
    n = torch.get_num_threads()
    if n != _blas_threads[0]:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=n, user_api="blas")  # ~1 ms: only when the count changes
        _blas_threads[0] = n


def _np(t: torch.Tensor | None) -> np.ndarray:
    return np.empty(0, np.float32) if t is None else t.detach().numpy()


def _weights(model) -> tuple:
    """The model's weights as typed lists, built once (they share the tensors' memory)."""
    if getattr(model, "_numba_weights", None) is None:
        ls = model.layers
        attn, mlp = [x.self_attn for x in ls], [x.mlp for x in ls]
        model._numba_weights = (
            List(_np(x.input_layernorm.weight) for x in ls),
            List(_np(x.post_attention_layernorm.weight) for x in ls),
            _np(model.norm.weight),
            List(_np(a.qkv_proj.weight) for a in attn),
            List(_np(a.qkv_proj.bias) for a in attn),
            List(_np(a.o_proj.weight) for a in attn),
            List(_np(a.o_proj.bias) for a in attn),
            List(_np(m.gate_up_proj.weight) for m in mlp),
            List(_np(m.down_proj.weight) for m in mlp),
        )
    return model._numba_weights


def _caches(model, kv_caches) -> tuple:
    """Per-layer K and V caches as typed lists, rebuilt only for another cache."""
    key = id(kv_caches), kv_caches[0][0].data_ptr()
    cached = getattr(model, "_numba_caches", None)
    if cached is None or cached[0] != key:
        ks = List(c[0].numpy() for c in kv_caches)
        vs = List(c[1].numpy() for c in kv_caches)
        model._numba_caches = cached = (key, (ks, vs))
    return cached[1]

"""The decoder's forward pass through the Triton kernels (`kernel_backend="triton"`).

The same modules and weights as `model.LlamaModel`; GEMMs and the embedding stay PyTorch
(cuBLAS), everything between them is a kernel. The residual stream is carried as in
vLLM: each layer's RMSNorm also adds the previous block's output to the residual, so
`x + h` and the norm after it are one pass. The sums are the PyTorch path's, in the same
order (x + h rounds once to the dtype either way).
"""

from __future__ import annotations

import torch

from .backend import triton_attention
from .rms_norm import rms_norm
from .rope import rope_
from .silu_mul import silu_mul


def triton_forward(model, input_ids, positions, kv_caches, meta) -> torch.Tensor:
    """Final hidden states [T, hidden] of every token in the batch."""
    x = model.embed_tokens(input_ids)
    cos, sin = model.rotary.cos, model.rotary.sin_signed
    residual = None
    for layer, (k_cache, v_cache) in zip(model.layers, kv_caches, strict=True):
        norm, attn, mlp = layer.input_layernorm, layer.self_attn, layer.mlp
        if residual is None:
            residual = x
            h = rms_norm(x, norm.weight, norm.eps)
        else:
            h = rms_norm(x, norm.weight, norm.eps, residual=residual)  # residual += x
        t = h.shape[0]
        qkv = attn.qkv_proj.forward(h)  # nn.Linear or quant.QuantLinear
        qk = qkv[:, : attn.q_size + attn.kv_size].view(t, -1, attn.head_dim)
        rope_(qk, positions, cos, sin)  # q and k heads of a token together, in place
        q, k = qk.split([attn.num_heads, attn.num_kv_heads], dim=1)
        v = qkv[:, attn.q_size + attn.kv_size :].view(t, attn.num_kv_heads, attn.head_dim)
        o = triton_attention(q, k, v, k_cache, v_cache, meta, attn.scale)
        x = attn.o_proj.forward(o.view(t, attn.q_size))
        post = layer.post_attention_layernorm
        h = rms_norm(x, post.weight, post.eps, residual=residual)
        x = mlp.down_proj.forward(silu_mul(mlp.gate_up_proj.forward(h)))
    return rms_norm(x, model.norm.weight, model.norm.eps, residual=residual)

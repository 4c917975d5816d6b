"""Weight-only quantisation: GGUF's Q4_1 and Q8_0 blocks kept packed, dequantised inside
the matmul (DOMAIN.md §10: bytes fall; the gain depends on the kernel and the batch).

Formats (32 weights a block, along the input dimension K, as llama.cpp stores them):
- Q4_1: scale d and minimum m (fp16), 32 4-bit codes q: w = d·q + m (20 bytes a block:
  0.625 bytes a weight). Codes 0-15 of a block are its 16 bytes' low nibbles, 16-31 the
  high nibbles.
- Q8_0: scale d (fp16), 32 int8 codes: w = d·q (34 bytes a block: 1.0625 a weight).
A `PackedWeight` holds them split (codes [N, K/2] uint8 or [N, K] int8, d and m [N, K/32]
fp16). `QuantLinear` computes `x·Wᵀ` from it:
- CUDA: the Triton dequant-GEMM of kernels/dequant_matmul.py (codes and scales read once
  per tile, dequantised in registers);
- CPU: the weight dequantised per call (`dequantize`), then one float GEMM. torch has no
  fast group-wise dequant-GEMV on an AVX2 CPU (its `_weight_int4pack_mm_for_cpu` and
  `_weight_int8pack_mm` measured 10-20x slower than the fp32 GEMV here), so on the CPU
  quantised decode is slower than float: the bytes fall, the time does not (BENCHMARKS.md).
The float reference is `dequantize` (equal to the `gguf` package's, tested).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError

BLOCK = 32
BLOCK_BYTES = {"q4_1": 20, "q8_0": 34}
BYTES_PER_WEIGHT = {fmt: b / BLOCK for fmt, b in BLOCK_BYTES.items()}
GGUF_NAMES = {"q4_1": "Q4_1", "q8_0": "Q8_0"}


@dataclass
class PackedWeight:
    fmt: str
    n: int
    k: int
    qs: torch.Tensor  # q4_1: uint8 [N, K/2] (two codes a byte); q8_0: int8 [N, K]
    d: torch.Tensor  # fp16 [N, K/32]
    m: torch.Tensor | None  # fp16 [N, K/32] (q4_1), None (q8_0)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qs, self.d, self.m) if t is not None)

    def rows(self, index: torch.Tensor) -> PackedWeight:
        m = None if self.m is None else self.m[index]
        return PackedWeight(self.fmt, int(index.numel()), self.k, self.qs[index], self.d[index], m)


def _check(fmt: str, k: int) -> None:
    if fmt not in BLOCK_BYTES:
        raise ConfigError(f"weights {fmt!r} is not one of {('float', *BLOCK_BYTES)}")
    if k % BLOCK:
        raise ConfigError(f"{fmt} needs an input dimension divisible by {BLOCK}, got {k}")


def from_gguf_blocks(blocks: np.ndarray, fmt: str, k: int) -> PackedWeight:
    """Split a GGUF tensor's raw blocks (uint8 [N, K/32 · block bytes]) into a PackedWeight."""
    _check(fmt, k)
    n, g = blocks.shape[0], k // BLOCK
    b = torch.from_numpy(np.ascontiguousarray(blocks).reshape(n, g, BLOCK_BYTES[fmt]))
    d = b[..., 0:2].contiguous().view(torch.float16).reshape(n, g)
    if fmt == "q4_1":
        m = b[..., 2:4].contiguous().view(torch.float16).reshape(n, g)
        return PackedWeight(fmt, n, k, b[..., 4:].reshape(n, k // 2).contiguous(), d, m)
    qs = b[..., 2:].contiguous().view(torch.int8).reshape(n, k)
    return PackedWeight(fmt, n, k, qs, d, None)


def quantize(w: torch.Tensor, fmt: str) -> PackedWeight:
    """Float [N, K] -> packed, with llama.cpp's reference rounding (Q4_1: codes from the
    block's min and (max - min)/15; Q8_0: round(x / (amax/127)))."""
    n, k = w.shape
    _check(fmt, k)
    x = w.detach().float().cpu().reshape(n, k // BLOCK, BLOCK)
    if fmt == "q4_1":
        lo, hi = x.amin(-1), x.amax(-1)
        d = (hi - lo) / 15
        inv = torch.where(d != 0, 1 / d, torch.zeros_like(d))
        q = ((x - lo[..., None]) * inv[..., None] + 0.5).to(torch.uint8).clamp_(max=15)
        qs = q[..., :16] | (q[..., 16:] << 4)
        return PackedWeight(fmt, n, k, qs.reshape(n, k // 2), d.half(), lo.half())
    d = x.abs().amax(-1) / 127
    inv = torch.where(d != 0, 1 / d, torch.zeros_like(d))
    q = torch.round(x * inv[..., None]).to(torch.int8)
    return PackedWeight(fmt, n, k, q.reshape(n, k), d.half(), None)


def codes(p: PackedWeight) -> torch.Tensor:
    """The integer codes [N, K] in weight order (uint8 0-15 for Q4_1, int8 for Q8_0)."""
    if p.fmt == "q8_0":
        return p.qs
    b = p.qs.reshape(p.n, p.k // BLOCK, 16)
    return torch.cat((b & 15, b >> 4), dim=-1).reshape(p.n, p.k)


def dequantize(p: PackedWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The float weight [N, K] (d·q + m in fp32, then rounded to `dtype`): the reference,
    and the CPU path's first half."""
    q = codes(p).reshape(p.n, p.k // BLOCK, BLOCK).float()
    d = p.d.float()[..., None]
    w = q.mul_(d) if p.m is None else torch.addcmul(p.m.float()[..., None], q, d)
    return w.reshape(p.n, p.k).to(dtype)


class QuantLinear(nn.Module):
    """`F.linear(x, W, bias)` with W packed (see the module doc for the paths)."""

    def __init__(self, packed: PackedWeight, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.fmt, self.in_features, self.out_features = packed.fmt, packed.k, packed.n
        self.register_buffer("qs", packed.qs)
        self.register_buffer("d", packed.d)
        self.register_buffer("m", packed.m)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())

    @property
    def packed(self) -> PackedWeight:
        return PackedWeight(self.fmt, self.out_features, self.in_features, self.qs, self.d, self.m)

    @property
    def weight_bytes(self) -> int:
        return self.packed.nbytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            from .kernels.dequant_matmul import dequant_matmul

            y = dequant_matmul(x, self.packed)
            return y if self.bias is None else y + self.bias
        return F.linear(x, dequantize(self.packed, x.dtype), self.bias)


class QuantEmbedding(nn.Module):
    """An embedding table kept packed; a lookup dequantises only the rows it reads."""

    def __init__(self, packed: PackedWeight, dtype: torch.dtype) -> None:
        super().__init__()
        self.table = QuantLinear(packed)  # shared with a tied LM head
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return dequantize(self.table.packed.rows(ids.reshape(-1)), self.dtype).reshape(
            *ids.shape, -1
        )


def pack_parts(parts, fmt: str, k: int) -> PackedWeight:
    """A GGUF loader's parts (gguf_loader.GGUFTensor, concatenated along rows) in `fmt`:
    blocks already in `fmt` are kept bit for bit, others are dequantised and re-quantised."""
    if all(t.qtype == GGUF_NAMES[fmt] for t in parts):
        return from_gguf_blocks(np.concatenate([t.blocks for t in parts]), fmt, k)
    w = np.concatenate([t.dequantize() for t in parts])
    return quantize(torch.from_numpy(w), fmt)


_LINEARS = (("self_attn", "qkv_proj"), ("self_attn", "o_proj"), ("mlp", "gate_up_proj"),
            ("mlp", "down_proj"))  # fmt: skip


@torch.no_grad()
def quantize_model(model, fmt: str, packed: dict | None = None) -> None:
    """Replace the model's linear layers (and its embedding / LM head) by packed ones, from
    a GGUF loader's parts where given, else by quantising the float weights. The embedding
    and LM head keep a GGUF file's own packed format (llama.cpp files store them in Q8_0
    or Q6_K; a format not here becomes `fmt`)."""
    packed = packed or {}
    device, dtype = model.embed_tokens.weight.device, model.embed_tokens.weight.dtype

    def make(name: str, module_weight: torch.Tensor | None, want: str) -> PackedWeight:
        parts = packed.get(name)
        if parts is not None:
            p = pack_parts(parts, want, parts[0].shape[1])
        else:
            p = quantize(module_weight, want)
        return PackedWeight(p.fmt, p.n, p.k, *(None if t is None else t.to(device)
                                               for t in (p.qs, p.d, p.m)))  # fmt: skip

    for i, layer in enumerate(model.layers):
        for block, proj in _LINEARS:
            parent = getattr(layer, block)
            old = getattr(parent, proj)
            name = f"layers.{i}.{block}.{proj}.weight"
            q = QuantLinear(make(name, old.weight, fmt), old.bias)
            setattr(parent, proj, q)

    def head_format(name: str) -> str:
        parts = packed.get(name)
        own = parts[0].qtype.lower() if parts else None
        return own if own in BLOCK_BYTES else fmt

    emb_name = "embed_tokens.weight"
    emb = make(emb_name, model.embed_tokens.weight, head_format(emb_name))
    model.embed_tokens = QuantEmbedding(emb, dtype)
    if model.config.tie_word_embeddings:
        model.lm_head = model.embed_tokens.table
    else:
        head = "lm_head.weight"
        model.lm_head = QuantLinear(make(head, model.lm_head.weight, head_format(head)))
    model.weight_format = fmt

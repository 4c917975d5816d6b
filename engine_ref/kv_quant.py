"""KV-cache quantisation (`CacheConfig.kv_dtype` "int8" or "fp8"): the storage, the scales,
and the PyTorch reference of quantise-on-write and dequantise-on-read.

Granularity: one fp32 scale per (token, KV head), the absolute maximum of that head's
`head_dim` values over the format's largest value (127 for int8, 448 for fp8 e4m3). A
token's K/V is written once and never touched again, so a scale is computed from the
values being written and nothing already stored is requantised (per-block scales would
have to grow as a block fills over several steps and rewrite its earlier tokens). It costs
4 bytes per head per token: 4 / head_dim extra bytes per element (6 % at head_dim 64).

int8 rounds half away from zero (as the Triton store does, so kernel and reference agree
bit for bit); fp8 is `torch.float8_e4m3fn` (round to nearest even, saturated at ±448).
"""

from __future__ import annotations

import functools

import torch

from ..errors import ConfigError
from .config import KV_DTYPES  # noqa: F401  ("auto": the model's dtype, no scales)

QMAX = {"int8": 127.0, "fp8": 448.0}
STORAGE = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}
SCALE_DTYPE = torch.float32
SCALE_BYTES = 4
# The smallest scale: an all-zero head stores zeros with a finite scale (never 0 / 0).
MIN_SCALE = 1e-12


def is_quantized(kv_dtype: str) -> bool:
    return kv_dtype in QMAX


def bytes_per_element(kv_dtype: str, head_dim: int, model_elem: int) -> float:
    """Stored bytes per K or V element, the per-(token, head) scale spread over head_dim."""
    if not is_quantized(kv_dtype):
        return float(model_elem)
    return 1.0 + SCALE_BYTES / head_dim


class QuantKV:
    """One layer's K (or V) cache when quantised: `data` [blocks, block_size, kv_heads, D]
    in the storage dtype and `scale` [blocks, block_size, kv_heads] fp32. Attention
    backends take it where they take a float cache tensor."""

    __slots__ = ("data", "kv_dtype", "scale")

    def __init__(self, data: torch.Tensor, scale: torch.Tensor, kv_dtype: str) -> None:
        self.data, self.scale, self.kv_dtype = data, scale, kv_dtype

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def device(self) -> torch.device:
        return self.data.device


def quantize(x: torch.Tensor, kv_dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] → (values [..., D] in the storage dtype, scales [...] fp32)."""
    qmax = QMAX[kv_dtype]
    xf = x.float()
    scale = (xf.abs().amax(-1) / qmax).clamp_min(MIN_SCALE)
    y = xf / scale[..., None]
    if kv_dtype == "int8":
        y = torch.trunc(y + torch.copysign(torch.full_like(y, 0.5), y)).clamp(-qmax, qmax)
    else:
        y = y.clamp(-qmax, qmax)
    return y.to(STORAGE[kv_dtype]), scale


def dequantize(values: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """values [..., D], scale [...] → [..., D] in `dtype` (computed in fp32)."""
    return (values.float() * scale[..., None]).to(dtype)


def store(x: torch.Tensor, cache: QuantKV, slot_mapping: torch.Tensor) -> None:
    """x [T, kv_heads, D] quantised into the cache slots `slot_mapping` [T] (long)."""
    values, scale = quantize(x, cache.kv_dtype)
    heads, dim = cache.data.shape[-2:]
    # Byte views: index_copy_ has no float8 kernel on the CPU.
    flat = cache.data.view(torch.uint8).view(-1, heads, dim)
    flat.index_copy_(0, slot_mapping, values.view(torch.uint8))
    cache.scale.view(-1, heads).index_copy_(0, slot_mapping, scale)


def read_blocks(cache, block_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Blocks [n, block_size, kv_heads, D] of a float cache or a QuantKV (dequantised)."""
    if isinstance(cache, QuantKV):
        return dequantize(
            cache.data.index_select(0, block_ids), cache.scale.index_select(0, block_ids), dtype
        )
    return cache.index_select(0, block_ids)


def kernel_operands(cache) -> tuple[torch.Tensor, torch.Tensor, int, int, bool]:
    """(values, scales, scale strides per block and per slot, quantised?) of one layer's
    cache for the Triton kernels; a float cache passes itself as its scales (never read).
    A scale's KV heads are contiguous (stride 1) in every layer's view."""
    if isinstance(cache, QuantKV):
        if cache.kv_dtype == "fp8" and cache.data.is_cuda:
            _check_fp8_loads(cache.data.device.index or 0)
        s = cache.scale
        assert s.stride(2) == 1
        return cache.data, s, s.stride(0), s.stride(1), True
    return cache, cache, 0, 0, False


@functools.cache
def _check_fp8_loads(device_index: int) -> None:
    """Triton compiles float8 e4m3 loads for compute capability 8.9 (Ada, Hopper) and
    newer only: say so instead of a compiler error."""
    major, minor = torch.cuda.get_device_capability(device_index)
    if (major, minor) < (8, 9):
        raise ConfigError(
            f"--kv-dtype fp8 on the Triton kernels needs a GPU of compute capability 8.9 or "
            f"newer (this one is {major}.{minor}): use --kv-dtype int8 or --kernel-backend torch"
        )

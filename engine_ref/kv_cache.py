"""The KV memory: one device tensor of fixed-size blocks and a CPU swap tier.

Layout [2 (K, V), layers, blocks, block_size, kv_heads, head_dim]: a block holds
`block_size` consecutive positions of one sequence for every layer, so swapping a block is
one indexed copy. The block manager decides which block holds what; this file only moves
bytes. A quantised pool (`kv_dtype` int8 / fp8, kv_quant.py) stores one byte per element
plus fp32 scales [2, layers, blocks, block_size, kv_heads] beside it, which count in a
block's bytes and move with it on swaps.
"""

from __future__ import annotations

import torch

from ..errors import ConfigError
from .config import ModelConfig
from .kv_quant import SCALE_BYTES, SCALE_DTYPE, STORAGE, QuantKV, is_quantized

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    return _DTYPES[name]


def storage_dtype(dtype: str, kv_dtype: str = "auto") -> torch.dtype:
    return STORAGE[kv_dtype] if is_quantized(kv_dtype) else torch_dtype(dtype)


def bytes_per_block(cfg: ModelConfig, block_size: int, dtype: str, kv_dtype: str = "auto") -> int:
    """K and V of `block_size` tokens in every layer, as stored (scales included)."""
    slots = 2 * cfg.num_layers * block_size * cfg.num_kv_heads
    elem = torch.empty((), dtype=storage_dtype(dtype, kv_dtype)).element_size()
    scales = SCALE_BYTES if is_quantized(kv_dtype) else 0
    return slots * (cfg.head_dim * elem + scales)


def num_blocks_for_bytes(
    cfg: ModelConfig, block_size: int, dtype: str, nbytes: int, kv_dtype: str = "auto"
) -> int:
    n = nbytes // bytes_per_block(cfg, block_size, dtype, kv_dtype)
    if n < 1:
        raise ConfigError(f"kv_cache_bytes={nbytes} holds no block of this model")
    return n


def _check_room(nbytes: int, num_blocks: int, device: torch.device) -> None:
    """Refuse a pool larger than the device's free memory: on the CPU, zeroed pages are
    mapped lazily, so an oversized pool would fail much later, as the OOM killer."""
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        import psutil

        free = psutil.virtual_memory().available
    if nbytes > free:
        raise ConfigError(
            f"the KV pool ({num_blocks:,} blocks, {nbytes / 2**20:,.0f} MiB) is more than "
            f"the {free / 2**20:,.0f} MiB free on {device}: lower --kv-cache-mb or --kv-blocks"
        )


class KVCache:
    def __init__(
        self,
        cfg: ModelConfig,
        num_blocks: int,
        block_size: int,
        num_cpu_blocks: int,
        device: torch.device,
        dtype: str,
        kv_dtype: str = "auto",
    ) -> None:
        shape = (cfg.num_kv_heads, cfg.head_dim)
        dt = storage_dtype(dtype, kv_dtype)
        self.kv_dtype = kv_dtype
        quant = is_quantized(kv_dtype)
        per_block = bytes_per_block(cfg, block_size, dtype, kv_dtype)
        _check_room(num_blocks * per_block, num_blocks, device)
        pin = device.type == "cuda"
        dev_blocks = (2, cfg.num_layers, num_blocks, block_size)
        cpu_blocks = (2, cfg.num_layers, num_cpu_blocks, block_size)
        try:
            # Zeros, not empty: masked padding reads must never see NaN garbage (0 * NaN = NaN).
            self.device_kv = torch.zeros((*dev_blocks, *shape), dtype=dt, device=device)
            self.cpu_kv = torch.zeros((*cpu_blocks, *shape), dtype=dt, pin_memory=pin)
            # Scales: none for a float pool (empty tensors keep the swap code one path).
            heads = (cfg.num_kv_heads,) if quant else (0,)
            sd = SCALE_DTYPE
            self.device_scale = torch.zeros((*dev_blocks, *heads), dtype=sd, device=device)
            self.cpu_scale = torch.zeros((*cpu_blocks, *heads), dtype=sd, pin_memory=pin)
        except (RuntimeError, MemoryError) as e:  # torch.OutOfMemoryError is a RuntimeError
            raise ConfigError(
                f"cannot allocate the KV pool ({num_blocks:,} blocks, "
                f"{num_blocks * per_block / 2**20:,.0f} MiB) on {device}: "
                f"{str(e).splitlines()[0][:120]}; lower --kv-cache-mb or --kv-blocks"
            ) from None
        self.device = device
        if quant:
            kv, sc = self.device_kv, self.device_scale
            self.layers = [
                (QuantKV(kv[0, i], sc[0, i], kv_dtype), QuantKV(kv[1, i], sc[1, i], kv_dtype))
                for i in range(cfg.num_layers)
            ]
        else:
            self.layers = [(self.device_kv[0, i], self.device_kv[1, i])
                           for i in range(cfg.num_layers)]  # fmt: skip

    @property
    def nbytes(self) -> int:
        kv, sc = self.device_kv, self.device_scale
        return kv.numel() * kv.element_size() + sc.numel() * sc.element_size()

    def swap_out(self, device_blocks: list[int], cpu_blocks: list[int]) -> None:
        """Copy device blocks to CPU blocks; returns when the copy is complete, so the
        caller may free the device blocks."""
        src = torch.tensor(device_blocks, dtype=torch.long, device=self.device)
        dst = torch.tensor(cpu_blocks, dtype=torch.long)
        for cpu, dev in self._pairs():
            cpu.index_copy_(2, dst, dev.index_select(2, src).cpu())

    def swap_in(self, cpu_blocks: list[int], device_blocks: list[int]) -> None:
        src = torch.tensor(cpu_blocks, dtype=torch.long)
        dst = torch.tensor(device_blocks, dtype=torch.long, device=self.device)
        # A blocking host-to-device copy: the CPU blocks may be freed when this returns.
        for cpu, dev in self._pairs():
            dev.index_copy_(2, dst, cpu.index_select(2, src).to(self.device))

    def host_like(self, num_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Host tensors (values, scales) of `num_blocks` blocks laid out like the device
        pool, for the prefix cache's host tier (host_tier.py)."""
        pin = self.device.type == "cuda"
        kv, sc = self.device_kv, self.device_scale
        shape = lambda t: (*t.shape[:2], num_blocks, *t.shape[3:])  # noqa: E731
        return (torch.zeros(shape(kv), dtype=kv.dtype, pin_memory=pin),
                torch.zeros(shape(sc), dtype=sc.dtype, pin_memory=pin))  # fmt: skip

    def copy_to_host(self, device_blocks: list[int], host, slots: list[int]) -> None:
        """Device blocks to slots of `host_like` tensors `host`; complete on return."""
        src = torch.tensor(device_blocks, dtype=torch.long, device=self.device)
        dst = torch.tensor(slots, dtype=torch.long)
        for h, dev in self._host_pairs(host):
            h.index_copy_(2, dst, dev.index_select(2, src).cpu())

    def copy_from_host(self, host, slots: list[int], device_blocks: list[int]) -> None:
        """Slots of `host` to device blocks; a blocking copy (the slots may be reused)."""
        src = torch.tensor(slots, dtype=torch.long)
        dst = torch.tensor(device_blocks, dtype=torch.long, device=self.device)
        for h, dev in self._host_pairs(host):
            dev.index_copy_(2, dst, h.index_select(2, src).to(self.device))

    def _host_pairs(self, host) -> list[tuple[torch.Tensor, torch.Tensor]]:
        pairs = [(host[0].view(torch.uint8), self.device_kv.view(torch.uint8))]
        if self.device_scale.numel():
            pairs.append((host[1], self.device_scale))
        return pairs

    def _pairs(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(CPU, device) tensors a swap copies: values as raw bytes (index_copy_ has no
        float8 kernel on the CPU), and the scales of a quantised pool."""
        pairs = [(self.cpu_kv.view(torch.uint8), self.device_kv.view(torch.uint8))]
        if self.device_scale.numel():
            pairs.append((self.cpu_scale, self.device_scale))
        return pairs

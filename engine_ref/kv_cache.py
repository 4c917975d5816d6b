"""The KV memory: one device tensor of fixed-size blocks and a CPU swap tier.

Layout [2 (K, V), layers, blocks, block_size, kv_heads, head_dim]: a block holds
`block_size` consecutive positions of one sequence for every layer, so swapping a block is
one indexed copy. The block manager decides which block holds what; this file only moves
bytes.
"""

from __future__ import annotations

import torch

from ..errors import ConfigError
from .config import ModelConfig

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    return _DTYPES[name]


def bytes_per_block(cfg: ModelConfig, block_size: int, dtype: str) -> int:
    elem = torch.empty((), dtype=torch_dtype(dtype)).element_size()
    return 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim * elem


def num_blocks_for_bytes(cfg: ModelConfig, block_size: int, dtype: str, nbytes: int) -> int:
    n = nbytes // bytes_per_block(cfg, block_size, dtype)
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
    ) -> None:
        shape = (cfg.num_kv_heads, cfg.head_dim)
        dt = torch_dtype(dtype)
        per_block = 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim
        per_block *= torch.empty((), dtype=dt).element_size()
        _check_room(num_blocks * per_block, num_blocks, device)
        pin = device.type == "cuda"
        try:
            # Zeros, not empty: masked padding reads must never see NaN garbage (0 * NaN = NaN).
            self.device_kv = torch.zeros(
                (2, cfg.num_layers, num_blocks, block_size, *shape), dtype=dt, device=device
            )
            self.cpu_kv = torch.zeros(
                (2, cfg.num_layers, num_cpu_blocks, block_size, *shape), dtype=dt, pin_memory=pin
            )
        except (RuntimeError, MemoryError) as e:  # torch.OutOfMemoryError is a RuntimeError
            raise ConfigError(
                f"cannot allocate the KV pool ({num_blocks:,} blocks, "
                f"{num_blocks * per_block / 2**20:,.0f} MiB) on {device}: "
                f"{str(e).splitlines()[0][:120]}; lower --kv-cache-mb or --kv-blocks"
            ) from None
        self.device = device
        self.layers = [(self.device_kv[0, i], self.device_kv[1, i]) for i in range(cfg.num_layers)]

    @property
    def nbytes(self) -> int:
        return self.device_kv.numel() * self.device_kv.element_size()

    def swap_out(self, device_blocks: list[int], cpu_blocks: list[int]) -> None:
        """Copy device blocks to CPU blocks; returns when the copy is complete, so the
        caller may free the device blocks."""
        src = torch.tensor(device_blocks, dtype=torch.long, device=self.device)
        dst = torch.tensor(cpu_blocks, dtype=torch.long)
        self.cpu_kv.index_copy_(2, dst, self.device_kv.index_select(2, src).cpu())

    def swap_in(self, cpu_blocks: list[int], device_blocks: list[int]) -> None:
        src = torch.tensor(cpu_blocks, dtype=torch.long)
        dst = torch.tensor(device_blocks, dtype=torch.long, device=self.device)
        # A blocking host-to-device copy: the CPU blocks may be freed when this returns.
        self.device_kv.index_copy_(2, dst, self.cpu_kv.index_select(2, src).to(self.device))

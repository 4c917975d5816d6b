"""The prefix cache's host tier (`--kv-offload-mb`): a bounded host-memory pool below the
device pool.

When the device pool evicts a cached, unreferenced block to reuse it, the block's KV is
copied here, keyed by its prefix hash (the same chained key as the device cache, so the
model fingerprint and the cache salt still separate contents). A later prefix lookup that
misses on the device but finds the hash here restores the block by copy (host → device)
instead of recomputing it. The tier is inclusive: a restored block stays here too (most
recently used), so evicting it from the device again costs no second copy.

Eviction is LRU over host blocks. A block written and evicted without ever being restored
is counted (`evicted_unused`): the copy was wasted work (thrash). Hashes a pending restore
needs are pinned, so the offloads its own device allocations cause cannot evict them.

The copies are synchronous and run in the step's schedule phase (admission is where
blocks are taken), so their time is in the step like the swap tier's.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import NamedTuple

from .kv_cache import KVCache


class HostRestore(NamedTuple):
    """One admission's prefix hits by tier, and what restoring the host part cost."""

    request_id: str
    device_tokens: int  # prefix tokens found in the device pool
    host_tokens: int  # prefix tokens restored from the host tier
    restore_bytes: int
    restore_ns: int


class HostTierCounts(NamedTuple):
    """Host-tier traffic since the last `take_counts()`."""

    offloaded_blocks: int  # device blocks copied to the host tier
    offload_ns: int
    evicted_unused: int  # host blocks evicted without ever being restored
    host_blocks_used: int  # a gauge: host blocks holding a prefix now


class HostTier:
    def __init__(self, kv_cache: KVCache, num_blocks: int, block_bytes: int) -> None:
        self.kv_cache = kv_cache
        self.num_blocks = num_blocks
        self.block_bytes = block_bytes
        self.host = kv_cache.host_like(num_blocks)
        self.slots: OrderedDict[bytes, int] = OrderedDict()  # hash -> slot, LRU first
        self.free: deque[int] = deque(range(num_blocks))
        self.restored: set[int] = set()  # slots restored at least once since written
        self.tokens: dict[int, tuple[int, ...] | None] = {}  # check mode: each slot's tokens
        self.pinned: set[bytes] = set()
        # Injected fault (probes/faults.py `restore_delay_us`): called with the number of
        # blocks of each restore, inside its timing.
        self.slow_restore: Callable[[int], None] | None = None
        # Drained each step by report_host_tier; bounded in case a step path never drains.
        self.restores: deque[HostRestore] = deque(maxlen=4096)
        self._offloaded = self._offload_ns = self._evicted_unused = 0
        self.total_offloaded = self.total_restored = self.total_evicted_unused = 0

    def __contains__(self, h: bytes) -> bool:
        return h in self.slots

    def offload(self, block_id: int, h: bytes, tokens: tuple[int, ...] | None) -> None:
        """Keep device block `block_id` (about to be reused) under its hash `h`."""
        if h in self.slots:
            self.slots.move_to_end(h)  # already here (inclusive tier): no copy
            return
        slot = self._free_slot()
        if slot is None:
            return  # every host block is pinned by a pending restore: drop this one
        t0 = time.monotonic_ns()
        self.kv_cache.copy_to_host([block_id], self.host, [slot])
        self._offload_ns += time.monotonic_ns() - t0
        self.slots[h] = slot
        self.tokens[slot] = tokens
        self._offloaded += 1
        self.total_offloaded += 1

    def _free_slot(self) -> int | None:
        if self.free:
            return self.free.popleft()
        for h, slot in self.slots.items():  # LRU first, skipping pinned hashes
            if h not in self.pinned:
                del self.slots[h]
                if slot not in self.restored:
                    self._evicted_unused += 1
                    self.total_evicted_unused += 1
                self.restored.discard(slot)
                return slot
        return None

    def restore(self, request_id: str, hashes: list[bytes], device_blocks: list[int],
                device_tokens: int, block_size: int) -> None:  # fmt: skip
        """Copy the blocks of `hashes` into `device_blocks` and record the admission."""
        slots = [self.slots[h] for h in hashes]
        t0 = time.monotonic_ns()
        if slots:
            self.kv_cache.copy_from_host(self.host, slots, device_blocks)
            if self.slow_restore is not None:
                self.slow_restore(len(slots))
        ns = time.monotonic_ns() - t0 if slots else 0
        for h, slot in zip(hashes, slots, strict=True):
            self.slots.move_to_end(h)
            self.restored.add(slot)
        self.total_restored += len(slots)
        self.restores.append(HostRestore(request_id, device_tokens, len(slots) * block_size,
                                         len(slots) * self.block_bytes, ns))  # fmt: skip

    def take_restores(self) -> list[HostRestore]:
        out = list(self.restores)
        self.restores.clear()
        return out

    def take_counts(self) -> HostTierCounts:
        out = HostTierCounts(self._offloaded, self._offload_ns, self._evicted_unused,
                             len(self.slots))  # fmt: skip
        self._offloaded = self._offload_ns = self._evicted_unused = 0
        return out


def make_host_tier(config, kv_cache: KVCache) -> HostTier | None:
    """The host tier `config.cache.kv_offload_bytes` asks for, or None (none asked, or the
    prefix cache is off: then there is nothing to offload)."""
    from ..errors import ConfigError
    from .kv_cache import bytes_per_block

    cc = config.cache
    if not cc.kv_offload_bytes or not cc.enable_prefix_caching:
        return None
    if config.tensor_parallel_size > 1 or getattr(config, "pipeline_parallel_size", 1) > 1:
        # The copies would have to run on every rank, each holding part of the KV.
        raise ConfigError("--kv-offload-mb runs without --tp / --pp for now")
    per_block = bytes_per_block(config.model, cc.block_size, config.dtype, cc.kv_dtype)
    n = cc.kv_offload_bytes // per_block
    if n < 1:
        raise ConfigError(
            f"--kv-offload-mb {cc.kv_offload_bytes / 2**20:g} holds no KV block of this model "
            f"({per_block:,} bytes each)"
        )
    return HostTier(kv_cache, n, per_block)


def report_host_tier(observer, tier: HostTier | None) -> None:
    """Hand the step's host-tier records to the observer (dropped without one), once per
    step right after scheduling, where the tier's copies happen."""
    if tier is None:
        return
    restores, counts = tier.take_restores(), tier.take_counts()
    if observer is not None:
        observer.on_kv_offload([r for r in restores if r.device_tokens or r.host_tokens], counts)

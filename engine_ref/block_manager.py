"""Paged KV bookkeeping: blocks, reference counts, the prefix cache, LRU eviction, swap.

A block is in exactly one of three places: referenced by requests (ref_count > 0), in the
prefix cache but unreferenced (`evictable`, LRU order, still hit-able), or empty
(`free_ids`). Free-for-allocation = empty + evictable; allocation takes empty blocks first,
then evicts the least recently released cached block.

Prefix-cache keys chain: block i's key hashes (key of block i-1, i, its tokens), and block
0's parent is the request's `hash_root` (the model fingerprint: weights, dtype, RoPE; plus an
optional cache salt). So the same tokens at another position, after other tokens, or under
another model configuration never hit. A block is registered only once its KV is computed.

With a host tier (host_tier.py, `--kv-offload-mb`) a cached block the LRU evicts is first
copied there, and a prefix lookup continues into it: such a hit is `HOST_HIT` in the hit
list, and `allocate` restores it by copy into a fresh device block.

With `check=True` the manager records each block's owners and the runner asks it to vet
every block a step reads or writes; freeing a block an in-flight step still uses fails.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque
from collections.abc import Iterable

from .host_tier import HostTier
from .kv_cache import KVCache
from .request import Request

HOST_HIT = -1  # a prefix hit in the host tier (no device block yet)


def block_hash(parent: bytes, index: int, tokens: Iterable[int]) -> bytes:
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(index.to_bytes(8, "little"))
    h.update(array("q", tokens).tobytes())
    return h.digest()


def hash_root(fingerprint: bytes, cache_salt: str | None = None) -> bytes:
    salt = b"" if cache_salt is None else cache_salt.encode()
    return hashlib.blake2b(fingerprint + b"|" + salt, digest_size=16).digest()


class Block:
    __slots__ = ("block_id", "hash", "ref_count", "token_ids")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.hash: bytes | None = None
        self.token_ids: tuple[int, ...] | None = None  # kept in check mode to vet hits


class OwnershipError(AssertionError):
    """A step touched a block its request does not own (check mode only)."""


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_cpu_blocks: int = 0,
        enable_prefix_caching: bool = True,
        kv_cache: KVCache | None = None,
        check: bool = False,
        host_tier: HostTier | None = None,
    ) -> None:
        self.num_blocks, self.block_size, self.num_cpu_blocks = (
            num_blocks,
            block_size,
            num_cpu_blocks,
        )
        self.enable_prefix_caching = enable_prefix_caching
        self.kv_cache = kv_cache
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_ids: deque[int] = deque(range(num_blocks))
        self.evictable: OrderedDict[int, None] = OrderedDict()
        self.hash_to_block: dict[bytes, int] = {}
        self.cpu_free: deque[int] = deque(range(num_cpu_blocks))
        self.check = check
        self.owners: list[set[str]] = [set() for _ in range(num_blocks)]
        self.cpu_owners: list[set[str]] = [set() for _ in range(num_cpu_blocks)]
        self.pinned: set[int] = set()
        self.num_evictions = 0
        self.host_tier = host_tier if enable_prefix_caching else None

    # ---- counts -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_ids) + len(self.evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self.hash_to_block)

    @property
    def num_free_cpu_blocks(self) -> int:
        return len(self.cpu_free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---- the prefix cache ---------------------------------------------------------------
    def compute_hashes(self, req: Request) -> None:
        bs, hashes, toks = self.block_size, req.block_hashes, req.all_token_ids
        for i in range(len(hashes), req.num_tokens // bs):
            parent = hashes[-1] if i else req.hash_root
            hashes.append(block_hash(parent, i, toks[i * bs : (i + 1) * bs]))

    def find_cached_prefix(self, req: Request) -> list[int]:
        """Blocks of the longest cached prefix, leaving at least one token to compute (its
        logits give the next token). Changes nothing."""
        if not self.enable_prefix_caching:
            return []
        self.compute_hashes(req)
        hits: list[int] = []
        tier, bs = self.host_tier, self.block_size
        for i, h in enumerate(req.block_hashes[: (req.num_tokens - 1) // bs]):
            bid = self.hash_to_block.get(h)
            if bid is None and tier is not None and h in tier:
                bid = HOST_HIT
            if bid is None:
                break
            if self.check:
                held = self.blocks[bid].token_ids if bid >= 0 else tier.tokens[tier.slots[h]]
                if held != tuple(req.all_token_ids[i * bs : (i + 1) * bs]):
                    raise OwnershipError(f"prefix-cache block {bid} holds other tokens")
            hits.append(bid)
        return hits

    def cache_full_blocks(self, req: Request, prev_computed: int) -> None:
        """Register blocks that became full and computed since `prev_computed` tokens."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        first, last = prev_computed // bs, req.num_computed_tokens // bs
        if first >= last:
            return
        self.compute_hashes(req)
        for i in range(first, last):
            block = self.blocks[req.block_table[i]]
            h = req.block_hashes[i]
            if block.hash is not None or h in self.hash_to_block:
                continue  # already cached, or the same content lives in another block
            block.hash = h
            self.hash_to_block[h] = block.block_id
            if self.check:
                block.token_ids = tuple(req.all_token_ids[i * bs : (i + 1) * bs])

    # ---- allocation ---------------------------------------------------------------------
    def can_allocate(self, hits: list[int], num_new_tokens: int, reserve: int = 0) -> bool:
        """Can a waiting request take `hits` and room for `num_new_tokens` after them while
        keeping `reserve` blocks free?"""
        restored = hits.count(HOST_HIT)  # each needs a fresh device block
        need = self.blocks_for(len(hits) * self.block_size + num_new_tokens) - len(hits)
        need += restored
        revived = sum(1 for b in hits if b >= 0 and self.blocks[b].ref_count == 0)
        return self.num_free_blocks - revived - need >= reserve

    def allocate(self, req: Request, hits: list[int], num_new_tokens: int) -> None:
        assert not req.block_table, f"{req.request_id} already holds blocks"
        for bid in hits:
            if bid >= 0:
                self._ref(bid, req.request_id)
        req.block_table = list(hits)
        if HOST_HIT in hits:
            self._restore(req, hits)
        elif self.host_tier is not None:
            self.host_tier.restore(req.request_id, [], [], len(hits) * self.block_size, 0)
        req.num_computed_tokens = len(hits) * self.block_size
        self.append_slots(req, num_new_tokens)

    def _restore(self, req: Request, hits: list[int]) -> None:
        """Copy `req`'s host-tier hits into fresh device blocks and cache them there."""
        tier, rid = self.host_tier, req.request_id
        where = [i for i, b in enumerate(hits) if b == HOST_HIT]
        hashes = [req.block_hashes[i] for i in where]
        tier.pinned.update(hashes)  # the takes below may offload: keep these on the host
        try:
            bids = [self._take(rid) for _ in where]
            tokens = [tier.tokens[tier.slots[h]] for h in hashes]
            device_tokens = (len(hits) - len(where)) * self.block_size
            tier.restore(rid, hashes, bids, device_tokens, self.block_size)
        finally:
            tier.pinned.difference_update(hashes)
        for i, bid, h, toks in zip(where, bids, hashes, tokens, strict=True):
            req.block_table[i] = bid
            block = self.blocks[bid]
            block.hash, block.token_ids = h, toks if self.check else None
            self.hash_to_block[h] = bid

    def blocks_needed(self, req: Request, num_new_tokens: int) -> int:
        return max(
            0, self.blocks_for(req.num_computed_tokens + num_new_tokens) - len(req.block_table)
        )

    def can_append(self, req: Request, num_new_tokens: int) -> bool:
        return self.blocks_needed(req, num_new_tokens) <= self.num_free_blocks

    def append_slots(self, req: Request, num_new_tokens: int) -> None:
        for _ in range(self.blocks_needed(req, num_new_tokens)):
            req.block_table.append(self._take(req.request_id))

    def free_tail(self, req: Request, num_tokens: int) -> None:
        """Free `req`'s blocks past those `num_tokens` tokens use (speculative decoding:
        the slots of drafts not proposed or rejected), tail first."""
        keep = self.blocks_for(num_tokens)
        while len(req.block_table) > keep:
            self._unref(req.block_table.pop(), req.request_id)

    def free(self, req: Request) -> None:
        # Tail first: the LRU then evicts a prefix's tail before its head.
        for bid in reversed(req.block_table):
            self._unref(bid, req.request_id)
        req.block_table = []

    def _take(self, owner: str) -> int:
        if self.free_ids:
            bid = self.free_ids.popleft()
        else:
            bid, _ = self.evictable.popitem(last=False)
            block = self.blocks[bid]
            if self.host_tier is not None:  # keep its KV below, before it is overwritten
                self.host_tier.offload(bid, block.hash, block.token_ids)
            del self.hash_to_block[block.hash]
            block.hash = block.token_ids = None
            self.num_evictions += 1
        self.blocks[bid].ref_count = 1
        if self.check:
            self.owners[bid].add(owner)
        return bid

    def _ref(self, bid: int, owner: str) -> None:
        block = self.blocks[bid]
        if block.ref_count == 0:
            del self.evictable[bid]
        block.ref_count += 1
        if self.check:
            self.owners[bid].add(owner)

    def _unref(self, bid: int, owner: str) -> None:
        block = self.blocks[bid]
        if self.check:
            if bid in self.pinned:
                raise OwnershipError(f"block {bid} freed while a step in flight uses it")
            if owner not in self.owners[bid]:
                raise OwnershipError(f"{owner} frees block {bid} it does not own")
            self.owners[bid].discard(owner)
        block.ref_count -= 1
        assert block.ref_count >= 0, f"block {bid} ref_count below zero"
        if block.ref_count == 0:
            if block.hash is not None:
                self.evictable[bid] = None
            else:
                self.free_ids.append(bid)

    # ---- the CPU swap tier ----------------------------------------------------------------
    def can_swap_out(self, req: Request) -> bool:
        return self.kv_cache is not None and len(req.block_table) <= len(self.cpu_free)

    def swap_out(self, req: Request) -> None:
        gpu = req.block_table
        cpu = [self.cpu_free.popleft() for _ in gpu]
        if self.check:
            self.check_access(req.request_id, gpu, ())
            for c in cpu:
                self.cpu_owners[c].add(req.request_id)
        self.kv_cache.swap_out(gpu, cpu)  # complete on return: the device blocks can go
        self.free(req)
        req.cpu_block_table = cpu

    def can_swap_in(self, req: Request, num_new_tokens: int, reserve: int = 0) -> bool:
        need = max(
            len(req.cpu_block_table), self.blocks_for(req.num_computed_tokens + num_new_tokens)
        )
        return self.num_free_blocks - need >= reserve

    def swap_in(self, req: Request) -> None:
        cpu = req.cpu_block_table
        gpu = [self._take(req.request_id) for _ in cpu]
        self.kv_cache.swap_in(cpu, gpu)
        self.free_cpu(req)
        req.block_table = gpu
        self.cache_full_blocks(req, 0)  # its full blocks are prefix-cacheable again

    def free_cpu(self, req: Request) -> None:
        for c in req.cpu_block_table:
            if self.check:
                if req.request_id not in self.cpu_owners[c]:
                    raise OwnershipError(f"{req.request_id} frees CPU block {c} it does not own")
                self.cpu_owners[c].discard(req.request_id)
            self.cpu_free.append(c)
        req.cpu_block_table = []

    # ---- check mode -----------------------------------------------------------------------
    def check_access(self, owner: str, read: Iterable[int], write: Iterable[int]) -> None:
        for bid in read:
            if owner not in self.owners[bid] or self.blocks[bid].ref_count == 0:
                raise OwnershipError(f"{owner} reads block {bid} it does not own")
        for bid in write:
            block = self.blocks[bid]
            if owner not in self.owners[bid]:
                raise OwnershipError(f"{owner} writes block {bid} it does not own")
            if block.ref_count != 1 or block.hash is not None:
                raise OwnershipError(f"{owner} writes block {bid}, shared or cached (immutable)")

    def pin(self, block_ids: Iterable[int]) -> None:
        self.pinned.update(block_ids)

    def unpin_all(self) -> None:
        self.pinned.clear()

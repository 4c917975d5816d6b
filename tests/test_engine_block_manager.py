"""The block manager: reference counts, chained prefix hashes, LRU eviction, the swap tier."""

from __future__ import annotations

from dataclasses import replace

import pytest

from perfdiag.engine_ref import LLMEngine, ModelConfig, SamplingParams
from perfdiag.engine_ref.block_manager import BlockManager, block_hash, hash_root
from perfdiag.engine_ref.request import Request
from perfdiag.engine_ref.testing import tiny_config

BS = 4
FP = ModelConfig.preset("tiny").fingerprint("float32")


def req(rid: str, tokens: list[int], root: bytes = hash_root(FP)) -> Request:
    return Request(rid, tuple(tokens), SamplingParams(), 0, len(tokens) + 16, hash_root=root)


def admit(bm: BlockManager, r: Request) -> int:
    """Allocate like the scheduler does and mark everything computed; returns hits."""
    hits = bm.find_cached_prefix(r)
    n = r.num_tokens - len(hits) * BS
    assert bm.can_allocate(hits, n)
    bm.allocate(r, hits, n)
    r.num_computed_tokens = r.num_tokens
    bm.cache_full_blocks(r, len(hits) * BS)
    return len(hits) * BS


def test_refcounts_and_sharing():
    bm = BlockManager(16, BS, check=True)
    a = req("a", list(range(10)))
    b = req("b", [*range(8), 50, 51, 52])
    assert admit(bm, a) == 0
    assert len(a.block_table) == 3 and bm.num_used_blocks == 3
    assert admit(bm, b) == 8  # two full blocks shared
    assert b.block_table[:2] == a.block_table[:2]
    assert [bm.blocks[x].ref_count for x in a.block_table] == [2, 2, 1]
    bm.free(a)
    assert [bm.blocks[x].ref_count for x in b.block_table[:2]] == [1, 1]
    bm.free(b)
    assert bm.num_free_blocks == 16 and bm.num_used_blocks == 0
    assert bm.num_cached_blocks == 2  # still cached, evictable


def test_hit_leaves_one_token_to_compute():
    bm = BlockManager(16, BS)
    admit(bm, req("a", list(range(8))))
    assert admit(bm, req("b", list(range(8)))) == 4  # block-aligned prompt: last block recomputed
    assert admit(bm, req("c", list(range(9)))) == 8


def test_same_tokens_at_another_position_never_hit():
    bm = BlockManager(32, BS)
    admit(bm, req("a", [1, 2, 3, 4, 5, 6, 7, 8, 9]))
    # [5..8] was cached as block 1 of "a"; here it is block 0: a different position chain
    assert admit(bm, req("b", [5, 6, 7, 8, 9, 9])) == 0
    # [1..4] after another block is not the cached [1..4] at position 0
    assert admit(bm, req("c", [0, 0, 0, 0, 1, 2, 3, 4, 9])) == 0
    h0 = block_hash(b"root", 0, [1, 2, 3, 4])
    assert h0 != block_hash(b"root", 1, [1, 2, 3, 4])
    assert block_hash(h0, 1, [5, 6, 7, 8]) != block_hash(b"root", 1, [5, 6, 7, 8])


def test_another_model_configuration_or_salt_never_hits():
    bm = BlockManager(32, BS)
    tokens = list(range(13))
    admit(bm, req("a", tokens))
    other_dtype = ModelConfig.preset("tiny").fingerprint("bfloat16")
    other_rope = replace(
        ModelConfig.preset("tiny"), rope=replace(ModelConfig.preset("tiny").rope, theta=5e5)
    ).fingerprint("float32")
    other_weights = ModelConfig.preset("tiny", seed=1).fingerprint("float32")
    for fp in (other_dtype, other_rope, other_weights):
        assert fp != FP
        assert admit(bm, req("x" + fp.hex()[:6], tokens, hash_root(fp))) == 0
    assert admit(bm, req("salted", tokens, hash_root(FP, "tenant-b"))) == 0
    assert admit(bm, req("same", tokens)) == 12


def test_engine_prefix_hits_respect_position_and_salt():
    engine = LLMEngine(tiny_config())
    p = [256, *range(40)]
    params = SamplingParams(temperature=0.0, max_tokens=2)
    engine.generate([p], params)
    rid = engine.add_request(p, params)
    hits = {rid: engine.block_manager.find_cached_prefix(engine.requests[rid])}
    assert len(hits[rid]) * 4 == 40
    shifted = engine.add_request([256, 7, *range(40)], params)
    salted = engine.add_request(p, params, cache_salt="other-tenant")
    assert engine.block_manager.find_cached_prefix(engine.requests[shifted]) == []
    assert engine.block_manager.find_cached_prefix(engine.requests[salted]) == []


def test_lru_evicts_least_recently_released_first():
    bm = BlockManager(6, BS, check=True)
    a, b = req("a", list(range(9))), req("b", list(range(100, 109)))
    admit(bm, a)
    admit(bm, b)  # 6 blocks used: a0 a1 a2, b0 b1 b2 (blocks 2 of each hold 1 token)
    a_blocks, b_blocks = list(a.block_table), list(b.block_table)
    bm.free(a)  # a's full blocks become evictable (tail first), a2 plain free
    bm.free(b)
    assert bm.num_free_blocks == 6 and bm.num_cached_blocks == 4
    # Take 4 blocks: the 2 empty ones first, then evict in LRU order: a1, a0 (a's tail first)
    c = req("c", list(range(200, 216)))
    admit(bm, c)
    assert bm.num_evictions == 2
    assert set(c.block_table) == {a_blocks[2], b_blocks[2], a_blocks[0], a_blocks[1]}
    # b's prefix survived; a's did not
    assert bm.find_cached_prefix(req("a2", list(range(9)))) == []
    bm.free(c)
    assert admit(bm, req("b2", list(range(100, 109)))) == 8


def test_a_hit_revives_an_evictable_block():
    bm = BlockManager(4, BS, check=True)
    a = req("a", list(range(9)))
    admit(bm, a)
    bm.free(a)
    b = req("b", list(range(9)))
    assert not bm.can_allocate(bm.find_cached_prefix(b), 1, reserve=2)  # 2 revived + 1 new
    assert bm.can_allocate(bm.find_cached_prefix(b), 1, reserve=1)
    assert admit(bm, b) == 8
    assert bm.num_free_blocks == 1


def test_swap_round_trip_keeps_kv_and_frees_both_tiers():
    engine = LLMEngine(tiny_config())
    rid = engine.add_request([256, *range(30)], SamplingParams(max_tokens=8))
    engine.step()
    engine.step()
    r, bm, kv = engine.requests[rid], engine.block_manager, engine.kv_cache
    before = kv.device_kv[:, :, r.block_table].clone()
    used = bm.num_used_blocks
    bm.swap_out(r)
    assert r.block_table == [] and len(r.cpu_block_table) == used
    assert bm.num_used_blocks == 0 and bm.num_free_cpu_blocks == bm.num_cpu_blocks - used
    assert bm.num_cached_blocks > 0  # its full blocks stay in the prefix cache meanwhile
    kv.device_kv.zero_()  # whatever the device pool held is gone
    bm.swap_in(r)
    assert bm.num_free_cpu_blocks == bm.num_cpu_blocks
    assert (kv.device_kv[:, :, r.block_table] == before).all()


def test_ownership_errors():
    from perfdiag.engine_ref.block_manager import OwnershipError

    bm = BlockManager(8, BS, check=True)
    a, b = req("a", list(range(6))), req("b", list(range(50, 56)))
    admit(bm, a)
    admit(bm, b)
    bm.check_access("a", a.block_table, [a.block_table[-1]])
    with pytest.raises(OwnershipError, match="reads"):
        bm.check_access("a", b.block_table, [])
    with pytest.raises(OwnershipError, match="writes"):
        bm.check_access("b", [], [a.block_table[0]])
    c = req("c", list(range(6)))
    admit(bm, c)  # shares a's full block 0
    with pytest.raises(OwnershipError, match="shared or cached"):
        bm.check_access("c", [], [c.block_table[0]])
    with pytest.raises(OwnershipError, match="does not own"):
        bm._unref(b.block_table[0], "a")

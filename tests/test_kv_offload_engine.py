"""The prefix cache's host tier (--kv-offload-mb) in the engine: greedy output
token-identical to the plain engine on a workload whose hot prefix set exceeds the device
pool (so hits really come from the host tier), with an int8 cache, speculative decoding and
preemption by recompute; every block free at the end; nothing changes with the prefix cache
off or no host memory; the tier's LRU, thrash and pinning bookkeeping."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from perfdiag.engine_ref.config import CacheConfig, SchedulerConfig, SpeculativeConfig
from perfdiag.engine_ref.engine import LLMEngine
from perfdiag.engine_ref.hooks import EngineObserver, RequestEventKind
from perfdiag.engine_ref.kv_cache import bytes_per_block
from perfdiag.engine_ref.request import SamplingParams
from perfdiag.engine_ref.testing import BOS, WorkItem, run, tiny_config

BLOCK = 4
TINY_BLOCK_BYTES = 2048  # tiny, float32, 4 tokens a block (asserted below)


class Offloads(EngineObserver):
    def __init__(self) -> None:
        self.restores, self.counts, self.preempted = [], [], set()

    def on_request(self, e) -> None:
        if e.kind == RequestEventKind.PREEMPTED:
            self.preempted.add(e.request_id)

    def on_kv_offload(self, restores, counts) -> None:
        self.restores.extend(restores)
        self.counts.append(counts)

    def host_tokens(self) -> int:
        return sum(r.host_tokens for r in self.restores)


def hot_prefixes(groups: int = 6, prefix_blocks: int = 6, rounds: int = 3, seed: int = 0):
    """`rounds` passes over `groups` shared prefixes of `prefix_blocks` blocks each, every
    request with its own suffix: the hot set (groups × prefix_blocks) is what matters."""
    rng = random.Random(seed)
    prefixes = [
        [BOS] + [rng.randrange(256) for _ in range(prefix_blocks * BLOCK - 1)]
        for _ in range(groups)
    ]
    items = []
    for r in range(rounds):
        for g in range(groups):
            suffix = [rng.randrange(256) for _ in range(rng.randrange(1, 9))]
            params = SamplingParams(temperature=0.0, max_tokens=rng.choice([2, 5, 9]))
            items.append(WorkItem(prefixes[(g + r) % groups] + suffix, params))
    return items


def engine(offload_blocks=0, blocks=24, observer=None, **cache_kw) -> LLMEngine:
    sched = cache_kw.pop("scheduler", None)
    cache = CacheConfig(
        block_size=BLOCK,
        num_gpu_blocks=blocks,
        check_ownership=True,
        kv_offload_bytes=offload_blocks * TINY_BLOCK_BYTES,
        **cache_kw,
    )
    return LLMEngine(tiny_config(cache, sched), observer)


def test_tiny_block_bytes():
    eng = engine()
    assert bytes_per_block(eng.config.model, BLOCK, "float32") == TINY_BLOCK_BYTES


@pytest.mark.parametrize("per_step", [1, 3])
def test_identical_and_hits_come_from_the_host_tier(per_step):
    items = hot_prefixes()  # 36 prefix blocks hot, 24 on the device
    plain = run(engine(), items, per_step)
    obs = Offloads()
    eng = engine(64, observer=obs)
    off = run(eng, items, per_step)
    assert off.tokens == plain.tokens and off.finish == plain.finish
    assert obs.host_tokens() > 0  # the host tier really served prefixes
    assert all(r.restore_bytes == r.host_tokens // BLOCK * TINY_BLOCK_BYTES for r in obs.restores)
    assert sum(c.offloaded_blocks for c in obs.counts) > 0
    assert eng.is_drained()


def test_int8_cache_restores_values_and_scales():
    items = hot_prefixes(seed=1)
    plain = run(engine(kv_dtype="int8", blocks=48), items, 1)
    obs = Offloads()
    # int8: 2 * 2 layers * 4 tokens * 2 heads * (8 + 4 scale bytes) per block
    eng = engine(128, blocks=48, observer=obs, kv_dtype="int8")
    off = run(eng, items, 1)
    assert off.tokens == plain.tokens
    assert obs.host_tokens() > 0 and eng.is_drained()


def test_speculative_decoding_with_the_host_tier():
    items = hot_prefixes(seed=2)
    spec = SpeculativeConfig("ngram", 4)
    base = run(LLMEngine(replace(engine().config, speculative=spec)), items, 1)
    obs = Offloads()
    eng = LLMEngine(replace(engine(64).config, speculative=spec), obs)
    off = run(eng, items, 1)
    assert off.tokens == base.tokens and obs.host_tokens() > 0 and eng.is_drained()


def test_preempted_by_recompute_finds_its_prefix_in_the_host_tier():
    """A pool so small that requests preempt each other: a victim's freed blocks are
    evicted to the host tier, and its re-admission restores them instead of recomputing."""
    rng = random.Random(5)
    items = [
        WorkItem(
            [BOS] + [rng.randrange(256) for _ in range(40)],
            SamplingParams(temperature=0.0, max_tokens=40),
        )
        for _ in range(8)
    ]
    sched = SchedulerConfig(max_num_batched_tokens=64, chunk_size=16)
    plain = run(
        LLMEngine(
            tiny_config(
                CacheConfig(block_size=BLOCK, num_gpu_blocks=30, check_ownership=True), sched
            )
        ),
        items,
    )
    obs = Offloads()
    cache = CacheConfig(
        block_size=BLOCK,
        num_gpu_blocks=30,
        check_ownership=True,
        kv_offload_bytes=200 * TINY_BLOCK_BYTES,
    )
    eng = LLMEngine(tiny_config(cache, sched), obs)
    res = run(eng, items)
    assert res.tokens == plain.tokens
    resumed = {r.request_id for r in obs.restores if r.host_tokens}
    assert resumed and resumed <= obs.preempted and eng.is_drained()


@pytest.mark.parametrize("cache_kw", [dict(enable_prefix_caching=False), dict()])
def test_nothing_changes_without_prefix_cache_or_host_memory(cache_kw):
    items = hot_prefixes(rounds=2)
    offload = 0 if not cache_kw else 64  # prefix cache off with 64 blocks asked: no tier
    eng = engine(offload, observer=(obs := Offloads()), **cache_kw)
    assert eng.block_manager.host_tier is None
    res = run(eng, items, 1)
    plain = run(engine(**cache_kw), items, 1)
    assert res.tokens == plain.tokens and res.steps == plain.steps and not obs.restores


def test_a_host_tier_too_small_for_a_block_is_refused():
    from perfdiag.errors import ConfigError

    cache = CacheConfig(block_size=BLOCK, num_gpu_blocks=24, kv_offload_bytes=100)
    with pytest.raises(ConfigError, match="holds no KV block"):
        LLMEngine(tiny_config(cache))


def test_thrash_blocks_written_and_evicted_unused_are_counted():
    """Every prompt unique: every offloaded block is evicted before any reuse."""
    rng = random.Random(9)
    items = [
        WorkItem(
            [BOS] + [rng.randrange(256) for _ in range(27)],
            SamplingParams(temperature=0.0, max_tokens=2),
        )
        for _ in range(20)
    ]
    obs = Offloads()
    eng = engine(8, blocks=24, observer=obs)
    run(eng, items, 1)
    tier = eng.block_manager.host_tier
    assert tier.total_offloaded > 8 and tier.total_restored == 0
    assert tier.total_evicted_unused == tier.total_offloaded - len(tier.slots)
    assert sum(c.evicted_unused for c in obs.counts) == tier.total_evicted_unused


def test_lru_keeps_the_recently_restored_and_pins_pending_restores():
    eng = engine(4)
    tier = eng.block_manager.host_tier
    for i in range(4):
        tier.offload(i, bytes([i]) * 16, None)
    tier.restore("r", [bytes([0]) * 16], [10], 0, BLOCK)  # block 0's hash now most recent
    tier.pinned.add(bytes([1]) * 16)
    tier.offload(5, b"\x05" * 16, None)  # evicts the LRU unpinned one: hash 2
    assert bytes([2]) * 16 not in tier and bytes([1]) * 16 in tier and bytes([0]) * 16 in tier
    assert tier.take_counts().evicted_unused == 1
    assert tier.restores[0].host_tokens == BLOCK


@pytest.mark.slow  # two real-model engines: ~10-20 s on a busy machine
def test_greedy_identical_on_smollm2():
    from smollm2_model import smollm2_path

    from perfdiag.engine_ref.config import EngineConfig
    from perfdiag.engine_ref.gguf_loader import read_gguf_config

    path = smollm2_path()
    mcfg = read_gguf_config(path)
    rng = random.Random(3)
    prefixes = [[rng.randrange(1000, 20000) for _ in range(48)] for _ in range(4)]
    prompts = [prefixes[i % 4] + [rng.randrange(1000, 20000) for _ in range(5)] for i in range(12)]
    per_block = bytes_per_block(mcfg, 16, "float32")

    def make(offload_blocks, obs=None):
        cache = CacheConfig(
            block_size=16, num_gpu_blocks=12, kv_offload_bytes=offload_blocks * per_block
        )
        cfg = EngineConfig(model=mcfg, model_path=str(path), max_model_len=256, cache=cache)
        return LLMEngine(cfg, obs)

    params = SamplingParams(temperature=0.0, max_tokens=6)
    outs, plain = [], []
    for n, sink in ((0, plain), (32, outs)):
        obs = Offloads()
        eng = make(n, obs)
        for p in prompts:  # one at a time: 4 hot prefixes of 3 blocks, 12 device blocks
            sink.append(eng.generate([p], params)[0].token_ids)
    assert outs == plain
    assert obs.host_tokens() > 0 and eng.is_drained()


def test_the_restore_delay_fault_slows_restores_inside_their_timing():
    from perfdiag.probes.faults import FaultOptions

    items = hot_prefixes(seed=4)
    times = {}
    for delay in (0.0, 2000.0):
        obs = Offloads()
        eng = engine(64, observer=obs)
        FaultOptions(restore_delay_us=delay).slow_restore(eng)
        run(eng, items, 1)
        restores = [r for r in obs.restores if r.host_tokens]
        assert restores
        times[delay] = min(r.restore_ns / (r.host_tokens // BLOCK) for r in restores)
    assert times[2000.0] >= 2_000_000 > times[0.0]


def test_swap_preemption_beside_the_host_tier_is_identical():
    """Swap mode keeps its own CPU tier; its swap-ins may offload evicted prefix blocks."""
    rng = random.Random(5)
    items = [
        WorkItem(
            [BOS] + [rng.randrange(256) for _ in range(40)],
            SamplingParams(temperature=0.0, max_tokens=40),
        )
        for _ in range(8)
    ]
    sched = SchedulerConfig(max_num_batched_tokens=64, chunk_size=16, preemption_mode="swap")
    res = {}
    for n in (0, 200):
        cache = CacheConfig(block_size=BLOCK, num_gpu_blocks=30, check_ownership=True,
                            kv_offload_bytes=n * TINY_BLOCK_BYTES)  # fmt: skip
        obs = Offloads()
        eng = LLMEngine(tiny_config(cache, sched), obs)
        res[n] = run(eng, items)
        assert eng.is_drained() and obs.preempted
    assert res[200].tokens == res[0].tokens

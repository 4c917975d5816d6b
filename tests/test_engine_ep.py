"""Expert parallelism (parallel.shard_moe) and the per-step expert loads: --tp 2 on a MoE
preset places E/2 experts on each rank and equals the single process token for token;
every step's tokens per expert add up to tokens × top-k × layers."""

from __future__ import annotations

import pytest
import torch

from perfdiag.engine_ref import EngineConfig, LLMEngine, ModelConfig, SamplingParams
from perfdiag.engine_ref.config import SchedulerConfig
from perfdiag.engine_ref.hooks import EngineObserver
from perfdiag.errors import ConfigError

PROMPTS = ["Hello world", "The quick brown fox jumps over", "abc", "experts " * 6]


class Records(EngineObserver):
    def __init__(self) -> None:
        self.collectives, self.steps, self.loads = [], [], []

    def on_collectives(self, events) -> None:
        self.collectives += events

    def on_expert_loads(self, events) -> None:
        self.loads += events

    def on_step(self, event) -> None:
        self.steps.append(event)


def _config(tp: int, placement=(), **model) -> EngineConfig:
    return EngineConfig(model=ModelConfig.preset("tiny-moe", **model), tensor_parallel_size=tp,
                        scheduler=SchedulerConfig(chunk_size=8),
                        expert_placement=placement)  # fmt: skip


def _generate(engine: LLMEngine, logits: list) -> list[list[int]]:
    forward = engine.runner.forward

    def keep(inp, all_logits=False):
        out = forward(inp, all_logits)
        logits.append(out.clone())
        return out

    engine.runner.forward = keep
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    return [o.token_ids for o in engine.generate(PROMPTS, params)]


def _per_step(loads) -> dict[int, dict[tuple[int, int], int]]:
    out: dict[int, dict] = {}
    for e in loads:
        out.setdefault(e.step_id, {})[(e.layer, e.expert)] = e.tokens
    return out


def test_ep2_equals_one_process_tokens_logits_and_loads():
    ref_logits, ep_logits = [], []
    one_rec, two_rec = Records(), Records()
    one = LLMEngine(_config(1), observer=one_rec)
    want = _generate(one, ref_logits)
    with LLMEngine(_config(2), observer=two_rec) as two:
        got = _generate(two, ep_logits)
        info = two.tp.info()
        # Each rank holds half the experts and half the shared expert's columns.
        moe = two.model.layers[0].mlp
        assert moe.experts.gate_up_proj.shape[0] == 4 and moe.local_experts == [0, 1, 2, 3]
        assert moe.shared_expert.down_proj.weight.shape[1] == 32
    assert got == want
    for a, b in zip(ref_logits, ep_logits, strict=True):
        torch.testing.assert_close(b, a, atol=2e-4, rtol=1e-4)
    assert info["expert_parallel_size"] == 2
    assert info["expert_placement"] == [0, 0, 0, 0, 1, 1, 1, 1]
    # Routing is the same computation on every rank: the same loads as one process.
    assert _per_step(two_rec.loads) == _per_step(one_rec.loads)
    assert {e.rank for e in two_rec.loads if e.expert < 4} == {0}
    assert {e.rank for e in two_rec.loads if e.expert >= 4} == {1}
    assert {e.rank for e in one_rec.loads} == {0}
    # Still 2 all-reduces per layer per step per rank: attention's and the MoE combine.
    cfg = one.config.model
    assert len(two_rec.collectives) == 2 * 2 * cfg.num_layers * len(two_rec.steps)


def test_any_placement_with_e_over_n_experts_per_rank_gives_the_same_tokens():
    want = _generate(LLMEngine(_config(1)), [])
    where = (1, 0, 0, 1, 1, 0, 1, 0)
    rec = Records()
    with LLMEngine(_config(2, where), observer=rec) as two:
        got = _generate(two, [])
        assert two.model.layers[1].mlp.local_experts == [1, 2, 5, 7]
        assert two.tp.info()["expert_placement"] == list(where)
    assert got == want
    assert all(e.rank == where[e.expert] for e in rec.loads)


def test_loads_add_up_to_tokens_times_top_k_per_layer():
    rec = Records()
    engine = LLMEngine(_config(1), observer=rec)
    _generate(engine, [])
    cfg = engine.config.model
    per_step = _per_step(rec.loads)
    assert set(per_step) == {s.step_id for s in rec.steps}
    for s in rec.steps:
        tokens = s.num_prefill_tokens + s.num_decode_seqs
        counts = per_step[s.step_id]
        assert len(counts) == cfg.num_layers * cfg.num_experts  # zeros included
        assert sum(counts.values()) == tokens * cfg.num_experts_per_tok * cfg.num_layers
        for layer in range(cfg.num_layers):
            layer_total = sum(n for (ly, _), n in counts.items() if ly == layer)
            assert layer_total == tokens * cfg.num_experts_per_tok


def test_router_bias_sends_tokens_to_the_biased_expert():
    plain, biased = Records(), Records()
    _generate(LLMEngine(_config(1), observer=plain), [])
    _generate(LLMEngine(_config(1, router_bias=((3, 4.0),)), observer=biased), [])

    def share(rec, expert):
        return sum(e.tokens for e in rec.loads if e.expert == expert) / sum(
            e.tokens for e in rec.loads
        )

    # A strong bias puts expert 3 in nearly every token's top-2: a share near 1/2.
    assert share(biased, 3) > 0.45 > share(plain, 3) + 0.2


@pytest.mark.parametrize(
    "tp, where, message",
    [
        (2, (0, 1, 0, 1), "names 4 experts"),
        (2, (0, 0, 0, 0, 0, 1, 1, 1), r"each of the 2 ranks 4 experts, got \[5, 3\]"),
        (2, (0, 1, 2, 1, 0, 1, 0, 1), "each of the 2 ranks"),
        (1, (0,) * 8, "over --tp ranks"),
    ],
)
def test_a_placement_that_does_not_fit_is_refused(tp, where, message):
    with pytest.raises(ConfigError, match=message):
        _config(tp, where)


def test_ep_needs_experts_divisible_by_ranks():
    with pytest.raises(ConfigError, match="num_experts"):
        _config(2, num_experts=7, num_experts_per_tok=2)
    with pytest.raises(ConfigError, match="shared_expert_intermediate_size"):
        _config(2, shared_expert_intermediate_size=33)

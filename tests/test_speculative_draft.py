"""The draft-model proposer alone, without the engine's verification: its drafts are the
draft model's own continuation (the dense reference recomputing everything), whatever it
cached, rejected or shares its batch with; its KV is trimmed, bounded and freed."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from perfdiag.engine_ref.config import BYTE_VOCAB, CacheConfig
from perfdiag.engine_ref.kv_cache import bytes_per_block
from perfdiag.engine_ref.reference import DenseReference
from perfdiag.engine_ref.request import Request, SamplingParams
from perfdiag.engine_ref.sampler import apply_top_k_top_p
from perfdiag.engine_ref.speculative.draft_model import DraftModelProposer
from perfdiag.engine_ref.testing import tiny_config, with_cache
from perfdiag.errors import ConfigError

GREEDY = SamplingParams(temperature=0.0, max_tokens=200)
DRAFT = "smollm2-135m"  # the real model's file preset: its Q4_1 blocks
BS = 4  # tiny_config's block size: drafts and rejections cross block boundaries


def request(rid: str, prompt: list[int], params: SamplingParams = GREEDY) -> Request:
    return Request(rid, tuple(prompt), params, 0, len(prompt) + params.max_tokens)


def prompt(n: int, salt: int = 0) -> list[int]:
    return [256] + [(7 * i + 13 * salt) % 256 for i in range(n - 1)]


@pytest.fixture(scope="module")
def proposer():
    # The same preset as the target (tiny, seed 0): the draft is the tiny model itself.
    return DraftModelProposer.from_target(tiny_config(), "tiny")


@pytest.fixture(scope="module")
def reference(proposer):
    return DenseReference(proposer.model)


def continuation(reference, tokens: list[int], k: int) -> list[int]:
    return reference.greedy(tokens, k, ignore_eos=True).token_ids


def emit(req: Request, tokens: list[int]) -> None:
    """What the engine's verification does: append the step's tokens to the request."""
    for t in tokens:
        req.append_token(t, 0.0)


def held_blocks(p: DraftModelProposer) -> int:
    return p.block_manager.num_used_blocks


def test_greedy_drafts_are_the_draft_models_continuation(proposer, reference):
    r = request("a", prompt(9))
    (got,) = proposer.propose([r], 5)
    assert got.tokens == continuation(reference, list(r.all_token_ids), 5)
    assert got.probs is None  # greedy: a one-hot q
    proposer.release("a")


def test_a_batch_of_different_lengths(proposer, reference):
    reqs = [request(f"b{n}", prompt(n, salt=n)) for n in (1, 6, 23, 4)]
    # Different histories too: one has decoded a few tokens already.
    emit(reqs[2], continuation(reference, list(reqs[2].all_token_ids), 3))
    for step in range(3):
        props = proposer.propose(reqs, 4)
        for r, p in zip(reqs, props, strict=True):
            assert p.tokens == continuation(reference, list(r.all_token_ids), 4), (step, r)
            emit(r, [*p.tokens[: 1 + step % 3], (p.tokens[-1] + 1) % BYTE_VOCAB])
            proposer.accepted(r)
    for r in reqs:
        proposer.release(r.request_id)


@pytest.mark.parametrize("n_accepted", [0, 2, 4])
def test_after_a_rejection_the_drafts_are_as_if_never_seen(proposer, reference, n_accepted):
    """Accept n of 4 drafts and append a token the draft did not propose (or, with all 4
    accepted, the bonus token): the next drafts ignore the rejected ones' KV."""
    r = request("c", prompt(10))
    first = proposer.propose([r], 4)[0].tokens
    own = first[:n_accepted]
    if n_accepted < 4:
        own.append((first[n_accepted] + 1) % BYTE_VOCAB)  # the target disagrees here
    else:
        own.append(continuation(reference, list(r.all_token_ids) + first, 1)[0])
    emit(r, own)
    proposer.accepted(r)
    s = proposer.seqs["c"]
    true_cached = 10 + min(n_accepted, 3)  # the 4th draft is never fed to the draft
    assert s.num_computed_tokens == true_cached
    assert len(s.block_table) == -(-true_cached // BS)  # blocks past the true tokens freed
    again = proposer.propose([r], 4)[0].tokens
    assert again == continuation(reference, list(r.all_token_ids), 4)
    fresh = DraftModelProposer(proposer.config, proposer.model)  # never saw the drafts
    assert fresh.propose([r], 4)[0].tokens == again
    proposer.release("c")


def test_release_frees_every_draft_block(proposer):
    reqs = [request(f"d{n}", prompt(n)) for n in (3, 17, 30)]
    proposer.propose(reqs, 6)
    assert held_blocks(proposer) == sum(-(-(n + 5) // BS) for n in (3, 17, 30))
    for r in reqs:
        proposer.release(r.request_id)
    proposer.release("never-seen")  # a request the draft never held: nothing to do
    assert held_blocks(proposer) == 0 and not proposer.seqs


def test_a_full_draft_pool_proposes_less_and_never_fails():
    target = tiny_config()
    mb = 5 * bytes_per_block(target.model, BS, "float32") / 2**20  # 5 blocks: 20 tokens
    p = DraftModelProposer.from_target(target, "tiny", draft_kv_mb=mb)
    long, short, mid = (
        request("long", prompt(25)),
        request("short", prompt(5)),
        request("mid", prompt(9)),
    )
    got = p.propose([long, short, mid], 4)
    assert got[0].tokens == []  # 25 tokens never fit 20
    assert len(got[1].tokens) == 4  # 8 tokens of KV: 2 blocks
    assert len(got[2].tokens) == 4  # 12 tokens: 3 blocks, the pool is full now
    assert held_blocks(p) == 5 and "long" not in p.seqs
    p.release("mid")
    emit(short, [*got[1].tokens[:1], 1])
    p.accepted(short)
    assert [len(x.tokens) for x in p.propose([short, long], 4)] == [4, 0]


def test_drafts_stop_where_the_request_must(proposer):
    r = request("e", prompt(5), SamplingParams(temperature=0.0, max_tokens=3))
    assert len(proposer.propose([r], 8)[0].tokens) == 2  # 3 tokens left: 2 drafts + 1 own
    emit(r, [1, 2])
    assert proposer.propose([r], 8)[0].tokens == []  # one token left: the target's
    proposer.release("e")
    assert held_blocks(proposer) == 0


def test_non_greedy_drafts_come_with_their_distributions(proposer, reference):
    params = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=5, max_tokens=50)
    r, g = request("f", prompt(12), params), request("g", prompt(7))
    sampled, greedy = proposer.propose([r, g], 3)
    assert greedy.probs is None and len(sampled.tokens) == 3
    q = sampled.probs
    assert q.dtype == torch.float32 and q.shape == (3, BYTE_VOCAB)
    logits = reference.logits(list(r.all_token_ids) + sampled.tokens[:-1])[-3:]
    n = logits.shape[0]
    want = apply_top_k_top_p(logits / 0.8, torch.full((n,), 20), torch.full((n,), 0.9)).softmax(-1)
    torch.testing.assert_close(q, want, atol=1e-5, rtol=1e-4)
    assert all(q[i, t] > 0 for i, t in enumerate(sampled.tokens))  # drawn from its support
    # A seeded request's drafts do not depend on what shares its batch.
    proposer.release("f")
    alone = proposer.propose([request("f", prompt(12), params)], 3)[0]
    assert alone.tokens == sampled.tokens
    proposer.release("f")
    proposer.release("g")


def test_draft_samples_follow_the_draft_distribution():
    """One draft per request at temperature 1 over many unseeded requests: the empirical
    frequencies match q (chi-square over the tokens q gives >= 1 % mass and the rest as
    one cell, at the 99.9 % level: Wilson-Hilferty's quantile)."""
    target = with_cache(tiny_config(), num_gpu_blocks=4096)
    p = DraftModelProposer.from_target(target, "tiny")
    params = SamplingParams(temperature=1.5, max_tokens=10)
    reqs = [request(f"s{i}", prompt(4), params) for i in range(4000)]  # a block each
    props = p.propose(reqs, 1)
    q = props[0].probs[0].double()
    counts = torch.bincount(torch.tensor([x.tokens[0] for x in props]), minlength=BYTE_VOCAB)
    big = q >= 0.01
    expected = q[big] * len(reqs)
    observed = counts[big].double()
    rest_e, rest_o = len(reqs) - expected.sum(), len(reqs) - observed.sum()
    chi2 = float(((observed - expected) ** 2 / expected).sum() + (rest_o - rest_e) ** 2 / rest_e)
    dof = int(big.sum())  # cells - 1, with the rest as one more cell
    z, a = 3.09, 2 / (9 * dof)
    assert chi2 < dof * (1 - a + z * a**0.5) ** 3, (chi2, dof)


def test_a_draft_with_another_vocabulary_is_refused():
    target = tiny_config(vocab_size=300)
    with pytest.raises(ConfigError) as e:
        DraftModelProposer.from_target(target, "tiny")
    msg = str(e.value)
    assert "\n" not in msg and "259" in msg and "300" in msg


def test_an_unknown_draft_is_refused():
    with pytest.raises(ConfigError, match="draft model 'nope'"):
        DraftModelProposer.from_target(tiny_config(), "nope")


def test_the_default_pool_holds_the_targets_tokens():
    target = tiny_config(cache=CacheConfig(block_size=4, num_gpu_blocks=37))
    p = DraftModelProposer.from_target(target, "tiny")
    assert p.block_manager.num_blocks == 37 and p.block_manager.block_size == 4


@pytest.mark.slow
def test_smollm2_q4_1_drafts_for_its_float_self():
    """The real model drafting for its float self with the file's own Q4_1 blocks: the
    drafts are what that Q4_1 engine decodes greedily, and the engine's speculative output
    is token-identical to its plain output, in far fewer steps (the same weights: nearly
    every draft is accepted)."""
    from smollm2_model import PROMPTS, smollm2_path

    from perfdiag.engine_ref.config import EngineConfig
    from perfdiag.engine_ref.engine import LLMEngine
    from perfdiag.engine_ref.gguf_loader import read_gguf_config
    from perfdiag.engine_ref.speculative.spec_config import SpeculativeConfig

    path = smollm2_path()
    target = EngineConfig(
        model=read_gguf_config(path),
        model_path=str(path),
        max_model_len=512,
        cache=CacheConfig(kv_cache_bytes=32 * 2**20),
    )
    params = SamplingParams(temperature=0.0, max_tokens=16)
    plain_engine = LLMEngine(target)
    plain = plain_engine.generate(PROMPTS, params)
    spec_engine = LLMEngine(replace(target, speculative=SpeculativeConfig("draft", 4, DRAFT)))
    spec = spec_engine.generate(PROMPTS, params)
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
    assert spec_engine._step_id * 2 < plain_engine._step_id
    p = spec_engine.proposer
    assert p.config.weight_format == "q4_1" and p.config.model.vocab_size == 49152
    assert spec_engine.is_drained() and held_blocks(p) == 0 and not p.seqs

    k = 6
    q4_1 = LLMEngine(p.config).generate(  # the draft's config, without speculation
        PROMPTS, SamplingParams(temperature=0.0, max_tokens=k, ignore_eos=True)
    )
    reqs = [request(f"m{i}", w.prompt_token_ids) for i, w in enumerate(q4_1)]
    assert [x.tokens for x in p.propose(reqs, k)] == [w.token_ids for w in q4_1]

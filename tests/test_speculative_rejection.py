"""The rejection sampler alone: speculative output follows the target distribution.

Over many draws with a fixed seed, the first emitted token's distribution equals p_0 and,
where the first draft was accepted, the second's equals p_1, for a one-hot q (n-gram) and
for a random q (a draft model) far from p. Greedy accepts exactly the argmax prefix.
"""

from __future__ import annotations

import torch

from perfdiag.engine_ref.request import Request, SamplingParams
from perfdiag.engine_ref.sampler import target_probs
from perfdiag.engine_ref.speculative.rejection import rejection_sample, verify

V = 6
N = 20_000
# Total-variation distance of N samples from the true law: about 0.008 here;
# a biased sampler (residual p instead of max(0, p - q)) is off by > 0.1.
TV_BOUND = 0.02


def _target(seed: int, rows: int, params: SamplingParams) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, V, generator=g) * 2
    return target_probs(logits, [params] * rows)


def _tv(counts: torch.Tensor, p: torch.Tensor) -> float:
    return 0.5 * float((counts / counts.sum() - p).abs().sum())


def _run(p: torch.Tensor, q: torch.Tensor | None, fixed_draft: list[int] | None):
    gen = torch.Generator().manual_seed(1234)
    first = torch.zeros(V)
    second = torch.zeros(V)
    for _ in range(N):
        if q is None:
            draft = fixed_draft
        else:
            draft = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(len(q))]
        tokens, n = rejection_sample(p, draft, q, gen)
        assert len(tokens) == n + 1 and tokens[:n] == draft[:n]
        first[tokens[0]] += 1
        if n >= 1:
            second[tokens[1]] += 1
    return first, second


def test_one_hot_draft_follows_target_distribution():
    p = _target(0, 3, SamplingParams(temperature=0.8))
    # Drafts the target finds likely and unlikely: both kinds of rejection happen.
    draft = [int(p[0].argmax()), int(p[1].argmin())]
    first, second = _run(p, None, draft)
    assert _tv(first, p[0]) < TV_BOUND
    assert second.sum() > 1000 and _tv(second, p[1]) < TV_BOUND


def test_random_draft_distribution_follows_target_distribution():
    params = SamplingParams(temperature=1.3, top_k=4)
    p = _target(1, 3, params)
    g = torch.Generator().manual_seed(7)
    q = torch.softmax(torch.randn(2, V, generator=g) * 2, -1)  # a poor draft: far from p
    assert 0.5 * float((q[0] - p[0]).abs().sum()) > 0.3
    first, second = _run(p, q, None)
    assert _tv(first, p[0]) < TV_BOUND
    assert second.sum() > 1000 and _tv(second, p[1]) < TV_BOUND
    assert first[p[0] == 0].sum() == 0  # top-k's excluded tokens never come out


def test_all_accepted_draws_a_bonus_token():
    p = torch.zeros(3, V)
    p[0, 2] = p[1, 4] = 1.0
    p[2, 5] = 1.0
    tokens, n = rejection_sample(p, [2, 4], None, torch.Generator().manual_seed(0))
    assert (tokens, n) == ([2, 4, 5], 2)


def _req(params: SamplingParams) -> Request:
    return Request("r", (1, 2), params, 0, 64)


def test_greedy_accepts_the_argmax_prefix_and_reports_raw_logprobs():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0], [0.0, 0.0, 5.0],
                           [1.0, 0.0, 0.0]])  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    greedy = SamplingParams(temperature=0.0)
    # Drafts [1, 0, 1]: 1 and 0 are the argmaxes, 1 is not (2 is): emit 1, 0, 2.
    out = verify(logits, [_req(greedy)], [[1, 0, 1]], [None], gen)[0]
    assert out.tokens == [1, 0, 2] and out.num_accepted == 2
    raw = logits.log_softmax(-1)
    assert out.logprobs == [float(raw[0, 1]), float(raw[1, 0]), float(raw[2, 2])]
    # Two requests in one batch: rows split per request, no drafts means a plain decode.
    both = verify(logits, [_req(greedy), _req(greedy)], [[1, 0], []], [None, None], gen)
    assert both[0].tokens == [1, 0, 2] and both[1].tokens == [0]


def test_seeded_request_reproduces():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(3))
    params = SamplingParams(temperature=1.0, seed=11)

    def once():
        req = _req(params)
        req.generator = torch.Generator().manual_seed(11)
        return verify(logits, [req], [[3, 4, 5, 6]], [None], torch.Generator())[0]

    assert once() == once()

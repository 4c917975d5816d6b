"""Verification of draft tokens by rejection sampling (Leviathan et al. 2023; Chen et al.
2023), so that speculative output follows the target's distribution exactly.

For draft tokens x_0..x_{k-1} drawn from q, and the target's distributions p_0..p_k at the
k + 1 verified positions: accept x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the
first rejection emit a token from norm(max(0, p_i - q_i)) and stop; when all k are accepted
emit a bonus token from p_k. A deterministic proposer's q is one-hot (accept with
probability p_i(x_i); the residual is p_i without x_i). Greedy requests accept a draft iff
it is the argmax, and emit the argmax where they stop. p is the sampler's own distribution
(temperature, top-k, top-p: sampler.target_probs).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..request import Request
from ..sampler import target_probs


class Verified(NamedTuple):
    tokens: list[int]  # emitted: the accepted drafts, then the target's own token
    logprobs: list[float]  # raw log_softmax of each emitted token at its position
    num_accepted: int  # drafts accepted (positions 0..n-1); position n rejected if n < k


def _draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token from `probs` [V], as the sampler draws (argmax of probs / Exp(1))."""
    noise = torch.empty_like(probs).exponential_(generator=generator)
    noise.clamp_(min=torch.finfo(noise.dtype).tiny)
    return int((probs / noise).argmax())


def rejection_sample(
    p: torch.Tensor, draft: list[int], q: torch.Tensor | None, generator: torch.Generator
) -> tuple[list[int], int]:
    """p [k+1, V] target probabilities, `draft` k tokens, q [k, V] their draft
    probabilities (None: one-hot) -> (emitted tokens, number of drafts accepted)."""
    k = len(draft)
    if k:
        rows = torch.arange(k, device=p.device)
        x = torch.tensor(draft, device=p.device)
        px = p[rows, x]
        qx = torch.ones_like(px) if q is None else q[rows, x]
        u = torch.rand(k, generator=generator, device=p.device, dtype=p.dtype)
        # u < px / qx without dividing by a zero q (such a draft is accepted iff p > 0).
        rejected = (~(u * qx < px)).tolist()
        n = rejected.index(True) if True in rejected else k
    else:
        n = 0
    if n == k:
        return [*draft, _draw(p[k], generator)], k
    if q is None:
        residual = p[n].clone()
        residual[draft[n]] = 0.0
    else:
        residual = (p[n] - q[n]).clamp_(min=0.0)
    if not float(residual.sum()) > 0.0:  # p == q up to rounding: nothing left, p is exact
        residual = p[n]
    return [*draft[:n], _draw(residual, generator)], n


def verify(
    logits: torch.Tensor,
    requests: list[Request],
    drafts: list[list[int]],
    draft_probs: list[torch.Tensor | None],
    default_generator: torch.Generator,
) -> list[Verified]:
    """logits [sum(k_r + 1), V] fp32: request r's rows are its k_r + 1 verified positions,
    requests in order -> what each request emits."""
    logprobs = logits.log_softmax(-1)
    argmax = logits.argmax(-1).tolist()
    sampled = [i for i, r in enumerate(requests) if not r.params.greedy]
    probs = None
    if sampled:
        offsets = _offsets(drafts)
        idx = [j for i in sampled for j in range(offsets[i], offsets[i] + len(drafts[i]) + 1)]
        params = [requests[i].params for i in sampled for _ in range(len(drafts[i]) + 1)]
        probs = dict.fromkeys(sampled)
        all_p = target_probs(logits[torch.tensor(idx, device=logits.device)], params)
        at = 0
        for i in sampled:
            probs[i] = all_p[at : at + len(drafts[i]) + 1]
            at += len(drafts[i]) + 1
    out: list[Verified] = []
    start = 0
    for i, (req, draft) in enumerate(zip(requests, drafts, strict=True)):
        k = len(draft)
        if probs is None or probs.get(i) is None:  # greedy
            best = argmax[start : start + k + 1]
            n = next((j for j in range(k) if draft[j] != best[j]), k)
            tokens = [*draft[:n], best[n]]
        else:
            gen = req.generator or default_generator
            tokens, n = rejection_sample(probs[i], draft, draft_probs[i], gen)
        rows = torch.arange(start, start + len(tokens), device=logits.device)
        chosen = logprobs[rows, torch.tensor(tokens, device=logits.device)].tolist()
        out.append(Verified(tokens, chosen, n))
        start += k + 1
    return out


def _offsets(drafts: list[list[int]]) -> list[int]:
    offsets, at = [], 0
    for d in drafts:
        offsets.append(at)
        at += len(d) + 1
    return offsets

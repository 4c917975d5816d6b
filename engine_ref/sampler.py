"""Token sampling: greedy, temperature, top-k, top-p, per-request seeds; chosen-token logprobs.

The reported log-probability is that of the chosen token under the model's raw
distribution (log_softmax of the logits, before temperature and filters), as vLLM reports
by default. Sampling draws Gumbel-style: argmax(probs / Exp(1)), with the exponentials from
the request's own generator when it has a seed, so a seeded request samples the same tokens
whatever else shares its batch.
"""

from __future__ import annotations

import torch

from .request import SamplingParams


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """Mask (to -inf) tokens outside each row's top-k and top-p nucleus. top_k 0 = off."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab)).clamp(max=vocab)
    ranks = torch.arange(vocab, device=logits.device)[None, :]
    drop = ranks >= k[:, None]
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(-1)
    # Keep a token while the mass before it is < top_p: the nucleus always keeps the top one.
    before = probs.cumsum(-1) - probs
    drop |= before >= top_p[:, None]
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def target_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """The distribution each row samples from: logits [N, V] over each row's temperature,
    then its top-k / top-p filters, softmaxed (rows must not be greedy). Speculative
    verification accepts drafts against exactly this distribution."""
    dev = logits.device
    sel = logits / torch.tensor([p.temperature for p in params], device=dev)[:, None]
    if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
        top_k = torch.tensor([p.top_k for p in params], device=dev)
        top_p = torch.tensor([p.top_p for p in params], device=dev)
        sel = apply_top_k_top_p(sel, top_k, top_p)
    return sel.softmax(-1)


class Sampler:
    def __init__(self, device: torch.device, seed: int = 0) -> None:
        self.generator = torch.Generator(device=device).manual_seed(seed)

    @torch.inference_mode()
    def __call__(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
    ) -> tuple[list[int], list[float]]:
        """logits [N, V] fp32 -> chosen token ids and their logprobs (lists of N)."""
        logprobs = logits.log_softmax(-1)
        tokens = logits.argmax(-1)
        rows = [i for i, p in enumerate(params) if not p.greedy]
        if rows:
            idx = torch.tensor(rows, device=logits.device)
            probs = target_probs(logits[idx], [params[i] for i in rows])
            noise = torch.empty_like(probs)
            for j, i in enumerate(rows):
                noise[j].exponential_(generator=generators[i] or self.generator)
            noise.clamp_(min=torch.finfo(noise.dtype).tiny)  # 0/0 would be a NaN that argmax picks
            tokens[idx] = (probs / noise).argmax(-1)
        chosen = logprobs.gather(-1, tokens[:, None])[:, 0]
        return tokens.tolist(), chosen.tolist()

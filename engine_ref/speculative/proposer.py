"""The contract between the engine and a proposer of draft tokens.

The engine asks once per step for the running decode requests' drafts, verifies them in one
target forward, and tells the proposer what the request's tokens are now (the accepted
drafts plus the target's own token). A proposer keeps whatever state it likes per request
(a draft model's KV cache, an n-gram index) and must drop it on `release`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from ..request import Request


@dataclass
class Proposal:
    """Up to k draft tokens for one request (fewer, even none, when nothing fits)."""

    tokens: list[int]
    # [len(tokens), vocab] float32: the distribution each token was drawn from, for the
    # rejection-sampling correction; None for a deterministic proposer (one-hot q).
    probs: torch.Tensor | None = None


class Proposer(Protocol):
    name: str  # "ngram", "draft"

    def propose(self, requests: Sequence[Request], k: int) -> list[Proposal]:
        """One proposal per request, in order; each request's prompt + output tokens so far
        are `request.prompt_token_ids` + `request.output_token_ids`."""
        ...

    def accepted(self, request: Request) -> None:
        """After verification appended tokens to `request`: its tokens are the truth now;
        anything the proposer cached past their length (rejected drafts) is stale."""
        ...

    def release(self, request_id: str) -> None:
        """The request finished, was aborted or preempted: free what it held."""
        ...

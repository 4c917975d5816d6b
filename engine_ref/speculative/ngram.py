"""The n-gram proposer (prompt lookup decoding): no model. The request's last n tokens
(n from `max_n` down to `min_n`) are looked up earlier in its prompt + output; the tokens
that followed its most recent earlier occurrence are the draft. Repetitive text (code,
quoting the prompt, lists) drafts well; anything else proposes nothing and decodes
normally."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..request import Request
from .proposer import Proposal


class NgramProposer:
    name = "ngram"

    def __init__(self, max_n: int = 4, min_n: int = 1) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes must satisfy 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.max_n, self.min_n = max_n, min_n

    def propose(self, requests: Sequence[Request], k: int) -> list[Proposal]:
        return [Proposal(self.lookup(r.all_token_ids, k)) for r in requests]

    def lookup(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier match of the longest suffix."""
        if k <= 0 or len(tokens) < self.min_n + 1:
            return []
        arr = np.asarray(tokens, dtype=np.int64)
        for n in range(min(self.max_n, len(arr) - 1), self.min_n - 1, -1):
            # Windows that start early enough to have a token after them (not the suffix).
            windows = np.lib.stride_tricks.sliding_window_view(arr[:-1], n)
            hits = np.flatnonzero((windows == arr[-n:]).all(axis=1))
            if hits.size:
                # The latest match with k tokens after it, else the earliest (the longest
                # continuation: in a repeating run the latest one is cut short by the end).
                full = hits[hits + n + k <= len(arr)]
                start = int(full[-1] if full.size else hits[0]) + n
                return arr[start : start + k].tolist()
        return []

    def accepted(self, request: Request) -> None:
        pass  # nothing cached: each lookup reads the request's tokens afresh

    def release(self, request_id: str) -> None:
        pass

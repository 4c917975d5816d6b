"""Requests: their states, sampling parameters and outputs (vLLM vocabulary)."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from ..errors import PerfdiagError


class InvalidRequestError(PerfdiagError, ValueError):
    """A request the engine refuses (empty or too long prompt, bad sampling parameters).

    Raised by `add_request`; the engine keeps serving every other request."""


class RequestStatus(enum.IntEnum):
    """Ordered: everything after SWAPPED is finished."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2  # by recompute: back in the waiting queue, KV released
    SWAPPED = 3  # by swap: KV in the CPU tier
    FINISHED_STOPPED = 4  # EOS or a stop token
    FINISHED_LENGTH_CAPPED = 5  # max_tokens or max_model_len
    FINISHED_ABORTED = 6

    @property
    def is_finished(self) -> bool:
        return self > RequestStatus.SWAPPED

    @property
    def finish_reason(self) -> str | None:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


def _bad(msg: str) -> InvalidRequestError:
    return InvalidRequestError(msg)


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling. temperature 0 is greedy; top_k 0 and top_p 1 disable those
    filters. The stopping token (EOS or a stop id) is included in the output ids."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise _bad(f"temperature must be a finite number >= 0, got {t!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise _bad(f"top_k must be an int >= 0 (0 disables it), got {self.top_k!r}")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0:
            raise _bad(f"top_p must be in (0, 1], got {p!r}")
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int)
        ):
            raise _bad(f"seed must be an int or None, got {self.seed!r}")
        mt = self.max_tokens
        if isinstance(mt, bool) or not isinstance(mt, int) or mt <= 0:
            raise _bad(f"max_tokens must be an int >= 1, got {mt!r}")
        for s in self.stop_token_ids:
            if isinstance(s, bool) or not isinstance(s, int) or s < 0:
                raise _bad(f"stop_token_ids must be ints >= 0, got {s!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


GREEDY = SamplingParams(temperature=0.0)


@dataclass(eq=False)
class Request:
    """One sequence through the engine. `num_computed_tokens` counts tokens whose KV is in
    the cache; the tokens after it (the prompt's rest, or the last sampled token) are still
    to be computed. `block_table` maps its logical blocks to device blocks."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    arrival_ns: int
    max_total_tokens: int  # min(prompt + max_tokens, max_model_len)
    eos_token_ids: frozenset[int] = frozenset()
    hash_root: bytes = b""  # model fingerprint (+ cache salt): the chain's first parent
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = -1  # prefix-cache hits at first admission; -1 before it
    block_table: list[int] = field(default_factory=list)
    cpu_block_table: list[int] = field(default_factory=list)  # while SWAPPED
    block_hashes: list[bytes] = field(default_factory=list)  # of its full blocks, chained
    num_preemptions: int = 0
    generator: object | None = None  # torch.Generator when params.seed is set

    def __post_init__(self) -> None:
        self.all_token_ids: list[int] = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def append_token(self, token_id: int, logprob: float) -> None:
        self.all_token_ids.append(token_id)
        self.output_token_ids.append(token_id)
        self.output_logprobs.append(logprob)

    def check_stop(self, max_model_len: int) -> RequestStatus | None:
        """The finished state after the last appended token, or None to continue."""
        last = self.output_token_ids[-1]
        if (not self.params.ignore_eos and last in self.eos_token_ids) or (
            last in self.params.stop_token_ids
        ):
            return RequestStatus.FINISHED_STOPPED
        if self.num_output_tokens >= self.params.max_tokens or self.num_tokens >= max_model_len:
            return RequestStatus.FINISHED_LENGTH_CAPPED
        return None


@dataclass
class RequestOutput:
    """What one step produced for one request (streaming granularity: one step)."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[float]
    num_output_tokens: int
    finished: bool
    finish_reason: str | None = None


@dataclass
class CompletionOutput:
    """A finished request, as `generate()` returns it."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str | None

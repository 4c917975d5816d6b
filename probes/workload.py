"""Workloads: what a run asks of an engine, independent of how requests are delivered.

A `WorkloadSpec` (frozen, validated) says how many requests, how they arrive (closed
loop at a fixed concurrency; open loop at a target rate with constant, Poisson or gamma
inter-arrivals, optionally under a concurrency cap), their prompt and output lengths,
shared-prefix groups, cancellations and warm-up. `plan(spec, vocab_size)` turns it into
the exact list of requests, reproducibly from the seed: each random aspect draws from its
own stream, so changing the rate never reshuffles prompts.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError

ARRIVAL_PROCESSES = ("constant", "poisson", "gamma")
# Bounds that keep a typo from meaning "forever" or "all memory"; far above any real use.
MAX_REQUESTS = 10**9
MAX_RATE = 1e6  # requests/s
MAX_CONCURRENCY = 10**6
LENGTH_KINDS = ("fixed", "uniform", "lognormal")
FITTABLE = ("prompt_len", "output_len")  # the lengths a workload may let perfdiag shorten


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


@dataclass(frozen=True)
class LengthSpec:
    """A token-length distribution: fixed, uniform [low, high] or lognormal (long tail)."""

    kind: str = "fixed"
    value: int = 128  # fixed
    low: int = 1  # uniform bounds, and clipping bounds for lognormal
    high: int = 128
    median: float = 128.0  # lognormal
    sigma: float = 0.5

    def __post_init__(self) -> None:
        _require(self.kind in LENGTH_KINDS, f"length kind {self.kind!r} is not {LENGTH_KINDS}")
        if self.kind == "fixed":
            _require(self.value >= 1, f"a fixed length must be >= 1, got {self.value}")
        else:
            _require(
                1 <= self.low <= self.high, f"need 1 <= low <= high, got {self.low}..{self.high}"
            )
        if self.kind == "lognormal":
            _require(self.median >= 1 and self.sigma > 0, "lognormal needs median >= 1, sigma > 0")

    @property
    def max(self) -> int:
        return self.value if self.kind == "fixed" else self.high

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "fixed":
            return np.full(n, self.value, dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(self.low, self.high, size=n, endpoint=True)
        drawn = rng.lognormal(math.log(self.median), self.sigma, size=n)
        return np.clip(np.rint(drawn), self.low, self.high).astype(np.int64)

    @classmethod
    def parse(cls, text: str | int | dict) -> LengthSpec:
        """`128`, `uniform:32:256`, `lognormal:MEDIAN:SIGMA[:LOW:HIGH]`, or a mapping."""
        if isinstance(text, dict):
            return _from_mapping(cls, text, "length")
        if isinstance(text, int) or str(text).isdigit():
            return cls("fixed", value=int(text))
        kind, *nums = str(text).split(":")
        try:
            if kind == "uniform" and len(nums) == 2:
                return cls("uniform", low=int(nums[0]), high=int(nums[1]))
            if kind == "lognormal" and len(nums) in (2, 4):
                low, high = (int(nums[2]), int(nums[3])) if len(nums) == 4 else (1, 8192)
                return cls("lognormal", median=float(nums[0]), sigma=float(nums[1]),
                           low=low, high=high)  # fmt: skip
        except ValueError:
            pass
        raise ConfigError(
            f"bad length {text!r}: use N, uniform:LOW:HIGH or lognormal:MEDIAN:SIGMA[:LOW:HIGH]"
        )


@dataclass(frozen=True)
class ArrivalSpec:
    """Closed loop (`concurrency` clients, each sending when its last request ends) or open
    loop (`rate` requests/s; `concurrency`, when set, caps requests in flight)."""

    mode: str = "closed"
    concurrency: int | None = None  # closed: the number of clients; open: the cap, if any
    rate: float | None = None
    process: str = "poisson"
    burstiness: float = 1.0  # gamma shape: 1 is Poisson, < 1 burstier, > 1 smoother

    def __post_init__(self) -> None:
        _require(self.mode in ("closed", "open"), f"arrival mode {self.mode!r}: closed or open")
        _require(self.process in ARRIVAL_PROCESSES, f"arrival process {self.process!r}?")
        if self.mode == "closed":
            _require(self.concurrency is not None and self.concurrency >= 1,
                     "a closed loop needs concurrency >= 1")  # fmt: skip
        else:
            _require(self.rate is not None and 0 < self.rate <= MAX_RATE,
                     f"an open loop needs a rate in (0, {MAX_RATE:,}] requests/s")  # fmt: skip
            _require(self.concurrency is None or self.concurrency >= 1,
                     "a concurrency cap must be >= 1")  # fmt: skip
        _require(self.concurrency is None or self.concurrency <= MAX_CONCURRENCY,
                 f"concurrency must be at most {MAX_CONCURRENCY:,}")  # fmt: skip
        _require(0 < self.burstiness <= 1000, "burstiness must be within (0, 1000]")


@dataclass(frozen=True)
class PrefixSpec:
    """`groups` shared prefixes of `length` tokens; requests pick one with Zipf weights
    (`skew` 0 is uniform, larger skews make a few prefixes hot and the rest cold)."""

    groups: int = 4
    length: int = 64
    skew: float = 1.0

    def __post_init__(self) -> None:
        _require(self.groups >= 1 and self.length >= 1, "shared prefix needs groups, length >= 1")
        _require(self.skew >= 0, "prefix skew must be >= 0")


@dataclass(frozen=True)
class CancelSpec:
    """Cancel a `fraction` of requests after `after_tokens` output tokens or `after_s`."""

    fraction: float = 0.0
    after_tokens: int | None = None
    after_s: float | None = None

    def __post_init__(self) -> None:
        _require(0 <= self.fraction <= 1, "cancel fraction must be within [0, 1]")
        if self.fraction > 0:
            _require(self.after_tokens is not None or self.after_s is not None,
                     "cancellation needs after_tokens or after_s")  # fmt: skip
        _require(self.after_tokens is None or self.after_tokens >= 0, "after_tokens >= 0")
        _require(self.after_s is None or self.after_s >= 0, "after_s must be >= 0")


@dataclass(frozen=True)
class WorkloadSpec:
    name: str = "custom"
    requests: int = 32
    warmup: int = 0
    seed: int = 0
    arrival: ArrivalSpec = field(default_factory=lambda: ArrivalSpec("closed", concurrency=4))
    prompt_len: LengthSpec = field(default_factory=lambda: LengthSpec("fixed", value=64))
    output_len: LengthSpec = field(default_factory=lambda: LengthSpec("fixed", value=32))
    shared_prefix: PrefixSpec | None = None
    cancel: CancelSpec = field(default_factory=CancelSpec)
    replay: str | None = None  # JSONL file of requests
    replay_timestamps: bool = False  # use the file's timestamp_s as the arrival schedule
    # A built-in prompt set of real text (prompt_sets.py): one user message per request,
    # chat-templated by the target; prompt_len is then unused.
    prompts: str | None = None
    # Requests end on the model's EOS, output_len only capping them (a real model's
    # natural lengths); off, output_len is forced (EOS ignored). --output-len turns it off.
    stop_at_eos: bool = False
    # The lengths that may be shortened to fit the model's context (prompt_len, output_len;
    # workload_fit.py): every built-in's, none of a user's unless the file says so.
    fit_to_context: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        fit = self.fit_to_context
        fit = (fit,) if isinstance(fit, str) else tuple(fit)  # a list from YAML/JSON
        object.__setattr__(self, "fit_to_context", fit)
        bad = set(self.fit_to_context) - set(FITTABLE)
        _require(not bad, f"fit_to_context names {sorted(bad)}: only {', '.join(FITTABLE)}")
        _require(1 <= self.requests <= MAX_REQUESTS,
                 f"a workload has 1 to {MAX_REQUESTS:,} requests, "
                 f"not {self.requests:,}")  # fmt: skip
        if self.prompts is not None:
            from .prompt_sets import prompt_set

            prompt_set(self.prompts)
        _require(0 <= self.warmup < self.requests, "warmup must be within [0, requests)")
        _require(0 <= self.seed <= 2**32 - 1, "seed must be within [0, 2**32 - 1]")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class PlannedRequest:
    index: int
    request_id: str
    offset_s: float | None  # open loop: send time after the run's start; closed: None
    prompt_ids: tuple[int, ...] | None
    prompt_text: str | None
    max_tokens: int
    prefix_group: int | None = None
    cancel_after_tokens: int | None = None
    cancel_after_s: float | None = None
    is_warmup: bool = False
    chat: bool = False  # prompt_text is a user message for the model's chat template
    stop_at_eos: bool = False  # max_tokens caps the output; EOS ends it

    @property
    def prompt_len(self) -> int | None:
        return len(self.prompt_ids) if self.prompt_ids is not None else None


def _from_mapping(cls, data: dict, what: str):
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    _require(not unknown, f"unknown {what} keys: {', '.join(sorted(unknown))}")
    try:
        return cls(**data)
    except TypeError as e:
        raise ConfigError(f"bad {what}: {e}") from None


def spec_from_mapping(data: dict[str, Any]) -> WorkloadSpec:
    """Build a spec from parsed YAML/JSON (nested mappings for the sub-specs)."""
    _require(isinstance(data, dict), "a workload must be a mapping")
    data = dict(data)
    subs = {"arrival": ArrivalSpec, "shared_prefix": PrefixSpec, "cancel": CancelSpec}
    for key, cls in subs.items():
        if isinstance(data.get(key), dict):
            data[key] = _from_mapping(cls, data[key], key)
    for key in ("prompt_len", "output_len"):
        if key in data:
            data[key] = LengthSpec.parse(data[key])
    return _from_mapping(WorkloadSpec, data, "workload")


PLAN_CHUNK = 50_000  # requests drawn at a time: a huge workload starts at once, in bounded memory


class Plan:
    """The exact requests of a run, drawn as they are iterated: same spec and seed, same
    requests. A workload of up to PLAN_CHUNK requests is drawn in one go; a larger one in
    chunks of PLAN_CHUNK, chunk k > 0 from its own seed stream (SeedSequence([seed, k])),
    sharing chunk 0's prefixes and continuing its arrival schedule, so `-n 100000000`
    starts at once and holds one chunk in memory. Iterating again gives the same requests."""

    def __init__(self, spec: WorkloadSpec, vocab_size: int):
        _require(vocab_size >= 2, "vocab_size must be >= 2")
        self.spec, self.vocab_size = spec, vocab_size
        self._replayed = None
        if spec.replay:
            streams = _streams(spec.seed, 0)
            self._replayed = _plan_replay(spec, vocab_size, streams[5], streams[4])

    def __len__(self) -> int:
        return len(self._replayed) if self._replayed is not None else self.spec.requests

    def __iter__(self) -> Iterator[PlannedRequest]:
        if self._replayed is not None:
            yield from self._replayed
            return
        spec, n = self.spec, self.spec.requests
        prefixes: list | None = None
        last_offset = None
        for k, start in enumerate(range(0, n, PLAN_CHUNK)):
            size = min(PLAN_CHUNK, n - start)
            streams = _streams(spec.seed, k)
            chunk, prefixes = _plan_chunk(spec, self.vocab_size, start, size, streams,
                                          prefixes, last_offset)  # fmt: skip
            if chunk and chunk[-1].offset_s is not None:
                last_offset = chunk[-1].offset_s
            yield from chunk

    def longest(self) -> int:
        """The most tokens (prompt + output) a request of the first chunk asks for (all of
        them up to PLAN_CHUNK requests; beyond, a later request too long for the target
        fails on its own); a text prompt counts as 0 (its length is known only once the
        target tokenizes it)."""
        first = self._replayed if self._replayed is not None else itertools.islice(self, PLAN_CHUNK)
        return max((r.prompt_len or 0) + r.max_tokens for r in first)


def plan(spec: WorkloadSpec, vocab_size: int) -> Plan:
    """The exact requests of a run (see Plan)."""
    return Plan(spec, vocab_size)


def _streams(seed: int, chunk: int) -> list[np.random.Generator]:
    entropy = seed if chunk == 0 else [seed, chunk]
    return [np.random.default_rng(s) for s in np.random.SeedSequence(entropy).spawn(6)]


def _plan_chunk(spec, vocab_size, start, n, streams, prefixes, last_offset):
    """Requests start..start+n-1, and the shared prefixes (drawn by chunk 0)."""
    rng_arrival, rng_len, rng_tokens, rng_prefix, rng_cancel, _ = streams
    prompt_lens = spec.prompt_len.sample(rng_len, n)
    output_lens = spec.output_len.sample(rng_len, n)
    groups, drawn = _prefix_groups(spec, n, vocab_size, rng_prefix, draw_prefixes=not prefixes)
    prefixes = prefixes or drawn
    offsets = arrival_offsets(spec.arrival, n, rng_arrival, after=last_offset)
    cancels = _cancel_mask(spec, n, rng_cancel)
    if spec.prompts is not None:
        return _plan_prompt_set(spec, start, offsets, output_lens, cancels, rng_tokens), prefixes
    planned = []
    for i in range(n):
        suffix = rng_tokens.integers(0, vocab_size, size=int(prompt_lens[i])).tolist()
        group = None if groups is None else int(groups[i])
        ids = (prefixes[group] if group is not None else []) + suffix
        offset = None if offsets is None else offsets[i]
        planned.append(_planned(spec, start + i, offset, tuple(ids), None,
                                int(output_lens[i]), group, cancels[i]))  # fmt: skip
    return planned, prefixes


def _plan_prompt_set(spec, start, offsets, output_lens, cancels, rng) -> list[PlannedRequest]:
    from .prompt_sets import prompt_set

    texts = prompt_set(spec.prompts)
    n = len(output_lens)
    order: list[int] = []
    while len(order) < n:  # every prompt once per round, rounds shuffled
        order.extend(rng.permutation(len(texts)).tolist())
    planned = []
    for i in range(n):
        text, max_tokens = texts[order[i]], int(output_lens[i])
        offset = None if offsets is None else offsets[i]
        req = _planned(spec, start + i, offset, None, text, max_tokens, None, cancels[i])
        planned.append(dataclasses.replace(req, chat=True, stop_at_eos=spec.stop_at_eos))
    return planned


def _planned(spec, i, offset, ids, text, max_tokens, group, cancel) -> PlannedRequest:
    return PlannedRequest(
        index=i,
        request_id=f"req-{i:06d}",
        offset_s=None if offset is None else float(offset),
        prompt_ids=ids,
        prompt_text=text,
        max_tokens=max_tokens,
        prefix_group=group,
        cancel_after_tokens=spec.cancel.after_tokens if cancel else None,
        cancel_after_s=spec.cancel.after_s if cancel else None,
        is_warmup=i < spec.warmup,
    )


def arrival_offsets(arrival: ArrivalSpec, n: int, rng: np.random.Generator,
                    after: float | None = None) -> np.ndarray | None:  # fmt: skip
    """Send times (s after start) on an absolute schedule; None for a closed loop. With
    `after` (the previous chunk's last send time), the schedule goes on from there."""
    if arrival.mode == "closed":
        return None
    mean = 1.0 / arrival.rate
    if arrival.process == "constant":
        gaps = np.full(n, mean)
    elif arrival.process == "poisson":
        gaps = rng.exponential(mean, size=n)
    else:
        shape = arrival.burstiness
        gaps = rng.gamma(shape, mean / shape, size=n)
    if after is None:
        gaps[0] = 0.0  # the first request goes at the start
        return np.cumsum(gaps)
    return after + np.cumsum(gaps)


def _prefix_groups(spec, n, vocab_size, rng, draw_prefixes: bool = True):
    sp = spec.shared_prefix
    if sp is None:
        return None, []
    weights = 1.0 / np.arange(1, sp.groups + 1) ** sp.skew
    groups = rng.choice(sp.groups, size=n, p=weights / weights.sum())
    if not draw_prefixes:
        return groups, []
    prefixes = [rng.integers(0, vocab_size, size=sp.length).tolist() for _ in range(sp.groups)]
    return groups, prefixes


def _cancel_mask(spec, n, rng) -> list[bool]:
    if spec.cancel.fraction == 0:
        return [False] * n
    k = round(spec.cancel.fraction * n)
    mask = np.zeros(n, dtype=bool)
    mask[rng.choice(n, size=k, replace=False)] = True
    return mask.tolist()


def _plan_replay(spec, vocab_size, rng, rng_cancel) -> list[PlannedRequest]:
    path = Path(spec.replay)
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the replay file ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: the replay file is not UTF-8 text (byte {e.start})") from None
    rows = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(_replay_row(json.loads(line), vocab_size, rng))
        except (json.JSONDecodeError, ConfigError, TypeError, ValueError) as e:
            raise ConfigError(f"{path}:{lineno}: {e}") from None
    _require(rows, f"{path}: no requests")
    rows = rows[: spec.requests] if spec.requests < len(rows) else rows
    n = len(rows)
    if spec.replay_timestamps:
        stamps = [r[3] for r in rows]
        _require(all(s is not None for s in stamps), f"{path}: every line needs timestamp_s")
        offsets = np.asarray(stamps, dtype=float) - stamps[0]
        _require(bool(np.all(np.diff(offsets) >= 0)), f"{path}: timestamps must not decrease")
    else:
        offsets = arrival_offsets(spec.arrival, n, rng)
    cancels = _cancel_mask(spec, n, rng_cancel)
    replay_spec = dataclasses.replace(spec, warmup=min(spec.warmup, n - 1))
    return [
        _planned(
            replay_spec,
            i,
            None if offsets is None else offsets[i],
            ids,
            text,
            out,
            group,
            cancels[i],
        )
        for i, (ids, text, out, _, group) in enumerate(rows)
    ]


def _replay_row(obj: Any, vocab_size: int, rng: np.random.Generator):
    if not isinstance(obj, dict):
        raise ConfigError("each line must be a JSON object")
    out = obj.get("max_tokens", obj.get("output_tokens"))
    if not isinstance(out, int) or out < 1:
        raise ConfigError("max_tokens (or output_tokens) must be an integer >= 1")
    ids, text = None, None
    if "prompt_ids" in obj:
        ids = tuple(int(t) for t in obj["prompt_ids"])
        if not ids or min(ids) < 0 or max(ids) >= vocab_size:
            raise ConfigError(f"prompt_ids must be non-empty ids below {vocab_size}")
    elif "prompt_tokens" in obj:
        n = int(obj["prompt_tokens"])
        if n < 1:
            raise ConfigError("prompt_tokens must be >= 1")
        ids = tuple(rng.integers(0, vocab_size, size=n).tolist())
    elif isinstance(obj.get("prompt"), str) and obj["prompt"]:
        text = obj["prompt"]
    else:
        raise ConfigError("give prompt (text), prompt_ids or prompt_tokens")
    stamp = obj.get("timestamp_s")
    group = obj.get("prefix_group")
    return ids, text, out, None if stamp is None else float(stamp), group

"""Routing requests to data-parallel replicas (DOMAIN.md §11 replica DP, §13 routing).

Pure Python, no torch: the replica front (replicas.py) says what each request costs and
when its tokens come back; the router keeps every replica's outstanding work from that.

- `round-robin`: replicas in turn, blind to load and cache.
- `least-loaded`: the replica with the least outstanding work.
- `prefix-aware`: the replica that already holds the request's prompt prefix — the
  chained hashes of its leading full KV blocks, as the engine's prefix cache keys them
  (computed by the caller), longest match first — unless that replica is overloaded
  (the bound below); then the least-loaded replica. Cache locality never starves or
  overloads a replica beyond the bound (DOMAIN §6).
- `weighted:W1,W2,…`: a fixed split in proportion to the weights (smooth weighted
  round-robin), blind to load: an imbalanced router for diagnosis experiments.

Load of a replica: its outstanding tokens — prompt tokens not yet prefilled (until the
request's first output token) plus output tokens not yet generated — over the requests
routed to it that have not ended. Tokens rather than requests, so a long prompt weighs
what it costs.

The prefix-aware bound: the prefix replica keeps the request while
    load[prefix] - load[least] <= max(REL_BOUND × mean load, ABS_BOUND × the request's tokens)
i.e. it may carry half the mean load more than the idlest replica, or two requests like
this one (so an idle pool still groups a prefix). Beyond that the request goes to the
least-loaded replica, which then holds the prefix too.

The router's view of who holds a prefix is its own placement history (bounded, least
recently used first out), not the engines' caches: a prefix the engine has evicted since
still draws its requests, which re-cache it there.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ..errors import ConfigError

POLICIES = ("round-robin", "least-loaded", "prefix-aware", "weighted")
REL_BOUND = 0.5  # of the mean outstanding tokens
ABS_BOUND = 2.0  # requests' worth of this request's tokens
MAX_PREFIXES = 1 << 16  # placements remembered
MAX_REPLICAS = 64


@dataclass(frozen=True)
class RouterPolicy:
    name: str = "round-robin"
    weights: tuple[int, ...] = ()  # weighted only: one per replica

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise ConfigError(f"router policy must be one of {', '.join(POLICIES)}, "
                              f"got {self.name!r}")  # fmt: skip
        if self.name == "weighted":
            if not self.weights or any(w < 0 for w in self.weights) or not sum(self.weights):
                raise ConfigError(f"weighted router needs non-negative weights with a positive "
                                  f"sum, got {self.weights}")  # fmt: skip
        elif self.weights:
            raise ConfigError(f"router {self.name} takes no weights")

    @classmethod
    def parse(cls, text: str) -> RouterPolicy:
        """`round-robin`, `least-loaded`, `prefix-aware` or `weighted:3,1`."""
        name, sep, rest = text.strip().partition(":")
        if name == "weighted" or sep:
            try:
                weights = tuple(int(w) for w in rest.split(","))
            except ValueError:
                raise ConfigError(f"bad router {text!r}: use weighted:W1,W2,… "
                                  "(one integer weight per replica)") from None  # fmt: skip
            return cls(name, weights)
        return cls(name)

    def __str__(self) -> str:
        if self.name == "weighted":
            return "weighted:" + ",".join(map(str, self.weights))
        return self.name

    def check_replicas(self, replicas: int) -> None:
        if not 1 <= replicas <= MAX_REPLICAS:
            raise ConfigError(f"data-parallel replicas must be within [1, {MAX_REPLICAS}], "
                              f"got {replicas}")  # fmt: skip
        if self.name == "weighted" and len(self.weights) != replicas:
            raise ConfigError(f"router {self} has {len(self.weights)} weights for {replicas} "
                              "replicas: give one per replica")  # fmt: skip

    @property
    def uses_prefixes(self) -> bool:
        return self.name == "prefix-aware"


class Route(NamedTuple):
    replica: int
    reason: str  # round-robin | least-loaded | prefix | prefix-overloaded | weighted


class _Work:
    __slots__ = ("prompt", "remaining", "replica")

    def __init__(self, replica: int, prompt: int, remaining: int) -> None:
        self.replica, self.prompt, self.remaining = replica, prompt, remaining


class Router:
    """Not thread-safe: call it from one thread (the event loop of the replica front)."""

    def __init__(self, policy: RouterPolicy, replicas: int) -> None:
        policy.check_replicas(replicas)
        self.policy, self.replicas = policy, replicas
        self.tokens = [0] * replicas  # outstanding tokens per replica
        self.requests = [0] * replicas  # outstanding requests per replica
        self.routed = [0] * replicas  # requests ever routed, per replica
        self.reasons: dict[str, int] = {}
        self._work: dict[str, _Work] = {}
        self._next = 0  # round-robin position (also breaks least-loaded ties)
        self._credit = [0] * replicas  # smooth weighted round-robin
        self._holders: OrderedDict[bytes, set[int]] = OrderedDict()

    # ---- decisions -------------------------------------------------------------------------
    def route(
        self, request_id: str, prompt_tokens: int, max_tokens: int,
        prefix_keys: Sequence[bytes] = (),
    ) -> Route:  # fmt: skip
        """Choose a replica for a new request and count its work there."""
        if request_id in self._work:
            raise ValueError(f"request {request_id!r} is already routed")
        name = self.policy.name
        if name == "round-robin":
            route = Route(self._next % self.replicas, name)
            self._next += 1
        elif name == "weighted":
            route = Route(self._weighted(), name)
        elif name == "least-loaded" or not prefix_keys:
            route = Route(self.least_loaded(), "least-loaded")
        else:
            route = self._by_prefix(prompt_tokens + max_tokens, prefix_keys)
        if self.policy.uses_prefixes:
            self._remember(prefix_keys, route.replica)
        i = route.replica
        self._work[request_id] = _Work(i, prompt_tokens, max_tokens)
        self.tokens[i] += prompt_tokens + max_tokens
        self.requests[i] += 1
        self.routed[i] += 1
        self.reasons[route.reason] = self.reasons.get(route.reason, 0) + 1
        return route

    def least_loaded(self) -> int:
        n, start = self.replicas, self._next
        best = min(range(n), key=lambda i: (self.tokens[i], self.requests[i], (i - start) % n))
        self._next = best + 1  # the next tie goes to the replica after this one
        return best

    def _weighted(self) -> int:
        weights, credit = self.policy.weights, self._credit
        for i, w in enumerate(weights):
            credit[i] += w
        best = max(range(self.replicas), key=lambda i: (credit[i], -i))
        credit[best] -= sum(weights)
        return best

    def _by_prefix(self, tokens: int, keys: Sequence[bytes]) -> Route:
        holders = next((self._holders[k] for k in reversed(keys) if k in self._holders), None)
        least = self.least_loaded()
        if not holders:
            return Route(least, "least-loaded")
        n = self.replicas
        best = min(holders, key=lambda i: (self.tokens[i], self.requests[i], i))
        mean = sum(self.tokens) / n
        if self.tokens[best] - self.tokens[least] > max(REL_BOUND * mean, ABS_BOUND * tokens):
            return Route(least, "prefix-overloaded")
        return Route(best, "prefix")

    def _remember(self, keys: Sequence[bytes], replica: int) -> None:
        holders = self._holders
        for k in keys:
            held = holders.get(k)
            if held is None:
                holders[k] = {replica}
            else:
                held.add(replica)
                holders.move_to_end(k)
        while len(holders) > MAX_PREFIXES:
            holders.popitem(last=False)

    # ---- progress --------------------------------------------------------------------------
    def progress(self, request_id: str, new_tokens: int) -> None:
        """`new_tokens` output tokens came back: the prompt is prefilled, fewer remain."""
        w = self._work.get(request_id)
        if w is None or new_tokens <= 0:
            return
        done = w.prompt + min(new_tokens, w.remaining)
        w.prompt, w.remaining = 0, w.remaining - min(new_tokens, w.remaining)
        self.tokens[w.replica] -= done

    def finish(self, request_id: str) -> None:
        """The request ended (finished, aborted, refused): its remaining work is gone."""
        w = self._work.pop(request_id, None)
        if w is None:
            return
        self.tokens[w.replica] -= w.prompt + w.remaining
        self.requests[w.replica] -= 1

    def summary(self) -> dict:
        """For the run's manifest: the policy, the bound and what it decided."""
        return {
            "policy": str(self.policy),
            "routed": list(self.routed),
            "reasons": dict(sorted(self.reasons.items())),
            **({"bound": {"relative_to_mean": REL_BOUND, "request_multiples": ABS_BOUND}}
               if self.policy.uses_prefixes else {}),
        }  # fmt: skip

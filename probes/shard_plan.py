"""A workload's requests split over N client shards (distributed load, probes/ray_load.py).

Open loop: request i goes to shard i mod N with its planned offset untouched, so each
shard sends every N-th arrival of the one schedule and together they send all of it (a
constant 300 req/s over two shards is two 150 req/s schedules interleaved). A concurrency
cap, and a closed loop's clients, are divided as evenly as they go (the first C mod N
shards one more); each shard needs at least one.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from .workload import ArrivalSpec, PlannedRequest


@dataclass(frozen=True)
class ShardShare:
    shard: int
    planned: list[PlannedRequest]
    concurrency: int | None  # closed loop: its clients; open loop: its cap (None: no cap)


def split_concurrency(total: int | None, shards: int) -> list[int | None]:
    if total is None:
        return [None] * shards
    if total < shards:
        raise ConfigError(f"--concurrency {total} cannot be split over {shards} clients: "
                          "each client needs at least one")  # fmt: skip
    return [total // shards + (k < total % shards) for k in range(shards)]


def split_plan(
    planned: list[PlannedRequest], arrival: ArrivalSpec, shards: int
) -> list[ShardShare]:
    if shards < 1:
        raise ConfigError(f"--clients must be >= 1, got {shards}")
    if len(planned) < shards:
        raise ConfigError(f"{len(planned)} requests cannot be split over {shards} clients")
    caps = split_concurrency(arrival.concurrency, shards)
    return [ShardShare(k, planned[k::shards], caps[k]) for k in range(shards)]

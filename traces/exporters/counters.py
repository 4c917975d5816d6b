"""The counters table as counter tracks: one track per (scope, name), samples in time order.

Where they go: `gpuN` scopes under that GPU's group (device utilisation, memory, power,
clocks beside its streams), `engine` under the scheduler, anything else (CPU cores, the
process) under a "Host" group. NaN samples are skipped: no viewer can draw them.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .sink import Sink
from .spans import gpu_group
from .steps import scheduler_group
from .tracks import COUNTER, Track, TrackTree

CHUNK_ROWS = 65536
_GPU_SCOPE = re.compile(r"gpu(\d+)$")
_UNITS = {
    "_pct": "%",
    "_bytes": "bytes",
    "_w": "W",
    "_mhz": "MHz",
    "_ns": "ns",
    "_s": "s",
    "_c": "°C",
    "_blocks": "blocks",
    "_per_s": "/s",
}


def unit_of(name: str) -> str:
    for suffix, unit in _UNITS.items():
        if name.endswith(suffix):
            return unit
    return ""


def write_counters(
    table: pa.Table, tree: TrackTree, sink: Sink, gpu_ranks: dict[int, int], engine_rank: int
) -> tuple[int, int]:
    """Returns (samples written, NaN samples skipped). `gpu_ranks`: device → the rank whose
    GPU group a rank-less `gpuN` scope joins."""
    if table.num_rows == 0:
        return 0, 0
    # dictionary columns cannot be sorted on: decode the two names first
    t = pa.table(
        {
            "name": table["name"].cast(pa.string()),
            "ts_ns": table["ts_ns"],
            "value": table["value"],
            "scope_": table["scope"].cast(pa.string()).fill_null(""),
        }
    )
    t = t.take(
        pc.sort_indices(t, [("scope_", "ascending"), ("name", "ascending"), ("ts_ns", "ascending")])
    )
    written = skipped = 0
    track: Track | None = None
    current = None
    for lo in range(0, t.num_rows, CHUNK_ROWS):
        c = t.slice(lo, CHUNK_ROWS)
        for sc, name, ts, value in zip(
            c["scope_"].to_pylist(),
            c["name"].to_pylist(),
            c["ts_ns"].to_pylist(),
            c["value"].to_pylist(),
            strict=True,
        ):
            if (sc, name) != current:
                current = (sc, name)
                track = tree.child(
                    ("counter", sc, name),
                    _scope_group(tree, sc, gpu_ranks, engine_rank),
                    name if not sc or _GPU_SCOPE.match(sc) or sc == "engine" else f"{sc} · {name}",
                    COUNTER,
                    unit=unit_of(name),
                )
            if value is None or math.isnan(value):
                skipped += 1
                continue
            sink.counter(track, ts, value)
            written += 1
    return written, skipped


def _scope_group(tree: TrackTree, scope: str, gpu_ranks: dict[int, int], engine_rank: int) -> Track:
    m = _GPU_SCOPE.match(scope)
    if m:
        device = int(m.group(1))
        return gpu_group(tree, gpu_ranks.get(device, -1), device)
    if scope == "engine":
        return scheduler_group(tree, engine_rank)
    return tree.group(("host",), "Host")


def gpu_ranks_of(spans_rank: np.ndarray, spans_device: np.ndarray) -> dict[int, int]:
    """device → the lowest rank that has spans on it (-1 when spans carry no rank)."""
    on = spans_device >= 0
    d, r = spans_device[on], spans_rank[on]
    out = {}
    for dev in np.unique(d).tolist():
        ranks = r[(d == dev) & (r >= 0)]
        out[dev] = int(ranks.min()) if len(ranks) else -1
    return out

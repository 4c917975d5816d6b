"""Run parts into one run: the client shards of a distributed `perfdiag run --clients N`
(probes/ray_load.py), each recorded on its own process's clock.

Every table is copied as Arrow batches (no per-row Python): timestamps moved onto the
merged run's clock by subtracting the part's clock offset (probes/clock_align.py), and
each `requests` row's JSON args gain `"client_shard": k` — the shard is an args field, not
a column, so the table's schema (and every run written before) stays as it is. Request ids
are the workload plan's, unique across shards; counters keep the scope their part gave
them (a shard's loop health is `client/shard{k}`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from .reader import load_run
from .schema import ROW_TYPES
from .writer import RunWriter

# The nanosecond timestamp columns of each table (durations are clock-free).
TIME_COLUMNS = {
    "requests": (),
    "request_events": ("ts_ns",),
    "steps": ("start_ns", "end_ns"),
    "spans": ("start_ns",),
    "counters": ("ts_ns",),
}
SHARD_KEY = "client_shard"


def shard_of_args(args: str | None) -> int | None:
    """A request's client shard from its args (None: a single client's run)."""
    if not args:
        return None
    value = json.loads(args).get(SHARD_KEY)
    return int(value) if value is not None else None


def shifted(table: pa.Table, name: str, offset_ns: int) -> pa.Table:
    """`table` with its timestamps moved by −offset_ns (a part's clock onto the run's)."""
    if not offset_ns:
        return table
    for column in TIME_COLUMNS[name]:
        i = table.schema.get_field_index(column)
        moved = pc.subtract(table.column(i), pa.scalar(offset_ns, pa.int64()))
        table = table.set_column(i, table.schema.field(i), moved)
    return table


def with_shard(table: pa.Table, shard: int) -> pa.Table:
    """Requests rows with `client_shard` in their JSON args."""
    i = table.schema.get_field_index("args")
    tagged = []
    for args in table.column(i).to_pylist():
        data = json.loads(args) if args else {}
        tagged.append(json.dumps({**data, SHARD_KEY: shard}))
    return table.set_column(i, table.schema.field(i), pa.array(tagged, pa.string()))


def append_part(writer: RunWriter, part: Path, shard: int, offset_ns: int) -> dict[str, int]:
    """Copy the run part at `part` into `writer`'s run; rows copied per table."""
    run = load_run(part)
    counts = {}
    for name in ROW_TYPES:
        table = shifted(run.arrow(name), name, offset_ns)
        if name == "requests":
            table = with_shard(table, shard)
        appender = writer.table(name)
        for batch in table.to_batches():
            appender.append_batch(batch)
        counts[name] = table.num_rows
    return counts

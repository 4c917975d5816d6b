"""The run's tables: one row type per table, from which the Arrow schema is derived.

Every table must hold both what the reference engine records and what foreign traces
(Kineto, serving benchmarks) carry, so columns are generic and units are in the names.
Timestamps are integer nanoseconds on the recording process's monotonic clock
(`time.monotonic_ns()`); the manifest maps that clock to wall time. Nothing is rounded.

Rules for evolving this file (the reader depends on them):
- a new column is added as nullable (`T | None`), so runs written before it still read
  (the reader fills it with nulls);
- removing, renaming or re-typing a column bumps SCHEMA_VERSION and adds an upgrade step
  in `reader._UPGRADES`.
"""

from __future__ import annotations

import types
import typing
from typing import NamedTuple

import pyarrow as pa

SCHEMA_VERSION = 1


class Request(NamedTuple):
    """One row per request, written when the request ends (its outcome and identity)."""

    request_id: str
    prompt_tokens: int | None = None
    # Tokens delivered to the client (perfdiag's client received them; `perfdiag serve`'s
    # own record: written to the connection). A stream dropped early (cancelled, timed
    # out, failed) may have had more sampled: the engine's first_token/token events in
    # request_events count those.
    output_tokens: int | None = None
    cached_tokens: int | None = None  # prompt tokens served from a prefix cache
    finish_reason: str | None = (
        None  # stop | length | abort | cancelled | timeout | error | rejected
    )
    is_warmup: bool = False
    prefix_group: int | None = None  # shared-prefix group the workload drew it from
    output_digest: str | None = (
        None  # hash of the generated token ids (correctness without content)
    )
    error: str | None = None
    args: str | None = None  # JSON object with anything else
    replica: int | None = None  # data-parallel replica that served it (None: one engine)


class RequestEvent(NamedTuple):
    """One point in a request's lifecycle, client side or engine side (long format)."""

    request_id: str
    kind: str  # see REQUEST_EVENT_KINDS
    ts_ns: int
    side: str = "engine"  # client | engine
    step_id: int | None = None  # the engine step the event happened in
    num_tokens: int | None = None  # tokens in a prefill chunk or in a delivered chunk
    detail: str | None = None  # preemption mode, finish reason, rejection message…
    num_cached_tokens: int | None = None  # "scheduled": prompt tokens found in the prefix cache


class Step(NamedTuple):
    """One engine iteration (one forward pass) and its batch composition."""

    step_id: int
    start_ns: int
    end_ns: int
    num_prefill_seqs: int = 0
    num_prefill_tokens: int = 0
    num_decode_seqs: int = 0
    num_context_tokens: int = 0  # KV tokens attended to, summed over the batch
    num_waiting: int | None = None  # queue depths after scheduling (what the forward ran in)
    num_running: int | None = None
    num_swapped: int | None = None
    num_preempted: int | None = None  # sequences preempted while scheduling this step
    kv_blocks_used: int | None = None
    kv_blocks_free: int | None = None
    kv_blocks_cached: int | None = None
    gpu_time_ns: int | None = None  # from CUDA events, when on a GPU
    rank: int | None = None
    num_cached_tokens: int | None = None  # prefix-cache hits of requests admitted this step
    kv_cpu_blocks_used: int | None = None  # the swap tier
    # Host evidence for the step (the recording process, all its threads): CPU time it got
    # and how often the kernel took a core from it, between the step's start and end.
    cpu_time_ns: int | None = None
    involuntary_switches: int | None = None
    blocked_by: str | None = None  # what held back requests still waiting (None: none did)
    # Data-parallel replica whose step it is (None: one engine). Step ids stay unique
    # across the run's replicas, so a step id alone still names one step.
    replica: int | None = None
    # The stepping thread's wait on a CPU run queue during the step (Linux schedstat;
    # probes/run_queue.py): the step time contention took, measured rather than inferred.
    run_delay_ns: int | None = None


class Span(NamedTuple):
    """An interval on one resource: a CPU op, runtime call, kernel, copy, collective,
    annotation or probe phase. `(pid, tid)` names a CPU thread, `(device, stream)` a GPU
    queue; `correlation` joins a launch to what it launched."""

    name: str
    category: str  # see SPAN_CATEGORIES
    start_ns: int
    dur_ns: int
    pid: int | None = None
    tid: int | None = None
    device: int | None = None
    stream: int | None = None
    rank: int | None = None
    step_id: int | None = None
    correlation: int | None = None
    flops: int | None = None
    bytes: int | None = None
    args: str | None = None  # JSON object: shapes, grid, meta-parameters, foreign fields


class Counter(NamedTuple):
    """A sampled value: queue depth, KV blocks, device utilisation, power, clocks…"""

    name: str  # unit-suffixed: kv_blocks_used, gpu_util_pct, power_w, sm_clock_mhz
    ts_ns: int
    value: float
    scope: str | None = None  # what it measures: engine, gpu0, cpu3, process


ROW_TYPES: dict[str, type] = {
    "requests": Request,
    "request_events": RequestEvent,
    "steps": Step,
    "spans": Span,
    "counters": Counter,
}

# Low-cardinality text columns: loaded as pandas Categoricals (fast, small).
CATEGORICAL: dict[str, frozenset[str]] = {
    "requests": frozenset({"finish_reason"}),
    "request_events": frozenset({"kind", "side"}),
    "steps": frozenset({"blocked_by"}),
    "spans": frozenset({"name", "category"}),
    "counters": frozenset({"name", "scope"}),
}

# Vocabularies: documented, not enforced, so foreign traces can bring their own.
REQUEST_EVENT_KINDS = (
    "scheduled_send", "created", "sent",  # client side (and first_token, chunk, done)
    "arrival", "tokenize_start", "tokenize_end", "queued", "scheduled",  # engine side
    "prefill_chunk", "first_token", "token", "chunk", "preempted", "resumed",
    "finished", "aborted", "done",
)  # fmt: skip
SPAN_CATEGORIES = (
    "cpu_op", "python", "cuda_runtime", "cuda_driver", "kernel", "gpu_memcpy",
    "gpu_memset", "comm", "annotation", "phase", "probe", "cuda_sync",
    "triton", "triton_interpret",  # Triton launches from the probe (timed on the GPU / host)
    "gc",  # a garbage-collection pause (probes/gc_probe.py)
)  # fmt: skip

_ARROW_TYPES = {int: pa.int64(), float: pa.float64(), str: pa.string(), bool: pa.bool_()}


def _arrow_field(name: str, hint: object) -> pa.Field:
    nullable = False
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        (hint,) = [a for a in args if a is not type(None)]
        nullable = True
    return pa.field(name, _ARROW_TYPES[hint], nullable=nullable)


def arrow_schema(table: str) -> pa.Schema:
    """The Arrow schema of `table`, derived from its row type's annotations."""
    row_type = ROW_TYPES[table]
    hints = typing.get_type_hints(row_type)
    return pa.schema([_arrow_field(name, hints[name]) for name in row_type._fields])


SCHEMAS: dict[str, pa.Schema] = {name: arrow_schema(name) for name in ROW_TYPES}

_DICTIONARY = pa.dictionary(pa.int32(), pa.string())


def storage_schema(table: str) -> pa.Schema:
    """The schema written to disk: categorical text dictionary-encoded (smaller files,
    and several times faster to convert from Python strings on the recording path)."""
    schema = SCHEMAS[table]
    return pa.schema(
        [f.with_type(_DICTIONARY) if f.name in CATEGORICAL[table] else f for f in schema]
    )


STORAGE_SCHEMAS: dict[str, pa.Schema] = {name: storage_schema(name) for name in ROW_TYPES}


def batch_from_rows(rows: list[tuple], schema: pa.Schema) -> pa.RecordBatch:
    """Row tuples as a record batch in `schema` (a storage schema). Raises on a
    malformed row."""
    # Converting the tuples as one struct array is the fastest transpose pyarrow offers
    # (zip(*rows) costs more than the conversion itself). A tuple of the wrong width is
    # an ArrowInvalid here, never a silently shifted column.
    batch = pa.RecordBatch.from_struct_array(pa.array(rows, type=pa.struct(list(schema))))
    for field, column in zip(schema, batch.columns, strict=True):
        if not field.nullable and column.null_count:
            raise ValueError(f"column {field.name} may not be null")
    return batch.cast(schema) if batch.schema != schema else batch

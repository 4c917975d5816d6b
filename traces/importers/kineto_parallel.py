"""Read one large trace with several processes: each worker decodes a character range of
the text, converts its rows to Arrow record batches and sends those to the importing
process, which only writes them (so the conversion runs in parallel too).

Decoding JSON into Python objects is the import's cost, and it is CPU-bound under the
GIL, so threads cannot share it; processes can. Every worker reads the text from the
start (decompression and skipping cost little next to decoding) and starts at the first
element boundary (`},{`) at or after its range start; the previous worker stops at the
first element starting at or after the same point. The boundaries are checked: if two
neighbours disagree (a `},{` inside a string fooled the search), or any worker fails, or
a span waits for a flow event that another worker may hold, the caller falls back to
reading the file in one process, which is always exact.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import struct
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path

from ..schema import STORAGE_SCHEMAS, batch_from_rows
from .compressed import GZIP_MAGIC, open_trace
from .kineto_events import KinetoFileReader

BATCH_ROWS = 16384
MIN_CHARS_PER_WORKER = 32 << 20  # below this, one process is as fast


class ParallelReadFailed(Exception):
    """The parallel read could not be trusted: read the file in one process instead."""


@dataclass
class WorkerResult:
    events: int
    first_at: int | None
    stopped_at: int | None
    spans_by_category: dict[str, int]
    skipped: dict[str, int]
    processes: dict
    threads: dict
    profiler_windows: list
    header: dict = field(default_factory=dict)


def text_size_estimate(path: Path) -> int:
    """Characters of text in the file: its size, or a gzip's recorded size (mod 4 GiB)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        if f.read(2) != GZIP_MAGIC:
            return size
        f.seek(-4, os.SEEK_END)
        isize = struct.unpack("<I", f.read(4))[0]
    # ISIZE wraps at 4 GiB; text never shrinks below its compressed size. (An estimate
    # only places the range cuts; a wrong one costs speed, never correctness.)
    while isize < size:
        isize += 1 << 32
    return isize


def plan_workers(path: Path, jobs: int | None) -> int:
    if jobs is not None and jobs <= 1:
        return 1
    chars = text_size_estimate(path)
    # The importing process only unpickles and writes (a fifth of the work): by default
    # one worker per core, at most 4 (more rarely pays: the text is read by each).
    most = jobs or min(os.cpu_count() or 1, 4)
    return max(1, min(most, chars // MIN_CHARS_PER_WORKER))


class RowBatcher:
    """A table's rows gathered into record batches in its storage schema, each handed to
    `sink` once it holds BATCH_ROWS rows (and at `flush`)."""

    __slots__ = ("rows", "schema", "sink")

    def __init__(self, table: str, sink):
        self.schema, self.sink, self.rows = STORAGE_SCHEMAS[table], sink, []

    def append(self, row) -> None:
        rows = self.rows
        rows.append(row)
        if len(rows) >= BATCH_ROWS:
            self.flush()

    def append_batch(self, batch) -> None:
        """Rows already in a batch, after those gathered so far."""
        self.flush()
        self.sink(batch)

    def flush(self) -> None:
        if self.rows:
            self.sink(batch_from_rows(self.rows, self.schema))
            self.rows = []


def _work(path: str, start: int, stop: int | None, rank, offset: int, flags: dict, conn) -> None:
    try:
        # Arrow batches pickle as IPC buffers: far cheaper to send than tuples.
        spans = RowBatcher("spans", lambda b: conn.send(("spans", b)))
        counters = RowBatcher("counters", lambda b: conn.send(("counters", b)))
        reader = KinetoFileReader(
            path,
            spans.append,
            counters.append,
            rank_of=lambda _h: rank,
            time_offset_ns=offset,
            **flags,
        )
        reader.read(start=start, stop=stop)
        if reader.unresolved:  # its flow event may sit in another worker's range
            raise ParallelReadFailed("spans without correlation or a flow in range")
        spans.flush()
        counters.flush()
        s = reader.stream
        conn.send(
            (
                "done",
                WorkerResult(
                    s.events_seen,
                    s.first_at,
                    s.stopped_at,
                    reader.spans_by_category,
                    reader.skipped,
                    reader.processes,
                    reader.threads,
                    reader.profiler_windows,
                    s.header if stop is None else {},
                ),
            )
        )
    except BaseException as e:  # reported to the parent, which falls back
        conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        conn.close()


def read_parallel(
    path: Path, workers: int, *, rank, offset: int, add_spans, add_counters, flags=None
) -> list[WorkerResult]:
    """Read `path` with `workers` processes; rows arrive as record batches at
    `add_spans(batch)` and `add_counters(batch)`. `flags`: the readers' keyword options
    (perfdiag_export, rank_from_args). Raises ParallelReadFailed when the result cannot
    be trusted."""
    chars = text_size_estimate(path)
    cuts = [i * chars // workers for i in range(workers)] + [None]
    ctx = mp.get_context("spawn")  # the parent runs a writer thread: never fork it
    procs, conns, order = [], [], {}
    for k in range(workers):
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(
            target=_work,
            args=(str(path), cuts[k], cuts[k + 1], rank, offset, dict(flags or {}), child),
            daemon=True,
        )
        p.start()
        child.close()
        procs.append(p)
        conns.append(parent)
        order[parent] = k
    results: dict[int, WorkerResult] = {}
    try:
        live = list(conns)
        while live:
            for conn in wait(live):
                try:
                    tag, payload = conn.recv()
                except EOFError:
                    live.remove(conn)
                    if order[conn] not in results:
                        raise ParallelReadFailed(f"worker {order[conn]} died") from None
                    continue
                if tag == "spans":
                    add_spans(payload)
                elif tag == "counters":
                    add_counters(payload)
                elif tag == "done":
                    results[order[conn]] = payload
                else:
                    raise ParallelReadFailed(payload)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join()
    ordered = [results[k] for k in range(workers)]
    for k in range(workers - 1):
        if ordered[k].stopped_at != ordered[k + 1].first_at:
            raise ParallelReadFailed(f"ranges {k} and {k + 1} disagree on their boundary")
    return ordered


def is_object_document(path: Path) -> bool:
    """Whether the trace is a JSON object (not the bare-array form), from its first bytes."""
    with open_trace(path, "rb") as f:
        return f.read(4096).lstrip()[:1] == b"{"

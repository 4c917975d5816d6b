"""The importer's fast front end: Kineto events decoded in native code, a batch at a time.

The stdlib scanner turns every event into a dict, ~2 µs per event (the import's cost);
msgspec decodes a batch of ~10k events into typed structs (kineto_structs.RawEvent) in
one call, keeping each event's args as its raw text, and the span rows' args keys are
then decoded for the whole batch in a second call. What it hands the row builder is
what the exact front end hands it, so the rows are the same (tests/test_kineto_fast.py
compares both on every shared trace and on fuzzed ones).

It gives up (FastReadFailed) on anything msgspec refuses — a NaN literal, nesting past
its depth, a batch cut it cannot place — and the caller reads the file again with the
exact front end, which reads such files or names their error.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import compress

import numpy as np
import pyarrow as pa

from .chrome_stream import BatchDecodeFailed, StopCutFailed
from .kineto_columns import span_batch
from .kineto_events import FastReadFailed
from .kineto_split import SplitReadFailed
from .kineto_structs import ARGS, NO_ARGS, ONE_ARGS, RAW_EVENTS, DecodeError


def _decode(text: str):
    try:
        return RAW_EVENTS.decode(text)
    except DecodeError:
        return None


def _one_view(raw):
    try:
        return ONE_ARGS.decode(raw)
    except DecodeError:  # null, a number, a list: no args
        return NO_ARGS


def _views(xs: list) -> tuple[list, pa.StringArray]:
    """Each X event's Args (NO_ARGS when absent or not an object) and its args text as
    one Arrow column (null when absent, empty or not an object), built from the raw
    texts joined once (no Python string per event)."""
    n = len(xs)
    raws = [e.args for e in xs]
    lengths = np.fromiter(map(len, raws), np.int64, n)
    null = lengths == 0
    have = np.flatnonzero(~null).tolist()
    present = raws if len(have) == n else [raws[i] for i in have]
    try:
        decoded = ARGS.decode(b"[" + b",".join(present) + b"]")
    except DecodeError:  # some args are not an object: one at a time
        decoded = [_one_view(r) for r in present]
        null[[i for i, v in zip(have, decoded, strict=True) if v is NO_ARGS]] = True
    if len(have) == n:
        views = decoded
    else:
        views = [NO_ARGS] * n
        for i, v in zip(have, decoded, strict=True):
            views[i] = v
    for i in np.flatnonzero(~null & (lengths < 8)).tolist():  # an empty object: no text
        if not str(raws[i], "utf-8").strip("{} \t\n\r"):
            null[i] = True
    if lengths.sum() >= 2**31:  # a batch is ~2 MB: only a single 2 GB event gets here
        raise FastReadFailed("an event's args beyond 2 GB")
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    texts = pa.Array.from_buffers(
        pa.string(), n, [pa.py_buffer(np.packbits(~null, bitorder="little")),
                         pa.py_buffer(offsets), pa.py_buffer(b"".join(raws))],
        null_count=int(null.sum()),
    )  # fmt: skip
    return views, texts


def _others(reader, others: list) -> None:
    """Non-span events (flows, metadata, counters) through the row builder."""
    if others:
        reader._add(others, [NO_ARGS] * len(others), [None] * len(others))


def _add_batch(reader, batch: list) -> None:
    is_x = [e.ph == "X" for e in batch]
    if all(is_x):
        xs, at, others, other_at = batch, range(len(batch)), [], []
    else:
        xs, at = list(compress(batch, is_x)), list(compress(range(len(batch)), is_x))
        not_x = [not x for x in is_x]
        others, other_at = list(compress(batch, not_x)), list(compress(range(len(batch)), not_x))
    views, texts = _views(xs)
    spans = None
    if xs and reader.add_spans is not None and not reader.perfdiag_export:
        spans = span_batch(reader, xs, views, texts)
    if spans is None:  # the row builder, event by event
        all_views, all_texts = [NO_ARGS] * len(batch), [None] * len(batch)
        for i, view, text in zip(at, views, texts.to_pylist(), strict=True):
            all_views[i], all_texts[i] = view, text
        reader._add(batch, all_views, all_texts)
        return
    record_batch, waiting = spans
    # The flow window is cleared only while no span waits (as the row builder does):
    # the non-span events before the first waiting span go first, then it and the rest.
    cut = bisect_left(other_at, at[waiting[0][0]]) if waiting else len(others)
    _others(reader, others[:cut])
    reader._pending.extend(entry for _, entry in waiting)
    _others(reader, others[cut:])
    reader.add_spans(record_batch)


def read_fast(reader, *, start: int = 0, split=None) -> None:
    """Read `reader`'s whole file through its row builder (KinetoFileReader._add); from
    the first event at or after character `start` (a split read's second range) when
    given. `split` (kineto_split.SplitRead): a helper process reads the file's tail
    while this one reads up to where they agree to cut."""
    reader.front_end = "fast"
    stream = reader.stream
    try:
        for batch in stream.events(on_start=reader._start, start=start, decode_batch=_decode):
            _add_batch(reader, batch)
            if split is not None:
                split.between_batches(reader)
    except StopCutFailed as e:  # this file can be read, only not cut there
        raise SplitReadFailed(str(e)) from None
    except BatchDecodeFailed as e:
        raise FastReadFailed(str(e)) from None
    except RecursionError:  # nested past msgspec's depth: the exact reader skips such events
        raise FastReadFailed("an event nested too deeply") from None
    if reader.rank is None:
        reader._start()
    if split is not None:
        split.join(reader)
    reader.finish()

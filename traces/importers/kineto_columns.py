"""A batch's span rows built a column at a time (Arrow and numpy), for the fast front end.

The row builder (KinetoFileReader._span_row) costs a few µs an event in Python, and most
events of a real trace take its plainest path: a str name, "123.456" µs times, a known
category, int pid/tid (CPU) or device/stream (GPU), an int correlation. Those rows are
built here column by column. Every other span ("special": a collective, a CPU op whose
cost comes from its shapes, a string where an id belongs, the profiler's window…) still
goes through _span_row and its row is put in its place, so the rows and their order are
the row builder's own (tests/test_kineto_fast.py). A span that waits for a flow event to
name its launch is handed back, so that the caller keeps the row builder's order of
flows and waiting spans.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..schema import STORAGE_SCHEMAS
from .kineto_events import (
    _COMM_ANNOTATION,
    _COMM_KERNEL,
    CATEGORIES,
    CORRELATED,
    CPU,
    GPU,
    MAX_NS,
    NO_STREAM,
    SKIPPED_CATEGORIES,
)
from .kineto_structs import UNSET

SCHEMA = STORAGE_SCHEMAS["spans"]
# Kineto's µs with three ns digits (Unix µs have 16 digits; ns beyond int64, in 2262, fail
# the cast and take the row builder).
_PLAIN_TIME = r"^[0-9]{1,16}\.[0-9]{3}$"
# Kineto categories whose spans wait for a flow event when they carry no correlation.
_WAITING = pa.array(
    sorted(c for c, (cat, kind) in CATEGORIES.items() if cat in CORRELATED or kind == GPU)
)
_ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError)
# The row builder's row[4:13], by column (step_id is never set by an import).
_ROW_INTS = ("pid", "tid", "device", "stream", "rank", None, "correlation", "flops", "bytes")


def _bools(arr: pa.Array) -> np.ndarray:
    return pc.fill_null(arr, False).to_numpy(zero_copy_only=False)


def _writable(arr: pa.Array) -> np.ndarray:
    return arr.to_numpy(zero_copy_only=False, writable=True)


def _times(values: list) -> tuple[np.ndarray, np.ndarray]:
    """Kineto µs → ns, and which values were plain (the rest: special rows)."""
    n = len(values)
    try:
        arr = pa.array(values)
    except _ARROW_ERRORS:
        return np.zeros(n, np.int64), np.zeros(n, bool)
    if pa.types.is_string(arr.type):
        plain = pc.fill_null(pc.match_substring_regex(arr, _PLAIN_TIME), False)
        digits = pc.replace_substring(pc.if_else(plain, arr, "0.000"), ".", "")
        try:
            return _writable(pc.cast(digits, pa.int64())), _bools(plain)
        except pa.ArrowInvalid:  # beyond int64 ns
            return np.zeros(n, np.int64), np.zeros(n, bool)
    if arr.type == pa.int64():  # whole µs (older Kineto)
        v = _writable(arr.fill_null(-1))
        plain = (v >= 0) & (v <= MAX_NS // 1000)
        return np.where(plain, v, 0) * 1000, plain
    return np.zeros(n, np.int64), np.zeros(n, bool)


def _ints(values: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ids: (values, present, plain): plain is an int in the int64 ns range or null."""
    n = len(values)
    try:
        arr = pa.array(values, pa.int64())
        present = _bools(arr.is_valid())
        v = _writable(arr.fill_null(0))
        if not present.any() or v.min() > -(2**63):
            return v, present, np.ones(n, bool)
    except _ARROW_ERRORS:
        pass
    plain = [x is None or (x.__class__ is int and -MAX_NS <= x <= MAX_NS) for x in values]
    clean = [x if ok else None for x, ok in zip(values, plain, strict=True)]
    arr = pa.array(clean, pa.int64())
    return _writable(arr.fill_null(0)), _bools(arr.is_valid()), np.array(plain, bool)


class _Dictionary:
    """A dictionary column's values: the batch's distinct strings, appendable."""

    def __init__(self, values: list[str]):
        self.values = values
        self.code = {v: i for i, v in enumerate(values)}

    def __getitem__(self, value: str) -> int:
        code = self.code.get(value)
        if code is None:
            code = self.code[value] = len(self.values)
            self.values.append(value)
        return code

    def array(self, codes: np.ndarray) -> pa.DictionaryArray:
        return pa.DictionaryArray.from_arrays(
            pa.array(codes.astype(np.int32)), pa.array(self.values, pa.string())
        )


def span_batch(reader, xs: list, views: list, texts: pa.StringArray):
    """The spans of the X events `xs` (their Args `views`, args `texts`) as one record
    batch in the storage schema, the row builder's counts updated, and the spans that
    wait for a flow event (x index, pending entry); None when the batch must go through
    the row builder whole (nothing counted yet)."""
    n = len(xs)
    try:
        cat_arr = pa.array([e.cat for e in xs], pa.string())
        name_arr = pc.fill_null(pa.array([e.name for e in xs], pa.string()), "")
    except _ARROW_ERRORS:  # a number where a name belongs
        return None
    corr, corr_present, corr_plain = _ints([v.correlation for v in views])
    # A span that may wait for a flow event to name its launch: the row builder's.
    special = ~corr_plain | (~corr_present & _bools(pc.is_in(cat_arr, _WAITING)))

    # Per distinct category, then indexed per row (null category: "other").
    enc = cat_arr.dictionary_encode()
    kineto_cats = [*enc.dictionary.to_pylist(), None]
    idx = pc.fill_null(enc.indices, len(kineto_cats) - 1).to_numpy()
    cats = _Dictionary([])
    code_u, kind_u, special_u = [], [], []
    for c in kineto_cats:
        mapped = CATEGORIES.get(c)
        category, kind = mapped or (c or "other", CPU)
        code_u.append(cats[category])
        kind_u.append(kind)
        special_u.append(mapped is None and c in SKIPPED_CATEGORIES)
    cat_code = np.array(code_u, np.int32)[idx]
    gpu = np.array(kind_u)[idx] == GPU
    special |= np.array(special_u, bool)[idx]
    named = {c: np.isin(cat_code, [cats.code[k] for k in ks if k in cats.code])
             for c, ks in (("ops", ("cpu_op", "annotation")), ("kernel", ("kernel",)),
                           ("mem", ("gpu_memcpy", "gpu_memset")))}  # fmt: skip

    nenc = name_arr.dictionary_encode()
    names = _Dictionary(nenc.dictionary.to_pylist())
    name_code = _writable(nenc.indices)
    comm_kernel = np.array([bool(_COMM_KERNEL.match(s)) for s in names.values], bool)
    comm_op = np.array([bool(_COMM_ANNOTATION.match(s)) for s in names.values], bool)
    special |= named["kernel"] & comm_kernel[name_code]
    special |= named["ops"] & comm_op[name_code]

    start, ts_plain = _times([e.ts for e in xs])
    dur, dur_plain = _times([e.dur for e in xs])
    special |= ~ts_plain | ~dur_plain
    start += reader.offset

    pid, pid_present, pid_plain = _ints([e.pid for e in xs])
    tid, tid_present, tid_plain = _ints([e.tid for e in xs])
    special |= ~gpu & ~(pid_plain & tid_plain)
    device, dev_present, dev_plain = _ints(
        [e.pid if v.device is UNSET else v.device for e, v in zip(xs, views, strict=True)]
    )
    stream, stream_present, stream_plain = _ints(
        [e.tid if v.stream is UNSET else v.stream for e, v in zip(xs, views, strict=True)]
    )
    special |= gpu & ~(dev_plain & stream_plain)
    stream_present &= stream != NO_STREAM  # a context-wide sync: on no stream

    # No flops key: none, unless shapes are there to cost it (the row builder's op_cost).
    flops, flops_present, flops_plain = _ints(
        [None if v.flops is UNSET else v.flops for v in views]
    )
    costed = np.fromiter((v.flops is UNSET and v.input_dims is not UNSET for v in views), bool, n)
    special |= named["ops"] & (~flops_plain | costed)
    nbytes, bytes_present, bytes_plain = _ints(
        [None if v.bytes is UNSET else v.bytes for v in views]
    )
    special |= named["mem"] & ~bytes_plain

    if special.sum() * 4 > n:  # mostly unusual rows: the row builder is cheaper whole
        return None
    cpu = ~gpu
    present = {
        "pid": pid_present & cpu, "tid": tid_present & cpu,
        "device": dev_present & gpu, "stream": stream_present & gpu,
        "flops": flops_present & named["ops"], "bytes": bytes_present & named["mem"],
        "correlation": corr_present,
    }  # fmt: skip
    rank = np.full(n, reader.rank if reader.rank is not None else 0, np.int64)
    values = {"pid": pid, "tid": tid, "device": device, "stream": stream, "flops": flops,
              "bytes": nbytes, "correlation": corr, "rank": rank}  # fmt: skip
    present["rank"] = np.full(n, reader.rank is not None)

    regular = ~special
    counts = np.bincount(cat_code[regular], minlength=len(cats.values))
    by_cat = reader.spans_by_category
    for category, count in zip(cats.values, counts.tolist(), strict=False):
        if count:
            by_cat[category] = by_cat.get(category, 0) + count

    keep = np.ones(n, bool)
    waiting = []
    for j in np.flatnonzero(special).tolist():
        got = reader._span_row(xs[j], views[j], texts[j].as_py())
        if got is None or got[1]:
            keep[j] = False
            if got is not None:  # its launch is named by a flow event: joined at the end
                waiting.append((j, (got[0], (xs[j].pid, xs[j].tid, xs[j].ts))))
            continue
        row = got[0]
        name_code[j], cat_code[j], start[j], dur[j] = names[row[0]], cats[row[1]], *row[2:4]
        for key, value in zip(_ROW_INTS, row[4:13], strict=True):
            if key is not None:
                values[key][j] = 0 if value is None else value
                present[key][j] = value is not None

    def ints(v: np.ndarray, ok: np.ndarray) -> pa.Array:
        return pa.array(v[keep], pa.int64(), mask=~ok[keep])

    kept = texts if keep.all() else texts.filter(pa.array(keep))
    columns = [
        names.array(name_code[keep]), cats.array(cat_code[keep]),
        pa.array(start[keep], pa.int64()), pa.array(dur[keep], pa.int64()),
        ints(values["pid"], present["pid"]), ints(values["tid"], present["tid"]),
        ints(values["device"], present["device"]), ints(values["stream"], present["stream"]),
        ints(values["rank"], present["rank"]), pa.nulls(int(keep.sum()), pa.int64()),
        ints(values["correlation"], present["correlation"]),
        ints(values["flops"], present["flops"]), ints(values["bytes"], present["bytes"]),
        kept,
    ]  # fmt: skip
    return pa.RecordBatch.from_arrays(columns, schema=SCHEMA), waiting

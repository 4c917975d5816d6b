"""Counting spans that are identical to an earlier span of the same file.

A trace written twice, or two copies of its event list pasted into one, would double
every busy time without a word. Identical spans are kept (as HTA keeps them: nothing a
trace holds is dropped on a guess) and counted, and the import says how many.

Each span gets a 64-bit key from its name, times, thread or stream, correlation and the
length of its args text; a file's count is its spans less its distinct keys. Rows and
Arrow batches give the same key for the same span, whichever front end built it.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_NULL = -(2**63)  # a missing id: no id can be it (ids are kept within ±(2**63 - 1))
_INT_FIELDS = (2, 3, 4, 5, 6, 7, 10)  # start, dur, pid, tid, device, stream, correlation
_INT_COLUMNS = ("start_ns", "dur_ns", "pid", "tid", "device", "stream", "correlation")
_MIX = np.uint64(0x9E3779B97F4A7C15)


def _mix(columns: list[np.ndarray]) -> np.ndarray:
    h = np.zeros(len(columns[0]), np.uint64)
    for col in columns:
        h = (h ^ col.astype(np.int64).view(np.uint64)) * _MIX
        h ^= h >> np.uint64(29)
    return h


class IdenticalSpans:
    """Wraps a table's `append` and `append_batch`, counting identical spans."""

    def __init__(self, table):
        self._table = table
        self._rows: list[tuple] = []
        self._keys: list[np.ndarray] = []

    def append(self, row: tuple) -> None:
        rows = self._rows
        rows.append(row)
        if len(rows) >= 1 << 16:
            self._flush_rows()

    def append_batch(self, batch: pa.RecordBatch) -> None:
        self._flush_rows()
        names = batch.column("name")
        if not pa.types.is_dictionary(names.type):
            names = names.dictionary_encode()
        distinct = np.array([hash(s) for s in names.dictionary.to_pylist()], np.int64)
        columns = [distinct[pc.fill_null(names.indices, 0).to_numpy(zero_copy_only=False)]]
        for name in _INT_COLUMNS:
            col = batch.column(name)
            columns.append(pc.fill_null(col, _NULL).to_numpy(zero_copy_only=False))
        args = pc.fill_null(pc.utf8_length(batch.column("args")), -1)
        columns.append(args.to_numpy(zero_copy_only=False))
        self._keys.append(_mix(columns))
        self._table.append_batch(batch)

    def _flush_rows(self) -> None:
        rows = self._rows
        if not rows:
            return
        columns = [np.fromiter((hash(r[0]) for r in rows), np.int64, len(rows))]
        for i in _INT_FIELDS:
            columns.append(
                np.fromiter((_NULL if r[i] is None else r[i] for r in rows), np.int64, len(rows))
            )
        columns.append(np.fromiter((-1 if r[13] is None else len(r[13]) for r in rows),
                                   np.int64, len(rows)))  # fmt: skip
        self._keys.append(_mix(columns))
        self._table.extend(rows)
        del rows[:]

    def finish(self) -> int:
        """Hand the last rows on; how many spans were identical to an earlier one."""
        self._flush_rows()
        if not self._keys:
            return 0
        keys = np.concatenate(self._keys)
        self._keys = []
        return int(len(keys) - len(np.unique(keys)))


def identical_warning(path, count: int) -> str:
    return (
        f"{path}: {count:,} spans are identical to an earlier one (same name, times, thread "
        "or stream, correlation and args): kept, so their time counts twice; was the trace "
        "written, or its events pasted, twice?"
    )

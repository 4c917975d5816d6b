"""Read a run: `load_run(path)` → a `Run` with the manifest and typed DataFrames.

Reads finished runs (Parquet), runs still being written or killed midway (Arrow IPC
streams, ignoring an incomplete last batch), and runs from older schema versions
(upgraded on read); refuses newer ones with a clear message. Tables are opened and
checked when the run loads; DataFrames are built on first access and cached.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import RunFormatError
from .layout import LOCK_FILE, PARQUET_SUFFIX, TABLES_DIR, parquet_path, stream_path
from .manifest import CRASHED, FINAL_STATUSES, RUNNING, Manifest, read_manifest
from .schema import CATEGORICAL, ROW_TYPES, SCHEMA_VERSION, SCHEMAS
from .stream import first_line, read_stream

# schema version v -> function upgrading (table name, Arrow table) from v to v + 1.
_UPGRADES: dict[int, Callable[[str, pa.Table], pa.Table]] = {}

# Columns that bound a row in time, per table: (start column, end column or None, dur col).
_TIME_COLUMNS = {
    "request_events": ("ts_ns", None, None),
    "steps": ("start_ns", "end_ns", None),
    "spans": ("start_ns", None, "dur_ns"),
    "counters": ("ts_ns", None, None),
}


class TableSource:
    """Where one table's rows come from. Parquet is read on first use, and only the
    columns asked for (a trace's `args` text is most of its bytes); a stream was read
    whole when the run loaded (it has no index to read columns from)."""

    def __init__(self, name: str, *, parquet: Path | None = None, table: pa.Table | None = None,
                 schema_version: int = SCHEMA_VERSION):  # fmt: skip
        self.name, self.parquet, self._table = name, parquet, table
        self._version = schema_version
        self.num_rows = table.num_rows if table is not None else 0
        self._file_columns: list[str] = []
        if parquet is not None:
            try:
                meta = pq.read_metadata(parquet)
            except (pa.ArrowException, OSError) as e:
                raise RunFormatError(f"{parquet} is corrupt or truncated "
                                     f"({first_line(e)})") from None  # fmt: skip
            self.num_rows = meta.num_rows
            self._file_columns = list(meta.schema.to_arrow_schema().names)

    def read(self, columns: list[str] | None = None) -> pa.Table:
        """The table (conformed to the current schema), or just `columns` of it."""
        if self._table is None and columns is None:
            self._table = self._load(None)
        if self._table is not None:
            full = self._table
            return (
                full
                if columns is None
                else full.select([c for c in columns if c in full.column_names])
            )
        return self._load(columns)

    def _load(self, columns: list[str] | None) -> pa.Table:
        if self.parquet is None:
            table = SCHEMAS[self.name].empty_table()
        else:
            wanted = None if columns is None else [c for c in columns if c in self._file_columns]
            dictionary = [c for c in CATEGORICAL[self.name] if c in self._file_columns]
            try:
                # ParquetFile, not read_table: the latter loads pyarrow.dataset (~50 ms)
                with pq.ParquetFile(self.parquet, read_dictionary=dictionary,
                                    page_checksum_verification=True) as f:  # fmt: skip
                    table = f.read(columns=wanted)
            except (pa.ArrowException, OSError) as e:
                raise RunFormatError(f"{self.parquet} is corrupt or truncated "
                                     f"({first_line(e)})") from None  # fmt: skip
        for version in range(self._version, SCHEMA_VERSION):
            table = _UPGRADES[version](self.name, table)
        return conform(self.name, table, columns)


@dataclass
class Run:
    path: Path
    manifest: Manifest
    status: str  # the manifest's, or "crashed" when it says running and no writer lives
    sources: dict[str, TableSource]
    missing_tables: list[str]  # tables the run has no file for (read as empty)
    warnings: list[str] = field(default_factory=list)
    # Tables the manifest counted rows for whose file is gone (deleted after the run
    # closed): table -> rows the manifest says it held. Read as empty, never as whole.
    lost_tables: dict[str, int] = field(default_factory=dict)
    _frames: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False)

    def arrow(self, name: str, columns: list[str] | None = None) -> pa.Table:
        """The table as Arrow; with `columns`, only those are read (from Parquet)."""
        if name not in self.sources:
            raise RunFormatError(f"unknown table {name!r}; tables: {', '.join(self.sources)}")
        return self.sources[name].read(columns)

    def table(self, name: str) -> pd.DataFrame:
        """The table as a DataFrame with stable dtypes (int64 / Int64 / category / string)."""
        if name not in self._frames:
            self._frames[name] = to_frame(name, self.arrow(name))
        return self._frames[name]

    @property
    def requests(self) -> pd.DataFrame:
        return self.table("requests")

    @property
    def request_events(self) -> pd.DataFrame:
        return self.table("request_events")

    @property
    def steps(self) -> pd.DataFrame:
        return self.table("steps")

    @property
    def spans(self) -> pd.DataFrame:
        return self.table("spans")

    @property
    def counters(self) -> pd.DataFrame:
        return self.table("counters")

    def row_counts(self) -> dict[str, int]:
        return {name: source.num_rows for name, source in self.sources.items()}

    def time_span_ns(self) -> tuple[int, int] | None:
        """(first, last) timestamp over every table, on the run's monotonic clock."""
        lo, hi = [], []
        for name, (start, end, dur) in _TIME_COLUMNS.items():
            if self.sources[name].num_rows == 0:
                continue
            t = self.arrow(name, [c for c in (start, end, dur) if c])
            bounds = pc.min_max(t[start])
            if bounds["min"].is_valid:
                lo.append(bounds["min"].as_py())
            if end is not None:
                last = pc.max(t[end]).as_py()
            elif dur is not None:
                last = pc.max(pc.add(t[start], t[dur])).as_py()
            else:
                last = bounds["max"].as_py()
            if last is not None:
                hi.append(last)
        return (min(lo), max(hi)) if lo and hi else None


def load_run(path: str | os.PathLike) -> Run:
    """Open the run at `path`; raise a RunFormatError subclass if it cannot be read.

    Every table file is checked now (a Parquet footer, a whole stream); Parquet data is
    read when a table is first used."""
    path = Path(path)
    manifest = read_manifest(path)
    status = manifest.status
    if status == RUNNING and not writer_alive(path):
        status = CRASHED
    tolerate = status not in FINAL_STATUSES
    sources, missing, notes, lost = {}, [], [], {}
    for name in ROW_TYPES:
        source, note = _open_table(path, name, manifest.schema_version, tolerate)
        _check_row_count(path, name, source, manifest)
        if source is None:
            missing.append(name)
            source = TableSource(name, table=SCHEMAS[name].empty_table())
            expected = _counted_rows(manifest, name)
            if expected:
                lost[name] = expected
                note = (
                    f"{name}: {TABLES_DIR}/{name}{PARQUET_SUFFIX} is missing: the manifest "
                    f"counts {expected:,} rows, lost since the run closed (read as empty)"
                )
        if not note and source is not None and source.parquet is None:
            note = _not_compacted(manifest, name)
        if note:
            notes.append(note)
        sources[name] = source
    if status == CRASHED:
        notes.insert(0, "the writer stopped without closing the run: it holds what was flushed")
    return Run(path, manifest, status, sources, missing, notes, lost_tables=lost)


def _not_compacted(manifest: Manifest, name: str) -> str | None:
    """Why a closed run's table is still its Arrow stream, when the writer said."""
    info = manifest.tables.get(name)
    why = info.get("compact_error") if isinstance(info, dict) else None
    if not why:
        return None
    if why == "interrupted":
        return f"{name}: compaction was interrupted: read from its Arrow stream (all rows)"
    return f"{name}: not compacted ({str(why)[:200]}): read from its Arrow stream"


def _counted_rows(manifest: Manifest, name: str) -> int | None:
    """The rows the writer counted in a table when it closed the run (None if it did not)."""
    info = manifest.tables.get(name)
    rows = info.get("rows") if isinstance(info, dict) else None
    return rows if isinstance(rows, int) and not isinstance(rows, bool) else None


def _check_row_count(run_dir: Path, name: str, source, manifest: Manifest) -> None:
    """A compacted table holds the rows the writer counted when it closed the run."""
    expected = _counted_rows(manifest, name)
    if source is None or source.parquet is None or expected is None:
        return
    if source.num_rows != expected:
        raise RunFormatError(
            f"{source.parquet} holds {source.num_rows:,} rows but the manifest of {run_dir} "
            f"says {expected:,}: the file was changed or damaged after the run closed"
        )


def writer_alive(run_dir: Path) -> bool:
    """Whether a live process still holds the run's writer lock."""
    try:
        fd = os.open(run_dir / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    else:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def _open_table(run_dir: Path, name: str, version: int, tolerate: bool):
    parquet, stream = parquet_path(run_dir, name), stream_path(run_dir, name)
    if parquet.exists():
        return TableSource(name, parquet=parquet, schema_version=version), None
    if stream.exists():
        contents = read_stream(stream, SCHEMAS[name], tolerate_truncation=tolerate)
        table = contents.table
        for v in range(version, SCHEMA_VERSION):
            table = _UPGRADES[v](name, table)
        note = None
        if contents.damaged:
            note = (f"{name}: {contents.damaged}: kept the {table.num_rows:,} rows before it, "
                    f"dropped the rest of the table")  # fmt: skip
        elif contents.truncated:
            note = f"{name}: ignored an incomplete last batch (the writer was killed mid-write)"
        return TableSource(name, table=conform(name, table)), note
    return None, None


def conform(name: str, table: pa.Table, only: list[str] | None = None) -> pa.Table:
    """Match `table` to the current schema: fill absent nullable columns, cast types,
    keep unknown extra columns last. A missing required column is an error. With `only`,
    just those columns, in that order."""
    schema = SCHEMAS[name]
    columns, fields = [], []
    wanted = schema if only is None else [schema.field(c) for c in only if c in schema.names]
    for f in wanted:
        if f.name in table.column_names:
            col = table[f.name]
            base = col.type.value_type if pa.types.is_dictionary(col.type) else col.type
            if base != f.type:
                try:
                    col = col.cast(f.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    raise RunFormatError(
                        f"table {name}: column {f.name} is {col.type}, expected {f.type}"
                    ) from None
            elif col.null_count and not f.nullable:
                raise RunFormatError(f"table {name}: column {f.name} has nulls")
            columns.append(col)
            fields.append(pa.field(f.name, col.type, nullable=f.nullable))
        elif f.nullable or table.num_rows == 0:
            columns.append(pa.nulls(table.num_rows, f.type))
            fields.append(f)
        else:
            raise RunFormatError(f"table {name} lacks the required column {f.name}")
    for extra in table.column_names:
        if extra not in schema.names and (only is None or extra in only):
            columns.append(table[extra])
            fields.append(table.schema.field(extra))
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def to_frame(name: str, table: pa.Table) -> pd.DataFrame:
    """Arrow → pandas with one dtype per column whatever the data: required ints stay
    int64 (exact ns), nullable ints become Int64 (never float), text is category or string."""
    data = {}
    categorical = CATEGORICAL.get(name, frozenset())
    for f, col in zip(table.schema, table.columns, strict=True):
        if f.name in categorical:
            if not pa.types.is_dictionary(col.type):
                col = col.dictionary_encode()
            data[f.name] = col.to_pandas()
        elif pa.types.is_integer(f.type):
            if f.nullable:
                data[f.name] = col.to_pandas(types_mapper={f.type: pd.Int64Dtype()}.get)
            else:
                data[f.name] = col.to_numpy().astype("int64", copy=False)
        elif pa.types.is_string(f.type) or pa.types.is_large_string(f.type):
            data[f.name] = col.to_pandas(types_mapper={f.type: pd.StringDtype()}.get)
        else:
            data[f.name] = col.to_pandas()
    return pd.DataFrame(data, copy=False)

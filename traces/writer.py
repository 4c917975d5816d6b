"""Record a run: append rows in batches to crash-safe Arrow IPC streams, compact on close.

The hot path (`TableAppender.append`) only puts a row tuple into an in-memory list
(no lock, no I/O); a background thread turns buffers into Arrow record batches and writes
them at least every `flush_interval_s`. Each batch is a complete IPC message written
straight to the OS, so a process killed at any point leaves every flushed batch
readable (the reader ignores an incomplete last message). `close()` compacts the streams
into Parquet and marks the run complete (or interrupted / crashed).

A failed write (disk full, I/O error, permission lost) stops writing at once: the flusher
drops what is still buffered (counted as `rows_lost`), callbacks registered with
`on_failure` stop the recording, and `close()` keeps every batch already on disk readable
(the streams stay where Parquet cannot be written) and marks the run crashed, with the
cause, when the manifest can still be written.

A writer holds an exclusive `flock` on `.writer.lock` for its lifetime: a reader that can
take the lock knows no writer is alive, which is how a run that still says "running" is
recognised as crashed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import os
import re
import secrets
import socket
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from .._version import __version__
from ..errors import ConfigError, PerfdiagError, RunFormatError
from . import environment
from .compaction import compact_table
from .layout import LOCK_FILE, TABLES_DIR, stream_path
from .manifest import (
    COMPLETE,
    CRASHED,
    INTERRUPTED,
    MANIFEST,
    RUNNING,
    Manifest,
    write_manifest,
)
from .schema import ROW_TYPES, SCHEMA_VERSION, STORAGE_SCHEMAS, batch_from_rows
from .signal_guard import Held, signals_held
from .storage_errors import storage_error, storage_kind
from .stream import (
    CHECKSUMS,
    CHECKSUMS_KEY,
    CRC_KEY,
    SCHEMA_CRC_KEY,
    batch_checksum,
    schema_checksum,
)

MAX_FLUSH_INTERVAL_S = 1.0
FLUSH_POLL_S = 0.05


def utc_now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


class WriteFailedError(PerfdiagError):
    """Writing the run failed (disk full, I/O error): the run stopped."""


def describe_os_error(e: BaseException) -> str:
    """One line for a failed write: the OS's words when there are some."""
    errno = getattr(e, "errno", None)
    if errno is not None:
        return os.strerror(errno)
    text = str(e)
    for marker in ("No space left on device", "Input/output error", "Permission denied"):
        if marker in text:  # pyarrow's OSError keeps errno only in its text
            return marker
    return text.splitlines()[0] if text else type(e).__name__


class TableAppender:
    """Buffers rows of one table for the background flusher.

    `append(row)` is the recording hot path and is nothing but the buffer list's own
    `append` (atomic under the GIL): no lock, no size check. The flusher takes rows
    with an atomic slice and deletes exactly those (`del rows[:n]`), so a row appended
    concurrently is never lost, whatever thread appends it.
    """

    __slots__ = (
        "_file",
        "_io_lock",
        "_last_write",
        "_rows",
        "_stream",
        "append",
        "dropped",
        "extend",
        "first_error",
        "name",
        "rows_written",
        "schema",
    )

    def __init__(self, name: str, path: Path):
        self.name = name
        self.schema = STORAGE_SCHEMAS[name]
        self._rows: list[tuple] = []
        self.append = self._rows.append  # a tuple in field order (the row NamedTuples)
        self.extend = self._rows.extend
        self._io_lock = threading.Lock()  # keeps batches in append order on disk
        self._file = pa.OSFile(str(path), "wb")  # unbuffered: each batch reaches the OS
        marked = self.schema.with_metadata(
            {CHECKSUMS_KEY: CHECKSUMS, SCHEMA_CRC_KEY: schema_checksum(self.schema)}
        )
        self._stream = ipc.new_stream(self._file, marked)
        self._file.flush()
        self._last_write = time.monotonic()
        self.rows_written = 0
        self.dropped = 0
        self.first_error: str | None = None

    def pending(self) -> int:
        return len(self._rows)

    def discard(self) -> int:
        """Drop every buffered row (after a failed write): how many were dropped."""
        n = len(self._rows)
        del self._rows[:n]
        return n

    def seconds_since_write(self) -> float:
        return time.monotonic() - self._last_write

    def flush(self) -> None:
        with self._io_lock:
            self._flush_locked()

    def append_batch(self, batch: pa.RecordBatch) -> None:
        """Write rows already converted to Arrow (by `rows_to_batch`, say in a worker
        process), after any buffered rows so the table keeps append order."""
        if batch.schema != self.schema:
            try:
                batch = batch.cast(self.schema)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as e:
                raise RunFormatError(f"a batch for table {self.name} does not fit: {e}") from None
        with self._io_lock:
            self._flush_locked()
            self._write(batch)

    def _flush_locked(self) -> None:
        rows = self._rows
        n = len(rows)
        chunk = rows[:n]
        del rows[:n]  # rows appended since len() stay, at the front
        self._last_write = time.monotonic()
        if chunk:
            self._write(self._to_batch(chunk))

    def _write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows:
            self._stream.write_batch(batch, custom_metadata={CRC_KEY: batch_checksum(batch)})
            self._file.flush()
            self.rows_written += batch.num_rows

    def close(self) -> None:
        self.flush()
        with self._io_lock:
            self._stream.close()
            self._file.close()

    def abandon(self) -> None:
        """Close the file without writing more (after a failed write)."""
        with self._io_lock, contextlib.suppress(OSError, pa.ArrowException):
            self._file.close()

    def _to_batch(self, rows: list[tuple]) -> pa.RecordBatch:
        try:
            return batch_from_rows(rows, self.schema)
        except (pa.ArrowException, ValueError, TypeError):
            pass
        # Rare path: keep every good row, count the bad ones (the trust gate reports them).
        good = []
        for row in rows:
            try:
                batch_from_rows([row], self.schema)
                good.append(row)
            except (pa.ArrowException, ValueError, TypeError) as e:
                self.dropped += 1
                if self.first_error is None:
                    self.first_error = f"{self.name}: {e} in row {row!r}"[:500]
                    warnings.warn(f"perfdiag dropped a malformed {self.first_error}", stacklevel=1)
        return (
            batch_from_rows(good, self.schema)
            if good
            else self.schema.empty_table().to_batches()[0]
        )


def rows_to_batch(rows: list[tuple], table: str) -> pa.RecordBatch:
    """Convert row tuples of `table` to a record batch in its storage schema (for
    `TableAppender.append_batch`). Raises on a malformed row."""
    return batch_from_rows(rows, STORAGE_SCHEMAS[table])


# A run id: the UTC second it began and 6 hex digits, then a label (the workload): a
# directory named so (perfdiag run's default) is its run's id.
RUN_ID = re.compile(r"\d{8}T\d{6}Z-[0-9a-f]{6}(-[A-Za-z0-9_.+=-]+)?")


def new_run_id(label: str | None = None) -> str:
    stamp = f"{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"
    clean = re.sub(r"[^A-Za-z0-9_.+=-]", "_", label) if label else ""
    return f"{stamp}-{clean}" if clean else stamp


def run_id_for(path: Path) -> str:
    """The directory's name when it is a run id (so the id and the directory agree),
    else a new id."""
    return path.name if RUN_ID.fullmatch(path.name) else new_run_id()


class RunWriter:
    """Writes one run directory. Use as a context manager or call `close(status)`."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        command: list[str] | None = None,
        config: dict[str, Any] | None = None,
        source: str = "perfdiag",
        environment_info: dict[str, Any] | None = None,
        flush_interval_s: float = 0.5,
        batch_rows: int = 65536,
    ):
        if not 0 < flush_interval_s <= MAX_FLUSH_INTERVAL_S:
            raise ConfigError(f"flush_interval_s must be in (0, {MAX_FLUSH_INTERVAL_S}]")
        if batch_rows < 1:
            raise ConfigError("batch_rows must be at least 1")
        self.path = Path(path)
        created_dir = self._prepare_directory()
        self._lock_fd = self._take_lock()
        self._manifest = Manifest(
            schema_version=SCHEMA_VERSION,
            perfdiag_version=__version__,
            run_id=run_id_for(self.path),
            created_at=utc_now_iso(),
            status=RUNNING,
            command=list(sys.argv if command is None else command),
            config=dict(config or {}),
            environment=environment_info or environment.fingerprint(),
            clock=environment.clock_origin(),
            source=source,
            writer={"pid": os.getpid(), "host": socket.gethostname()},
            tables={name: {"format": "arrow-stream"} for name in ROW_TYPES},
        )
        self._tables: dict[str, TableAppender] = {}
        self._flush_interval_s = flush_interval_s
        self._batch_rows = batch_rows
        self._error: BaseException | None = None
        self._failure_callbacks: list[Callable[[], None]] = []
        self.rows_lost = 0  # buffered when writing failed, never written
        self._closed = False
        self._stop = threading.Event()
        self._flusher = threading.Thread(
            target=self._flush_loop, name="perfdiag-run-flusher", daemon=True
        )
        try:
            # An interrupt once the manifest exists must find a writer that can close
            # the run: it is held until the writer is whole, then closes it (below).
            with signals_held():
                try:
                    write_manifest(self.path, self._manifest)
                    for name in ROW_TYPES:
                        self._tables[name] = TableAppender(name, stream_path(self.path, name))
                except (OSError, pa.ArrowException) as e:
                    self._undo_open(created_dir)  # nothing was recorded: leave nothing
                    raise storage_error(self.path, e, "no run was started") or ConfigError(
                        f"{self.path}: cannot write the run ({describe_os_error(e)})"
                    ) from None
                self._flusher.start()
        except KeyboardInterrupt:
            self.close(INTERRUPTED)
            raise

    # -- recording -----------------------------------------------------------------------
    def table(self, name: str) -> TableAppender:
        try:
            return self._tables[name]
        except KeyError:
            raise ConfigError(f"unknown table {name!r}; tables: {', '.join(ROW_TYPES)}") from None

    def append(self, table: str, row: tuple) -> None:
        self._tables[table].append(row)

    @property
    def manifest(self) -> Manifest:
        return self._manifest

    def update_manifest(self, **changes: Any) -> bool:
        """Record more about the run (say, the resolved config) while it is running.
        Returns whether it reached the disk (a failed write stops the run instead)."""
        import dataclasses

        self._manifest = dataclasses.replace(self._manifest, **changes)
        try:
            write_manifest(self.path, self._manifest)
        except OSError as e:
            self._fail(e)
            return False
        return True

    def flush(self) -> None:
        """Write every buffered row now (the background thread also does this)."""
        if self._error is None:
            try:
                for table in self._tables.values():
                    table.flush()
            except (OSError, pa.ArrowException) as e:
                self._fail(e)
        if self._error is not None:
            raise WriteFailedError(f"{self.path}: {self.failure}") from None

    @property
    def failure(self) -> str | None:
        """What went wrong writing the run, in one line; None while all is well."""
        if self._error is None:
            return None
        return f"writing the run failed ({describe_os_error(self._error)})"

    def failure_error(self) -> WriteFailedError:
        """The one-line error a recording stopped by a failed write ends with."""
        kind = storage_kind(self._error) if self._error is not None else None
        return WriteFailedError(
            f"{self.path}: {kind + ': ' if kind else ''}{self.failure}: the run stopped; "
            f"everything written before it "
            f"is kept ({self.rows_lost:,} rows were lost)"
        )

    def on_failure(self, callback: Callable[[], None]) -> None:
        """Call `callback` (from the flusher's thread) if a write fails: stop the run."""
        self._failure_callbacks.append(callback)
        if self._error is not None:
            callback()

    def _fail(self, e: BaseException) -> None:
        if self._error is not None:
            return
        self._error = e
        for callback in self._failure_callbacks:
            with contextlib.suppress(Exception):
                callback()

    # -- ending --------------------------------------------------------------------------
    def close(self, status: str = COMPLETE) -> None:
        """Flush, compact every table to Parquet and mark the run `status`."""
        if self._closed:
            return
        if status not in (COMPLETE, INTERRUPTED, CRASHED):
            raise ConfigError(f"a run ends complete, interrupted or crashed, not {status!r}")
        self._closed = True
        # Ctrl-C or SIGTERM now would leave the run `running`, locked, half-compacted:
        # it is held, stops the compaction (the streams stay the data), and is raised
        # once the manifest says how the run ended and the lock is gone.
        with signals_held() as held:
            self._close(status, held)

    def _close(self, status: str, held: Held) -> None:
        self._stop.set()
        if self._flusher.is_alive():
            self._flusher.join()
        for table in self._tables.values():
            if self._error is None:
                try:
                    table.close()
                    continue
                except (OSError, pa.ArrowException) as e:
                    self._fail(e)
            self.rows_lost += table.discard()
            table.abandon()
        tables = {name: compact_table(self.path, name, held) for name in self._tables}
        dropped = {n: t.dropped for n, t in self._tables.items() if t.dropped}
        extra = dict(self._manifest.extra)
        if dropped:
            extra["dropped_records"] = dropped
            extra["first_drop_error"] = next(
                t.first_error for t in self._tables.values() if t.first_error
            )
        left = [n for n, info in tables.items() if info.get("compact_error") == INTERRUPTED]
        if left:
            extra["compaction"] = (f"interrupted: {', '.join(left)} kept as Arrow streams "
                                   f"(every row is there; they read more slowly)")  # fmt: skip
        if self._error is not None:
            status = CRASHED
            extra["write_error"] = self.failure
            extra["rows_lost"] = self.rows_lost
        if not self.update_manifest(status=status, ended_at=utc_now_iso(), tables=tables,
                                    extra=extra):  # fmt: skip
            # The manifest on disk still lists the streams, which stay; with the lock
            # released below, a reader sees a crashed run and reads them.
            tables = {}
        for name, info in tables.items():
            if info["format"] == "parquet":  # a stream that did not compact is the data
                stream_path(self.path, name).unlink(missing_ok=True)
        self._release_lock()

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            status = COMPLETE
        elif issubclass(exc_type, KeyboardInterrupt):
            status = INTERRUPTED
        else:
            status = CRASHED
        self.close(status)

    # -- internals -----------------------------------------------------------------------
    def _prepare_directory(self) -> bool:
        """Create the (empty or absent) run directory's tables/; whether it created the
        run directory itself."""
        try:
            existed = self.path.exists()
            if existed and (not self.path.is_dir() or any(self.path.iterdir())):
                raise ConfigError(f"{self.path}: already exists and is not an empty directory")
            (self.path / TABLES_DIR).mkdir(parents=True, exist_ok=True)
        except PermissionError:
            raise ConfigError(f"{self.path}: cannot create the run directory here") from None
        except OSError as e:
            raise storage_error(self.path, e, "no run was started") or ConfigError(
                f"{self.path}: cannot create the run directory ({e})"
            ) from None
        return not existed

    def _undo_open(self, created_dir: bool) -> None:
        """Remove what opening wrote (the directory was empty: all of it is ours)."""
        self._closed = True
        for table in self._tables.values():
            table.abandon()
        for name in ROW_TYPES:
            stream_path(self.path, name).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            (self.path / TABLES_DIR).rmdir()
        (self.path / MANIFEST).unlink(missing_ok=True)
        (self.path / (MANIFEST + ".tmp")).unlink(missing_ok=True)
        self._release_lock()
        if created_dir:
            with contextlib.suppress(OSError):
                self.path.rmdir()

    def _take_lock(self) -> int:
        fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd

    def _release_lock(self) -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
        (self.path / LOCK_FILE).unlink(missing_ok=True)

    def _flush_loop(self) -> None:
        # Poll often (cheap) so a burst is written once it fills a batch, bounding memory;
        # write every table at least every flush interval so a crash loses little.
        while not self._stop.wait(FLUSH_POLL_S):
            if self._error is not None:  # stopped writing: bound memory until close()
                self.rows_lost += sum(t.discard() for t in self._tables.values())
                continue
            try:
                for table in self._tables.values():
                    if (
                        table.pending() >= self._batch_rows
                        or table.seconds_since_write() >= self._flush_interval_s
                    ):
                        table.flush()
            except Exception as e:  # surfaced by flush()/close() in the recording thread
                self._fail(e)

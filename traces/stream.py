"""Read an Arrow IPC stream that may end in an incomplete message (a crashed writer),
checking each batch: its CRC-32 (written beside it as the message's custom metadata) and
Arrow's full validation (offsets, UTF-8), so damaged bytes are found, never read as values.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from ..errors import RunFormatError

CRC_KEY = b"perfdiag.crc32"  # of the batch's serialized IPC message
# In the stream's schema: every batch has a checksum (a batch without one is damaged).
CHECKSUMS_KEY, CHECKSUMS = b"perfdiag.checksums", b"crc32"
SCHEMA_CRC_KEY = b"perfdiag.schema_crc32"  # the schema message is checked too


def batch_checksum(batch: pa.RecordBatch) -> bytes:
    """What the writer stores beside a batch, and the reader recomputes."""
    return str(zlib.crc32(batch.serialize())).encode()


@dataclass
class StreamContents:
    table: pa.Table
    truncated: bool  # an incomplete last message was ignored
    damaged: str | None = None  # which batch failed its check (the batches before it kept)


def iter_stream(
    path: Path, schema: pa.Schema, *, tolerate_truncation: bool, state: dict | None = None
) -> Iterator[pa.RecordBatch]:
    """Yield the complete record batches of `path`.

    With `tolerate_truncation`, a stream cut short (empty file, a partial schema or batch
    message) ends quietly and `state["truncated"]` is set, and a damaged batch ends it
    with `state["damaged"]` saying which; otherwise either is an error.
    """
    state = {} if state is None else state
    state["truncated"] = False
    state["damaged"] = None
    try:
        # Zero-copy: the mapping stays alive as long as the batches it backs.
        source = pa.memory_map(str(path), "r")
    except OSError as e:
        raise RunFormatError(f"{path}: unreadable ({e})") from None
    if source.size() == 0:
        # Killed before the schema was written: nothing was recorded yet.
        state["truncated"] = True
        if not tolerate_truncation:
            raise RunFormatError(f"{path}: empty table file")
        return
    try:
        reader = ipc.open_stream(source)
        metadata = reader.schema.metadata or {}
        schema_ok = _schema_intact(reader.schema, metadata)
    except (pa.ArrowException, OSError, UnicodeDecodeError) as e:
        if tolerate_truncation and source.size() < 1024:
            state["truncated"] = True
            return  # the schema message itself was cut short
        state["damaged"] = "its schema message is unreadable"
        if tolerate_truncation:
            return
        raise RunFormatError(f"{path}: not an Arrow stream ({first_line(e)})") from None
    if not schema_ok:
        state["damaged"] = "its schema message is damaged (checksum mismatch)"
        if tolerate_truncation:
            return
        raise RunFormatError(f"{path}: {state['damaged']}")
    checksummed = metadata.get(CHECKSUMS_KEY) == CHECKSUMS
    index = 0
    while True:
        try:
            batch, metadata = reader.read_next_batch_with_custom_metadata()
        except StopIteration:
            return
        except (pa.ArrowException, OSError, UnicodeDecodeError) as e:
            state["truncated"] = True
            if tolerate_truncation:
                return
            raise RunFormatError(f"{path}: truncated or corrupt ({e})") from None
        problem = _check(batch, metadata, checksummed)
        if problem is not None:
            state["damaged"] = f"batch {index} {problem}"
            if tolerate_truncation:
                return
            raise RunFormatError(f"{path}: batch {index} {problem}")
        index += 1
        yield batch


def schema_checksum(schema: pa.Schema) -> bytes:
    """Of the schema without its metadata: a flipped type or name changes it."""
    return str(zlib.crc32(schema.remove_metadata().serialize())).encode()


def _schema_intact(schema: pa.Schema, metadata) -> bool:
    expected = metadata.get(SCHEMA_CRC_KEY)
    if metadata.get(CHECKSUMS_KEY) != CHECKSUMS:
        return True  # written before checksums: the batches' validation is all there is
    return expected is not None and schema_checksum(schema) == expected


def first_line(e: BaseException) -> str:
    """An exception's message in one line (Arrow's run to several)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _check(batch: pa.RecordBatch, metadata, checksummed: bool) -> str | None:
    """Why `batch` cannot be trusted, or None. Streams written before checksums (no
    schema marker) are checked by Arrow's validation alone."""
    expected = None if metadata is None else metadata.get(CRC_KEY)
    if expected is None and checksummed:
        return "is damaged (its checksum is missing)"
    if expected is not None and batch_checksum(batch) != expected:
        return "is damaged (checksum mismatch)"
    try:
        batch.validate(full=True)
    except (pa.ArrowException, ValueError) as e:
        return f"is damaged ({str(e).splitlines()[0]})"
    return None


def read_stream(path: Path, schema: pa.Schema, *, tolerate_truncation: bool) -> StreamContents:
    state: dict = {}
    batches = list(iter_stream(path, schema, tolerate_truncation=tolerate_truncation, state=state))
    file_schema = batches[0].schema if batches else schema
    table = pa.Table.from_batches(batches, schema=file_schema)
    return StreamContents(table, state["truncated"], state["damaged"])

"""Read an Arrow IPC stream that may end in an incomplete message (a crashed writer)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from ..errors import RunFormatError


@dataclass
class StreamContents:
    table: pa.Table
    truncated: bool  # an incomplete last message was ignored


def iter_stream(
    path: Path, schema: pa.Schema, *, tolerate_truncation: bool, state: dict | None = None
) -> Iterator[pa.RecordBatch]:
    """Yield the complete record batches of `path`.

    With `tolerate_truncation`, a stream cut short (empty file, a partial schema or batch
    message) ends quietly and `state["truncated"]` is set; otherwise it is an error.
    """
    state = {} if state is None else state
    state["truncated"] = False
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
    except (pa.ArrowInvalid, OSError) as e:
        state["truncated"] = True
        if tolerate_truncation and source.size() < 1024:
            return  # the schema message itself was cut short
        raise RunFormatError(f"{path}: not an Arrow stream ({e})") from None
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            return
        except (pa.ArrowInvalid, OSError) as e:
            state["truncated"] = True
            if tolerate_truncation:
                return
            raise RunFormatError(f"{path}: truncated or corrupt ({e})") from None
        yield batch


def read_stream(path: Path, schema: pa.Schema, *, tolerate_truncation: bool) -> StreamContents:
    state: dict = {}
    batches = list(iter_stream(path, schema, tolerate_truncation=tolerate_truncation, state=state))
    file_schema = batches[0].schema if batches else schema
    return StreamContents(pa.Table.from_batches(batches, schema=file_schema), state["truncated"])

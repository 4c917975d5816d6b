"""Write a results file whole or not at all: into `NAME.tmp` beside it, flushed to the
disk, then renamed over NAME. A failed write removes the temporary file and leaves any
earlier NAME as it was; a full or read-only disk is one line (StorageFullError), any
other OSError is raised as it is (callers that tolerate a read-only run catch it).

Bytes go through `os.write`, one call per chunk, so tests can make the disk "full"
without mounting anything.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from .storage_errors import storage_error

CHUNK = 1 << 20


def write_atomic(path: str | os.PathLike, data: str | bytes | Callable[[BinaryIO], None]) -> Path:
    """Write `data` (text as UTF-8, bytes, or a function that writes into a binary
    file, such as a figure's savefig) to `path` atomically; returns the path."""
    path = Path(path)
    if callable(data):
        buffer = io.BytesIO()
        data(buffer)
        data = buffer.getvalue()
    elif isinstance(data, str):
        data = data.encode("utf-8")
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view[:CHUNK]) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise storage_error(path, e, "nothing was written") or e from None
    return path

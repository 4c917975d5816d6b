"""Opening a trace that may be gzipped, and the errors its data can raise.

Inflating is ~10 % of a large trace's import; ISA-L's inflate (the `isal` package, a
drop-in for the gzip module) does it in 60 % of zlib's time (0.08 against 0.135 s on a
412k-event trace here). `isal` is a dependency; its errors are not zlib's.
"""

from __future__ import annotations

import zlib
from pathlib import Path

from isal import igzip
from isal.isal_zlib import error as IsalError

DATA_ERRORS = (OSError, EOFError, zlib.error, IsalError)  # corrupt or truncated data

GZIP_MAGIC = b"\x1f\x8b"


def is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def open_trace(path: Path, mode: str = "rt", *, gz: bool | None = None, **kwargs):
    """The file, inflated when it is a gzip (`gz`: known already, else read from its magic)."""
    if gz is None:
        gz = is_gzip(path)
    if gz:
        return igzip.open(path, mode, **kwargs)
    return open(path, mode, **kwargs)

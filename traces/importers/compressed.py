"""Opening a trace that may be gzipped, and the errors its data can raise.

Inflating is ~10 % of a large trace's import; ISA-L's inflate (the `isal` package, a
drop-in for the gzip module) does it in 60 % of zlib's time (0.08 against 0.135 s on a
412k-event trace here). The stdlib's gzip when it is not installed.
"""

from __future__ import annotations

import zlib
from pathlib import Path

try:
    from isal import igzip as _gzip
    from isal.isal_zlib import error as _isal_error

    DATA_ERRORS: tuple[type[BaseException], ...] = (OSError, EOFError, zlib.error, _isal_error)
except ImportError:  # pragma: no cover - isal is a dependency; a platform without its wheel
    import gzip as _gzip

    DATA_ERRORS = (OSError, EOFError, zlib.error)

GZIP_MAGIC = b"\x1f\x8b"


def is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def open_trace(path: Path, mode: str = "rt", *, gz: bool | None = None, **kwargs):
    """The file, inflated when it is a gzip (`gz`: known already, else read from its magic)."""
    if gz is None:
        gz = is_gzip(path)
    if gz:
        return _gzip.open(path, mode, **kwargs)
    return open(path, mode, **kwargs)

"""A full disk, an exhausted quota or a read-only filesystem is the user's machine, not a
bug in perfdiag: one line that names the path and says which, exit code 1.

pyarrow raises OSError without an errno and keeps the OS's words in its text, so both
are looked at.
"""

from __future__ import annotations

import errno
import os

from ..errors import PerfdiagError

_KINDS = {errno.ENOSPC: "disk full", errno.EDQUOT: "disk full (quota)", errno.EROFS: "read-only"}
_WORDS = {  # pyarrow's text for the same errors
    os.strerror(errno.ENOSPC): "disk full",
    os.strerror(errno.EDQUOT): "disk full (quota)",
    os.strerror(errno.EROFS): "read-only",
}


class StorageFullError(PerfdiagError):
    """Writing failed because the disk is full or read-only."""


def storage_kind(e: BaseException) -> str | None:
    """`disk full`, `disk full (quota)` or `read-only` when `e` says so, else None."""
    code = getattr(e, "errno", None)
    if code in _KINDS:
        return _KINDS[code]
    if isinstance(e, OSError):
        text = str(e)
        for words, kind in _WORDS.items():
            if words in text:
                return kind
    return None


def storage_error(path, e: BaseException, what: str = "") -> StorageFullError | None:
    """The one-line error for a full or read-only disk (None for any other failure).
    `what` says what was lost, e.g. "nothing was written"."""
    kind = storage_kind(e)
    if kind is None:
        return None
    where = path if path is not None else getattr(e, "filename", None)
    tail = f": {what}" if what else ""
    head = f"{where}: " if where is not None else ""
    return StorageFullError(f"{head}cannot write: {kind}{tail}")

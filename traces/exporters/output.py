"""Where an export goes, written so that a failure never leaves half a file behind.

A file is written beside its target under a temporary name and renamed into place when
complete; a directory (TensorBoard's log dir) is built the same way. Any OS error becomes
one line naming the path.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from ...errors import PerfdiagError
from ..storage_errors import storage_error

EXPORTS_DIR = "exports"


class ExportError(PerfdiagError):
    """The export could not be made (bad input, an unwritable destination)."""


def default_path(run_path: Path, run_id: str, suffix: str) -> Path:
    return Path(run_path) / EXPORTS_DIR / f"{run_id}{suffix}"


@contextlib.contextmanager
def atomic_file(target: Path, mode: str = "wb") -> Iterator:
    """Open a temporary file beside `target`; rename it onto `target` on success."""
    target = Path(target)
    if target.is_dir():
        raise ExportError(f"cannot write {target}: it is a directory")
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        f = open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"}))  # noqa: SIM115
    except OSError as e:
        raise _write_error(target, e) from None
    try:
        with f:
            yield f
        os.replace(tmp, target)
    except OSError as e:
        _remove(tmp)
        raise _write_error(target, e) from None
    except BaseException:
        _remove(tmp)
        raise


@contextlib.contextmanager
def atomic_dir(target: Path) -> Iterator[Path]:
    """A temporary directory beside `target`, renamed onto it on success (an existing
    `target` is replaced)."""
    target = Path(target)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        if target.exists() and not target.is_dir():
            raise ExportError(f"cannot write {target}: it exists and is not a directory")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    except OSError as e:
        raise _write_error(target, e) from None
    try:
        yield tmp
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _write_error(target, e) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def _write_error(target: Path, e: OSError) -> PerfdiagError:
    """One line naming the path; a full or read-only disk says so in those words."""
    return storage_error(target, e, "nothing was written") or ExportError(
        f"cannot write {target}: {e.strerror or e}"
    )

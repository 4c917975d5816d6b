"""Checks of options shared by several commands, each a one-line ConfigError (exit 1)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError


def check_top(top: int, flag: str = "--top") -> None:
    if top < 0:  # pandas' head(-1) would quietly mean "all but the last"
        raise ConfigError(f"{flag} is a number of rows >= 0, got {top}")


def check_ceilings_dir(path: Path | None) -> None:
    """A --ceilings-dir given must exist: a typo would otherwise judge the roofline
    against the datasheet without a word."""
    if path is None:
        return
    try:
        if not path.exists():
            raise ConfigError(f"--ceilings-dir {path}: no such directory (`perfdiag calibrate "
                              "--ceilings-dir DIR` writes one)")  # fmt: skip
        if not path.is_dir():
            raise ConfigError(f"--ceilings-dir {path}: not a directory")
    except OSError as e:  # a name too long for the filesystem
        raise ConfigError(f"--ceilings-dir {path}: not a usable directory ({e.strerror})") from None

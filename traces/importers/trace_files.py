"""The trace files an import names: a directory stands for every *.json / *.json.gz in it.
Kept apart from the importers so the CLI resolves its arguments without loading them."""

from __future__ import annotations

from pathlib import Path

from ...errors import ConfigError

TRACE_SUFFIXES = (".json", ".json.gz")


def trace_files(args: list[Path]) -> list[Path]:
    """The files named, each directory replaced by its trace files in name order."""
    files: list[Path] = []
    for a in args:
        if a.is_dir():
            found = sorted(
                p for p in a.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES)
            )
            if not found:
                raise ConfigError(f"{a}: no *.json or *.json.gz trace files in the directory")
            files += found
        else:
            files.append(a)
    return files

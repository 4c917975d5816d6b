"""The run manifest: identity, provenance, clock origin and status of a run directory.

It is small JSON, always replaced atomically (write, fsync, rename), so a reader sees
either the old manifest or the new one, never half of one.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from ..errors import RunFormatError, RunNotFoundError, SchemaVersionError
from . import manifest_model
from .schema import SCHEMA_VERSION

MANIFEST = "manifest.json"

RUNNING, COMPLETE, INTERRUPTED, CRASHED = "running", "complete", "interrupted", "crashed"
STATUSES = (RUNNING, COMPLETE, INTERRUPTED, CRASHED)
# Statuses a writer leaves behind on purpose; "crashed" is what a reader concludes when a
# run still says "running" but no writer holds it.
FINAL_STATUSES = (COMPLETE, INTERRUPTED)


@dataclasses.dataclass(frozen=True)
class Manifest:
    schema_version: int
    perfdiag_version: str
    run_id: str
    created_at: str  # ISO 8601, UTC
    status: str
    command: list[str]
    config: dict[str, Any]
    environment: dict[str, Any]
    clock: dict[str, int | str]  # see environment.clock_origin
    source: str = "perfdiag"  # what produced the run: perfdiag, or an importer's name
    ended_at: str | None = None
    writer: dict[str, Any] = dataclasses.field(default_factory=dict)
    tables: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)  # keys we don't know

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data.update(data.pop("extra"))
        return json.dumps(data, indent=2, sort_keys=False, default=str) + "\n"

    def wall_ns(self, monotonic_ns: int) -> int:
        """Map a timestamp on the run's monotonic clock to Unix wall-clock ns."""
        return monotonic_ns - int(self.clock["monotonic_ns"]) + int(self.clock["wall_ns"])


_FIELDS = {f.name: f for f in dataclasses.fields(Manifest)}


def parse_manifest(text: str, where: str = MANIFEST) -> Manifest:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise RunFormatError(f"{where} is not valid JSON ({e.msg} at line {e.lineno})") from None
    except RecursionError:
        raise RunFormatError(f"{where} is nested too deeply to be a manifest") from None
    if not isinstance(data, dict):
        raise RunFormatError(f"{where} must hold a JSON object")
    version = data.get("schema_version")
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{where} has schema version {version} (written by perfdiag "
            f"{data.get('perfdiag_version', '?')}); this perfdiag reads up to version "
            f"{SCHEMA_VERSION}: upgrade perfdiag to read it"
        )
    problem = manifest_model.validate(data)
    if problem is not None:
        raise RunFormatError(f"{where}: {problem}")
    known = {k: v for k, v in data.items() if k in _FIELDS and k != "extra"}
    extra = {k: v for k, v in data.items() if k not in _FIELDS}
    return Manifest(**known, extra=extra)


def read_manifest(run_dir: Path) -> Manifest:
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise RunNotFoundError(f"{run_dir}: no such directory")
    if not run_dir.is_dir():
        raise RunNotFoundError(f"{run_dir}: not a directory (a run is a directory)")
    path = run_dir / MANIFEST
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise RunNotFoundError(f"{run_dir}: not a run (no {MANIFEST})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise RunFormatError(f"{path}: unreadable ({e})") from None
    return parse_manifest(text, where=str(path))


def write_manifest(run_dir: Path, manifest: Manifest) -> None:
    """Replace the manifest atomically and durably."""
    path = Path(run_dir) / MANIFEST
    tmp = path.with_name(MANIFEST + ".tmp")
    try:
        with open(tmp, "w") as f:
            f.write(manifest.to_json())
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        tmp.unlink(missing_ok=True)  # the old manifest stays whole
        raise
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

"""The manifest's schema as types: what every reader of a manifest relies on.

Decoding a manifest through `ManifestModel` (msgspec) checks each field the code reads,
down to the nested dictionaries it looks into, so a malformed field is one line naming
its path (`$.clock.wall_ns`) instead of a TypeError wherever it is first used. Unknown
keys are allowed at every level (newer writers, importers' extras) and kept: the model
validates, the manifest's own dictionaries stay as written.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

INT64_MAX = 2**63 - 1
Count = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
Nanoseconds = Annotated[int, msgspec.Meta(ge=-INT64_MAX, le=INT64_MAX)]
Text = str | None


class Open(msgspec.Struct, kw_only=True):
    """A mapping whose listed keys have types; other keys pass."""


class Clock(Open, kw_only=True):
    clock: str = "monotonic"
    monotonic_ns: Nanoseconds
    wall_ns: Nanoseconds
    uncertainty_ns: Count | None = None
    resolution_ns: Count | None = None


class Gpu(Open, kw_only=True):
    name: Text = None


class Environment(Open, kw_only=True):
    perfdiag: Text = None
    python: Text = None
    implementation: Text = None
    platform: Text = None
    hostname: Text = None
    cpu_model: Text = None
    cpu_count: Count | None = None
    git_revision: Text = None
    packages: dict[str, Text] = {}
    gpus: list[Gpu] = []
    recorded_by: Text = None


class TableInfo(Open, kw_only=True):
    format: Literal["parquet", "arrow-stream"] = "arrow-stream"
    rows: Count | None = None
    compact_error: Text = None


class RunOptionsModel(Open, kw_only=True):
    engine: dict[str, Any] = {}
    workload: dict[str, Any] = {}
    probes: dict[str, Any] = {}


class EngineConfigModel(Open, kw_only=True):
    model: dict[str, Any] = {}
    scheduler: dict[str, Any] = {}
    cache: dict[str, Any] = {}
    dtype: Text = None


class Config(Open, kw_only=True):
    run_options: RunOptionsModel | None = None
    engine_config: EngineConfigModel | None = None
    num_kv_blocks: Count | None = None
    faults: dict[str, Any] = {}
    target: dict[str, Any] = {}
    importer: Text = None


class ProfilerWindowInfo(Open, kw_only=True):
    requested_steps: tuple[Count, Count] | None = None
    captured_steps: tuple[Count, Count] | None = None
    spans: Count | None = None
    clock_sync_uncertainty_ns: Count | None = None


class ManifestModel(Open, kw_only=True):
    schema_version: Annotated[int, msgspec.Meta(ge=1)]
    perfdiag_version: str
    run_id: str
    created_at: str
    status: Literal["running", "complete", "interrupted", "crashed"]
    command: list[str]
    config: Config
    environment: Environment
    clock: Clock
    source: str = "perfdiag"
    ended_at: Text = None
    writer: dict[str, Any] = {}
    tables: dict[str, TableInfo] = {}
    profiler_window: ProfilerWindowInfo | None = None  # written by `perfdiag run`


def validate(data: dict) -> str | None:
    """What is wrong with a decoded manifest, in one line; None when it fits."""
    try:
        msgspec.convert(data, ManifestModel, strict=True)
    except msgspec.ValidationError as e:
        return str(e).replace("`", "")
    return None

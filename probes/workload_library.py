"""Find a workload by built-in name or YAML file, and apply command-line overrides."""

from __future__ import annotations

import dataclasses
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError
from ..yaml_file import read_yaml_mapping
from .workload import WorkloadSpec, spec_from_mapping

DEFAULT_WORKLOAD = "chat"


@cache
def builtins() -> dict[str, dict[str, Any]]:
    text = resources.files(__package__).joinpath("workloads.yaml").read_text()
    return yaml.safe_load(text)


def describe_builtins() -> dict[str, str]:
    return {name: data.get("description", "") for name, data in builtins().items()}


def load_workload(name_or_path: str) -> WorkloadSpec:
    """A built-in name (`chat`, `burst`, …) or the path of a YAML workload file."""
    if name_or_path in builtins():
        data = dict(builtins()[name_or_path])
        data.pop("description", None)
        return spec_from_mapping({"name": name_or_path, **data})
    path = Path(name_or_path)
    if not path.suffix and not path.exists():
        raise ConfigError(
            f"unknown workload {name_or_path!r}; built-ins: {', '.join(builtins())}, "
            "or give a YAML file"
        )
    data = read_yaml_mapping(path, "the workload file")
    data.pop("description", None)
    data.setdefault("name", path.stem)
    try:
        return spec_from_mapping(data)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def override(spec: WorkloadSpec, **changes: Any) -> WorkloadSpec:
    """Apply flags given on the command line; None means "not given". Keys are the spec's
    fields plus the arrival's (`rate`, `concurrency`, `process`, `burstiness`, `mode`)."""
    changes = {k: v for k, v in changes.items() if v is not None}
    if "fit_to_context" not in changes:  # a length given by flag is the user's: never shortened
        changes["fit_to_context"] = tuple(k for k in spec.fit_to_context if k not in changes)
    if "output_len" in changes and "stop_at_eos" not in changes:
        changes["stop_at_eos"] = False  # a given output length is forced, EOS or not
    if "requests" in changes and "warmup" not in changes:
        # Fewer requests than a built-in's warm-up: keep at least one measured request.
        changes["warmup"] = max(0, min(spec.warmup, changes["requests"] - 1))
    arrival_keys = {f.name for f in dataclasses.fields(spec.arrival)}
    arrival = {k: changes.pop(k) for k in list(changes) if k in arrival_keys}
    if arrival:
        # A rate alone turns a closed loop into an open one (its concurrency becomes the cap
        # only if given too); a concurrency alone on a closed loop changes its clients.
        merged = dataclasses.asdict(spec.arrival) | arrival
        if "rate" in arrival and "mode" not in arrival:
            merged["mode"] = "open"
            if spec.arrival.mode == "closed" and "concurrency" not in arrival:
                merged["concurrency"] = None
        if "mode" in arrival and arrival["mode"] == "closed":
            merged["rate"] = None
        changes["arrival"] = type(spec.arrival)(**merged)
    try:
        return dataclasses.replace(spec, **changes)
    except TypeError as e:
        raise ConfigError(f"bad workload option: {e}") from None

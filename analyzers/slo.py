"""Service-level objectives: per-request targets a request must all meet to count as
good. Given on the command line (`ttft=0.5,tpot=50ms`) or in a YAML file
(`ttft: 0.5`, `tpot: 50ms`, …); numbers are seconds, or carry `s`/`ms`/`us`.

- ttft: time to first token;
- tpot: (E2E − TTFT)/(N − 1); a request with one output token has none and meets it;
- itl:  every gap between deliveries (the longest stall the user saw);
- e2e:  send → done.
A request is good only if it ended normally (stop or length) *and* meets every target:
errors, rejections and timeouts are misses. Client cancellations are neither: the
client chose to stop them, so they leave the attainment's denominator.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import ConfigError
from ..yaml_file import read_yaml_mapping

TARGETS = ("ttft", "tpot", "itl", "e2e")
_PER_SECOND = {"": 1.0, "s": 1.0, "ms": 1e3, "us": 1e6, "µs": 1e6}  # divide: 200us is 0.0002
_VALUE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(s|ms|us|µs)?\s*$")


@dataclass(frozen=True)
class Slo:
    ttft_s: float | None = None
    tpot_s: float | None = None
    itl_s: float | None = None
    e2e_s: float | None = None

    def __post_init__(self) -> None:
        values = [getattr(self, f"{t}_s") for t in TARGETS]
        if all(v is None for v in values):
            raise ConfigError("an SLO needs at least one target: ttft, tpot, itl or e2e")
        for name, v in zip(TARGETS, values, strict=True):
            if v is not None and not (v > 0 and np.isfinite(v)):
                raise ConfigError(f"SLO target {name} must be a positive time, got {v}")


def parse_slo(text: str) -> Slo:
    """`ttft=0.5,tpot=50ms` → Slo."""
    targets = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep:
            raise ConfigError(f"bad SLO {part!r}: use NAME=VALUE, e.g. ttft=0.5,tpot=50ms")
        targets[key.strip()] = value
    return _from_mapping(targets, "--slo")


def load_slo_file(path: str | Path) -> Slo:
    data = read_yaml_mapping(path, "the SLO file", "a mapping, e.g. `ttft: 0.5`")
    return _from_mapping(data, str(path))


def _from_mapping(data: dict, where: str) -> Slo:
    values = {}
    for key, raw in data.items():
        name = str(key).strip().lower().removesuffix("_s")
        if name not in TARGETS:
            raise ConfigError(f"{where}: unknown SLO target {key!r}; known: {', '.join(TARGETS)}")
        values[f"{name}_s"] = _seconds(raw, where, name)
    return Slo(**values)


def _seconds(raw, where: str, name: str) -> float:
    if isinstance(raw, bool):
        raise ConfigError(f"{where}: {name} must be a time, got {raw!r}")
    if isinstance(raw, int | float):
        return float(raw)
    match = _VALUE.match(str(raw))
    if not match:
        raise ConfigError(f"{where}: {name}={raw!r} is not a time (e.g. 0.5, 500ms)")
    return float(match.group(1)) / _PER_SECOND[match.group(2) or ""]


def judge(slo: Slo, per_request: pd.DataFrame) -> pd.DataFrame:
    """Per request: whether it met each target set, and whether it is good.

    `per_request` needs outcome, ttft_s, tpot_s, max_itl_s and e2e_s (NaN: not measured;
    an unmeasured TPOT or ITL passes, an unmeasured TTFT or E2E fails)."""
    ok = (per_request["outcome"] == "ok").to_numpy()
    out = pd.DataFrame(index=per_request.index)
    good = ok.copy()
    for name, column, missing_passes in (
        ("ttft", "ttft_s", False),
        ("tpot", "tpot_s", True),
        ("itl", "max_itl_s", True),
        ("e2e", "e2e_s", False),
    ):
        target = getattr(slo, f"{name}_s")
        if target is None:
            continue
        v = per_request[column].to_numpy(dtype=np.float64)
        met = np.where(np.isnan(v), missing_passes, v <= target)
        out[f"meets_{name}"] = met
        good &= met
    out["good"] = good
    return out

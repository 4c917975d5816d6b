"""What `perfdiag sweep` is asked to do, as data: a base run, the axes to vary, repeats.

Every key is a `perfdiag run` flag (`chunk-size`, `rate`, `max-seqs`, `preset`, …), so a
point of a sweep is exactly the run those flags would make: `perfdiag run --like` on any
point's run repeats it. Values are parsed with the flag's own type. An axis is a list
(`64,128,256`) or a range: `LO:HI:xF` multiplies by F (`1:16:x2` is 1,2,4,8,16),
`LO:HI:+S` adds S. `chunk-size` also takes `off` (chunked prefill off).

From the command line (`--set K=V`, `--vary K=LIST`, several of each: the grid is their
product) or a YAML file:

    base: {preset: small, requests: 40}
    vary: {rate: [1, 2, 4, 8]}
    repeats: 2
    slo: {ttft: 0.5, tpot: 50ms}
    target: http://127.0.0.1:8000        # optional: an OpenAI-compatible server
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..probes import run_flags
from ..yaml_file import read_yaml_mapping

# Run flags a sweep sets itself, or that make no sense per point.
NOT_SWEEPABLE = ("out_dir", "quiet", "target", "api_key")
LOAD_FLAGS = ("rate", "concurrency")  # axes that change the offered load, not the engine
MAX_POINTS = 10_000
MAX_REPEATS = 100
_OFF = ("off", "none")


@dataclass(frozen=True)
class Axis:
    flag: str  # the run parameter's name: chunk_size, rate, …
    values: tuple[Any, ...]

    @property
    def label(self) -> str:
        return self.flag.replace("_", "-")

    @property
    def is_load(self) -> bool:
        return self.flag in LOAD_FLAGS


@dataclass(frozen=True)
class Point:
    index: int
    values: tuple[tuple[str, Any], ...]  # (flag, value) per axis, in axis order

    @property
    def label(self) -> str:
        return " ".join(f"{k.replace('_', '-')}={show(v)}" for k, v in self.values)

    @property
    def name(self) -> str:
        """A directory name: p003-chunk-size=64-rate=2."""
        parts = [f"{k.replace('_', '-')}={show(v)}" for k, v in self.values]
        return re.sub(r"[^A-Za-z0-9=.+_-]", "_", "-".join([f"p{self.index:03d}", *parts]))

    def run_name(self, repeat: int) -> str:
        return f"{self.name}-r{repeat}"


@dataclass(frozen=True)
class SweepSpec:
    base: dict[str, Any] = field(default_factory=dict)  # run flags every point shares
    axes: tuple[Axis, ...] = ()
    repeats: int = 1
    slo: str | None = None  # `ttft=0.5,tpot=50ms`: goodput and attainment per point
    target: str | None = None  # an OpenAI-compatible server instead of engine_ref
    api_key: str | None = None

    def __post_init__(self) -> None:
        if not self.axes:
            raise ConfigError("a sweep needs at least one axis: --vary FLAG=V1,V2,…")
        flags = [a.flag for a in self.axes]
        if len(set(flags)) != len(flags):
            raise ConfigError(f"an axis is given twice: {', '.join(flags)}")
        if shared := sorted(set(flags) & set(self.base)):
            raise ConfigError(f"{shared[0]} is both set and varied")
        if not 1 <= self.repeats <= MAX_REPEATS:
            raise ConfigError(f"repeats must be within [1, {MAX_REPEATS}], got {self.repeats}")
        if len(self.points()) > MAX_POINTS:
            raise ConfigError(f"the grid has more than {MAX_POINTS:,} points")
        check_target_flags([*self.base, *flags], self.target)

    def points(self) -> list[Point]:
        grid = itertools.product(*(a.values for a in self.axes))
        names = [a.flag for a in self.axes]
        return [Point(i, tuple(zip(names, vs, strict=True))) for i, vs in enumerate(grid)]

    def flags_of(self, point: Point) -> dict[str, Any]:
        """The `perfdiag run` flags of one point."""
        flags = dict(self.base)
        for k, v in point.values:
            flags = with_flag(flags, k, v)
        if self.target:
            flags["target"], flags["api_key"] = self.target, self.api_key
        return flags

    def to_dict(self) -> dict[str, Any]:
        return {
            "base": {k: show(v) for k, v in self.base.items()},
            "vary": {a.flag: [show(v) for v in a.values] for a in self.axes},
            "repeats": self.repeats,
            "slo": self.slo,
            "target": self.target,
        }


def with_flag(flags: dict[str, Any], flag: str, value: Any) -> dict[str, Any]:
    """`flags` with one more run flag set (a chunk size of `off`: chunked prefill off)."""
    if flag == "chunk_size" and value is None:
        return {**flags, "no_chunked_prefill": True}
    return {**flags, flag: value}


def show(value: Any) -> str:
    """A flag's value as the command line writes it (None, or NaN in a table: `off`)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "off"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def flag_types() -> dict[str, type]:
    """Every `perfdiag run` flag a sweep may set, with its value's type."""
    return {k: v for k, v in run_flags.flag_types().items() if k not in NOT_SWEEPABLE}


def engine_flags() -> frozenset[str]:
    """The run flags that configure engine_ref (its help panel): a server's own."""
    return run_flags.engine_flags()


def check_target_flags(flags, target: str | None) -> None:
    """Engine knobs mean nothing to an HTTP target: refuse them rather than ignore them."""
    if target is None:
        return
    knobs = sorted(set(flags) & engine_flags())
    if knobs:
        raise ConfigError(f"{knobs[0].replace('_', '-')} configures engine_ref; a --target "
                          "server's settings are its own (set them when starting it)")  # fmt: skip


def flag_name(key: str) -> str:
    name = str(key).strip().lstrip("-").replace("-", "_")
    known = flag_types()
    if name not in known:
        if name in NOT_SWEEPABLE:
            raise ConfigError(f"{key!r} is set by the sweep itself, not per point")
        near = ", ".join(k.replace("_", "-") for k in sorted(known))
        raise ConfigError(f"unknown run flag {key!r}; a sweep takes these: {near}")
    return name


def parse_value(flag: str, text: Any) -> Any:
    """One value of a run flag, from the command line's text or a YAML scalar."""
    kind = flag_types()[flag]
    if isinstance(text, str):
        raw = text.strip()
    elif isinstance(text, bool):
        raw = "on" if text else "off"
    elif text is None:
        raw = "off"
    else:
        raw = str(text)
    if flag == "chunk_size" and raw.lower() in _OFF:
        return None  # chunked prefill off
    try:
        if kind is bool:
            low = raw.lower()
            if low in ("on", "true", "yes", "1"):
                return True
            if low in ("off", "false", "no", "0"):
                return False
            raise ValueError
        if kind is int:
            value = float(raw)
            if not value.is_integer():
                raise ValueError
            return int(value)
        if kind is float:
            value = float(raw)
            if not math.isfinite(value):
                raise ValueError
            return value
        if kind is Path:
            return Path(raw)
        return raw
    except ValueError:
        want = {bool: "on or off", int: "a whole number", float: "a number"}.get(kind, "a value")
        raise ConfigError(f"{flag.replace('_', '-')}={raw!r}: not {want}") from None


def parse_values(flag: str, text: str) -> tuple[Any, ...]:
    """`64,128,256`, `1:16:x2` or `64:512:+64`."""
    text = text.strip()
    match = re.fullmatch(r"([^:]+):([^:]+):([x*+])([^:]+)", text)
    if match and flag_types()[flag] in (int, float):
        lo, hi, op, step = match.groups()
        return _range(flag, parse_value(flag, lo), parse_value(flag, hi), op, float(step))
    values = tuple(parse_value(flag, v) for v in text.split(",") if v.strip())
    if not values:
        raise ConfigError(f"{flag.replace('_', '-')}: no values")
    return values


def _range(flag: str, lo, hi, op: str, step: float) -> tuple[Any, ...]:
    name = flag.replace("_", "-")
    grows = step > 1 if op in "x*" else step > 0
    if lo is None or hi is None or not grows or hi < lo:
        raise ConfigError(f"{name}: a range is LO:HI:xF (F > 1) or LO:HI:+S (S > 0), LO <= HI")
    out, v = [], lo
    while v <= hi * (1 + 1e-9) and len(out) <= MAX_POINTS:
        out.append(v)
        v = v * step if op in "x*" else v + step
        if flag_types()[flag] is int:
            v = round(v) if round(v) > out[-1] else out[-1] + 1
    return tuple(out)


def parse_assignment(text: str, many: bool) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep:
        example = "rate=1,2,4" if many else "preset=tiny"
        raise ConfigError(f"bad {text!r}: use FLAG=VALUE{'S' if many else ''}, e.g. {example}")
    flag = flag_name(key)
    return flag, parse_values(flag, value) if many else parse_value(flag, value)


def from_command_line(
    sets: list[str], varies: list[str], repeats: int, slo: str | None, target: str | None,
    api_key: str | None,
) -> SweepSpec:  # fmt: skip
    base = dict(parse_assignment(s, many=False) for s in sets)
    axes = tuple(Axis(*parse_assignment(v, many=True)) for v in varies)
    return SweepSpec(base, axes, repeats, slo, target, api_key)


def from_file(path: Path, api_key: str | None = None) -> SweepSpec:
    data = read_yaml_mapping(path, "the sweep file", "a mapping with `vary:` (and `base:`)")
    unknown = set(data) - {"base", "vary", "repeats", "slo", "target"}
    if unknown:
        raise ConfigError(f"{path}: unknown key {sorted(unknown)[0]!r} "
                          "(known: base, vary, repeats, slo, target)")  # fmt: skip
    base_raw, vary_raw = data.get("base") or {}, data.get("vary") or {}
    if not isinstance(base_raw, dict) or not isinstance(vary_raw, dict):
        raise ConfigError(f"{path}: `base` and `vary` must be mappings of run flags")
    try:
        base = {flag_name(k): parse_value(flag_name(k), v) for k, v in base_raw.items()}
        axes = []
        for k, v in vary_raw.items():
            flag = flag_name(k)
            values = (
                tuple(parse_value(flag, x) for x in v)
                if isinstance(v, list)
                else parse_values(flag, str(v))
            )
            axes.append(Axis(flag, values))
        return SweepSpec(base, tuple(axes), _repeats(data.get("repeats", 1), path),
                         _slo_text(data.get("slo")), data.get("target"), api_key)  # fmt: skip
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def _repeats(value, path) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{path}: repeats must be a whole number, got {value!r}")
    return value


def _slo_text(value) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items())
    raise ConfigError(f"slo must be `ttft=0.5,tpot=50ms` or a mapping, got {value!r}")

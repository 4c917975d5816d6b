"""What a sweep shows, in words: the knee of each series, the limiting cause on either
side of it (from the points' own triage), and how the main metrics moved end to end
(a move is called real only when the ends' confidence intervals do not overlap)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from .causes import readable
from .knee import Knee, knee_metric, knee_of, label
from .spec import SweepSpec, show
from .table import separated

MOVES = ("ttft_p50_ms", "ttft_p99_ms", "itl_p99_ms", "tpot_p50_ms", "e2e_p50_s",
         "output_tok_s", "req_s", "attainment", "goodput_req_s")  # fmt: skip


@dataclass(frozen=True)
class Side:
    point: str  # the point's label
    cause: str  # check id, or "none"
    title: str
    agree: str  # repeats that agree, e.g. "2/2"


@dataclass(frozen=True)
class Move:
    metric: str
    first: float
    last: float
    real: bool  # the ends' intervals do not overlap


@dataclass(frozen=True)
class SeriesSummary:
    series: str  # the other axes' values ("" with one axis)
    axis: str
    metric: str
    knee: str | None  # the axis value at the knee
    shape: str
    before: Side | None
    at: Side | None
    after: Side | None
    moves: tuple[Move, ...]
    text: str


def summarise(
    spec: SweepSpec, table: pd.DataFrame, metric: str | None = None
) -> list[SeriesSummary]:
    axis = spec.axes[0]
    others = [a.flag for a in spec.axes[1:]]
    groups = table.groupby(others, sort=False, dropna=False) if others else [((), table)]
    out = []
    for key, series in groups:
        series = series[series["repeats"] > 0].reset_index(drop=True)
        if series.empty:
            continue
        key = key if isinstance(key, tuple) else (key,)
        name = " ".join(
            f"{f.replace('_', '-')}={show(v)}" for f, v in zip(others, key, strict=True)
        )
        chosen = metric or knee_metric(series, axis.is_load, spec.slo is not None)
        out.append(_series(series, axis.flag, name, chosen))
    return out


def series_name(flags: list[str], values: tuple) -> str:
    """`max-seqs=8 policy=fcfs`: the other axes' values that make one series."""
    return " ".join(f"{f.replace('_', '-')}={show(v)}" for f, v in zip(flags, values, strict=True))


def _series(series: pd.DataFrame, axis: str, name: str, metric: str) -> SeriesSummary:
    knee = knee_of(series, axis, metric)
    moves = tuple(_move(series, m) for m in MOVES if m in series and series[m].notna().any())
    where = f" ({name})" if name else ""
    flag = axis.replace("_", "-")
    if knee is None:
        text = (f"{label(metric)}{where}: no knee over {flag} "
                f"{show(series[axis].iloc[0])}…{show(series[axis].iloc[-1])}: "
                + _flat_or_few(series, metric))  # fmt: skip
        text += _moves_text(series, axis, moves)
        return SeriesSummary(name, axis, metric, None, "", None, None, None, moves, text)
    i = knee.index
    before = _side(series, axis, i - 1) if i > 0 else None
    at = _side(series, axis, i)
    after = _side(series, axis, i + 1) if i + 1 < len(series) else None
    value = show(series[axis].iloc[i])
    text = _knee_text(series, axis, knee, where, value, before, at, after)
    text += _moves_text(series, axis, moves)
    return SeriesSummary(name, axis, metric, value, knee.shape, before, at, after, moves, text)


def _knee_text(series, axis, knee: Knee, where, value, before, at, after) -> str:
    flag = axis.replace("_", "-")
    y = series[knee.metric].to_numpy("float64")
    i = knee.index
    parts = [f"{label(knee.metric)}{where} bends at {flag}={value} ({knee.shape}; "
             f"{_fmt(y[0])} at {show(series[axis].iloc[0])}, {_fmt(y[i])} at the knee, "
             f"{_fmt(y[-1])} at {show(series[axis].iloc[-1])})."]  # fmt: skip
    for word, side in (("Below", before), ("At", at), ("Above", after)):
        if side is not None:
            parts.append(f"{word} it ({side.point}): {_cause_text(side)}.")
    return " ".join(parts)


def _moves_text(series: pd.DataFrame, axis: str, moves: tuple[Move, ...]) -> str:
    """The trade-off end to end: what moved beyond noise, and what did not."""
    flag = axis.replace("_", "-")
    real = [m for m in moves if m.real]
    still = [label(m.metric) for m in moves if not m.real]
    ends = f"{flag}={show(series[axis].iloc[0])} to {show(series[axis].iloc[-1])}"
    parts = [f"{label(m.metric)} {_fmt(m.first)} → {_fmt(m.last)}" for m in real]
    text = f" From {ends}: " + ("; ".join(parts) if parts else "nothing moved beyond noise")
    if parts and still:
        text += f"; within noise: {', '.join(still)}"
    return text + "."


def _cause_text(side: Side) -> str:
    if side.cause in ("", "none"):
        return f"no warning or critical finding ({side.agree} repeats)"
    return f"{side.cause} — {side.title} ({side.agree} repeats)"


def _side(series: pd.DataFrame, axis: str, i: int) -> Side:
    r = series.iloc[i]
    return Side(
        point=f"{axis.replace('_', '-')}={show(r[axis])}",
        cause=str(r.get("cause", "") or "none"),
        title=str(r.get("cause_title", "") or ""),
        agree=str(r.get("cause_agree", "")),
    )


def _move(series: pd.DataFrame, metric: str) -> Move:
    first, last = series.iloc[0], series.iloc[-1]
    return Move(metric, float(first[metric]), float(last[metric]),
                separated(first, last, metric))  # fmt: skip


def _flat_or_few(series: pd.DataFrame, metric: str) -> str:
    if len(series) < 3:
        return "a knee needs at least three points"
    y = series[metric].to_numpy("float64")
    return f"it stays within noise ({_fmt(np.nanmin(y))}–{_fmt(np.nanmax(y))})"


def _fmt(v: float) -> str:
    if not np.isfinite(v):
        return "not measured"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def to_jsonable(summaries: list[SeriesSummary]) -> list[dict[str, Any]]:
    def clean(x):
        if isinstance(x, float) and not np.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [clean(v) for v in x]
        return x

    return [clean(asdict(s)) for s in summaries]


def markdown(spec: SweepSpec, table: pd.DataFrame, summaries: list[SeriesSummary],
             figures: list[str]) -> str:  # fmt: skip
    axes = ", ".join(f"{a.label} ∈ {{{', '.join(show(v) for v in a.values)}}}" for a in spec.axes)
    base = " ".join(f"--{k.replace('_', '-')} {show(v)}" for k, v in spec.base.items())
    lines = [f"# Sweep: {axes}", ""]
    head = f"Base: `perfdiag run {base}`" if base else "Base: `perfdiag run` defaults"
    head += f"; {spec.repeats} repeat(s) per point"
    head += (f"; SLO {spec.slo}" if spec.slo else "") + (
        f"; target {spec.target}" if spec.target else ""
    )
    lines += [head + ".", ""]
    lines += ["## What the sweep shows", ""]
    lines += [f"- {s.text}" for s in summaries] or ["- no point was measured"]
    lines += ["", "## Points (95 % confidence intervals)", "", *_table_md(spec, table), ""]
    for f in figures:
        lines += [f"![{f}]({f})", ""]
    return "\n".join(lines)


def _table_md(spec: SweepSpec, table: pd.DataFrame) -> list[str]:
    cols = [a.flag for a in spec.axes]
    metrics = ["ttft_p50_ms", "ttft_p99_ms", "itl_p99_ms", "tpot_p50_ms", "output_tok_s"]
    if spec.slo:
        metrics.append("attainment")
    head = [c.replace("_", "-") for c in cols] + [label(m) for m in metrics] + ["limiting cause"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for _, r in table.iterrows():
        cells = [show(r[c]) for c in cols]
        for m in metrics:
            lo, hi = r.get(f"{m}_lo"), r.get(f"{m}_hi")
            ci = f" [{_fmt(lo)}, {_fmt(hi)}]" if pd.notna(lo) and pd.notna(hi) else ""
            cells.append(f"{_fmt(r.get(m, np.nan))}{ci}")
        cause = readable(r.get("cause"), r.get("cause_title"))
        cells.append(f"{cause} ({r.get('cause_agree', '')})")
        lines.append("| " + " | ".join(cells) + " |")
    return lines

"""A sweep's figures (PNG, matplotlib's Agg backend, imported only when drawn):

- `latency.png`: TTFT, ITL, TPOT and E2E p50/p99 against the swept variable, with their
  95 % intervals; the knee marked;
- `throughput.png`: output tokens/s, requests/s and goodput against it (each repeat a
  dot, the line their mean), and with an SLO its attainment with 95 % intervals;
- `latency_throughput.png`: p99 TTFT and p50 TPOT against the throughput achieved, each
  point labelled with its value of the swept variable — the curve capacity planning reads.

With several axes, each value of the other axes is its own line.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .knee import label
from .spec import SweepSpec, show
from .summary import SeriesSummary

LATENCY_PANELS = (
    ("TTFT", "ttft_p50_ms", "ttft_p99_ms", "ms"),
    ("ITL (per chunk)", "itl_p50_ms", "itl_p99_ms", "ms"),
    ("TPOT", "tpot_p50_ms", "tpot_p99_ms", "ms"),
    ("E2E", "e2e_p50_s", "e2e_p99_s", "s"),
)


def draw_all(spec: SweepSpec, table: pd.DataFrame, summaries: list[SeriesSummary],
             out_dir: Path, runs: pd.DataFrame | None = None) -> list[str]:  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = table[table["repeats"] > 0]
    if table.empty:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    names = []
    for name, draw in (
        ("latency.png", _latency),
        ("throughput.png", _throughput),
        ("latency_throughput.png", _latency_throughput),
    ):
        fig = draw(spec, table, summaries, plt, runs)
        fig.savefig(out_dir / name, dpi=110, bbox_inches="tight")
        plt.close(fig)
        names.append(name)
    return names


def _series(spec: SweepSpec, table: pd.DataFrame):
    others = [a.flag for a in spec.axes[1:]]
    if not others:
        yield "", table
        return
    for key, s in table.groupby(others, sort=False, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        yield (
            " ".join(f"{f.replace('_', '-')}={show(v)}" for f, v in zip(others, key, strict=True)),
            s,
        )


def _x(spec: SweepSpec, s: pd.DataFrame) -> np.ndarray:
    """Positions on the x axis: the values, or for a categorical axis (a policy, a chunk
    size of `off`) the order of the sweep's values."""
    values = s[spec.axes[0].flag]
    numeric = pd.to_numeric(values, errors="coerce").to_numpy("float64")
    if np.isfinite(numeric).all():
        return numeric
    order = {show(v): i for i, v in enumerate(spec.axes[0].values)}
    return values.map(show).map(order).to_numpy("float64")


def _axis_ticks(ax, spec: SweepSpec, table: pd.DataFrame) -> None:
    flag = spec.axes[0].flag
    values = table[[flag]].drop_duplicates()
    ax.set_xticks(_x(spec, values), [show(v) for v in values[flag]])
    ax.set_xlabel(spec.axes[0].label)


def _mark_knees(ax, spec: SweepSpec, table: pd.DataFrame, summaries, metric_columns) -> None:
    metric_columns = set(metric_columns)
    for s in summaries:
        if s.knee is None or s.metric not in metric_columns:
            continue
        series = (
            table if not s.series else next(t for n, t in _series(spec, table) if n == s.series)
        )
        x = _x(spec, series.reset_index(drop=True))
        at = series.reset_index(drop=True)[spec.axes[0].flag].map(show) == s.knee
        if at.any():
            ax.axvline(x[int(np.flatnonzero(at.to_numpy())[0])], color="grey", ls=":", lw=1)


def _errorbar(ax, x, s: pd.DataFrame, column: str, **kw) -> None:
    y = s[column].to_numpy("float64")
    lo = s.get(f"{column}_lo", pd.Series(np.nan, index=s.index)).to_numpy("float64")
    hi = s.get(f"{column}_hi", pd.Series(np.nan, index=s.index)).to_numpy("float64")
    err = np.vstack([np.nan_to_num(y - lo), np.nan_to_num(hi - y)]).clip(min=0)
    ax.errorbar(x, y, yerr=err, marker="o", ms=3, capsize=2, **kw)


def _latency(spec, table, summaries, plt, runs=None):
    fig, axes = plt.subplots(2, 2, figsize=(10, 6.5))
    for ax, (title, p50, p99, unit) in zip(axes.flat, LATENCY_PANELS, strict=True):
        for name, s in _series(spec, table):
            suffix = f" {name}" if name else ""
            _errorbar(ax, _x(spec, s), s, p50, label=f"p50{suffix}")
            _errorbar(ax, _x(spec, s), s, p99, label=f"p99{suffix}", ls="--")
        _mark_knees(ax, spec, table, summaries, (p50, p99))
        ax.set_title(title)
        ax.set_ylabel(unit)
        _axis_ticks(ax, spec, table)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Latency (95 % intervals; dotted line: the knee)")
    fig.tight_layout()
    return fig


def _throughput(spec, table, summaries, plt, runs=None):
    panels = [("output_tok_s", "output tokens/s"), ("req_s", "requests/s")]
    if spec.slo:
        panels.append(("attainment", "SLO attainment"))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), squeeze=False)
    for ax, (column, title) in zip(axes[0], panels, strict=True):
        for name, s in _series(spec, table):
            suffix = f" {name}" if name else ""
            x = _x(spec, s)
            if column == "attainment":  # pooled requests: a binomial interval
                _errorbar(ax, x, s, column, label=f"attainment{suffix}")
                continue
            ax.plot(x, s[column].to_numpy("float64"), marker="o", ms=3, label=f"mean{suffix}")
            _repeat_dots(ax, spec, s, runs, column)
            if column == "req_s" and spec.slo and s["goodput_req_s"].notna().any():
                ax.plot(x, s["goodput_req_s"].to_numpy("float64"), marker="o", ms=3, ls=":",
                        label=f"goodput{suffix}")  # fmt: skip
                _repeat_dots(ax, spec, s, runs, "goodput_req_s")
            if column == "req_s" and spec.axes[0].flag == "rate":
                ax.plot(x, x, color="grey", lw=0.8, label="offered rate")
        _mark_knees(ax, spec, table, summaries, (s.metric for s in summaries))
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        _axis_ticks(ax, spec, table)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Throughput (dots: each repeat) and SLO attainment (95 % intervals)"
                 if spec.slo else "Throughput (dots: each repeat)")  # fmt: skip
    fig.tight_layout()
    return fig


def _repeat_dots(ax, spec: SweepSpec, series: pd.DataFrame, runs, column: str) -> None:
    if runs is None or column not in runs:
        return
    flags = [a.flag for a in spec.axes]
    keys = series[flags].map(show).agg(tuple, axis=1)
    mine = runs[runs[flags].map(show).agg(tuple, axis=1).isin(set(keys))]
    axis = spec.axes[0].flag
    where = dict(zip(series[axis].map(show), _x(spec, series), strict=True))
    x = mine[axis].map(show).map(where).to_numpy("float64")
    ax.scatter(x, mine[column].to_numpy("float64"), s=8, color="black", alpha=0.4, zorder=3)


def _latency_throughput(spec, table, summaries, plt, runs=None):
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, column in zip(axes, ("ttft_p99_ms", "tpot_p50_ms"), strict=True):
        for name, s in _series(spec, table):
            x = s["output_tok_s"].to_numpy("float64")
            ax.plot(x, s[column].to_numpy("float64"), marker="o", ms=3, label=name or None)
            for xi, yi, v in zip(x, s[column], s[spec.axes[0].flag], strict=True):
                ax.annotate(show(v), (xi, yi), fontsize=7, xytext=(3, 3),
                            textcoords="offset points")  # fmt: skip
        ax.set_xlabel("output tokens/s achieved")
        ax.set_ylabel(label(column))
        ax.grid(alpha=0.3)
        if len(spec.axes) > 1:
            ax.legend(fontsize=7)
    fig.suptitle(f"Latency against throughput (labels: {spec.axes[0].label})")
    fig.tight_layout()
    return fig

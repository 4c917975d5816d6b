"""Figures a finding can point to, drawn as PNG for report.md where a plot says more
than a table. matplotlib is imported only when a figure is drawn (Agg backend, no
display): analysing a run never needs it.

- `ttft_parts`: the TTFT critical path, mean / p50 / p99 tail, stacked by part;
- `itl_causes`: what the gaps between tokens were made of, all gaps and the p99 tail;
- `load`: requests in flight (client) and in the engine's queue over time (inbox and
  waiting queue, from the request events: the intervals TTFT's queue part is made of);
- `steps`: step durations over time, coloured by batch kind, with preemptions marked;
  both shade the probe stalls and the profiler window (figure_data.py has the data);
- `kv`: KV blocks in use and the waiting queue over the steps.
"""

from __future__ import annotations

from pathlib import Path

from ..traces.atomic_file import write_atomic
from .figure_data import figure_data

FIGURES = ("ttft_parts", "itl_causes", "load", "steps", "kv")


def draw(name: str, ctx, out_dir: Path) -> Path | None:
    """Draw figure `name` for the triage context into `out_dir`; None when the run has
    nothing to show for it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = _DRAW[name](ctx, plt)
    if fig is None:
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.png"
    try:
        write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=110, bbox_inches="tight"))
    finally:
        plt.close(fig)
    return path


def _ttft_parts(ctx, plt):
    from ..analyzers.ttft import PARTS

    t = ctx.get("ttft")
    if t is None or not t.engine_events:
        return None
    fig, ax = plt.subplots(figsize=(7, 3.2))
    bands = (("mean", t.mean), ("p50", t.p50), ("p99 tail", t.p99))
    left = [0.0] * len(bands)
    for part in PARTS:
        values = [max(getattr(b, part), 0.0) * 1e3 for _, b in bands]
        ax.barh([n for n, _ in bands], values, left=left, label=part.removesuffix("_s"))
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax.set_xlabel("ms")
    ax.set_title("TTFT critical path")
    ax.invert_yaxis()
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    return fig


def _itl_causes(ctx, plt):
    from ..analyzers.itl import CAUSES

    itl = ctx.get("itl")
    if itl is None or itl.mean.gaps == 0:
        return None
    fig, ax = plt.subplots(figsize=(7, 2.8))
    bands = (("all gaps", itl.mean), ("p99 tail", itl.tail))
    left = [0.0, 0.0]
    for cause in CAUSES:
        values = [max(getattr(b, f"{cause}_s"), 0.0) * 1e3 for _, b in bands]
        ax.barh([n for n, _ in bands], values, left=left, label=cause)
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax.set_xlabel("ms per gap")
    ax.set_title("What the gaps between tokens were made of")
    ax.invert_yaxis()
    ax.legend(fontsize=7, ncol=6, loc="upper center", bbox_to_anchor=(0.5, -0.3))
    return fig


def _load(ctx, plt):
    d = figure_data(ctx)
    flight, queue = d.in_flight, d.queue
    if not len(flight) and not len(queue):
        return None
    fig, ax = plt.subplots(figsize=(7, 3))
    if len(flight):
        ax.step(flight["t_s"], flight["in_flight"], where="post", label="in flight (client)")
    if len(queue):
        ax.step(queue["t_s"], queue["queued"], where="post", lw=0.9,
                label="engine queue (arrived, not yet running)")  # fmt: skip
    _mark_stalls(ax, d)
    ax.set_xlabel("s")
    ax.set_ylabel("requests")
    ax.set_title("Load over time")
    ax.legend(fontsize=8)
    return fig


def _steps(ctx, plt):
    d = figure_data(ctx)
    per = d.steps
    if not len(per):
        return None
    fig, ax = plt.subplots(figsize=(7, 3))
    for kind in ("decode", "mixed", "prefill"):
        sel = (per["kind"] == kind).to_numpy()
        ax.scatter(per["t_s"][sel], per["dur_ms"][sel], s=4, label=kind)
    pre = per["preempted"].to_numpy()
    if pre.any():
        ax.scatter(per["t_s"][pre], per["dur_ms"][pre], s=18, marker="x", c="red",
                   label="preemption")  # fmt: skip
    _mark_stalls(ax, d)
    ax.set_xlabel("s")
    ax.set_ylabel("step ms")
    ax.set_title("Engine steps")
    ax.legend(fontsize=8, markerscale=2)
    return fig


def _mark_stalls(ax, d) -> None:
    """Shade the profiler window and the probe stalls, each labelled once."""
    w = d.profiler_window
    if w is not None:
        ax.axvspan(w.start_s, w.end_s, color="tab:blue", alpha=0.08, lw=0, label=w.label)
    for i, st in enumerate(d.stalls):
        label = "probe stall" if i == 0 else None
        ax.axvspan(st.start_s, st.end_s, color="tab:red", alpha=0.18, lw=0, label=label)


def _kv(ctx, plt):
    steps = ctx.run.steps
    if not len(steps) or not steps["kv_blocks_used"].notna().any():
        return None
    t = (steps["start_ns"] - steps["start_ns"].min()) / 1e9
    pool = steps["kv_blocks_used"] + steps["kv_blocks_free"]
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.plot(t, steps["kv_blocks_used"] / pool * 100, lw=0.8, label="KV in use (%)")
    ax.set_ylabel("% of the pool")
    ax.set_ylim(0, 105)
    ax2 = ax.twinx()
    ax2.plot(t, steps["num_waiting"], lw=0.8, color="tab:orange", label="waiting")
    ax2.set_ylabel("waiting after scheduling")
    ax.set_xlabel("s")
    ax.set_title("KV pool and waiting queue")
    return fig


_DRAW = {
    "ttft_parts": _ttft_parts,
    "itl_causes": _itl_causes,
    "load": _load,
    "steps": _steps,
    "kv": _kv,
}

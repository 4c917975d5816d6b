"""The HTML report's interactive figures (plotly), drawn from the same data as report.md's
PNGs (figure_data.py). Each function gives a plotly Figure, or None when the run has
nothing to show for it. plotly is imported here only, and only when a report is drawn.

- `latency`: TTFT, TPOT, ITL (per chunk) and E2E distributions, the metrics' p50 and p99
  marked;
- `ttft_parts`, `itl_causes`: the TTFT critical path and what the gaps between tokens
  were made of (mean, p50, p99 tail), stacked by part;
- `steps`: each engine step's duration over time by batch kind, preemptions, probe
  stalls and the profiler window;
- `load`: requests in flight (client), in the engine's queue (inbox and waiting, from the
  request events) and waiting after each step's scheduling, with the probe stalls;
- `kv`: KV blocks in use over time;
- `roofline`: engine steps (analytic FLOPs and bytes) and spans that carry their own, on
  the device's roofline.
"""

from __future__ import annotations

import numpy as np

from .figure_data import figure_data

FIGURES = ("latency", "ttft_parts", "itl_causes", "steps", "load", "kv", "roofline")
TITLES = {
    "latency": "Latency distributions",
    "ttft_parts": "TTFT critical path",
    "itl_causes": "What the gaps between tokens were made of",
    "steps": "Engine steps over time",
    "load": "Load and engine queue over time",
    "kv": "KV pool over time",
    "roofline": "Roofline",
}
KIND_COLOURS = {"prefill": "#2ca02c", "mixed": "#ff7f0e", "decode": "#1f77b4", "idle": "#7f7f7f"}
STALL = "rgba(214, 39, 40, 0.18)"
WINDOW = "rgba(31, 119, 180, 0.10)"


def build(name: str, ctx):
    return _BUILD[name](ctx)


def _layout(fig, title: str, height: int = 320, **kw):
    fig.update_layout(
        title=title,
        height=height,
        margin=dict(l=60, r=20, t=50, b=45),
        template="plotly_white",
        legend=dict(orientation="h", y=-0.22),
        **kw,
    )
    return fig


def _latency(ctx):
    from plotly.subplots import make_subplots

    d = figure_data(ctx)
    lat = d.latencies
    if not lat:
        return None
    fig = make_subplots(rows=1, cols=len(lat), subplot_titles=[x.name for x in lat])
    import plotly.graph_objects as go

    for i, x in enumerate(lat, start=1):
        fig.add_trace(
            go.Histogram(x=x.ms, nbinsx=40, name=x.name, showlegend=False, marker_color="#1f77b4"),
            row=1,
            col=i,
        )
        for q, value, dash in (("p50", x.p50_ms, "dot"), ("p99", x.p99_ms, "dash")):
            if np.isfinite(value):
                fig.add_vline(
                    x=value,
                    line_dash=dash,
                    line_color="#d62728",
                    row=1,
                    col=i,
                    annotation_text=f"{q} {value:,.1f}",
                    annotation_font_size=10,
                )
        fig.update_xaxes(title_text="ms", row=1, col=i)
    return _layout(fig, TITLES["latency"], height=300)


def _stacked(bands, parts, title: str, unit: str):
    import plotly.graph_objects as go

    fig = go.Figure()
    for label, attr in parts:
        values = [max(float(getattr(b, attr)), 0.0) * 1e3 for _, b in bands]
        if not any(values):
            continue
        fig.add_trace(
            go.Bar(
                y=[n for n, _ in bands],
                x=values,
                name=label,
                orientation="h",
                hovertemplate=f"{label}: %{{x:,.2f}} {unit}<extra></extra>",
            )
        )
    fig.update_layout(barmode="stack", legend_traceorder="normal")
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title_text=unit)
    return _layout(fig, title, height=300)


def _ttft_parts(ctx):
    from ..analyzers.ttft import PARTS

    t = ctx.get("ttft")
    if t is None or not t.engine_events:
        return None
    bands = (("mean", t.mean), ("p50", t.p50), ("p99 tail", t.p99))
    parts = [(p.removesuffix("_s").replace("_", " "), p) for p in PARTS]
    return _stacked(bands, parts, TITLES["ttft_parts"], "ms")


def _itl_causes(ctx):
    from ..analyzers.itl import CAUSES

    itl = ctx.get("itl")
    if itl is None or itl.mean.gaps == 0:
        return None
    bands = (("all gaps", itl.mean), ("p99 tail", itl.tail))
    parts = [(c.replace("_", " "), f"{c}_s") for c in CAUSES]
    return _stacked(bands, parts, TITLES["itl_causes"], "ms per gap")


def _marks(fig, d) -> None:
    """The profiler window and each probe stall as shaded bands, named in the legend."""
    import plotly.graph_objects as go

    w = d.profiler_window
    if w is not None:
        fig.add_vrect(x0=w.start_s, x1=w.end_s, fillcolor=WINDOW, line_width=0, layer="below")
        fig.add_trace(
            go.Scatter(
                x=[w.start_s],
                y=[None],
                mode="markers",
                name=w.label,
                marker=dict(color=WINDOW, symbol="square", size=12),
            )
        )
    for i, st in enumerate(d.stalls):
        fig.add_vrect(x0=st.start_s, x1=st.end_s, fillcolor=STALL, line_width=0, layer="below")
        # An invisible point at the stall's middle gives it a hover label.
        fig.add_trace(
            go.Scatter(
                x=[(st.start_s + st.end_s) / 2],
                y=[None],
                mode="markers",
                name="probe stall",
                legendgroup="stall",
                showlegend=i == 0,
                marker=dict(color=STALL, symbol="square", size=12),
                hovertext=st.label,
            )
        )


def _steps(ctx):
    import plotly.graph_objects as go

    d = figure_data(ctx)
    per = d.steps
    if not len(per):
        return None
    fig = go.Figure()
    for kind, colour in KIND_COLOURS.items():
        sel = (per["kind"] == kind).to_numpy()
        if sel.any():
            fig.add_trace(
                go.Scattergl(
                    x=per["t_s"][sel],
                    y=per["dur_ms"][sel],
                    mode="markers",
                    name=kind,
                    marker=dict(size=4, color=colour),
                    customdata=per["step_id"][sel],
                    hovertemplate="step %{customdata}: %{y:,.2f} ms<extra></extra>",
                )
            )
    pre = per["preempted"].to_numpy()
    if pre.any():
        fig.add_trace(
            go.Scatter(
                x=per["t_s"][pre],
                y=per["dur_ms"][pre],
                mode="markers",
                name="preemption",
                marker=dict(symbol="x", size=9, color="#d62728"),
            )
        )
    _marks(fig, d)
    fig.update_xaxes(title_text="s")
    fig.update_yaxes(title_text="step ms")
    return _layout(fig, TITLES["steps"])


def _load(ctx):
    import plotly.graph_objects as go

    d = figure_data(ctx)
    if not len(d.in_flight) and not len(d.queue):
        return None
    fig = go.Figure()
    series = (
        (d.in_flight, "in_flight", "in flight (client)", "solid"),
        (d.queue, "queued", "engine queue (arrived, not yet running)", "solid"),
        (d.waiting, "waiting", "waiting after scheduling (steps table)", "dot"),
    )
    for frame, col, name, dash in series:
        if len(frame):
            fig.add_trace(
                go.Scatter(
                    x=frame["t_s"],
                    y=frame[col],
                    name=name,
                    mode="lines",
                    line=dict(shape="hv", dash=dash, width=1.5),
                )
            )
    _marks(fig, d)
    fig.update_xaxes(title_text="s")
    fig.update_yaxes(title_text="requests")
    return _layout(fig, TITLES["load"])


def _kv(ctx):
    import plotly.graph_objects as go

    d = figure_data(ctx)
    steps = ctx.run.steps
    if not len(steps) or not steps["kv_blocks_used"].notna().any():
        return None
    s = steps[steps["kv_blocks_used"].notna().to_numpy()]
    pool = (s["kv_blocks_used"] + s["kv_blocks_free"]).to_numpy(float)
    used = s["kv_blocks_used"].to_numpy(float) / np.where(pool > 0, pool, np.nan) * 100
    fig = go.Figure(
        go.Scatter(
            x=d.seconds(s["start_ns"]), y=used, mode="lines", name="KV in use (% of the pool)"
        )
    )
    _marks(fig, d)
    fig.update_xaxes(title_text="s")
    fig.update_yaxes(title_text="% of the pool", range=[0, 105])
    return _layout(fig, TITLES["kv"], height=280)


def _roofline(ctx):
    import plotly.graph_objects as go

    roof = figure_data(ctx).roofline
    if roof is None:
        return None
    c = roof.ceilings
    peak, bw = c.peak_flops(roof.dtype), c.bytes_per_s
    fig = go.Figure()
    frames = [("engine steps", roof.steps, "step_id")]
    if len(roof.spans):
        frames.append(("spans (own FLOPs)", roof.spans, "name"))
    lo, hi = [], []
    for name, f, label in frames:
        if not len(f):  # no steps (a trace without them, or a table lost): no columns
            continue
        ok = np.isfinite(f["intensity"]) & np.isfinite(f["attained_flops_per_s"])
        ok &= (f["intensity"] > 0) & (f["attained_flops_per_s"] > 0)
        f = f[ok.to_numpy()]
        if not len(f):
            continue
        lo.append(f["intensity"].min())
        hi.append(f["intensity"].max())
        fig.add_trace(
            go.Scattergl(
                x=f["intensity"],
                y=f["attained_flops_per_s"],
                mode="markers",
                name=name,
                marker=dict(size=5),
                text=f[label].astype(str),
                customdata=f["bound"],
                hovertemplate="%{text}: %{x:.3g} FLOP/B, %{y:.3g} FLOP/s "
                "(%{customdata})<extra></extra>",
            )
        )
    if not lo:
        return None
    x = np.geomspace(min(min(lo), peak / bw) / 4, max(max(hi), peak / bw) * 4, 64)
    fig.add_trace(
        go.Scatter(
            x=x,
            y=np.minimum(peak, x * bw),
            mode="lines",
            name=f"roof ({c.device})",
            line=dict(color="#444", width=1.5),
        )
    )
    fig.update_xaxes(type="log", title_text="arithmetic intensity (FLOP/byte)")
    fig.update_yaxes(type="log", title_text="attained FLOP/s")
    return _layout(fig, f"{TITLES['roofline']} ({roof.dtype}, {c.kind} ceilings)", height=360)


_BUILD = {
    "latency": _latency,
    "ttft_parts": _ttft_parts,
    "itl_causes": _itl_causes,
    "steps": _steps,
    "load": _load,
    "kv": _kv,
    "roofline": _roofline,
}

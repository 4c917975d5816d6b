"""results/report.html: the triage as one self-contained HTML file with interactive plots.

Written by `perfdiag report RUN` and `perfdiag analyze RUN --html`. The words and numbers
come from the triage view (triage_view.py), the model the CLI, the TUI and report.md
render, so the four agree: the verdict, the gate, each finding with its evidence, ids and
advice, every step's status and counts with each check's outcome, and the symptoms. The
plots (html_figures.py) come from figure_data.py, as report.md's PNGs do.

Self-contained: plotly.js is inlined once in the head, every figure's data is inline,
there is no link, script or font to fetch, so the file opens offline (file://, e-mail,
a CI artefact). The page never loads anything over the network.
"""

from __future__ import annotations

import html
from pathlib import Path

from ..analyzers.findings import Finding, Triage
from ..traces.atomic_file import write_atomic
from ..traces.layout import RESULTS_DIR
from .html_figures import FIGURES, TITLES, build
from .triage_view import GATE_HEADING, StepView, triage_view

HTML_FILE = "report.html"
PLOTLY_CONFIG = {"displaylogo": False, "responsive": True}

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto;
       max-width: 1180px; padding: 0 20px 40px; color: #222; }
h1 { font-size: 22px; margin: 18px 0 4px; } h2 { font-size: 18px; margin: 26px 0 8px;
  border-bottom: 1px solid #ddd; padding-bottom: 3px; } h3 { font-size: 15px; margin: 0 0 4px; }
.meta { color: #555; } code { font-size: 12.5px; background: #f3f3f3; padding: 0 3px; }
.verdict { font-size: 17px; padding: 10px 14px; border-left: 5px solid #888; background: #fafafa; }
.finding { border: 1px solid #ddd; border-left-width: 5px; border-radius: 3px;
           padding: 10px 14px; margin: 10px 0; }
.critical { border-left-color: #c62828; } .warning { border-left-color: #ef8f00; }
.info { border-left-color: #6b8fb3; }
.sev { font-weight: 600; text-transform: uppercase; font-size: 12px; }
.sev.critical, .st.fired.critical { color: #c62828; }
.sev.warning, .st.fired.warning { color: #b26a00; }
.sev.info { color: #3f6d99; } .st.pass { color: #2e7d32; } .st.partial { color: #8a6d00; }
.st.not-evaluated { color: #777; } .st { font-weight: 600; }
table { border-collapse: collapse; margin: 6px 0; } td, th { padding: 3px 10px 3px 0;
  text-align: left; vertical-align: top; } th { border-bottom: 1px solid #ccc; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
details { margin: 4px 0 4px 8px; } summary { cursor: pointer; }
.figure { margin: 8px 0 18px; } .nav a { margin-right: 12px; }
/* a narrow screen (a phone: 390 px) squeezed the plots until titles and axes were cut:
   each keeps a readable width and scrolls sideways in its own box */
.figure { overflow-x: auto; } .figure .plotly-graph-div { min-width: 640px; }
"""


def write_html(triage: Triage, ctx, path: Path | None = None) -> Path:
    """Write the report (into the run's results/ unless `path` is given), atomically."""
    target = path if path is not None else Path(ctx.run.path) / RESULTS_DIR / HTML_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(target, render_html(triage, ctx))


def render_html(triage: Triage, ctx) -> str:
    from plotly.offline import get_plotlyjs

    figures = {}
    for name in FIGURES:
        fig = build(name, ctx)
        if fig is not None:
            figures[name] = fig.to_html(
                full_html=False, include_plotlyjs=False, div_id=f"plot-{name}", config=PLOTLY_CONFIG
            )
    body = "\n".join(_body(triage, ctx, figures))
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
        f"<title>perfdiag report: {_e(triage.run_id)}</title>\n"
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<style>{CSS}</style>\n<script>{get_plotlyjs()}</script>\n</head>\n"
        f"<body>\n{body}\n</body></html>\n"
    )


def _body(triage: Triage, ctx, figures: dict[str, str]):
    s = ctx.serving
    view = triage_view(triage)
    yield f"<h1>perfdiag report: {_e(triage.run_id)}</h1>"
    window = s.window
    meta = [
        f"run <code>{_e(triage.run_path)}</code>",
        f"status {_e(ctx.run.status)}",
        f"{_e(s.basis or 'no')} view",
    ]
    if hasattr(window, "duration_s"):
        meta.append(f"window {window.duration_s:.2f} s ({_e(window.reason)})")
    if triage.baseline:
        meta.append(f"baseline <code>{_e(triage.baseline)}</code>")
    yield f'<p class="meta">{" · ".join(meta)}</p>'
    nav = [
        ("verdict", "Verdict"),
        ("findings", "Findings"),
        ("steps", "Triage steps"),
        ("plots", "Plots"),
        ("symptoms", "Symptoms"),
    ]
    yield '<p class="nav">' + "".join(f'<a href="#{a}">{t}</a>' for a, t in nav) + "</p>"

    top = view.top
    yield '<h2 id="verdict">Verdict</h2>'
    if top is not None:
        yield (
            f'<p class="verdict {top.severity}" id="top-cause">Top cause: '
            f"<strong>{_e(view.verdict)}</strong> "
            f'(<span class="sev {top.severity}">{top.severity}</span>, step {top.step})</p>'
        )
    else:
        yield f'<p class="verdict" id="top-cause">Top cause: {_e(view.verdict)}.</p>'
    yield f'<h2 id="gate">{_e(GATE_HEADING)}</h2>'
    yield f"<p>{_e(view.gate_summary[0].upper() + view.gate_summary[1:])}.</p>"
    for f in view.qualifiers:
        yield from _finding(f, figures)

    yield '<h2 id="findings">Findings, ranked</h2>'
    rest = [f for f in triage.findings if f.step > 1]
    if not rest:
        yield "<p>None.</p>"
    for f in rest:
        yield from _finding(f, figures)

    yield '<h2 id="steps">Triage steps</h2>'
    yield "<table><tr><th>step</th><th>title</th><th>status</th><th>checks</th></tr>"
    for st in view.steps:
        yield (
            f'<tr id="step-{st.step}"><td class="num">{st.step}</td><td>{_e(st.title)}</td>'
            f"<td>{_status(st)}</td><td>{_e(st.counts.text())}</td></tr>"
        )
    yield "</table>"
    for st in view.steps:
        yield (
            f"<details><summary>Step {st.step} ({_status(st)}): "
            f"{_e(st.counts.text())}</summary><ul>"
        )
        for o in st.outcomes:
            yield f"<li><code>{_e(o.check)}</code> {_e(o.text())}</li>"
        yield "</ul></details>"

    yield '<h2 id="plots">Plots</h2>'
    if not figures:
        yield "<p>The run has nothing to plot.</p>"
    for name, div in figures.items():
        yield f'<div class="figure" id="fig-{name}">{div}</div>'

    yield '<h2 id="symptoms">Symptoms</h2>'
    yield "<table><tr><th>symptom</th><th>present</th><th>explained by</th></tr>"
    for sc in triage.scenarios:
        why = ", ".join(f"<code>{_e(c)}</code>" for c in sc.explained_by) or "–"
        yield f"<tr><td>{_e(sc.title)}</td><td>{_e(sc.symptom)}</td><td>{why}</td></tr>"
    yield "</table>"
    yield '<p class="meta">Written by perfdiag; self-contained (opens offline).</p>'


def _status(st: StepView) -> str:
    cls = f"st {st.status}" + (f" {st.worst}" if st.status == "fired" and st.worst else "")
    return f'<span class="{cls}">{_e(st.status_text)}</span>'


def _finding(f: Finding, figures: dict[str, str]):
    yield f'<div class="finding {f.severity}" id="finding-{_e(f.check)}">'
    yield (f'<h3>{f.rank}. <span class="sev {f.severity}">{f.severity}</span> {_e(f.title)}</h3>')
    follows = f" — {f.cause[0]} <code>{_e(f.cause[1])}</code>" if f.cause else ""
    yield (
        f'<p class="meta">Step {f.step} ({_e(f.step_title)}) · check '
        f"<code>{_e(f.check)}</code>{follows}</p>"
    )
    yield f"<p>{_e(f.explanation)}</p>"
    if f.evidence and f.severity != "info":
        yield "<table><tr><th>evidence</th><th>value</th></tr>"
        for e in f.evidence:
            yield f'<tr><td>{_e(e.label)}</td><td class="num">{_e(e.text())}</td></tr>'
        yield "</table>"
    for ids in f.ids:
        listed = ", ".join(f"<code>{_e(i)}</code>" for i in ids.ids)
        yield f"<p>{_e(ids.kind.capitalize())}s, {_e(ids.label)}: {listed}</p>"
    if f.recommendations:
        yield "<p>What to try:</p><ul>"
        yield "".join(f"<li>{_e(r)}</li>" for r in f.recommendations) + "</ul>"
    shown = [n for n in f.figures if n in figures]
    if shown:
        links = ", ".join(f'<a href="#fig-{n}">{_e(TITLES[n])}</a>' for n in shown)
        yield f"<p>Plots: {links}</p>"
    yield "</div>"


def _e(text) -> str:
    return html.escape(str(text), quote=True)

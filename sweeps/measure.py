"""One point of a sweep, measured: record the run, analyse it as `perfdiag analyze`
would (results/metrics.json and findings.json are written into the run, so every point
opens in the TUI and compares like any run), and keep what the sweep's tables need.

The triage of a point's repeat sees the point's other repeats (step 1 measures the
noise), so a point that does not reproduce says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..analyzers.findings import Triage, write_findings
from ..analyzers.lifecycle import Missing
from ..analyzers.serving import ServingAnalysis, analyze_serving, write_metrics
from ..analyzers.slo import Slo
from ..playbooks.evaluate import run_triage
from ..playbooks.facts import TriageContext
from ..traces.reader import Run, load_run
from .causes import limiting_cause, measurement_caveat

NAN = float("nan")


@dataclass
class Measured:
    """One recorded run of a point: its analysis, and the per-request values the sweep
    pools across repeats."""

    path: Path
    run: Run
    serving: ServingAnalysis
    triage: Triage | None = None

    @property
    def usable(self) -> bool:
        return not isinstance(self.serving.metrics, Missing)


def record(options, http, run_dir: Path, on_progress=None) -> Path:
    """Record one run (engine_ref in this process, or an HTTP target) into `run_dir`."""
    if http is not None:
        from ..probes.http_session import record_http_run

        return record_http_run(options, run_dir, command=["perfdiag", "sweep"],
                               on_progress=on_progress, http=http).path  # fmt: skip
    from ..probes.session import record_run

    return record_run(options, run_dir, command=["perfdiag", "sweep"],
                      on_progress=on_progress).path  # fmt: skip


def analyse(path: Path, slo: Slo | None) -> Measured:
    run = load_run(path)
    serving = analyze_serving(run, slo)
    write_metrics(serving, path)
    return Measured(path, run, serving)


def triage_point(repeats: list[Measured]) -> None:
    """Each repeat's triage, with the point's other repeats as its repeats."""
    contexts = [TriageContext(m.run, m.serving) for m in repeats]
    for i, m in enumerate(repeats):
        others = tuple(c for j, c in enumerate(contexts) if j != i)
        ctx = TriageContext(m.run, m.serving, repeats=others)
        m.triage = run_triage(ctx)
        write_findings(m.triage, m.path)


def row(m: Measured) -> dict[str, Any]:
    """The run's numbers: latency percentiles (ms; E2E in s), throughput, goodput, the
    load it was offered and got, and its triage's limiting cause."""
    w = m.run.manifest.config.get("run_options", {}).get("workload", {})
    arrival = w.get("arrival", {}) if isinstance(w, dict) else {}
    out: dict[str, Any] = {
        "run": m.path.name,
        "status": m.run.status,
        "offered_rate": arrival.get("rate") if arrival.get("mode") == "open" else NAN,
        "concurrency": arrival.get("concurrency"),
    }
    metrics = m.serving.metrics
    if isinstance(metrics, Missing):
        return out
    for name, dist, scale in (
        ("ttft", metrics.ttft_s, 1e3),
        ("tpot", metrics.tpot_s, 1e3),
        ("itl", metrics.itl_per_chunk_s, 1e3),
        ("e2e", metrics.e2e_s, 1.0),
    ):
        unit = "s" if name == "e2e" else "ms"
        out[f"{name}_p50_{unit}"] = dist.p50 * scale
        out[f"{name}_p99_{unit}"] = dist.p99 * scale
    tp = metrics.throughput
    out["output_tok_s"] = tp.output_tokens_per_s
    out["req_s"] = tp.requests_per_s
    pr = metrics.per_request[metrics.per_request["in_window"]]
    out["sent_rate"] = _send_rate(pr["sent_ns"])
    out["lateness_p99_ms"] = _p99(pr["lateness_s"]) * 1e3
    out["requests"] = metrics.outcomes.requests
    out["failed"] = metrics.outcomes.error + metrics.outcomes.rejected
    out["window_s"] = metrics.window.duration_s
    out["steady"] = metrics.window.steady
    g = metrics.goodput
    out["attainment"] = g.attainment if g is not None else NAN
    out["judged"], out["good"] = (g.judged, g.good) if g is not None else (0, 0)
    out["goodput_req_s"] = g.requests_per_s if g is not None else NAN
    if m.triage is not None:
        cause = limiting_cause(m.triage)
        out["cause"] = cause.check if cause else "none"
        out["cause_title"] = cause.title if cause else "no warning or critical finding"
        out["cause_severity"] = cause.severity if cause else ""
        qualifier = next((f for f in m.triage.qualifiers if f.severity != "info"), None)
        qualifier = qualifier or measurement_caveat(m.triage)
        out["qualifier"] = qualifier.check if qualifier else ""
    return out


def request_values(m: Measured) -> pd.DataFrame:
    """Measured requests: ttft_s, tpot_s, e2e_s and whether each met the SLO."""
    metrics = m.serving.metrics
    pr = metrics.per_request
    sel = pr["in_window"].to_numpy(bool)
    out = pd.DataFrame({c: pr[c].to_numpy("float64")[sel] for c in ("ttft_s", "tpot_s", "e2e_s")})
    out["request"] = np.flatnonzero(sel)
    return out


def gap_values(m: Measured) -> pd.DataFrame:
    """Delivery gaps (ITL per chunk) of the measured requests: request, gap_s."""
    metrics = m.serving.metrics
    g = metrics.gaps
    sel = metrics.per_request["in_window"].to_numpy(bool)
    if not len(g):
        return pd.DataFrame({"request": np.zeros(0, np.int64), "gap_s": np.zeros(0)})
    keep = sel[g["code"].to_numpy()]
    return pd.DataFrame(
        {"request": g["code"].to_numpy()[keep], "gap_s": g["gap_s"].to_numpy("float64")[keep]}
    )


def _send_rate(sent_ns: pd.Series) -> float:
    t = np.sort(sent_ns.dropna().to_numpy(np.int64))
    if len(t) < 2 or t[-1] == t[0]:
        return NAN
    return (len(t) - 1) / ((t[-1] - t[0]) / 1e9)


def _p99(values: pd.Series) -> float:
    v = values.to_numpy("float64")
    v = v[np.isfinite(v)]
    return float(np.percentile(v, 99)) if len(v) else NAN

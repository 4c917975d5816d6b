"""A run as the explorer sees it: `RunData` holds the run, its analyses and the view
models of the overview (identity, key metrics, ranked findings, triage steps).

Everything here is computed by the analyzers and playbooks; this module only selects and
shapes. It never imports Textual, so it is tested on its own. Opening a run reads its
manifest and table metadata only (fast, and where a missing or corrupt run is caught);
`RunData.analyse` runs the serving analyses and the triage, reporting each stage, so
the app can run it in a background worker and show what is ready as it comes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from ..analyzers.findings import Evidence, Finding, Triage
from ..analyzers.lifecycle import Missing
from ..analyzers.run_config import section
from ..playbooks.triage_view import StepView, TriageView, triage_view
from ..traces.reader import Run, load_run
from . import fmt

Progress = Callable[[str, float], None]  # (stage, fraction done)

# Engine options worth a glance, in the order people tune them.
ENGINE_KEYS = ("preset", "device", "dtype", "chunk_size", "max_seqs", "max_batched_tokens",
               "kv_cache_mb", "kv_blocks", "block_size", "prefix_cache", "preemption", "policy",
               "kernel_backend", "cuda_graphs")  # fmt: skip


def open_run(source: Run | str | os.PathLike) -> Run:
    """A Run as given, or loaded from its path (raises PerfdiagError if it is not one)."""
    return source if isinstance(source, Run) else load_run(Path(source))


@dataclass(frozen=True)
class Identity:
    run_id: str
    status: str
    source: str
    path: str
    rows: tuple[tuple[str, str], ...]  # (label, text): command, created, config, environment…


class RunData:
    """One run with its analyses, filled in stage by stage by `analyse`."""

    def __init__(self, run: Run, *, label: str = "A", slo=None, steady: bool = True,
                 ceilings_dir: Path | None = None):  # fmt: skip
        self.run = run
        self.label = label
        self.slo = slo
        self.steady = steady
        self.ceilings_dir = ceilings_dir
        self.identity = identity(run)
        self.serving = None  # ServingAnalysis, once analysed
        self.ctx = None  # TriageContext (facts' memo, the timeline report)
        self.triage: Triage | None = None
        self.stage = "opened"
        self.cache: dict = {}  # derived view data, built once per run (see `memo`)

    def memo(self, key: str, build):
        """`build(self)` once; later calls return the same object."""
        if key not in self.cache:
            self.cache[key] = build(self)
        return self.cache[key]

    @property
    def ready(self) -> bool:
        return self.triage is not None

    def analyse(self, progress: Progress | None = None) -> RunData:
        from ..analyzers.serving import analyze_serving
        from ..playbooks.evaluate import run_triage
        from ..playbooks.facts import TriageContext

        report = progress or (lambda stage, done: None)
        report("serving analyses", 0.1)
        self.serving = analyze_serving(self.run, self.slo, steady=self.steady)
        self.stage = "serving"
        report("triage", 0.5)
        self.ctx = TriageContext(self.run, self.serving)
        self.triage = run_triage(self.ctx)
        self.stage = "ready"
        report("ready", 1.0)
        return self

    def get(self, name: str):
        """A serving analysis by name, or None (not analysed yet, or the run cannot feed it)."""
        if self.serving is None:
            return None
        value = getattr(self.serving, name)
        return None if isinstance(value, Missing) else value

    def missing_reason(self, name: str) -> str:
        if self.serving is None:
            return "still analysing"
        value = getattr(self.serving, name)
        if isinstance(value, Missing):
            return f"the run lacks {', '.join(value.needs)}"
        return ""

    @cached_property
    def spans(self):
        """The timeline's spans frame (classes, resources), read once."""
        from ..analyzers.spans import timeline_spans

        return timeline_spans(self.run)

    @cached_property
    def timeline(self):
        """The timeline report (breakdown, resources, overlap, GPU gaps, kernels), or None
        when the run has no spans. Shared with the triage's facts when they built it."""
        if self.ctx is not None and "timeline" in self.ctx.__dict__ and self.ctx.timeline:
            return self.ctx.timeline
        if self.run.sources["spans"].num_rows == 0:
            return None
        from ..analyzers.report import report_from_spans

        return report_from_spans(self.spans, self.run.steps)

    @cached_property
    def critical_path(self):
        """The critical path through the traced steps, or None without GPU work. Shared
        with the triage's facts when they built it."""
        if self.ctx is not None and self.ctx.__dict__.get("critical_path") is not None:
            return self.ctx.critical_path
        tl = self.timeline
        if tl is None or not tl.gpu_ops:
            return None
        from ..analyzers.critical_path import critical_path

        return critical_path(self.spans, tl.windows)

    @cached_property
    def roofline(self):
        from ..analyzers.roofline import roofline_report

        return roofline_report(self.run, ceilings_dir=self.ceilings_dir)

    # -- the overview's view models ---------------------------------------------------
    def metrics(self) -> tuple[Evidence, ...]:
        return key_metrics(self)

    @property
    def view(self) -> TriageView | None:
        """The triage as the CLI and report.md show it too (playbooks/triage_view.py)."""
        if self.triage is None:
            return None
        return self.memo("triage_view", lambda d: triage_view(d.triage))

    def steps(self) -> tuple[StepView, ...]:
        return self.view.steps if self.view is not None else ()

    def findings(self) -> tuple[Finding, ...]:
        return self.triage.findings if self.triage is not None else ()


def identity(run: Run) -> Identity:
    m = run.manifest
    env = m.environment or {}
    rows = [("command", " ".join(str(c) for c in m.command) or fmt.DASH)]
    when = _when(m.created_at)
    if m.ended_at:
        when += f" → {_when(m.ended_at)}"
    rows.append(("recorded", when))
    for label, text in config_summary(m.config or {}):
        rows.append((label, text))
    rows.append(("environment", environment_summary(env)))
    counts = run.row_counts()
    rows.append(("tables", " · ".join(f"{k} {v:,}" for k, v in counts.items())))
    return Identity(m.run_id, run.status, m.source, str(run.path), tuple(rows))


def _when(iso: str) -> str:
    # 2026-11-30T02:39:36.922+00:00 → 2026-11-30 02:39:36 UTC (the manifest stores UTC)
    return iso[:19].replace("T", " ") + " UTC" if len(iso) >= 19 else iso


def config_summary(config: dict) -> list[tuple[str, str]]:
    """The configuration in a few lines: engine options, model shape, workload; an
    imported run's importer and traces."""
    out = []
    opts = config.get("run_options") if isinstance(config.get("run_options"), dict) else {}
    engine = section(opts, "engine")
    parts = [f"{k}={_short(engine[k])}" for k in ENGINE_KEYS if engine.get(k) is not None]
    if parts:
        out.append(("engine", " ".join(parts)))
    model = section(config, "engine_config", "model")
    if model:
        out.append(("model", model_summary(model)))
    w = section(opts, "workload")
    if w:
        out.append(("workload", workload_summary(w)))
    target = opts.get("target")
    if target:
        out.append(("target", _short(target)))
    if "importer" in config:
        traces = config.get("traces") or []
        out.append(("imported", f"{config['importer']}: {', '.join(map(str, traces))}"))
    return out


def _short(v) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def model_summary(model: dict) -> str:
    arch = model.get("architecture", "model")
    layers = model.get("num_layers") or model.get("num_hidden_layers")
    heads = model.get("num_heads") or model.get("num_attention_heads")
    kv = model.get("num_kv_heads") or model.get("num_key_value_heads")
    return (
        f"{arch} {layers} layers, hidden {model.get('hidden_size')}, heads {heads}/{kv} kv, "
        f"vocab {model.get('vocab_size')}"
    )


def workload_summary(w: dict) -> str:
    a = w.get("arrival") or {}
    if a.get("mode") == "closed":
        load = f"closed loop ×{a.get('concurrency')}"
    else:
        load = f"open {_short(a.get('rate'))} req/s {a.get('process', '')}".strip()
        if a.get("concurrency"):
            load += f", cap {a['concurrency']}"
    parts = [str(w.get("name", "workload")), f"{w.get('requests')} requests", load]
    for key in ("prompt_len", "output_len"):
        d = w.get(key)
        if isinstance(d, dict):
            kind = d.get("kind")
            if kind == "uniform":
                parts.append(f"{key.split('_')[0]} {d.get('low')}–{d.get('high')}")
            elif kind == "fixed":
                parts.append(f"{key.split('_')[0]} {d.get('value')}")
            else:
                parts.append(f"{key.split('_')[0]} {kind} ~{_short(d.get('median'))}")
    if w.get("shared_prefix"):
        parts.append("shared prefixes")
    return ", ".join(parts)


def environment_summary(env: dict) -> str:
    parts = []
    if env.get("python"):
        parts.append(f"Python {env['python']}")
    packages = env.get("packages") or {}
    for name in ("torch", "triton"):
        if packages.get(name):
            parts.append(f"{name} {packages[name]}")
    if env.get("cuda_runtime"):
        parts.append(f"CUDA {env['cuda_runtime']}")
    gpus = env.get("gpus") or []
    names = [str(g.get("name")) for g in gpus if isinstance(g, dict) and g.get("name")]
    if names:
        parts.append(f"{len(names)}× {names[0]}" if len(set(names)) == 1 else ", ".join(names))
    elif "gpus" in env:
        parts.append("no GPU")
    if env.get("cpu_model"):
        parts.append(f"{env['cpu_model']} ×{env.get('cpu_count', '?')}")
    if env.get("git_revision"):
        rev = str(env["git_revision"])
        parts.append(f"git {rev[:9]}{' dirty' if rev.endswith('-dirty') else ''}")
    if env.get("hostname"):
        parts.append(f"host {env['hostname']}")
    if env.get("recorded_by"):
        parts.append(str(env["recorded_by"]))
    return " · ".join(parts) or fmt.DASH


def key_metrics(data: RunData) -> tuple[Evidence, ...]:
    """The numbers to read first: what was served, how fast, how long users waited."""
    counts = data.run.row_counts()
    steps = Evidence("steps", "engine steps", counts.get("steps", 0))
    spans = Evidence("spans", "spans", counts.get("spans", 0))
    m = data.get("metrics")
    if m is None:
        return (steps, spans)
    o, t, w = m.outcomes, m.throughput, m.window
    failed = o.error + o.rejected + o.timeout + o.unfinished
    window = "steady state" if w.steady else "whole run"
    out = [
        Evidence("requests", "ok / failed / cancelled",
                 f"{o.ok} / {failed} / {o.cancelled}"),
        Evidence("window", f"window ({window})", w.duration_s, "s"),
        Evidence("out_tps", "output tokens/s", t.output_tokens_per_s),
        Evidence("rps", "requests/s", t.requests_per_s),
    ]  # fmt: skip
    for name, label, dist in (
        ("ttft", "TTFT p50 / p99", m.ttft_s),
        ("tpot", "TPOT p50 / p99", m.tpot_s),
        ("itl", "ITL p50 / p99", m.itl_per_chunk_s),
        ("e2e", "E2E p50 / p99", m.e2e_s),
    ):
        out.append(Evidence(name, label, f"{fmt.ms(dist.p50)} / {fmt.ms(dist.p99)}"))
    if m.goodput is not None:
        out.append(Evidence("slo", "SLO attainment", m.goodput.attainment, "%"))
    out.append(steps)
    return tuple(out)

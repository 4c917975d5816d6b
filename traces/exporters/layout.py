"""Lay a run out as tracks, slices, counters, instants and flows, into any sink.

The passes run in a fixed order, which is also the order of the groups in the viewers
and the tie-break rule of the flows (flows.py): findings (declared first so they sit on
top), requests, the scheduler (steps and their counters), spans (CPU processes, then
GPUs, then anything unattributed), the counters table, and last the findings' instants.
The run is read through the reader, only the columns each pass needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..reader import Run
from .counters import gpu_ranks_of, write_counters
from .findings import Annotation, annotations_from_findings, read_findings
from .flows import StepFlows
from .requests import EVENT_COLUMNS, REQUEST_COLUMNS, request_slices, write_requests
from .sink import Sink, TraceInfo
from .spans import SPAN_COLUMNS, Names, SpanPlan, write_spans
from .steps import step_starts, write_hit_rate, write_steps
from .tracks import INSTANTS, TrackTree

__all__ = ["SPAN_COLUMNS", "LayoutSummary", "trace_info", "write_run"]


@dataclass
class LayoutSummary:
    slices: dict[str, int] = field(default_factory=dict)  # per category (kind)
    counter_samples: int = 0
    instants: int = 0
    flows: int = 0
    warnings: list[str] = field(default_factory=list)

    @property
    def total_slices(self) -> int:
        return sum(self.slices.values())

    @property
    def events(self) -> int:
        return self.total_slices + self.counter_samples + self.instants


def trace_info(run: Run) -> TraceInfo:
    m = run.manifest
    span = run.time_span_ns()
    clock = m.clock or {}
    return TraceInfo(
        run_id=m.run_id,
        source=m.source,
        first_ns=span[0] if span else None,
        monotonic_ns=clock.get("monotonic_ns"),
        wall_ns=clock.get("wall_ns"),
        metadata={
            "perfdiag_version": m.perfdiag_version,
            "status": run.status,
            "clock": clock.get("clock"),
        },
    )


def write_run(
    run: Run, sink: Sink, *, with_args: bool = True, annotations: list[Annotation] | None = None
) -> LayoutSummary:
    """Write the whole run into `sink` (then closed). `annotations`: instants to add;
    by default the run's findings (results/findings.json), if it has any."""
    summary = LayoutSummary()
    info = trace_info(run)
    sink.begin(info)
    tree = TrackTree(sink.declare)
    findings: list[dict] = []
    if annotations is None:
        findings, warning = read_findings(run.path)
        if warning:
            summary.warnings.append(warning)
    findings_track = None
    if findings or annotations:
        findings_track = tree.child(
            ("findings", "instants"), tree.group(("findings",), "Findings"), "findings", INSTANTS
        )

    steps = run.arrow("steps")
    starts = step_starts(steps)
    request_rank = min((r for r, _ in starts), default=-1)
    req_step_start = {sid: s for (r, sid), s in starts.items() if r == request_rank}
    flows = StepFlows()

    events = run.arrow("request_events", [*EVENT_COLUMNS, "num_cached_tokens"])
    requests = run.arrow("requests", REQUEST_COLUMNS)
    slices = request_slices(events, requests, req_step_start)
    counts, summary.flows = write_requests(slices, tree, sink, flows, req_step_start)
    summary.slices.update(counts)
    request_start = {r.request_id: r.start for r in slices}
    del slices

    plan = SpanPlan(run, starts, flows, with_args)  # before the steps: it adds their flows
    gpu_ranks = gpu_ranks_of(plan.cols["rank"], plan.cols["device"])

    n_steps, samples = write_steps(steps, tree, sink, flows, request_rank)
    if n_steps:
        summary.slices["step"] = n_steps
    samples += write_hit_rate(events, requests, tree, sink, request_rank)
    del events

    names = Names(
        run.manifest.extra, "perfdiag" if run.manifest.source == "perfdiag" else "process"
    )
    for cat, n in write_spans(plan, tree, sink, names).items():
        summary.slices[cat] = summary.slices.get(cat, 0) + n
    summary.flows += len(plan.flows.out_ids)
    summary.flows += sum(len(v) for k, v in flows.out.items() if k[0] != "request")
    del plan

    written, skipped = write_counters(run.arrow("counters"), tree, sink, gpu_ranks, request_rank)
    summary.counter_samples = samples + written
    if skipped:
        summary.warnings.append(f"{skipped} NaN counter samples skipped")

    if findings_track is not None:
        if annotations is None:
            run_start = info.first_ns or 0
            annotations = annotations_from_findings(
                findings, req_step_start, request_start, run_start
            )
        for a in annotations:
            args = [("severity", a.severity), ("text", a.text)]
            args += [(k, v) for k, v in (("ref", a.ref), ("check", a.check)) if v]
            sink.instant(findings_track, a.ts_ns, a.title, "finding", args)
        summary.instants = len(annotations)
    sink.close()
    return summary

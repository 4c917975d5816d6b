"""One request's life: its latencies, a timeline from the send (input, queue, prefill
chunks, decode steps, preemptions; deliveries below), its TTFT critical path, the steps
it ran in (enter: the step's kernels) and every recorded event."""

from __future__ import annotations

import pandas as pd
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Label, Static

from .. import fmt
from ..data_requests import PART_LABELS, request_detail
from ..data_steps import SpanIndex, recorded_work
from ..widgets.charts import Chart, decomposition
from ..widgets.frame_table import Column, FrameView, number
from .base import RunScreen

SEGMENT = {"input": ("·", "white"), "queue": ("░", "yellow"), "prefill": ("▓", "magenta"),
           "decode": ("█", "cyan"), "preempted": ("╳", "red")}  # fmt: skip
EVENT_COLUMNS = [
    Column("t_ms", "t ms", 9, number(4)),
    Column("side", "side", 6),
    Column("kind", "event", 14),
    Column("step_id", "step", 6, number(8)),
    Column("num_tokens", "tokens", 6, number()),
    Column("detail", "detail", 20),
]


def timeline(detail, width: int) -> Text:
    """Segments on one row, deliveries on the next, a scale on the third."""
    end = max(detail.end_ms, 1e-9)
    cells = [(" ", "")] * width
    for seg in detail.segments:
        a = int(seg.start_ms / end * width)
        b = max(int(seg.end_ms / end * width), a + 1)
        for c in range(max(a, 0), min(b, width)):
            cells[c] = SEGMENT[seg.kind]
    text = Text()
    for ch, style in cells:
        text.append(ch, style=style or None)
    marks = [" "] * width
    for t in detail.deliveries_ms:
        marks[min(width - 1, max(0, int(t / end * width)))] = "│"
    text.append("\n" + "".join(marks), style="green")
    right = f"{fmt.num(end)} ms"
    text.append("\n0 ms" + right.rjust(width - 4), style="dim")
    key = Text("\n")
    for kind, (ch, style) in SEGMENT.items():
        key.append(f"{ch} ", style=style)
        key.append(f"{kind}  ")
    key.append("│ ", style="green")
    key.append("delivery")
    return text + key


class RequestScreen(RunScreen):
    def __init__(self, data, request_id: str, frame: pd.DataFrame | None = None) -> None:
        super().__init__(data)
        self.request_id = self.key = request_id
        self.name_text = f"request {request_id}"
        self.frame = frame

    def body(self) -> ComposeResult:
        d = request_detail(self.data, self.request_id, self.frame)
        self.detail = d
        if d is None:
            yield Label(f"no request {self.request_id!r} in this run")
            return
        with VerticalScroll(id="request"):
            yield Static(self.summary(), id="request-head")
            yield Chart(lambda w: timeline(d, w), id="request-timeline")
            if d.ttft_parts:
                parts = [(PART_LABELS[k], v) for k, v in d.ttft_parts.items()]
                ttft = d.row.get("ttft_ms", float("nan")) / 1e3
                yield Label("TTFT critical path", classes="section")
                yield Chart(lambda w: decomposition(parts, w, ttft, fmt.ms), id="request-ttft")
            yield Label(f"Steps it ran in ({len(d.steps)})  [dim](enter: kernels)[/]",
                        classes="section")  # fmt: skip
            yield self.steps_table()
            yield Label(f"Events ({len(d.events)})", classes="section")
            ev = d.events.reset_index(drop=True)
            ev.insert(0, "row", [str(i) for i in range(len(ev))])
            yield FrameView(ev, EVENT_COLUMNS, "row", id="request-events", classes="short")

    def summary(self) -> Text:
        r = self.detail.row
        t = Text()
        t.append(f"{self.request_id}  ", style="bold")
        t.append(f"{r['outcome']}", style="green" if r["outcome"] == "ok" else "red")
        if r.get("warmup"):
            t.append(" (warm-up)", style="dim")
        t.append(f" · prompt {fmt.num(r['prompt'])} · output {fmt.num(r['output'])} tokens\n")
        t.append(f"TTFT {fmt.num(r['ttft_ms'])} ms · queue {fmt.num(r['queue_ms'])} ms · "
                 f"TPOT {fmt.num(r['tpot_ms'])} ms · max ITL {fmt.num(r['max_itl_ms'])} ms · "
                 f"E2E {fmt.num(r['e2e_ms'])} ms")  # fmt: skip
        return t

    def steps_table(self) -> DataTable:
        table = DataTable(id="request-steps", cursor_type="row")
        table.add_columns("step", "role", "start ms", "dur ms", "batch", "context", "recorded ops")
        steps = self.detail.steps
        work = recorded_work(self.data.memo("span_index", SpanIndex), steps["step_id"])
        for s in steps.itertuples():
            batch = f"P{s.prefill_seqs}/{s.prefill_tokens} D{s.decode_seqs}"
            n, ns = work.get(int(s.step_id), (0, 0))
            gpu = f"{n:,}" + (f", GPU {fmt.ms_ns(ns)}" if ns else "") if n else fmt.DASH
            table.add_row(str(s.step_id), s.role, fmt.num(s.start_ms, 4), fmt.num(s.dur_ms),
                          batch, fmt.num(s.context_tokens), gpu, key=str(s.step_id))  # fmt: skip
        table.styles.height = min(len(self.detail.steps), 8) + 1
        return table

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id != "request-steps":
            return
        from .step import EngineStepScreen

        self.app.push_screen(EngineStepScreen(self.data, int(str(event.row_key.value))))

    def on_frame_view_opened(self, event: FrameView.Opened) -> None:
        row = self.detail.events.iloc[int(event.ident)]
        if row["step_id"] == row["step_id"]:
            from .step import EngineStepScreen

            self.app.push_screen(EngineStepScreen(self.data, int(row["step_id"])))

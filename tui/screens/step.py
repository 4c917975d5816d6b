"""One engine step: its batch and state, the time of its phases, where it sits on the
roofline, and the kernels, copies and ops recorded in it with their roofline positions."""

from __future__ import annotations

import pandas as pd
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Label, Static

from .. import fmt
from ..data_steps import SpanIndex, step_detail, steps_frame
from ..widgets.charts import Chart, decomposition
from ..widgets.frame_table import Column, FrameView, number
from .base import RunScreen

WORK_COLUMNS = [
    Column("name", "kernel / op", 22, lambda v: fmt.clip(str(v), 22)),
    Column("category", "category", 10),
    Column("resource", "on", 8),
    Column("offset_ms", "at ms", 7, number()),
    Column("dur_us", "dur µs", 8, number()),
    Column("flops", "FLOP", 8, lambda v: fmt.si(v)),
    Column("bytes", "bytes", 8, lambda v: fmt.si(v, "B")),
    Column("intensity", "FLOP/B", 7, number()),
    Column("pct_of_roof", "% roof", 6, number(2)),
    Column("bound", "bound", 9),
]


class EngineStepScreen(RunScreen):
    needs_analysis = False

    def __init__(self, data, step_id: int, frame: pd.DataFrame | None = None) -> None:
        super().__init__(data)
        self.step_id = self.key = int(step_id)
        self.name_text = f"engine step {step_id}"
        self.frame = frame

    def body(self) -> ComposeResult:
        index = self.data.memo("span_index", SpanIndex)
        frame = self.frame if self.frame is not None else self.data.memo("steps", steps_frame)
        d = step_detail(self.data, index, self.step_id, frame)
        self.detail = d
        if d is None:
            yield Label(f"no step {self.step_id} in this run")
            return
        with VerticalScroll(id="step"):
            yield Static(self.summary(), id="step-head")
            if len(d.phases):
                parts = list(zip(d.phases["name"], d.phases["dur_ms"] / 1e3, strict=True))
                total = d.row["dur_ms"] / 1e3
                yield Label("Phases", classes="section")
                yield Chart(lambda w: decomposition(parts, w, total, fmt.ms), id="step-phases")
            yield Static(self.roofline_text(), id="step-roofline")
            yield Label(f"Kernels, copies and ops in the step ({len(d.work)})", classes="section")
            if len(d.work):
                w = d.work.reset_index(drop=True)
                w.insert(0, "row", [str(i) for i in range(len(w))])
                yield FrameView(w, WORK_COLUMNS, "row", id="step-work")
            else:
                yield Label("none recorded (op-level detail needs a profiler window: "
                            "perfdiag run --profile-steps A:B)", classes="note")  # fmt: skip

    def summary(self) -> Text:
        r = self.detail.row
        t = Text()
        t.append(f"step {self.step_id}  ", style="bold")
        n = fmt.num
        t.append(
            f"{r['kind']} · {n(r['dur_ms'])} ms · host after {n(r['host_after_ms'])} ms"
            f" · GPU {n(r['gpu_ms'])} ms\n"
        )
        t.append(
            f"prefill {n(r['prefill_seqs'])} seqs / {n(r['prefill_tokens'])} tokens"
            f" · decode {n(r['decode_seqs'])} seqs · context {n(r['context_tokens'])}"
            f" · waiting {n(r['waiting'])} · running {n(r['running'])} · KV {n(r['kv_pct'], 2)}%"
        )
        return t

    def roofline_text(self) -> Text:
        roof = self.detail.roofline
        c = self.data.roofline.ceilings
        dtype = self.data.roofline.dtype
        t = Text("Roofline: ", style="bold")
        if roof is None:
            t.append("no analytic position (the run's config has no model shape)", style="dim")
            return t
        attained = fmt.si(roof["attained_flops_per_s"], "FLOP/s")
        t.append(
            f"{fmt.num(roof['intensity'])} FLOP/B · {attained}"
            f" · {fmt.pct(roof['pct_of_roof'] / 100)} of its roof · "
        )
        t.append(str(roof["bound"]), style="bold yellow" if roof["bound"] == "latency" else "bold")
        t.append(f"\nceilings: {c.device} {dtype} {fmt.si(c.peak_flops(dtype), 'FLOP/s')}, "
                 f"{fmt.si(c.bytes_per_s, 'B/s')} ({c.source})", style="dim")  # fmt: skip
        return t

"""Every engine step in one table: composition, queue and KV state, time, host time
after it, the roofline's verdict; enter opens the step's kernels and roofline."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import Label

from .. import fmt
from ..data_steps import steps_frame
from ..widgets.frame_table import Column, FrameView, number
from .base import RunScreen

COLUMNS = [
    Column("step_id", "step", 7, number(8)),
    Column("kind", "kind", 7),
    Column("start_ms", "start ms", 9, number(4)),
    Column("dur_ms", "dur ms", 7, number()),
    Column("prefill_tokens", "pf tok", 6, number()),
    Column("decode_seqs", "dec", 4, number()),
    Column("waiting", "wait", 4, number()),
    Column("kv_pct", "KV %", 5, number(2)),
    Column("host_after_ms", "host→ ms", 8, number()),
    Column("pct_of_roof", "% roof", 6, number(2)),
    Column("bound", "bound", 9, lambda v: fmt.DASH if not v or v != v else str(v)),
]


class StepsScreen(RunScreen):
    name_text = "steps"
    needs_analysis = False  # the steps table and the roofline need no triage

    def body(self) -> ComposeResult:
        frame = steps_frame(self.data)
        self.frame = frame
        if not len(frame):
            yield Label("no engine steps in this run (an imported trace has profiler windows: "
                        "see step 4, resources)")  # fmt: skip
            return
        cols = [c for c in COLUMNS if c.key in frame.columns]
        yield FrameView(frame, cols, "key", id="steps-table")

    def on_mount(self) -> None:
        for view in self.query(FrameView):
            view.table.focus()

    def on_frame_view_opened(self, event: FrameView.Opened) -> None:
        from .step import EngineStepScreen

        step_id = int(event.ident.rsplit(":", 1)[-1])
        self.app.push_screen(EngineStepScreen(self.data, step_id, frame=self.frame))

"""Every request in one table: sort (s, or click a header), filter (/), enter opens the
request's timeline. Latencies in ms; `queue` is the TTFT critical path's queue part."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult

from .. import fmt
from ..data_requests import requests_frame
from ..widgets.frame_table import Column, FrameView, number
from .base import RunScreen

OUTCOME_STYLE = {"ok": "green", "cancelled": "dim", "unfinished": "yellow"}


def _outcome(v) -> Text:
    return Text(str(v), style=OUTCOME_STYLE.get(str(v), "red"))


COLUMNS = [  # what a narrow terminal must show comes first
    Column("request_id", "request", 12, lambda v: fmt.clip(str(v), 12)),
    Column("outcome", "outcome", 8, _outcome),
    Column("ttft_ms", "TTFT ms", 8, number()),
    Column("queue_ms", "queue ms", 8, number()),
    Column("e2e_ms", "E2E ms", 8, number()),
    Column("tpot_ms", "TPOT ms", 7, number()),
    Column("max_itl_ms", "max ITL", 7, number()),
    Column("prompt", "prompt", 6, number()),
    Column("output", "out", 5, number()),
    Column("sent_ms", "sent at ms", 10, number(4)),
]


class RequestsScreen(RunScreen):
    name_text = "requests"

    def __init__(self, data, query: str = "") -> None:
        super().__init__(data)
        self.initial_query = query

    def body(self) -> ComposeResult:
        frame = requests_frame(self.data)
        self.frame = frame
        if not len(frame):
            from textual.widgets import Label

            yield Label(f"no requests: {self.data.missing_reason('metrics') or 'none recorded'}")
            return
        view = FrameView(frame, COLUMNS, "request_id", sort="ttft_ms", id="requests")
        view.query_text = self.initial_query
        yield view

    def on_mount(self) -> None:
        for view in self.query(FrameView):
            view.table.focus()

    def on_frame_view_opened(self, event: FrameView.Opened) -> None:
        from .request import RequestScreen

        self.app.push_screen(RequestScreen(self.data, event.ident, frame=self.frame))

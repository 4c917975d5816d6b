"""Step 3: where TTFT and ITL go. Percentiles of every latency, the TTFT critical path
(mean, median band, p99 tail) and the ITL causes (every gap, the spikes) as bars, and
the worst requests (enter: the request's timeline)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import DataTable, Label, Static

from ...analyzers.itl import CAUSES
from .. import fmt
from ..data_requests import PART_LABELS, TTFT_PARTS, requests_frame
from ..widgets.charts import Chart, stacked_bar, swatches
from .checks import TriageStepScreen

ITL_CAUSES = tuple(f"{c}_s" for c in CAUSES)
WORST = 10


def bars(rows: list[tuple[str, list[tuple[str, float]], float]]) -> Chart:
    """Labelled stacked bars on a common scale (the longest total fills the width)."""
    longest = max((total for _, _, total in rows if total == total), default=0.0)

    def draw(width: int) -> Text:
        label_w = max(len(r[0]) for r in rows) + 1
        bar_w = max(width - label_w - 10, 10)
        out = Text()
        for label, parts, total in rows:
            n = round(bar_w * total / longest) if longest else 0
            out.append(label.ljust(label_w), style="bold")
            out.append_text(stacked_bar(parts, max(n, 1), total))
            out.append(f" {fmt.ms(total)}\n")
        return out + swatches([label for label, _ in rows[0][1]], width=width)

    return Chart(draw)


def percentiles(m) -> Table:
    t = Table("latency", "p50", "p90", "p95", "p99", "max", "mean", "n", box=None,
              header_style="bold dim", padding=(0, 1))  # fmt: skip
    for label, d in (("TTFT", m.ttft_s), ("TPOT", m.tpot_s), ("ITL (chunk)", m.itl_per_chunk_s),
                     ("ITL (token)", m.itl_per_token_s), ("E2E", m.e2e_s)):  # fmt: skip
        t.add_row(label, *(fmt.ms(getattr(d, k)) for k in ("p50", "p90", "p95", "p99", "max",
                                                             "mean")), f"{d.count:,}")  # fmt: skip
    return t


class LatencyScreen(TriageStepScreen):
    step = 3

    def evidence(self) -> ComposeResult:
        m = self.data.get("metrics")
        if m is None:
            yield Label(f"no latencies: {self.data.missing_reason('metrics')}", classes="note")
            return
        w = m.window
        window = "steady state" if w.steady else f"whole run: {w.reason.replace('-', ' ')}"
        yield Label(f"Latencies ({m.basis} view; {window})", classes="section")
        yield Static(percentiles(m), id="percentiles")
        ttft = self.data.get("ttft")
        if ttft is not None:
            yield Label("TTFT critical path", classes="section")
            yield bars([(name, [(PART_LABELS[k], getattr(p, k)) for k in TTFT_PARTS], p.ttft_s)
                        for name, p in (("mean", ttft.mean), ("p50", ttft.p50),
                                        ("p99 tail", ttft.p99))])  # fmt: skip
        itl = self.data.get("itl")
        if itl is not None:
            yield Label("ITL causes (mean per gap)", classes="section")
            yield bars([(name, [(k[:-2].replace("_", " "), getattr(p, k)) for k in ITL_CAUSES],
                         p.gap_s) for name, p in (("every gap", itl.mean),
                                                  ("spikes ≥ p99", itl.tail))])  # fmt: skip
        yield Label(f"Worst {WORST} requests by TTFT  [dim](enter: timeline; r: all requests)[/]",
                    classes="section")  # fmt: skip
        yield self.worst_table()

    def worst_table(self) -> DataTable:
        frame = self.data.memo("requests", requests_frame)
        worst = frame.nlargest(WORST, "ttft_ms")
        table = DataTable(id="worst", cursor_type="row")
        table.add_columns("request", "TTFT ms", "queue ms", "prompt", "E2E ms", "outcome")
        for r in worst.itertuples():
            table.add_row(r.request_id, fmt.num(r.ttft_ms), fmt.num(r.queue_ms), fmt.num(r.prompt),
                          fmt.num(r.e2e_ms), r.outcome, key=f"request:{r.request_id}")  # fmt: skip
        table.styles.height = len(worst) + 1
        return table

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        key = str(event.row_key.value)
        if key.startswith("request:"):
            from .request import RequestScreen

            self.app.push_screen(RequestScreen(self.data, key[8:]))
        else:
            super().on_data_table_row_selected(event)

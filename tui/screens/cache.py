"""Step 5: which cache tier hits come from and what they saved; KV memory over the run,
preemptions (what they cost), and whether cold prefixes wait longer than hot ones."""

from __future__ import annotations

import numpy as np
from rich.table import Table
from textual.app import ComposeResult
from textual.widgets import Label, Static

from .. import fmt
from .checks import TriageStepScreen
from .load import series_chart


class CacheScreen(TriageStepScreen):
    step = 5

    def evidence(self) -> ComposeResult:
        cache = self.data.get("cache")
        if cache is None:
            yield Label(f"no cache analysis: {self.data.missing_reason('cache')}", classes="note")
        else:
            yield Static(cache_table(cache), id="cache-numbers")
        steps = self.data.run.steps
        if len(steps) and steps["kv_blocks_used"].notna().any():
            s = steps.sort_values("start_ns")
            used = s["kv_blocks_used"].to_numpy(dtype="float64", na_value=np.nan)
            free = s["kv_blocks_free"].to_numpy(dtype="float64", na_value=np.nan)
            yield Label("KV memory over the steps", classes="section")
            yield series_chart("KV blocks in use", 100 * used / (used + free), "%", 100.0, height=4)
        pre = self.data.get("preemptions")
        if pre is not None:
            yield Static(preemption_table(pre), id="preemptions")
        fair = self.data.get("fairness")
        if fair is not None and fair.classes:
            yield Static(fairness_table(fair), id="fairness")


def cache_table(c) -> Table:
    t = Table("prefix cache", "value", box=None, header_style="bold dim", padding=(0, 1))
    t.add_row("prompt tokens (admitted)", f"{c.prompt_tokens:,}")
    t.add_row("hit at first admission", f"{c.first_admission_hit_tokens:,} ({fmt.pct(c.hit_rate)})")
    t.add_row("requests with hits", f"{c.requests_with_hits:,}")
    t.add_row("hits when resuming (recompute)", f"{c.recompute_hit_tokens:,}")
    for tier in c.tiers:
        t.add_row(f"tier {tier.tier}", f"{tier.hit_tokens:,} tokens in {tier.events:,} hits, "
                                       f"saved {fmt.duration(tier.saved_s)}")  # fmt: skip
    t.add_row("compute saved", f"{fmt.duration(c.saved_s)} ({fmt.pct(c.saved_share)} of step time)")
    t.add_row("cost per prefill token", fmt.duration(c.cost_per_prefill_token_s))
    return t


def preemption_table(p) -> Table:
    t = Table("preemptions", "value", box=None, header_style="bold dim", padding=(0, 1))
    t.add_row("count (recompute / swap)", f"{p.count:,} ({p.recompute:,} / {p.swap:,})")
    t.add_row("recomputed tokens", f"{p.recomputed_tokens:,} ({fmt.duration(p.recompute_cost_s)})")
    t.add_row("swapped tokens", f"{p.swapped_tokens:,}")
    t.add_row("waiting to be resumed", fmt.duration(p.waiting_s))
    return t


def fairness_table(f) -> Table:
    t = Table("prefix class", "groups", "requests", "queue p50", "queue p99", box=None,
              header_style="bold dim", padding=(0, 1))  # fmt: skip
    for c in f.classes:
        t.add_row(c.hotness, str(c.groups), f"{c.requests:,}", fmt.ms(c.queue_wait_s.p50),
                  fmt.ms(c.queue_wait_s.p99))  # fmt: skip
    return t

"""The few figures `perfdiag run` prints when it ends (the full metrics are the serving
analyzers'): outcome counts, output throughput, TTFT and ITL percentiles, client side.

Warm-up requests are excluded. TTFT = first token received − request sent; ITL = gaps
between successive deliveries of one request (one chunk may carry several tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

FAILED = ("error", "rejected")
CANCELLED = ("cancelled", "timeout", "abort")


@dataclass(frozen=True)
class RunSummary:
    requests: int
    completed: int
    failed: int
    cancelled: int
    warmup_excluded: int
    window_s: float  # first send → last completion of the measured requests
    output_tokens: int
    output_tokens_per_s: float
    requests_per_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    itl_p50_s: float
    itl_p99_s: float
    e2e_p50_s: float
    e2e_p99_s: float


def summarize(requests: pd.DataFrame, request_events: pd.DataFrame) -> RunSummary:
    measured = requests[~requests["is_warmup"]]
    ids = set(measured["request_id"])
    ev = request_events[(request_events["side"] == "client")
                        & request_events["request_id"].isin(ids)]  # fmt: skip
    first = ev.pivot_table(index="request_id", columns="kind", values="ts_ns",
                           aggfunc="min", observed=True)  # fmt: skip
    sent = first.get("sent", pd.Series(dtype="float64"))
    ttft = (first.get("first_token") - sent).dropna() / 1e9 if "first_token" in first else []
    e2e = (first.get("done") - sent).dropna() / 1e9 if "done" in first else []
    chunks = ev[ev["kind"] == "chunk"].sort_values(["request_id", "ts_ns"])
    gaps = chunks.groupby("request_id", observed=True)["ts_ns"].diff().dropna() / 1e9
    reasons = measured["finish_reason"].astype(str)
    completed = int(reasons.isin(("stop", "length")).sum())
    window = 0.0
    if len(sent) and "done" in first:
        window = (first["done"].max() - sent.min()) / 1e9
    tokens = int(measured["output_tokens"].fillna(0).sum())
    return RunSummary(
        requests=len(requests),
        completed=completed,
        failed=int(reasons.isin(FAILED).sum()),
        cancelled=int(reasons.isin(CANCELLED).sum()),
        warmup_excluded=int(requests["is_warmup"].sum()),
        window_s=float(window),
        output_tokens=tokens,
        output_tokens_per_s=tokens / window if window > 0 else 0.0,
        requests_per_s=completed / window if window > 0 else 0.0,
        ttft_p50_s=_pct(ttft, 50),
        ttft_p99_s=_pct(ttft, 99),
        itl_p50_s=_pct(gaps, 50),
        itl_p99_s=_pct(gaps, 99),
        e2e_p50_s=_pct(e2e, 50),
        e2e_p99_s=_pct(e2e, 99),
    )


def _pct(values, q: float) -> float:
    arr = np.asarray(values, dtype="float64")
    return float(np.percentile(arr, q)) if arr.size else float("nan")

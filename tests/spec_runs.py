"""Hand-made speculative runs for the analysis tests (issue 38's record format): per step
a `draft` phase, then the verify `forward` and `sample`; per verified request the counters
spec_drafted / spec_accepted / spec_emitted at the step's start, scoped by request id.
Acceptance is drawn i.i.d. per position with probability `alpha`, so the analytical
model's assumption holds by construction and its figures can be checked against it."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd

MS = 1_000_000


def spec_run(alpha=0.7, k=4, steps=200, batch=(2, 3, 4), draft_ms=0.5, fixed_ms=4.0,
             per_seq_ms=0.5, per_draft_ms=0.0, other_ms=1.0, fill=1.0, seed=0,
             method="ngram", kv_dtype="auto"):  # fmt: skip
    """A run of `steps` speculative decode steps over batches cycling through `batch`.
    Verify forward = fixed + per_seq·B + per_draft·(drafted tokens); a request drafts K
    tokens with probability `fill`, else a uniform 0..K-1."""
    rng = np.random.default_rng(seed)
    counters, spans, rows = [], [], []
    t = 0
    for s in range(steps):
        b = batch[s % len(batch)]
        start = t
        drafted_total = 0
        for r in range(b):
            d = k if rng.random() < fill else int(rng.integers(0, k))
            acc = 0
            while acc < d and rng.random() < alpha:
                acc += 1
            drafted_total += d
            rid = f"r{r}"
            for name, value in (("spec_drafted", d), ("spec_accepted", acc),
                                ("spec_emitted", acc + 1)):  # fmt: skip
                counters.append((name, start, float(value), rid))
        fwd = fixed_ms + per_seq_ms * b + per_draft_ms * drafted_total
        parts = (("schedule", other_ms / 2), ("draft", draft_ms), ("forward", fwd * 0.9),
                 ("sample", fwd * 0.1), ("post_process", other_ms / 2))  # fmt: skip
        for name, dur in parts:
            d_ns = round(dur * MS)
            spans.append({"name": name, "category": "phase", "start_ns": t, "dur_ns": d_ns,
                          "step_id": s})  # fmt: skip
            t += d_ns
        rows.append({"step_id": s, "start_ns": start, "end_ns": t, "rank": 0,
                     "num_prefill_tokens": 0, "num_decode_seqs": b})  # fmt: skip
    spec = {"method": method, "num_tokens": k, "draft": "tiny" if method == "draft" else None}
    config = {"engine_config": {"speculative": spec, "cache": {"kv_dtype": kv_dtype}}}
    return SimpleNamespace(
        counters=pd.DataFrame(counters, columns=["name", "ts_ns", "value", "scope"]),
        spans=pd.DataFrame(spans),
        steps=pd.DataFrame(rows),
        manifest=SimpleNamespace(config=config),
    )


def plain_run(steps=200, batch=(2, 3, 4), fixed_ms=4.0, per_seq_ms=0.5, other_ms=1.0):
    """The same load without speculation: decode steps of forward + sample only."""
    spans, rows, t = [], [], 0
    for s in range(steps):
        b = batch[s % len(batch)]
        start = t
        fwd = fixed_ms + per_seq_ms * b
        for name, dur in (("schedule", other_ms / 2), ("forward", fwd * 0.9),
                          ("sample", fwd * 0.1), ("post_process", other_ms / 2)):  # fmt: skip
            d_ns = round(dur * MS)
            spans.append({"name": name, "category": "phase", "start_ns": t, "dur_ns": d_ns,
                          "step_id": s})  # fmt: skip
            t += d_ns
        rows.append({"step_id": s, "start_ns": start, "end_ns": t, "rank": 0,
                     "num_prefill_tokens": 0, "num_decode_seqs": b})  # fmt: skip
    return SimpleNamespace(
        counters=pd.DataFrame(columns=["name", "ts_ns", "value", "scope"]),
        spans=pd.DataFrame(spans),
        steps=pd.DataFrame(rows),
        manifest=SimpleNamespace(config={"engine_config": {"speculative": None}}),
    )


def write_run(path, run, client: bool = False):
    """`run` (spec_run or plain_run) as a run directory: its steps, phases and counters,
    and engine-side lifecycles for its requests (one token event per emitted token; a
    plain run's requests emit one per step they are in). `client`: client events too, a
    step's tokens reaching the client in one chunk 0.1 ms after the step (as a server
    streams speculative output)."""
    from perfdiag.traces.schema import Counter, Request, RequestEvent, Span, Step
    from perfdiag.traces.writer import RunWriter

    steps = run.steps
    c = run.counters
    emitted = c[c["name"] == "spec_emitted"]
    by_step = {}
    if len(emitted):
        ts_step = dict(zip(steps["start_ns"], steps["step_id"], strict=True))
        for ts, rid, n in zip(emitted["ts_ns"], emitted["scope"], emitted["value"], strict=True):
            by_step.setdefault(ts_step[ts], []).append((rid, int(n)))
    else:
        for sid, b in zip(steps["step_id"], steps["num_decode_seqs"], strict=True):
            by_step[sid] = [(f"r{r}", 1) for r in range(b)]
    ends = dict(zip(steps["step_id"], steps["end_ns"], strict=True))
    events, counts, last = [], {}, {}
    rids = sorted({rid for rows in by_step.values() for rid, _ in rows})
    for rid in rids:
        events += [RequestEvent(rid, "arrival", 0), RequestEvent(rid, "queued", 0),
                   RequestEvent(rid, "scheduled", 0, step_id=0)]  # fmt: skip
    for sid in sorted(by_step):
        for rid, n in by_step[sid]:
            for _ in range(n):
                kind = "first_token" if rid not in counts else "token"
                counts[rid] = counts.get(rid, 0) + 1
                events.append(RequestEvent(rid, kind, int(ends[sid]), step_id=int(sid),
                                           num_tokens=counts[rid]))  # fmt: skip
            last[rid] = int(ends[sid])
            if client:
                kind = "first_token" if counts[rid] == n else "chunk"
                at = int(ends[sid]) + MS // 10
                events.append(RequestEvent(rid, kind, at, side="client", num_tokens=n))
                if kind == "first_token":
                    events.append(RequestEvent(rid, "chunk", at, side="client", num_tokens=n))
    for rid in rids:
        events.append(RequestEvent(rid, "finished", last[rid], detail="length"))
        if client:
            events += [RequestEvent(rid, "sent", 0, side="client"),
                       RequestEvent(rid, "done", last[rid] + MS // 5, side="client",
                                    num_tokens=counts[rid])]  # fmt: skip
    config = {"engine_config": run.manifest.config.get("engine_config", {})}
    with RunWriter(path, command=["test"], config=config, environment_info={"test": True}) as w:
        w.table("requests").extend(Request(rid, 16, counts[rid], 0, "length") for rid in rids)
        w.table("request_events").extend(events)
        w.table("steps").extend(
            Step(
                int(r.step_id), int(r.start_ns), int(r.end_ns), 0, 0, int(r.num_decode_seqs), rank=0
            )
            for r in steps.itertuples()
        )
        w.table("spans").extend(
            Span(r.name, "phase", int(r.start_ns), int(r.dur_ns), step_id=int(r.step_id))
            for r in run.spans.itertuples()
        )
        w.table("counters").extend(
            Counter(r.name, int(r.ts_ns), float(r.value), r.scope) for r in c.itertuples()
        )
    return path

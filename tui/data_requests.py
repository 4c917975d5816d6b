"""Requests as the explorer shows them: the table of every request (latencies in ms,
the TTFT critical path's queue part) and one request's life — milestones, the TTFT parts
of this request, the steps it ran in with their composition, and a timeline of segments
(input, queue, prefill chunks, decode steps, preemptions) and deliveries."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..analyzers.ttft import PARTS as TTFT_PARTS
from .data import RunData

PART_LABELS = {"input_s": "input", "queue_s": "queue", "cache_load_s": "cache load",
               "prefill_own_s": "prefill (own)", "step_overhead_s": "step overhead",
               "prefill_others_s": "prefill (others)", "inflation_s": "inflation",
               "probe_s": "probe", "host_gap_s": "host gaps", "sample_return_s": "sample+return",
               "remainder_s": "unexplained"}  # fmt: skip


def requests_frame(data: RunData) -> pd.DataFrame:
    """One row per request; times in ms (what the filter's numbers mean)."""
    m = data.get("metrics")
    if m is None:
        return pd.DataFrame(columns=["request_id"])
    pr = m.per_request
    origin = pr["sent_ns"].min() if pr["sent_ns"].notna().any() else 0
    out = pd.DataFrame(
        {
            "request_id": pr["request_id"].astype(str).to_numpy(),
            "outcome": pr["outcome"].astype(str).to_numpy(),
            "warmup": pr["is_warmup"].to_numpy(),
            "sent_ms": (pr["sent_ns"].astype("float64") - float(origin)).to_numpy() / 1e6,
            "prompt": pr["prompt_tokens"].to_numpy(),
            "output": pr["output_tokens"].to_numpy(),
            "ttft_ms": pr["ttft_s"].to_numpy() * 1e3,
            "tpot_ms": pr["tpot_s"].to_numpy() * 1e3,
            "e2e_ms": pr["e2e_s"].to_numpy() * 1e3,
            "max_itl_ms": pr["max_itl_s"].to_numpy() * 1e3,
        }
    )
    ttft = data.get("ttft")
    if ttft is not None and len(ttft.per_request):
        q = pd.Series(ttft.per_request["queue_s"].to_numpy() * 1e3,
                      index=ttft.per_request["request_id"].astype(str).to_numpy())  # fmt: skip
        out["queue_ms"] = q.reindex(out["request_id"]).to_numpy()
    else:
        out["queue_ms"] = np.nan
    return out


@dataclass(frozen=True)
class Segment:
    kind: str  # input | queue | prefill | decode | preempted | stream
    start_ms: float  # from the send
    end_ms: float
    step_id: int | None = None


@dataclass(frozen=True)
class RequestDetail:
    request_id: str
    row: dict  # the requests_frame row
    ttft_parts: dict[str, float]  # part → seconds (empty when not decomposed)
    events: pd.DataFrame  # t_ms (from the send), side, kind, step_id, num_tokens, detail
    steps: pd.DataFrame  # the steps it ran in: step_id, role, start_ms, dur_ms, composition
    segments: tuple[Segment, ...]
    deliveries_ms: tuple[float, ...]  # client deliveries, from the send
    end_ms: float  # the request's last moment, from the send


def request_detail(data: RunData, request_id: str, frame: pd.DataFrame | None = None):
    """Everything about one request, or None when the run has no such request."""
    frame = requests_frame(data) if frame is None else frame
    hit = frame[frame["request_id"] == request_id]
    if not len(hit):
        return None
    ev = data.run.request_events
    mine = ev[(ev["request_id"] == request_id).to_numpy()].sort_values("ts_ns", kind="stable")
    t_ns = mine["ts_ns"].to_numpy(np.int64)
    side = mine["side"].astype(str).to_numpy()
    kind = mine["kind"].astype(str).to_numpy()
    sent = _first(t_ns, (kind == "sent") & (side == "client"))
    if sent is None:  # engine-only run: the engine's arrival is the start
        sent = _first(t_ns, kind == "arrival")
    if sent is None:
        sent = int(t_ns.min()) if len(t_ns) else 0
    events = pd.DataFrame({
        "t_ms": (t_ns - sent) / 1e6, "side": side, "kind": kind,
        "step_id": mine["step_id"].to_numpy(dtype="float64", na_value=np.nan),
        "num_tokens": mine["num_tokens"].to_numpy(dtype="float64", na_value=np.nan),
        "detail": mine["detail"].astype(object).where(mine["detail"].notna(), "").to_numpy(),
    })  # fmt: skip
    steps = _steps_of(data, events, sent)
    segments = _segments(events, steps)
    client = events[(events["side"] == "client") & (events["kind"] == "chunk")]
    deliveries = tuple(float(x) for x in client["t_ms"])
    if not deliveries:  # engine view: sampled tokens are the deliveries
        eng = events[events["kind"].isin(["first_token", "token"])]
        deliveries = tuple(float(x) for x in eng["t_ms"])
    ends = [float(events["t_ms"].max()) if len(events) else 0.0]
    ends += [s.end_ms for s in segments]
    parts = {}
    ttft = data.get("ttft")
    if ttft is not None:
        p = ttft.per_request[ttft.per_request["request_id"].astype(str) == request_id]
        if len(p):
            parts = {k: float(p[k].iloc[0]) for k in TTFT_PARTS}
    return RequestDetail(request_id, hit.iloc[0].to_dict(), parts, events, steps, tuple(segments),
                         deliveries, max(ends))  # fmt: skip


def _first(t_ns: np.ndarray, m: np.ndarray) -> int | None:
    return int(t_ns[m].min()) if m.any() else None


def _steps_of(data: RunData, events: pd.DataFrame, sent: int) -> pd.DataFrame:
    """The engine steps the request took part in, with what it did in each."""
    e = events[events["step_id"].notna() & (events["side"] == "engine")]
    role = {}
    for sid, k, n in zip(e["step_id"].astype(int), e["kind"], e["num_tokens"], strict=True):
        if k == "prefill_chunk":
            role[sid] = f"prefill {int(n) if n == n else '?'} tok"
        elif k in ("first_token", "token") and sid not in role:
            role[sid] = "decode"
        elif k in ("preempted", "resumed", "scheduled"):
            role.setdefault(sid, k)
    cols = ["step_id", "role", "start_ms", "dur_ms", "prefill_seqs", "prefill_tokens",
            "decode_seqs", "context_tokens"]  # fmt: skip
    if not role or not len(data.run.steps):
        return pd.DataFrame(columns=cols)
    s = data.run.steps
    s = s[s["step_id"].isin(list(role)).to_numpy()].drop_duplicates("step_id")
    s = s.sort_values("start_ns")
    return pd.DataFrame({
        "step_id": s["step_id"].to_numpy(),
        "role": [role[int(i)] for i in s["step_id"]],
        "start_ms": (s["start_ns"].to_numpy(np.int64) - sent) / 1e6,
        "dur_ms": (s["end_ns"] - s["start_ns"]).to_numpy(np.int64) / 1e6,
        "prefill_seqs": s["num_prefill_seqs"].to_numpy(),
        "prefill_tokens": s["num_prefill_tokens"].to_numpy(),
        "decode_seqs": s["num_decode_seqs"].to_numpy(),
        "context_tokens": s["num_context_tokens"].to_numpy(),
    })[cols]  # fmt: skip


def _segments(events: pd.DataFrame, steps: pd.DataFrame) -> list[Segment]:
    """Input (send → tokenised), queue (→ the admitting step), the steps it ran in, and
    preempted stretches (preempted → resumed or the next step it ran in)."""

    def at(kind: str, side: str | None = None) -> float | None:
        m = events["kind"] == kind
        if side:
            m &= events["side"] == side
        return float(events.loc[m, "t_ms"].min()) if m.any() else None

    out = []
    tok = at("tokenize_end") or at("queued") or at("arrival")
    if tok is not None and tok > 0:
        out.append(Segment("input", 0.0, tok))
    first_step = float(steps["start_ms"].min()) if len(steps) else at("scheduled")
    if tok is not None and first_step is not None and first_step > tok:
        out.append(Segment("queue", tok, first_step))
    for sid, role, start, dur in zip(steps["step_id"], steps["role"], steps["start_ms"],
                                     steps["dur_ms"], strict=True):  # fmt: skip
        kind = "prefill" if role.startswith("prefill") else "decode"
        out.append(Segment(kind, float(start), float(start + dur), int(sid)))
    pre = events.loc[events["kind"] == "preempted", "t_ms"].to_numpy()
    for t in pre:
        later = steps["start_ms"][steps["start_ms"] > t]
        back = float(later.min()) if len(later) else float(events["t_ms"].max())
        out.append(Segment("preempted", float(t), back))
    return out

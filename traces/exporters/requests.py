"""Requests as slices: one slice per request, its lifecycle phases nested inside.

From each request's engine events (in time order, ties in recording order):
`tokenize` (arrival → tokenize_end), `queue` (queued → scheduled), one `prefill` slice
per prefill chunk (its step's start, or the previous phase's end if later, → the
chunk's event), `decode` (the end of the last chunk or resume → the next preemption or
the finish), `preempted` (preempted → resumed / scheduled again). Phases are made
sequential (each starts no earlier than the previous one ended), so they never overlap;
the request's slice spans its phases and all its events, client side included, so they
nest inside it. Requests then go to lanes (the lowest free one), so no two overlap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .flows import StepFlows
from .lanes import interval_lanes
from .sink import FLOW_REQUEST_STEP, Sink, Value, flow_id
from .tracks import Track, TrackTree

EVENT_COLUMNS = ["request_id", "kind", "ts_ns", "side", "step_id", "num_tokens", "detail"]
REQUEST_COLUMNS = [
    "request_id",
    "prompt_tokens",
    "output_tokens",
    "cached_tokens",
    "finish_reason",
    "is_warmup",
    "prefix_group",
]
PHASES = ("tokenize", "queue", "prefill", "decode", "preempted")
_NULL = -1


@dataclass
class Phase:
    start: int
    end: int
    kind: str  # one of PHASES (the slice's category)
    name: str
    args: list[tuple[str, Value]] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)  # engine steps it took part in


@dataclass
class RequestSlices:
    request_id: str
    start: int
    end: int
    phases: list[Phase]
    args: list[tuple[str, Value]]


def request_slices(
    events: pa.Table, requests: pa.Table, step_start: dict[int, int]
) -> list[RequestSlices]:
    """Every request with events, sorted by start; `step_start`: step_id → its start."""
    if events.num_rows == 0:
        return []
    rid = pc.dictionary_encode(events["request_id"]).combine_chunks()
    codes = rid.indices.to_numpy(zero_copy_only=False)
    names = rid.dictionary.to_pylist()
    ts = events["ts_ns"].to_numpy()
    order = np.lexsort((np.arange(len(ts)), ts, codes))  # stable: recording order on ties
    kinds = events["kind"].take(order).to_pylist()
    engine = pc.equal(events["side"].take(order), "engine").fill_null(False).to_pylist()
    steps = events["step_id"].take(order).fill_null(_NULL).to_pylist()
    tokens = events["num_tokens"].take(order).to_pylist()
    details = events["detail"].take(order).to_pylist()
    ts_sorted = ts[order].tolist()
    codes_sorted = codes[order]
    bounds = np.flatnonzero(np.diff(codes_sorted)) + 1
    info = _request_args(requests)
    out = []
    for a, b in zip(np.r_[0, bounds].tolist(), np.r_[bounds, len(order)].tolist(), strict=True):
        name = names[codes_sorted[a]]
        rows = range(a, b)
        phases = _phases(
            [(kinds[i], ts_sorted[i], steps[i], tokens[i], details[i]) for i in rows if engine[i]],
            step_start,
        )
        lo = min([ts_sorted[a]] + [p.start for p in phases])
        hi = max([ts_sorted[b - 1]] + [p.end for p in phases])
        out.append(RequestSlices(name, lo, hi, phases, info.get(name, [])))
    out.sort(key=lambda r: (r.start, -r.end))
    return out


def _phases(events: list[tuple], step_start: dict[int, int]) -> list[Phase]:
    phases: list[Phase] = []
    cursor = None  # where the last phase ended: the next one starts no earlier
    open_phase: Phase | None = None
    arrival = None
    chunks = 0
    linked: set[int] = set()

    def add(kind, name, start, end, args=(), steps=()):
        nonlocal cursor
        start = start if cursor is None else max(start, cursor)
        phase = Phase(start, max(end, start), kind, name, list(args), list(steps))
        phases.append(phase)
        cursor = phase.end
        return phase

    def close(at):
        nonlocal open_phase
        if open_phase is not None:
            p, open_phase = open_phase, None
            add(p.kind, p.name, p.start, at, p.args, p.steps)

    def opening(kind, name, at, args=()):
        nonlocal open_phase
        close(at)
        open_phase = Phase(at if cursor is None else max(at, cursor), at, kind, name, list(args))

    for kind, ts, step, ntok, detail in events:
        if kind == "arrival":
            arrival = ts
        elif kind == "tokenize_end" and arrival is not None:
            add("tokenize", "tokenize", arrival, ts)
        elif kind == "queued":
            opening("queue", "queue", ts)
        elif kind in ("scheduled", "resumed"):
            if open_phase is not None and open_phase.kind in ("queue", "preempted"):
                close(ts)
        elif kind == "prefill_chunk":
            start = step_start.get(step, ts)
            start = start if cursor is None else max(start, cursor)
            close(min(start, ts) if open_phase is not None else start)
            chunks += 1
            args = [("chunk", chunks)]
            if ntok is not None:
                args.append(("num_tokens", ntok))
            if step != _NULL:
                args.append(("step_id", step))
            add(
                "prefill",
                f"prefill chunk {chunks}",
                start,
                ts,
                args,
                [step] if step != _NULL and step not in linked else [],
            )
            linked.add(step)
        elif kind in ("first_token", "token"):
            if open_phase is None or open_phase.kind != "decode":
                opening("decode", "decode", ts if cursor is None else cursor)
            if step != _NULL and step not in linked:
                open_phase.steps.append(step)
                linked.add(step)
        elif kind == "preempted":
            mode = detail or "preempted"
            opening("preempted", f"preempted ({mode})", ts, [("mode", mode)])
        elif kind in ("finished", "aborted"):
            close(ts)
    if open_phase is not None:  # a run cut short: the phase lasts to its last event
        close(events[-1][1])
    for p in phases:
        if p.kind == "decode":
            p.args.append(("steps", len(p.steps)))
    return phases


def _request_args(requests: pa.Table) -> dict[str, list[tuple[str, Value]]]:
    if requests.num_rows == 0:
        return {}
    cols = {c: requests[c].to_pylist() for c in REQUEST_COLUMNS if c in requests.column_names}
    out = {}
    for i, rid in enumerate(cols["request_id"]):
        out[rid] = [
            (c, cols[c][i]) for c in REQUEST_COLUMNS[1:] if c in cols and cols[c][i] is not None
        ]
    return out


def write_requests(
    slices: list[RequestSlices],
    tree: TrackTree,
    sink: Sink,
    flows: StepFlows,
    step_start: dict[int, int],
) -> tuple[dict[str, int], int]:
    """Requests on lanes under a "Requests" group, each phase linked to its steps.
    Returns (slices per category, flows)."""
    if not slices:
        return {}, 0
    group = tree.group(("requests",), "Requests")
    lanes = interval_lanes([r.start for r in slices], [r.end for r in slices])
    tracks: list[Track] = []
    counts: dict[str, int] = {"request": len(slices)}
    n = 0
    for r, lane in zip(slices, lanes, strict=True):
        while len(tracks) <= lane:
            tracks.append(tree.child(("requests", len(tracks)), group, f"lane {len(tracks) + 1}"))
        track = tracks[lane]
        sink.slice(track, r.start, r.end - r.start, r.request_id, "request", r.args)
        for p in r.phases:
            outs, ins = [], []
            for step in p.steps:
                s = step_start.get(step)
                if s is None:
                    continue
                fid = flow_id(FLOW_REQUEST_STEP, n)
                n += 1
                if p.start <= s:  # on a tie the phase is first: requests are written first
                    outs.append(fid)
                    flows.into[("request", step)].append(fid)
                else:
                    ins.append(fid)
                    flows.out[("request", step)].append(fid)
            sink.slice(track, p.start, p.end - p.start, p.name, p.kind, p.args, None, outs, ins)
            counts[p.kind] = counts.get(p.kind, 0) + 1
    return counts, n

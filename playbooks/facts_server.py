"""Facts about a server seen only from the client (`perfdiag run --target` of a server
that records nothing for perfdiag): what its timing shows about how it serves.

A server that batches streams the tokens of every request it holds at once: whenever two
or more requests are in flight, their token streams (first token → end) overlap, except
while a newcomer is in its prefill. A server that serves one request at a time never lets
two streams overlap: a request in flight waits, its TTFT running, until the one streaming
ends. That difference is structural, so the test needs no tuned threshold: streams that
overlapped in (almost) none of the time two requests were in flight.
"""

from __future__ import annotations

import numpy as np

from ..analyzers.intervals import union
from .facts import Fact, TriageContext, Unavailable, ev, fact, ms
from .facts_target import server_batches

# Streams overlapping in less than this share of the time ≥ 2 requests were in flight: the
# server served one at a time (a batching server's streams overlap most of that time; the
# slack covers client-side clock jitter at a stream's end).
SERIAL_OVERLAP = 0.05
MIN_REQUESTS, MIN_OVERLAP_SHARE = 8, 0.1
# Streams must fill this share of the requests' time in flight for their overlap to be
# telling: a batching server's streams of one or two tokens against a long TTFT seldom meet.
MIN_STREAMING_SHARE = 0.25


def _time_with_two(starts: np.ndarray, ends: np.ndarray) -> float:
    """Seconds during which at least two of the intervals [start, end) are open."""
    t = np.concatenate([starts, ends])
    step = np.concatenate([np.ones_like(starts), -np.ones_like(ends)])
    order = np.lexsort((step, t))  # at a tie an end (−1) closes before a start opens
    t, open_ = t[order], np.cumsum(step[order])
    return float(np.sum(np.diff(t)[open_[:-1] >= 2]))


@fact(
    "serial_server",
    provides=("requests", "concurrency", "overlap_pct", "queued_ms", "ttft_ms"),
)
def serial_server(ctx: TriageContext) -> Fact | Unavailable:
    """The share of TTFT spent waiting behind other requests' token streams, when the
    server streamed one request at a time (0 when its streams overlapped: it batches)."""
    m = ctx.get("metrics")
    if m is None:
        return ctx.missing("metrics")
    if m.basis != "client" or (ctx.run.steps is not None and len(ctx.run.steps)):
        return Unavailable("the engine's own record shows how it batches (steps, queue)")
    running = server_batches(ctx)
    if running is not None and running > 1:  # its own gauge: no inference from the timing
        return Unavailable(f"the server's metrics show it running {running} requests at once")
    pr = m.per_request
    ok = pr[(pr["outcome"] == "ok") & np.isfinite(pr["ttft_s"]) & np.isfinite(pr["e2e_s"])]
    if len(ok) < MIN_REQUESTS:
        return Unavailable(f"fewer than {MIN_REQUESTS} completed requests")
    sent = ok["sent_ns"].astype("int64").to_numpy() / 1e9
    first, done = sent + ok["ttft_s"].to_numpy(), sent + ok["e2e_s"].to_numpy()
    span = float(done.max() - sent.min())
    in_flight_two = _time_with_two(sent, done)
    if span <= 0 or in_flight_two < MIN_OVERLAP_SHARE * span:
        return Unavailable("requests were rarely two in flight: nothing shows how it batches")
    streaming = float(np.sum(done - first) / np.sum(done - sent))
    if streaming < MIN_STREAMING_SHARE:  # a batching server's short streams rarely meet
        return Unavailable(f"streams are {streaming:.0%} of the time in flight: too short "
                           "against TTFT to show whether they overlap")  # fmt: skip
    overlap = _time_with_two(first, done) / in_flight_two
    # Per request: the part of its TTFT during which another request was streaming (its
    # own stream begins where its TTFT ends, so the union of all streams serves).
    streams = union(np.round(first * 1e9), np.round(done * 1e9)).coverage()
    queued = streams.between(np.round(sent * 1e9), np.round(first * 1e9)) / 1e9
    ttft = first - sent
    value = float(queued.sum() / ttft.sum()) if overlap < SERIAL_OVERLAP else 0.0
    busy = float(np.sum(done - sent) / span)
    evidence = (
        ev("requests", "completed requests", len(ok)),
        ev("concurrency", "requests in flight (mean)", busy),
        ev("overlap_pct", "streams overlapping while ≥ 2 in flight", overlap, "%"),
        ev("queued_ms", "TTFT behind others' streams (mean)", ms(float(queued.mean())), "ms"),
        ev("ttft_ms", "TTFT (mean)", ms(float(ttft.mean())), "ms"),
    )
    return Fact(value, evidence, (), impact=value)

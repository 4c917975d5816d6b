"""Hand-built runs for the serving analyzers, written with RunWriter.

Every time below is in milliseconds after T0, chosen so that each metric and each
decomposition part can be computed by hand; the expected values live in the tests,
with the arithmetic beside them. Tests `import serving_runs` (pytest puts tests/data on
sys.path).
"""

from __future__ import annotations

from pathlib import Path

from perfdiag.traces.schema import Request, RequestEvent, Span, Step
from perfdiag.traces.writer import RunWriter

T0 = 5_000_000_000_000  # ns: large, so nothing can hide in float rounding
MS = 1_000_000


def ns(ms: float) -> int:
    return T0 + round(ms * MS)


def client(rid: str, kind: str, ms: float, tokens: int | None = None) -> RequestEvent:
    return RequestEvent(rid, kind, ns(ms), side="client", num_tokens=tokens)


def engine(rid, kind, ms, step=None, tokens=None, detail=None, cached=None) -> RequestEvent:
    return RequestEvent(rid, kind, ns(ms), "engine", step, tokens, detail, cached)


def step(sid, start, end, *, pf_seqs=0, pf_tokens=0, decode=0, context=0, waiting=0,
         running=0, swapped=0, preempted=0, cached=0) -> Step:  # fmt: skip
    return Step(
        sid, ns(start), ns(end), pf_seqs, pf_tokens, decode, context, waiting, running,
        swapped, preempted, num_cached_tokens=cached,
    )  # fmt: skip


def sample_phase(sid: int, start: float, end: float) -> Span:
    return Span("sample", "phase", ns(start), round((end - start) * MS), step_id=sid)


def write(path: Path, requests, events, steps=(), spans=(), arrival=None) -> Path:
    config = {"run_options": {"workload": {"arrival": arrival}}} if arrival else {}
    with RunWriter(path, command=["test"], config=config, environment_info={"test": True}) as w:
        w.table("requests").extend(requests)
        w.table("request_events").extend(events)
        w.table("steps").extend(steps)
        w.table("spans").extend(spans)
    return path


def basic(path: Path, with_rejection: bool = True) -> Path:
    """Two served requests sharing steps, a cancelled one without engine events, a
    rejected one, a failed one and a warm-up.

    A (prompt 10, 4 tokens): sent 1, tokenised 2, admitted by step 0 [32, 40] (alone;
      sampling from 39), first token at the client at 41. Token 2 from step 1 [42, 45]
      (sampling from 44.5), shared with B's 3-token prefill, delivered at 46. Tokens 3
      and 4 from steps 2 [46, 48] and 3 [48.5, 50.5] (sampling from 47.5 and 50), both
      delivered in one chunk at 52; done at 52.5.
    B (prompt 3, 3 tokens): sent 40, tokenised 40.5, prefilled in step 1 (first token at
      the client 45.5); tokens 2 and 3 from steps 2 and 3, delivered at 48.2 and 51;
      done 51.2.
    C (cancelled, client events only): sent 30, tokens at 33 and 34, done 34.2.
    R rejected (sent 10, done 10.5), E failed (sent 20, done 21), W warm-up (−20 … −14).
    """
    requests = [
        Request("W", 5, 1, 0, "stop", is_warmup=True),
        Request("A", 10, 4, 0, "length"),
        Request("B", 3, 3, 0, "length"),
        Request("C", 5, 2, None, "cancelled"),
        Request("E", 7, 0, None, "error", error="boom"),
    ]
    events = [
        client("W", "sent", -20), client("W", "first_token", -15),
        client("W", "chunk", -15, 1), client("W", "done", -14, 1),
        # A
        client("A", "scheduled_send", 0), client("A", "created", 0), client("A", "sent", 1),
        engine("A", "arrival", 1.5, tokens=10), engine("A", "tokenize_end", 2, tokens=10),
        engine("A", "queued", 2, tokens=10),
        engine("A", "scheduled", 32.2, step=0, tokens=10, cached=0),
        engine("A", "prefill_chunk", 39.5, step=0, tokens=10),
        engine("A", "first_token", 39.5, step=0, tokens=1),
        client("A", "first_token", 41), client("A", "chunk", 41, 1),
        engine("A", "token", 44.8, step=1, tokens=2), client("A", "chunk", 46, 1),
        engine("A", "token", 47.8, step=2, tokens=3),
        engine("A", "token", 50.2, step=3, tokens=4),
        engine("A", "finished", 50.2, step=3, tokens=4, detail="length"),
        client("A", "chunk", 52, 2), client("A", "done", 52.5, 4),
        # B
        client("B", "scheduled_send", 40), client("B", "created", 40), client("B", "sent", 40),
        engine("B", "arrival", 40.2, tokens=3), engine("B", "tokenize_end", 40.5, tokens=3),
        engine("B", "queued", 41, tokens=3),
        engine("B", "scheduled", 42.2, step=1, tokens=3, cached=0),
        engine("B", "prefill_chunk", 44.8, step=1, tokens=3),
        engine("B", "first_token", 44.8, step=1, tokens=1),
        client("B", "first_token", 45.5), client("B", "chunk", 45.5, 1),
        engine("B", "token", 47.8, step=2, tokens=2), client("B", "chunk", 48.2, 1),
        engine("B", "token", 50.2, step=3, tokens=3),
        engine("B", "finished", 50.2, step=3, tokens=3, detail="length"),
        client("B", "chunk", 51, 1), client("B", "done", 51.2, 3),
        # C, E
        client("C", "created", 30), client("C", "sent", 30), client("C", "first_token", 33),
        client("C", "chunk", 33, 1), client("C", "chunk", 34, 1), client("C", "done", 34.2, 2),
        client("E", "created", 20), client("E", "sent", 20), client("E", "done", 21, 0),
    ]  # fmt: skip
    if with_rejection:
        requests.append(Request("R", 9, 0, None, "rejected", error="too long"))
        events += [
            client("R", "created", 10), client("R", "sent", 10),
            engine("R", "arrival", 10.1, tokens=9),
            engine("R", "finished", 10.2, tokens=0, detail="rejected: too long"),
            client("R", "done", 10.5, 0),
        ]  # fmt: skip
    steps = [
        step(0, 32, 40, pf_seqs=1, pf_tokens=10, context=10, running=1),
        step(1, 42, 45, pf_seqs=1, pf_tokens=3, decode=1, context=14, running=2),
        step(2, 46, 48, decode=2, context=16, running=2),
        step(3, 48.5, 50.5, decode=2, context=18, running=2),
    ]
    spans = [sample_phase(0, 39, 39.5), sample_phase(1, 44.5, 44.8),
             sample_phase(2, 47.5, 47.8), sample_phase(3, 50, 50.2)]  # fmt: skip
    return write(path, requests, events, steps, spans)


def preempt(path: Path) -> Path:
    """A recompute preemption between tokens and a swap preemption before a first token.

    D (prompt 32, 3 tokens): sent 0, tokenised 0.5; prefilled alone in step 0 [1, 5]
      (sampling from 4.5), first token at the client 5.5; token 2 from step 1 [6, 7]
      (sampling from 6.6; the step also holds F's 4-token chunk), delivered 7.5;
      preempted (recompute, 33 tokens computed) at 8.1 in step 2 [8, 9]; taken back by
      step 3 [10, 12] with 32 tokens cached, recomputes 2, samples token 3 (sampling
      from 11.5), delivered 12.5; done 12.6.
    F (prompt 8, 1 token, chunks of 4): sent 0.2, tokenised 0.6; first chunk in step 1;
      swapped out at 8.1 (4 tokens computed); swapped back in step 3, the copy ending at
      10.6; second chunk and its first token in step 3, at the client 12.4; done 12.5.
    """
    requests = [Request("D", 32, 3, 0, "length"), Request("F", 8, 1, 0, "length")]
    events = [
        client("D", "created", 0), client("D", "sent", 0),
        engine("D", "arrival", 0.1, tokens=32), engine("D", "tokenize_end", 0.5, tokens=32),
        engine("D", "queued", 0.5, tokens=32),
        engine("D", "scheduled", 1.2, step=0, tokens=32, cached=0),
        engine("D", "prefill_chunk", 4.8, step=0, tokens=32),
        engine("D", "first_token", 4.8, step=0, tokens=1),
        client("D", "first_token", 5.5), client("D", "chunk", 5.5, 1),
        engine("D", "token", 6.8, step=1, tokens=2), client("D", "chunk", 7.5, 1),
        engine("D", "preempted", 8.1, step=2, tokens=33, detail="recompute"),
        engine("D", "scheduled", 10.2, step=3, tokens=2, cached=32),
        engine("D", "resumed", 10.2, step=3, tokens=2, detail="recompute"),
        engine("D", "prefill_chunk", 11.8, step=3, tokens=2),
        engine("D", "token", 11.8, step=3, tokens=3),
        engine("D", "finished", 11.8, step=3, tokens=3, detail="length"),
        client("D", "chunk", 12.5, 1), client("D", "done", 12.6, 3),
        client("F", "created", 0.2), client("F", "sent", 0.2),
        engine("F", "arrival", 0.3, tokens=8), engine("F", "tokenize_end", 0.6, tokens=8),
        engine("F", "queued", 0.6, tokens=8),
        engine("F", "scheduled", 6.2, step=1, tokens=4, cached=0),
        engine("F", "prefill_chunk", 6.8, step=1, tokens=4),
        engine("F", "preempted", 8.1, step=2, tokens=4, detail="swap"),
        engine("F", "resumed", 10.6, step=3, tokens=4, detail="swap"),
        engine("F", "prefill_chunk", 11.8, step=3, tokens=4),
        engine("F", "first_token", 11.8, step=3, tokens=1),
        engine("F", "finished", 11.8, step=3, tokens=1, detail="length"),
        client("F", "first_token", 12.4), client("F", "chunk", 12.4, 1),
        client("F", "done", 12.5, 1),
    ]  # fmt: skip
    steps = [
        step(0, 1, 5, pf_seqs=1, pf_tokens=32, context=32, waiting=1, running=1),
        step(1, 6, 7, pf_seqs=1, pf_tokens=4, decode=1, context=37, running=2),
        step(2, 8, 9, waiting=1, swapped=1, preempted=2),
        step(3, 10, 12, pf_seqs=2, pf_tokens=6, context=42, running=2, cached=32),
    ]
    spans = [sample_phase(0, 4.5, 4.8), sample_phase(1, 6.6, 6.8),
             sample_phase(2, 8.6, 8.8), sample_phase(3, 11.5, 11.8)]  # fmt: skip
    return write(path, requests, events, steps, spans)


def steady(path: Path, n: int = 60, warmup: int = 5, every_ms: float = 10, lasts_ms: float = 50):
    """Client-only: a request sent every `every_ms`, each in flight `lasts_ms` (one token
    delivered at its end); the first `warmup` are warm-up."""
    requests, events = [], []
    for i in range(n):
        rid, sent = f"s{i:03d}", i * every_ms
        requests.append(Request(rid, 4, 1, None, "stop", is_warmup=i < warmup))
        events += [
            client(rid, "scheduled_send", sent), client(rid, "created", sent),
            client(rid, "sent", sent), client(rid, "first_token", sent + lasts_ms),
            client(rid, "chunk", sent + lasts_ms, 1), client(rid, "done", sent + lasts_ms, 1),
        ]  # fmt: skip
    arrival = {"mode": "open", "rate": 1000 / every_ms, "concurrency": None}
    return write(path, requests, events, arrival=arrival)

"""The load client: deliver planned requests to a target and time them as a client sees them.

The client never knows how requests travel: a `Target` streams chunks of output tokens
for a request (the in-process engine, a null engine for tests, an HTTP server later).
Open-loop arrivals are sent on an absolute schedule (each sleep is computed from the
start, so lateness never accumulates) and every request's lateness is recorded; under a
concurrency cap the time a due request waits for a slot is recorded separately.

Client-side events per request (all `time.monotonic_ns()`):
  scheduled_send  the planned send time (open loop only)
  created         the client was ready to send it (woke on schedule / a worker took it)
  sent            handed to the target (after any wait for a slot under a cap)
  first_token     the first chunk carrying tokens arrived
  chunk           every chunk that carried tokens, with its token count
  done            the stream ended (finished, cancelled, timed out, failed or rejected)
lateness = created − scheduled_send; client wait = sent − created.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from .workload import ArrivalSpec, PlannedRequest


class Chunk(NamedTuple):
    token_ids: list[int]  # tokens delivered together (may be empty, e.g. a final marker)
    finished: bool = False
    finish_reason: str | None = None  # the target's: stop | length | abort


class RequestRejected(Exception):
    """The target refused the request (invalid, or back-pressure): a client-visible miss."""


class Target(Protocol):
    def stream(self, request: PlannedRequest) -> AsyncIterator[Chunk]: ...


class ClientSink(Protocol):
    def client_event(self, request_id: str, kind: str, ts_ns: int, num_tokens: int | None) -> None:
        """One client-side lifecycle point."""

    def request_done(self, result: ClientResult) -> None:
        """The request's outcome, once its stream ended."""


@dataclass
class ClientResult:
    request: PlannedRequest
    finish_reason: str  # stop | length | abort | cancelled | timeout | error | rejected
    output_tokens: int = 0
    output_digest: str | None = None
    error: str | None = None
    token_ids: list[int] | None = None  # kept only when asked (--record-text)


@dataclass
class Progress:
    """Live counters for a progress display (read from another task or thread)."""

    total: int
    sent: int = 0
    done: int = 0
    failed: int = 0  # error or rejected
    cancelled: int = 0  # cancelled or timed out by the workload
    output_tokens: int = 0
    max_lateness_ns: int = 0
    results: list[ClientResult] = field(default_factory=list)

    @property
    def in_flight(self) -> int:
        return self.sent - self.done


def digest(token_ids: Iterable[int]) -> str:
    """A stable digest of generated ids: compares runs for correctness without content."""
    h = hashlib.blake2b(digest_size=16)
    for t in token_ids:
        h.update(int(t).to_bytes(8, "little", signed=True))
    return h.hexdigest()


async def drive(
    planned: list[PlannedRequest],
    target: Target,
    sink: ClientSink,
    arrival: ArrivalSpec,
    progress: Progress | None = None,
    keep_token_ids: bool = False,
) -> Progress:
    """Send every planned request per `arrival`; return when all have ended."""
    progress = progress or Progress(total=len(planned))
    client = _Client(target, sink, progress, keep_token_ids)
    if arrival.mode == "closed":
        await client.closed_loop(planned, arrival.concurrency)
    else:
        await client.open_loop(planned, arrival.concurrency)
    return progress


class _Client:
    def __init__(self, target: Target, sink: ClientSink, progress: Progress, keep: bool):
        self.target, self.sink, self.progress = target, sink, progress
        self.keep_token_ids = keep

    async def closed_loop(self, planned: list[PlannedRequest], concurrency: int) -> None:
        queue = iter(planned)

        async def worker() -> None:
            for req in queue:  # workers share one iterator: each request is taken once
                now = time.monotonic_ns()
                self.sink.client_event(req.request_id, "created", now, None)
                await self.send(req)

        await asyncio.gather(*(worker() for _ in range(concurrency)))

    async def open_loop(self, planned: list[PlannedRequest], cap: int | None) -> None:
        slots = asyncio.Semaphore(cap) if cap else None
        tasks = []
        requests = iter(planned)
        # A Plan draws its requests (up to PLAN_CHUNK at once) on the first next(): done
        # before the clock starts, else the first sends are late by the whole draw.
        first = next(requests, None)
        start = time.monotonic_ns()
        for req in itertools.chain(() if first is None else (first,), requests):
            due = start + round(req.offset_s * 1e9)
            delay = due - time.monotonic_ns()
            if delay > 0:
                await asyncio.sleep(delay / 1e9)  # from the absolute schedule: no drift
            now = time.monotonic_ns()
            self.progress.max_lateness_ns = max(self.progress.max_lateness_ns, now - due)
            self.sink.client_event(req.request_id, "scheduled_send", due, None)
            self.sink.client_event(req.request_id, "created", now, None)
            tasks.append(asyncio.create_task(self.send(req, slots)))
        await asyncio.gather(*tasks)

    async def send(self, req: PlannedRequest, slots: asyncio.Semaphore | None = None) -> None:
        if slots is None:
            await self._send(req)
            return
        async with slots:  # a due request that waits here is client back-pressure
            await self._send(req)

    async def _send(self, req: PlannedRequest) -> None:
        self.sink.client_event(req.request_id, "sent", time.monotonic_ns(), None)
        self.progress.sent += 1
        tokens: list[int] = []
        try:
            if req.cancel_after_s is not None:
                result = await asyncio.wait_for(self._consume(req, tokens), req.cancel_after_s)
            else:
                result = await self._consume(req, tokens)
        except asyncio.TimeoutError:
            result = ClientResult(req, "timeout")
        except RequestRejected as e:
            result = ClientResult(req, "rejected", error=str(e) or "rejected")
        except Exception as e:  # a failed request is a result, not the end of the run
            result = ClientResult(req, "error", error=f"{type(e).__name__}: {e}")
        result.output_tokens = len(tokens)
        result.output_digest = digest(tokens)
        if self.keep_token_ids:
            result.token_ids = tokens
        self.sink.client_event(req.request_id, "done", time.monotonic_ns(), len(tokens))
        self._count(result)
        self.sink.request_done(result)

    async def _consume(self, req: PlannedRequest, tokens: list[int]) -> ClientResult:
        stream = self.target.stream(req)
        try:
            async for chunk in stream:
                now = time.monotonic_ns()
                if chunk.token_ids:
                    if not tokens:
                        self.sink.client_event(req.request_id, "first_token", now, None)
                    tokens.extend(chunk.token_ids)
                    self.sink.client_event(req.request_id, "chunk", now, len(chunk.token_ids))
                    self.progress.output_tokens += len(chunk.token_ids)
                if chunk.finished:
                    return ClientResult(req, chunk.finish_reason or "stop")
                if req.cancel_after_tokens is not None and len(tokens) >= req.cancel_after_tokens:
                    return ClientResult(req, "cancelled")
        finally:
            await stream.aclose()  # closing the stream aborts the request at the target
        return ClientResult(req, "error", error="the stream ended without finishing")

    def _count(self, result: ClientResult) -> None:
        p = self.progress
        p.done += 1
        if result.finish_reason in ("error", "rejected"):
            p.failed += 1
        elif result.finish_reason in ("cancelled", "timeout"):
            p.cancelled += 1
        p.results.append(result)

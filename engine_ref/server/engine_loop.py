"""The server's engine loop: `AsyncLLMEngine`'s stepping task and per-request queues, plus
what a server needs around them.

Adding a request is synchronous (`AsyncLLMEngine.open_stream`): a request the engine
refuses raises before any response header is sent (so it can still become a 400), and the
handler owns the stream's lifetime: `release()` aborts a request whose stream ended early
(client gone, timeout), and the engine frees its KV when the step in flight ends.

The loop also observes the engine (a tee in front of the recorder, if any) to know which
requests wait for admission: that count bounds the queue (back-pressure) and feeds the
metrics, and it is kept from the engine's own events rather than from its private state.
"""

from __future__ import annotations

import asyncio
import collections
import time

from ..async_engine import AsyncLLMEngine
from ..hooks import EngineObserver, PhaseEvent, RequestEvent, StepBegin, StepEvent
from ..hooks import RequestEventKind as K
from ..request import SamplingParams
from .metrics import ServerMetrics


class EngineStopped(Exception):
    """The server is shutting down, or the engine failed: the stream cannot go on."""


class _Tracker(EngineObserver):
    """Request states from the engine's events (any thread: set operations are atomic
    under the GIL), forwarded to the inner observer (the run recorder)."""

    def __init__(self, inner: EngineObserver | None, metrics: ServerMetrics | None):
        self.inner, self.metrics = inner, metrics
        self.active: set[str] = set()  # added, not yet finished
        self.waiting: set[str] = set()  # not admitted: new, or preempted by recompute
        self.swapped: set[str] = set()
        self._queued_ns: dict[str, int] = {}
        self._prompt: dict[str, int] = {}
        self._last_token_ns: dict[str, int] = {}
        self.finished_ns: collections.deque[int] = collections.deque(maxlen=256)

    def on_request(self, e: RequestEvent) -> None:
        rid, m = e.request_id, self.metrics
        if e.kind is K.TOKENIZED:
            self._prompt[rid] = e.num_tokens
        elif e.kind is K.QUEUED:
            self._queued_ns[rid] = e.ts_ns
        elif e.kind is K.SCHEDULED:
            self.waiting.discard(rid)
            queued = self._queued_ns.pop(rid, None)
            if queued is not None and m is not None:  # first admission only
                m.queue_time.observe((e.ts_ns - queued) / 1e9)
                m.prefix_queries.inc(self._prompt.get(rid, 0))
                m.prefix_hits.inc(e.num_cached_tokens)
        elif e.kind is K.PREFILL_CHUNK and m is not None:
            m.prompt_tokens.inc(e.num_tokens)
        elif e.kind in (K.FIRST_TOKEN, K.TOKEN):
            last = self._last_token_ns.get(rid)
            self._last_token_ns[rid] = e.ts_ns
            if m is not None:
                m.generation_tokens.inc()
                if last is not None:
                    m.itl.observe((e.ts_ns - last) / 1e9)
        elif e.kind is K.PREEMPTED:
            if m is not None:
                m.preemptions.inc()
            (self.swapped if e.detail == "swap" else self.waiting).add(rid)
        elif e.kind is K.RESUMED:
            self.swapped.discard(rid)
            self.waiting.discard(rid)
        elif e.kind is K.FINISHED:
            self.forget(rid)
            self.finished_ns.append(e.ts_ns)
            if m is not None and not e.detail.startswith("rejected"):
                m.success(e.detail)
        if self.inner is not None:
            self.inner.on_request(e)

    def forget(self, rid: str) -> None:
        for s in (self.active, self.waiting, self.swapped):
            s.discard(rid)
        for d in (self._queued_ns, self._prompt, self._last_token_ns):
            d.pop(rid, None)

    def on_step_begin(self, e: StepBegin) -> None:
        if self.inner is not None:
            self.inner.on_step_begin(e)

    def on_phase(self, e: PhaseEvent) -> None:
        if self.inner is not None:
            self.inner.on_phase(e)

    def on_kv_offload(self, restores, counts) -> None:
        if self.inner is not None:
            self.inner.on_kv_offload(restores, counts)

    def on_step(self, e: StepEvent) -> None:
        if self.inner is not None:
            self.inner.on_step(e)


class EngineLoop:
    def __init__(self, engine, metrics: ServerMetrics | None = None) -> None:
        self.engine = engine
        self.tracker = _Tracker(engine.observer, metrics)
        engine.observer = self.tracker
        self._front = AsyncLLMEngine(
            engine,
            on_failure=lambda e: EngineStopped(f"the engine failed: {type(e).__name__}: {e}"),
        )
        self._stopping = False

    @property
    def error(self) -> BaseException | None:
        """The exception that broke the engine, if any."""
        return self._front.error

    # ---- state ---------------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self.tracker.waiting)

    @property
    def num_running(self) -> int:
        t = self.tracker
        return max(0, len(t.active) - len(t.waiting) - len(t.swapped))

    def kv_usage(self) -> float:
        bm = self.engine.block_manager
        return bm.num_used_blocks / bm.num_blocks

    def is_active(self, request_id: str) -> bool:
        return request_id in self.tracker.active

    def retry_after_s(self) -> int:
        """How long the waiting queue takes to drain at the recent completion rate."""
        done = list(self.tracker.finished_ns)
        now = time.monotonic_ns()
        recent = [t for t in done if now - t < 30e9]
        if len(recent) < 2:
            return 1
        rate = (len(recent) - 1) / max((recent[-1] - recent[0]) / 1e9, 1e-3)
        return int(min(60, max(1, round(self.num_waiting / rate))))

    # ---- requests ------------------------------------------------------------------------
    def add(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> asyncio.Queue:
        """Queue a request; raises InvalidRequestError (nothing changed) or EngineStopped."""
        if self._stopping:
            raise EngineStopped("the server is shutting down")
        t = self.tracker
        t.active.add(request_id)  # before the engine can schedule it from the step thread
        t.waiting.add(request_id)
        try:
            _, queue = self._front.open_stream(prompt_ids, params, request_id)
        except BaseException:
            t.forget(request_id)
            raise
        return queue

    def release(self, request_id: str) -> bool:
        """The stream is over: abort the request if the engine still holds it. Returns
        whether it was aborted (its KV is freed when the step in flight ends)."""
        return self._front.release(request_id, abort=request_id in self.tracker.active)

    async def close(self) -> None:
        """End every stream, abort every request, stop stepping."""
        self._stopping = True
        self._front.fail_streams(EngineStopped("the server is shutting down"))
        for rid in list(self.tracker.active):
            self.engine.abort(rid)
        await self._front.close()
        self.engine.observer = self.tracker.inner

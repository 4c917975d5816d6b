"""An asyncio front for the engine: many concurrent streams, one stepping thread.

`generate()` is an async iterator of `RequestOutput`s for one request. A background task
steps the engine in a one-thread executor (so the event loop stays free while the model
runs) and routes each step's outputs to the streams. A client that stops iterating (its task
cancelled, the iterator closed) aborts its request; the engine releases the request's KV
when the step in flight ends.

`open_stream()` / `release()` are the same machinery for callers that own a stream's
lifetime themselves (the HTTP server): adding is synchronous, so a refused request raises
before anything was streamed, and releasing aborts a request whose stream ended early.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor

from .engine import LLMEngine, Prompt
from .request import RequestOutput, SamplingParams


class AsyncLLMEngine:
    def __init__(
        self,
        engine: LLMEngine,
        on_failure: Callable[[Exception], BaseException] | None = None,
    ) -> None:
        """`on_failure(e)` makes the item every open stream receives when a step raises
        `e` (default: `e` itself)."""
        self.engine = engine
        self._on_failure = on_failure or (lambda e: e)
        self._streams: dict[str, asyncio.Queue] = {}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-step")
        self._task: asyncio.Task | None = None
        self._wakeup: asyncio.Event | None = None
        self.error: Exception | None = None  # what broke the engine, if anything did

    def open_stream(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        cache_salt: str | None = None,
    ) -> tuple[str, asyncio.Queue]:
        """Add a request now (raises InvalidRequestError, changing nothing, if refused) and
        return its id and the queue its outputs (or a failure) arrive on. The caller must
        `release()` it when the stream ends."""
        rid = self.engine.add_request(prompt, params, request_id, cache_salt=cache_salt)
        # No step output can be routed before this line: routing runs on this event loop.
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[rid] = queue
        self._ensure_loop()
        return rid, queue

    def release(self, request_id: str, abort: bool = True) -> bool:
        """Stop routing to the stream; with `abort`, abort the request if the engine still
        holds it (its KV is freed when the step in flight ends). Returns whether it was."""
        self._streams.pop(request_id, None)
        return self.engine.abort(request_id) if abort else False

    async def generate(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        cache_salt: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        rid, queue = self.open_stream(prompt, params, request_id, cache_salt)
        finished = False
        try:
            while True:
                out = await queue.get()
                if isinstance(out, BaseException):
                    raise out
                finished = out.finished
                yield out
                if finished:
                    return
        finally:
            self.release(rid, abort=not finished)

    async def generate_all(self, prompt: Prompt, params: SamplingParams | None = None) -> list[int]:
        """All of one request's output token ids, once it finishes."""
        tokens: list[int] = []
        async for out in self.generate(prompt, params):
            tokens.extend(out.new_token_ids)
        return tokens

    async def abort(self, request_id: str) -> bool:
        return self.engine.abort(request_id)

    def fail_streams(self, item: BaseException) -> None:
        """Put `item` on every open stream (they end with it)."""
        for q in self._streams.values():
            q.put_nowait(item)

    def _ensure_loop(self) -> None:
        if self._wakeup is None:
            self._wakeup = asyncio.Event()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        self._wakeup.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self.engine.has_unfinished_requests():
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            try:
                outputs = await loop.run_in_executor(self._executor, self.engine.step)
            except Exception as e:  # a broken engine ends every stream with the error
                self.error = e
                self.fail_streams(self._on_failure(e))
                raise
            for out in outputs:
                q = self._streams.get(out.request_id)
                if q is not None:
                    q.put_nowait(out)

    async def close(self) -> None:
        """Stop stepping (after the step in flight) and release the stepping thread."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        loop = asyncio.get_running_loop()
        # After the step in flight (one worker, first in first out), on the stepping thread.
        with contextlib.suppress(Exception):
            await loop.run_in_executor(self._executor, self._close_observer)
        # Off the event loop: the step in flight may take a while to end.
        await loop.run_in_executor(None, self._executor.shutdown, True)

    def _close_observer(self) -> None:
        if self.engine.observer is not None:
            self.engine.observer.on_close()

    async def __aenter__(self) -> AsyncLLMEngine:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

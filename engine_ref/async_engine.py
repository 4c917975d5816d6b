"""An asyncio front for the engine: many concurrent streams, one stepping thread.

`generate()` is an async iterator of `RequestOutput`s for one request. A background task
steps the engine in a one-thread executor (so the event loop stays free while the model
runs) and routes each step's outputs to the streams. A client that stops iterating (its task
cancelled, the iterator closed) aborts its request; the engine releases the request's KV
when the step in flight ends.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from .engine import LLMEngine, Prompt
from .request import RequestOutput, SamplingParams


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._streams: dict[str, asyncio.Queue] = {}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-step")
        self._task: asyncio.Task | None = None
        self._wakeup: asyncio.Event | None = None

    async def generate(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        cache_salt: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        rid = self.engine.add_request(prompt, params, request_id, cache_salt=cache_salt)
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[rid] = queue
        self._ensure_loop()
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
            self._streams.pop(rid, None)
            if not finished:
                self.engine.abort(rid)

    async def generate_all(self, prompt: Prompt, params: SamplingParams | None = None) -> list[int]:
        """All of one request's output token ids, once it finishes."""
        tokens: list[int] = []
        async for out in self.generate(prompt, params):
            tokens.extend(out.new_token_ids)
        return tokens

    async def abort(self, request_id: str) -> bool:
        return self.engine.abort(request_id)

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
                for q in self._streams.values():
                    q.put_nowait(e)
                raise
            for out in outputs:
                q = self._streams.get(out.request_id)
                if q is not None:
                    q.put_nowait(out)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._executor.shutdown(wait=True)

    async def __aenter__(self) -> AsyncLLMEngine:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

"""Targets the load client can drive: the in-process reference engine, and a null engine.

The null engine answers at once (optionally pacing tokens), so tests and benchmarks can
measure the client itself: its arrival accuracy, its back-pressure accounting.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from .client import Chunk, RequestRejected
from .workload import PlannedRequest


class NullTarget:
    """Answers every request with `max_tokens` tokens, `tokens_per_chunk` at a time, each
    chunk `token_interval_s` after the previous one (0: at once)."""

    def __init__(self, token_interval_s: float = 0.0, tokens_per_chunk: int = 1):
        self.token_interval_s = token_interval_s
        self.tokens_per_chunk = tokens_per_chunk

    async def stream(self, request: PlannedRequest) -> AsyncIterator[Chunk]:
        produced = 0
        while produced < request.max_tokens:
            if self.token_interval_s:
                await asyncio.sleep(self.token_interval_s)
            n = min(self.tokens_per_chunk, request.max_tokens - produced)
            ids = list(range(produced, produced + n))
            produced += n
            done = produced >= request.max_tokens
            yield Chunk(ids, done, "length" if done else None)
            if not self.token_interval_s:
                await asyncio.sleep(0)  # let other requests run, as a real target would


class EngineTarget:
    """The in-process reference engine behind its asyncio front (one stepping thread)."""

    def __init__(self, async_engine, *, ignore_eos: bool = True, temperature: float = 0.0):
        self.engine = async_engine
        self.ignore_eos = ignore_eos  # planned output lengths are honoured exactly
        self.temperature = temperature

    async def stream(self, request: PlannedRequest) -> AsyncIterator[Chunk]:
        from ..engine_ref import InvalidRequestError, SamplingParams

        params = SamplingParams(
            temperature=self.temperature,
            max_tokens=request.max_tokens,
            ignore_eos=self.ignore_eos and not request.stop_at_eos,
            seed=request.index,
        )
        prompt = list(request.prompt_ids) if request.prompt_ids is not None else request.prompt_text
        template = getattr(self.engine.engine.tokenizer, "apply_chat_template", None)
        if request.chat and template is not None:  # a real model's own chat format
            prompt = template([{"role": "user", "content": prompt}])
        outputs = self.engine.generate(prompt, params, request.request_id)
        try:
            async for out in outputs:
                yield Chunk(list(out.new_token_ids), out.finished, out.finish_reason)
        except InvalidRequestError as e:
            raise RequestRejected(str(e)) from None
        finally:
            await outputs.aclose()  # a client that stops early aborts in the engine

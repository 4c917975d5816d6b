"""Data-parallel replicas: N whole engines in one process behind a router (`--dp N`).

Each replica is an `LLMEngine` with its own weights, KV pool, scheduler and prefix cache,
stepped by its own `AsyncLLMEngine` (one stepping thread each); the router picks a
replica per request on the event loop. Why threads in one process rather than a process
per replica: every replica's hook events reach one recorder on one clock with nothing to
ship or align, and a torch forward releases the GIL, so the replicas' forwards overlap;
what does not overlap is their Python host work (scheduling, sampling bookkeeping), which
takes turns on the GIL. The session splits torch's threads between the replicas so that
they do not oversubscribe the cores.

`generate()` matches `AsyncLLMEngine.generate`, so the load client drives replicas as it
drives one engine.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable, Sequence

from .async_engine import AsyncLLMEngine
from .block_manager import block_hash, hash_root
from .engine import LLMEngine, Prompt
from .request import RequestOutput, SamplingParams
from .router import Router


def prefix_keys(engine: LLMEngine, ids: Sequence[int], cache_salt: str | None) -> list[bytes]:
    """The chained hashes of the prompt's full blocks, as `engine`'s prefix cache keys them
    (the blocks a prefix hit can serve: the last token is always computed)."""
    if not engine.config.cache.enable_prefix_caching:
        return []
    bs = engine.block_manager.block_size
    parent, keys = hash_root(engine.fingerprint, cache_salt), []
    for i in range((len(ids) - 1) // bs):
        parent = block_hash(parent, i, ids[i * bs : (i + 1) * bs])
        keys.append(parent)
    return keys


class AsyncReplicas:
    def __init__(
        self,
        engines: Sequence[LLMEngine],
        router: Router,
        on_route: Callable[[str, int], None] | None = None,
    ) -> None:
        """`on_route(request_id, replica)` is told each decision before the request is
        added (the recorder files the request under its replica)."""
        if len(engines) != router.replicas:
            raise ValueError(f"{len(engines)} engines for a router of {router.replicas}")
        self.engines = list(engines)
        self.fronts = [AsyncLLMEngine(e) for e in engines]
        self.router = router
        self.on_route = on_route
        self._ids = itertools.count()

    @property
    def engine(self) -> LLMEngine:
        """Replica 0: the tokenizer and configuration every replica shares."""
        return self.engines[0]

    async def generate(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        cache_salt: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        rid = f"req-{next(self._ids)}" if request_id is None else str(request_id)
        params = params or SamplingParams()
        ids = self.engine.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        keys = prefix_keys(self.engine, ids, cache_salt) if self.router.policy.uses_prefixes else ()
        route = self.router.route(rid, len(ids), params.max_tokens, keys)
        if self.on_route is not None:
            self.on_route(rid, route.replica)
        outputs = self.fronts[route.replica].generate(prompt, params, rid, cache_salt)
        try:
            async for out in outputs:
                self.router.progress(rid, len(out.new_token_ids))
                yield out
        finally:
            await outputs.aclose()  # a client that stops early aborts in the replica
            self.router.finish(rid)

    async def close(self) -> None:
        await asyncio.gather(*(f.close() for f in self.fronts))

    async def __aenter__(self) -> AsyncReplicas:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

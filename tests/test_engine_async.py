"""The asyncio front: concurrent streams, client cancellation, same tokens as generate()."""

from __future__ import annotations

import asyncio

import pytest

from perfdiag.engine_ref import (
    AsyncLLMEngine,
    InvalidRequestError,
    LLMEngine,
    RecordingObserver,
    RequestEventKind,
    SamplingParams,
)
from perfdiag.engine_ref.testing import tiny_config

PARAMS = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
PROMPTS = [[256, *range(i, i + 5 + 3 * i)] for i in range(5)]


def test_concurrent_streams_match_generate():
    want = [o.token_ids for o in LLMEngine(tiny_config()).generate(PROMPTS, PARAMS)]

    async def main():
        async with AsyncLLMEngine(LLMEngine(tiny_config())) as aengine:

            async def one(prompt):
                toks, chunks = [], 0
                async for out in aengine.generate(prompt, PARAMS):
                    toks.extend(out.new_token_ids)
                    chunks += 1
                assert out.finished and out.finish_reason == "length"
                return toks, chunks

            return await asyncio.gather(*(one(p) for p in PROMPTS)), aengine.engine

    results, engine = asyncio.run(main())
    assert [toks for toks, _ in results] == want
    assert all(chunks == 12 for _, chunks in results)  # streamed one step at a time
    assert engine.is_drained()


def test_client_cancellation_aborts_and_frees():
    obs = RecordingObserver()

    async def main():
        engine = LLMEngine(tiny_config(), observer=obs)
        async with AsyncLLMEngine(engine) as aengine:
            long = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)

            async def consume(n_before_cancel=None):
                got = 0
                async for _ in aengine.generate([256, 1, 2, 3], long):
                    got += 1
                    if n_before_cancel is not None and got == n_before_cancel:
                        raise asyncio.CancelledError  # the client goes away mid-stream
                return got

            task = asyncio.create_task(consume(3))
            with pytest.raises(asyncio.CancelledError):
                await task
            others = await asyncio.gather(*(aengine.generate_all(p, PARAMS) for p in PROMPTS[:2]))
            for _ in range(100):  # the engine thread releases at the end of its step
                if engine.is_drained():
                    break
                await asyncio.sleep(0.01)
            return engine, others

    engine, others = asyncio.run(main())
    assert engine.is_drained()
    assert all(len(o) == 12 for o in others)
    fin = [e for e in obs.requests if e.kind == RequestEventKind.FINISHED]
    cancelled = next(e for e in fin if e.request_id == "req-0")
    assert cancelled.detail == "abort" and cancelled.num_tokens < 200


def test_bad_request_raises_in_the_caller():
    async def main():
        async with AsyncLLMEngine(LLMEngine(tiny_config())) as aengine:
            with pytest.raises(InvalidRequestError):
                async for _ in aengine.generate([], PARAMS):
                    pass
            return await aengine.generate_all([256, 5], PARAMS)

    assert len(asyncio.run(main())) == 12

"""The server under stress: clients that drop mid-stream free their KV; past the waiting
bound it answers 429, and every request is accounted for in both runs' records."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp

from perfdiag.engine_ref import CacheConfig, LLMEngine, SchedulerConfig
from perfdiag.engine_ref.server import ServerConfig, ServerThread
from perfdiag.engine_ref.testing import tiny_config
from perfdiag.probes.http_session import HttpOptions, record_http_run
from perfdiag.probes.run_options import ProbeOptions, RunOptions
from perfdiag.probes.server_probe import ServerRun
from perfdiag.probes.workload import ArrivalSpec, LengthSpec, WorkloadSpec
from perfdiag.traces.reader import load_run


def _wait_drained(engine, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if engine.is_drained():
            return True
        time.sleep(0.01)
    return engine.is_drained()


def test_clients_dropped_mid_stream_free_their_kv(tmp_path):
    engine = LLMEngine(tiny_config())
    run = ServerRun(tmp_path / "srv", engine, ServerConfig(port=0), device_sampling=False)
    with ServerThread(engine, ServerConfig(port=0), run.recorder, run.run_id) as srv:

        async def one(i: int, drop_after: int | None):
            body = {"prompt": [256, *range(i, i + 30)], "max_tokens": 60, "ignore_eos": True,
                    "stream": True}  # fmt: skip
            async with aiohttp.ClientSession() as s:
                resp = await s.post(f"{srv.url}/v1/completions", json=body,
                                    headers={"x-request-id": f"drop-{i}"})  # fmt: skip
                got = 0
                async for line in resp.content:
                    if line.startswith(b"data: {"):
                        got += 1
                        if drop_after is not None and got >= drop_after:
                            resp.close()  # the connection goes: the server must notice
                            return "dropped"
                return "finished"

        async def before_first_token(i: int):
            body = {"prompt": [256, *range(90)], "max_tokens": 30, "stream": True}
            async with aiohttp.ClientSession() as s:
                task = asyncio.ensure_future(
                    s.post(
                        f"{srv.url}/v1/completions",
                        json=body,
                        headers={"x-request-id": f"early-{i}"},
                    )
                )
                await asyncio.sleep(0.002)  # sent, then gone while it waits or prefills
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                return "dropped"

        async def main():
            jobs = [one(i, drop_after=2 + i % 3) for i in range(6)]
            jobs += [one(100, None)] + [before_first_token(i) for i in range(3)]
            return await asyncio.gather(*jobs)

        results = asyncio.run(main())
        assert results.count("finished") == 1
        assert _wait_drained(engine), "KV leaked: free blocks != the pool"
        bm = engine.block_manager
        assert bm.num_free_blocks == bm.num_blocks
    run.close("complete")
    r = load_run(tmp_path / "srv")
    reasons = dict(zip(r.requests["request_id"], r.requests["finish_reason"], strict=True))
    assert reasons["drop-100"] == "length"
    assert all(reasons[f"drop-{i}"] == "cancelled" for i in range(6))
    ev = r.request_events
    aborted = set(ev.loc[(ev["kind"] == "aborted") & (ev["side"] == "engine"), "request_id"])
    assert {f"drop-{i}" for i in range(6)} <= aborted  # aborted in the engine, not just closed


def test_overload_gets_429_and_every_request_is_accounted_for(tmp_path):
    # One running sequence at a time and a waiting bound of 2: a burst must overflow.
    config = tiny_config(scheduler=SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=64,
                                                   chunk_size=16),
                         cache=CacheConfig(block_size=4, num_gpu_blocks=256))  # fmt: skip
    engine = LLMEngine(config)
    server_config = ServerConfig(port=0, max_waiting=2)
    run = ServerRun(tmp_path / "srv", engine, server_config, device_sampling=False)
    with ServerThread(engine, server_config, run.recorder, run.run_id) as srv:
        spec = WorkloadSpec(requests=24, arrival=ArrivalSpec(mode="open", rate=2000.0,
                                                             process="constant"),
                            prompt_len=LengthSpec(value=12),
                            output_len=LengthSpec(value=20))  # fmt: skip
        options = RunOptions(workload=spec, probes=ProbeOptions(device_sampling=False))
        result = record_http_run(options, tmp_path / "cli", http=HttpOptions(url=srv.url))
        assert result.status == "complete"
        assert _wait_drained(engine)
    run.close("complete")
    client, server = load_run(tmp_path / "cli"), load_run(tmp_path / "srv")
    c = client.requests.set_index("request_id")
    assert len(c) == 24 and c.index.is_unique  # none lost on the client
    assert set(c["finish_reason"]) <= {"length", "rejected"}
    rejected = c[c["finish_reason"] == "rejected"]
    assert len(rejected) > 0 and (c["finish_reason"] == "length").sum() >= 3
    assert rejected["error"].str.startswith("HTTP 429").all()
    assert all(json.loads(a)["http"]["retry_after"] for a in rejected["args"])
    s = server.requests.set_index("request_id")
    s = s[~s.index.str.startswith("perfdiag-probe")]
    assert set(s.index) == set(c.index)  # none lost on the server either
    both = c[["finish_reason"]].join(s[["finish_reason"]].add_suffix("_server"))
    assert (both["finish_reason"] == both["finish_reason_server"]).all()
    assert (c.loc[c["finish_reason"] == "length", "output_tokens"] == 20).all()

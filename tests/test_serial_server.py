"""A server seen only from the client: one that streams one request at a time (as
llama-cpp-python's does) is told from one that batches, by whether token streams overlap."""

from __future__ import annotations

import asyncio
import json
import threading

from aiohttp import web

from perfdiag import load_run
from perfdiag.playbooks.evaluate import run_triage
from perfdiag.playbooks.facts import TriageContext, evaluate_fact
from perfdiag.probes.http_session import HttpOptions, record_http_run
from perfdiag.probes.run_options import ProbeOptions, RunOptions
from perfdiag.probes.workload import ArrivalSpec, LengthSpec, WorkloadSpec

PREFILL_S, TOKEN_S, TOKENS = 0.02, 0.01, 8


def _app(serial: bool) -> web.Application:
    lock = asyncio.Lock() if serial else None

    async def models(request):
        return web.json_response({"data": [{"id": "m"}]})

    async def generate(resp, n):
        await asyncio.sleep(PREFILL_S)
        for i in range(n):
            if i:
                await asyncio.sleep(TOKEN_S)
            choice = {"index": 0, "text": " x", "finish_reason": "length" if i == n - 1 else None}
            await resp.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")

    async def completions(request):
        body = await request.json()
        if not body.get("stream"):
            return web.json_response({"choices": [{"text": "x", "finish_reason": "length"}]})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if lock is None:
            await generate(resp, body["max_tokens"])
        else:
            async with lock:  # one request at a time, the others wait their turn
                await generate(resp, body["max_tokens"])
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    return app


def _record(tmp_path, serial: bool, concurrency: int = 3):
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box = {}

    async def serve():
        runner = web.AppRunner(_app(serial))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        box["url"], box["runner"] = f"http://127.0.0.1:{runner.addresses[0][1]}", runner
        started.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(serve()),
                                              loop.run_forever()), daemon=True)  # fmt: skip
    thread.start()
    started.wait(10)
    try:
        spec = WorkloadSpec(requests=12, warmup=0,
                            arrival=ArrivalSpec(mode="closed", concurrency=concurrency),
                            prompt_len=LengthSpec(value=8),
                            output_len=LengthSpec(value=TOKENS))  # fmt: skip
        out = tmp_path / ("serial" if serial else "batching")
        options = RunOptions(workload=spec, probes=ProbeOptions(device_sampling=False))
        record_http_run(options, out, http=HttpOptions(url=box["url"], scrape_period_s=None))
    finally:
        asyncio.run_coroutine_threadsafe(box["runner"].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    return load_run(out)


def test_a_server_that_streams_one_request_at_a_time_is_named(tmp_path):
    run = _record(tmp_path, serial=True)
    fact = evaluate_fact("serial_server", TriageContext(run), {})
    # At concurrency 3 a request waits for about two others' streams out of its TTFT.
    assert fact.value > 0.5
    overlap = next(e.value for e in fact.evidence if e.name == "overlap_pct")
    assert overlap < 0.05
    finding = run_triage(TriageContext(run)).by_check("server-serializes")
    assert finding is not None and finding.severity == "critical"


def test_a_batching_server_is_not(tmp_path):
    run = _record(tmp_path, serial=False)
    fact = evaluate_fact("serial_server", TriageContext(run), {})
    assert fact.value == 0.0
    assert next(e.value for e in fact.evidence if e.name == "overlap_pct") > 0.5
    assert run_triage(TriageContext(run)).by_check("server-serializes") is None


def test_one_request_at_a_time_from_the_client_tells_nothing(tmp_path):
    run = _record(tmp_path, serial=True, concurrency=1)
    fact = evaluate_fact("serial_server", TriageContext(run), {})
    assert "rarely two in flight" in fact.reason


def test_the_check_reads_only_client_views(sample_run):
    # An engine's own run shows its batching directly (steps, queue): not this fact's job.
    fact = evaluate_fact("serial_server", TriageContext(load_run(sample_run[0])), {})
    assert hasattr(fact, "reason")

"""The HTTP load client against small fake servers: token counts per chunk from ids, from
running usage or from final usage only; the text fallback; refusals and failures; its own
health (event-loop lag, CPU); scraping /metrics."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest
from aiohttp import web

from perfdiag.probes.client import drive
from perfdiag.probes.http_session import LoopMonitor
from perfdiag.probes.http_target import HttpTarget, ids_to_text
from perfdiag.probes.metrics_scrape import MetricsScraper
from perfdiag.probes.workload import ArrivalSpec, LengthSpec, WorkloadSpec, plan

SEEN = web.AppKey("seen", list)


class Sink:
    def __init__(self):
        self.chunks, self.results, self.events = {}, {}, []

    def client_event(self, rid, kind, ts, n):
        self.events.append((rid, kind, n))
        if kind == "chunk":
            self.chunks.setdefault(rid, []).append(n)

    def request_done(self, result):
        self.results[result.request.request_id] = result


def fake_app(mode: str, per_chunk: int = 3, accept_ids: bool = True, status: int = 200,
             uuid_request_ids: bool = False):  # fmt: skip
    """An OpenAI-ish server: `mode` ids | usage | final (how it reports token counts);
    `uuid_request_ids`: an x-request-id that is not a UUID gets an empty 400, as
    llama-cpp-python's server (starlette-context) answers."""
    seen = []

    async def models(request):
        return web.json_response({"data": [{"id": "fake", "max_model_len": 4096}]})

    async def completions(request):
        if uuid_request_ids:
            try:
                uuid.UUID(request.headers.get("x-request-id", ""))
            except ValueError:
                return web.Response(status=400)
        body = await request.json()
        seen.append(body)
        if not accept_ids and isinstance(body["prompt"], list):
            return web.json_response({"error": {"message": "text only"}}, status=400)
        if mode == "final" and "return_token_ids" in body:
            return web.json_response({"error": {"message": "unknown field"}}, status=400)
        if status != 200 and body.get("stream"):  # the probe passes, real requests fail
            return web.json_response({"error": {"message": "nope"}}, status=status,
                                     headers={"Retry-After": "3"})  # fmt: skip
        if not body.get("stream"):
            return web.json_response({"choices": [{"text": "x", "finish_reason": "length"}]})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n, sent = body["max_tokens"], 0
        while sent < n:
            k = min(per_chunk, n - sent)
            sent += k
            choice = {
                "index": 0,
                "text": "ab" * k,
                "finish_reason": "length" if sent == n else None,
            }
            if mode == "ids":
                choice["token_ids"] = list(range(sent - k, sent))
            chunk = {"choices": [choice]}
            if mode == "usage":
                chunk["usage"] = {"prompt_tokens": 5, "completion_tokens": sent}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        usage = {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": n + 5}
        await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    app[SEEN] = seen
    return app


async def _serve(app):
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


def run_against(app, n=4, max_tokens=7, **target_kw):
    spec = WorkloadSpec(
        requests=n,
        arrival=ArrivalSpec(mode="closed", concurrency=2),
        prompt_len=LengthSpec(value=6),
        output_len=LengthSpec(value=max_tokens),
    )

    async def main():
        runner, url = await _serve(app)
        sink = Sink()
        try:
            async with HttpTarget(url, on_event=sink.client_event, **target_kw) as target:
                await drive(plan(spec, 256), target, sink, spec.arrival)
        finally:
            await runner.cleanup()
        return sink, target

    return asyncio.run(main())


@pytest.mark.parametrize("mode", ["ids", "usage"])
def test_multi_token_chunks_counted_exactly(mode):
    sink, target = run_against(fake_app(mode, per_chunk=3), max_tokens=7)
    for rid, result in sink.results.items():
        assert result.finish_reason == "length" and result.output_tokens == 7
        assert sink.chunks[rid] == [3, 3, 1]
        rec = target.records[rid]
        assert rec.token_counts == mode and rec.multi_token_chunks == 2
        assert rec.unattributed_tokens == 0 and rec.usage_completion_tokens == 7


def test_final_usage_only_flags_tokens_it_cannot_place():
    app = fake_app("final", per_chunk=3)
    sink, target = run_against(app, max_tokens=7)
    assert target.info.extras is False  # the server refused the extensions: driven without
    assert "return_token_ids" not in app[SEEN][-1]
    for rid in sink.results:
        assert sink.chunks[rid] == [1, 1, 1]  # one per text chunk, the only guess possible
        rec = target.records[rid]
        assert rec.token_counts == "chunks" and rec.unattributed_tokens == 4


def test_text_prompts_when_the_server_refuses_token_ids():
    app = fake_app("ids", accept_ids=False)
    sink, target = run_against(app)
    assert target.info.prompt_format == "text"
    prompt = app[SEEN][-1]["prompt"]
    assert isinstance(prompt, str) and len(prompt.split()) == 6
    assert all(r.finish_reason == "length" for r in sink.results.values())
    assert ids_to_text([0, 1, 2]) == "the of and"


def test_uuid_request_ids_when_the_server_wants_them():
    sink, target = run_against(fake_app("ids", uuid_request_ids=True), n=3)
    assert target.info.request_ids == "uuid" and target.info.prompt_format == "ids"
    assert all(r.finish_reason == "length" for r in sink.results.values())
    sent = {target.records[rid].request_id_sent for rid in sink.results}
    assert len(sent) == 3 and all(uuid.UUID(s) for s in sent)  # one fresh UUID each
    _, plain = run_against(fake_app("ids"), n=2)
    assert plain.info.request_ids == "plain"  # the workload's ids, where the server takes them
    assert all(rec.request_id_sent is None for rec in plain.records.values())


@pytest.mark.parametrize(("status", "reason"), [(429, "rejected"), (400, "rejected"),
                                                (503, "error")])  # fmt: skip
def test_refusals_and_failures_are_results(status, reason):
    sink, target = run_against(fake_app("ids", status=status), n=3, prompt_format="ids")
    assert [r.finish_reason for r in sink.results.values()] == [reason] * 3
    for rid, r in sink.results.items():
        assert f"HTTP {status}: nope" in r.error
        assert target.records[rid].status == status
        if status == 429:
            assert target.records[rid].retry_after == "3"


def test_loop_monitor_flags_a_blocked_client():
    rows = []

    async def main():
        mon = LoopMonitor(rows.append, period_s=0.005, window_s=0.05)
        task = asyncio.create_task(mon.run())
        await asyncio.sleep(0.06)
        end = time.monotonic() + 0.4
        while time.monotonic() < end:  # the client's own work hogs its loop
            pass
        await asyncio.sleep(0.06)
        task.cancel()
        return mon.summary()

    health = asyncio.run(main())
    assert health["client_bound"] and health["loop_lag_max_ms"] >= 300
    assert {r[0] for r in rows} == {"client_loop_lag_max_s", "client_loop_cpu_pct",
                                    "client_process_cpu_pct"}  # fmt: skip
    assert health["busy"]  # its own work: the client was the bottleneck


def test_a_loop_delayed_while_the_hypervisor_steals_names_the_steal(monkeypatch):
    from collections import namedtuple

    from perfdiag.probes import http_session

    times = namedtuple("times", "user system idle steal")
    readings = iter([times(0, 0, 0, 0), times(40, 10, 20, 30)])  # 30 % of the time stolen
    monkeypatch.setattr(http_session, "_machine_cpu", lambda: next(readings))

    async def main():
        mon = LoopMonitor(lambda row: None, period_s=0.005, window_s=0.05)
        task = asyncio.create_task(mon.run())
        for _ in range(12):  # the loop is paused, not busy: a vCPU given to others
            await asyncio.sleep(0.01)
            time.sleep(0.03)
            await asyncio.sleep(0.03)
        task.cancel()
        return mon.summary()

    health = asyncio.run(main())
    assert health["client_bound"] and not health["busy"]
    assert health["host_steal_pct"] == pytest.approx(30.0)
    assert "the hypervisor took 30%" in health["reasons"][-1]


def test_scrape_metrics_into_counters():
    from perfdiag.engine_ref import LLMEngine
    from perfdiag.engine_ref.server import ServerConfig, start_server
    from perfdiag.engine_ref.testing import tiny_config

    rows = []

    async def main():
        srv = await start_server(LLMEngine(tiny_config()), ServerConfig(port=0))
        async with srv, HttpTarget(srv.url) as target:
            scraper = MetricsScraper(target.session, f"{srv.url}/metrics", rows.append, 0.05)
            task = asyncio.create_task(scraper.run())
            await asyncio.sleep(0.2)
            task.cancel()

    asyncio.run(main())
    names = {r[0] for r in rows}
    assert "vllm:num_requests_running" in names and "vllm:kv_cache_usage_perc" in names
    assert "vllm:request_success_total{finished_reason=length}" in names  # the probe request
    assert all(r[3] == "target" for r in rows)
    # Histogram buckets are kept: the server's percentiles are estimated from them.
    assert any(n.startswith("vllm:time_to_first_token_seconds_bucket{") for n in names)


def _metrics_of_run(path):
    from perfdiag.analyzers.lifecycle import build_lifecycle
    from perfdiag.analyzers.metrics import serving_metrics
    from perfdiag.analyzers.steady_state import find_window
    from perfdiag.traces.reader import load_run

    lc = build_lifecycle(load_run(path))
    return serving_metrics(lc, find_window(lc.requests, lc.origin_ns, steady=False))


def _record_against(url, tmp_path, n, tokens):
    from perfdiag.probes.http_session import HttpOptions, record_http_run
    from perfdiag.probes.run_options import ProbeOptions, RunOptions

    spec = WorkloadSpec(
        requests=n,
        warmup=0,
        arrival=ArrivalSpec(mode="closed", concurrency=2),
        prompt_len=LengthSpec(value=6),
        output_len=LengthSpec(value=tokens),
    )
    options = RunOptions(workload=spec, probes=ProbeOptions(device_sampling=False))
    record_http_run(options, tmp_path, http=HttpOptions(url=url, scrape_period_s=None))
    return _metrics_of_run(tmp_path)


def test_itl_per_token_and_per_chunk_from_a_multi_token_stream(tmp_path):
    """3 + 3 + 1 tokens per request: 2 gaps per chunk, 6 per token, whatever the timing."""
    import threading

    holder, ready, stop = {}, threading.Event(), threading.Event()

    def thread():
        async def main():
            runner, url = await _serve(fake_app("ids", per_chunk=3))
            holder["url"] = url
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.01)
            await runner.cleanup()

        asyncio.run(main())

    t = threading.Thread(target=thread, daemon=True)
    t.start()
    ready.wait()
    try:
        m = _record_against(holder["url"], tmp_path / "run", n=5, tokens=7)
    finally:
        stop.set()
        t.join()
    assert m.outcomes.ok == 5
    assert m.itl_per_chunk_s.count == 5 * 2 and m.itl_per_token_s.count == 5 * 6
    assert m.tokens_per_chunk.max == 3 and m.tokens_per_chunk.count == 15
    assert m.output_tokens.mean == 7


def test_itl_per_token_and_per_chunk_against_perfdiag_serve(tmp_path):
    from perfdiag.engine_ref import LLMEngine
    from perfdiag.engine_ref.server import ServerConfig, ServerThread
    from perfdiag.engine_ref.testing import tiny_config

    with ServerThread(LLMEngine(tiny_config()), ServerConfig(port=0)) as srv:
        m = _record_against(srv.url, tmp_path / "run", n=6, tokens=10)
    assert m.outcomes.ok == 6 and m.output_tokens.mean == 10
    assert m.itl_per_token_s.count == 6 * 9  # N − 1 per request, however tokens were chunked
    chunks = m.tokens_per_chunk.count
    assert m.itl_per_chunk_s.count == chunks - 6 and 6 <= chunks <= 60
    assert m.ttft_s.count == 6 and m.ttft_s.p50 > 0

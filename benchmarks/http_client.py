"""Benchmark the HTTP load client: can it offer the rate it is asked for?

A null server (aiohttp, in its own process, streaming every token at once: it costs the
client nothing to wait for) is driven by `perfdiag run --target`'s client, exactly as
shipped (recorder, loop monitor, one connection pool), open loop at constant target rates
up to 500 req/s. Reported per rate: the achieved offered rate (sends / their span), the
lateness of sends against the absolute schedule (p50, p99, max), the share completed, and
the client's own event-loop lag and CPU.

    .venv/bin/python benchmarks/http_client.py [--seconds 4] [--rates 50,100,200,300,400,500]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from perfdiag import load_run
from perfdiag.probes.http_session import HttpOptions, record_http_run
from perfdiag.probes.run_options import ProbeOptions, RunOptions
from perfdiag.probes.workload import ArrivalSpec, LengthSpec, WorkloadSpec
from perfdiag.traces.environment import cpu_model, package_version

TOKENS = 8


def null_server() -> None:
    """Serve /v1/models and streaming /v1/completions that answer instantly."""
    from aiohttp import web

    async def models(request):
        return web.json_response({"data": [{"id": "null"}]})

    async def completions(request):
        body = await request.json()
        if not body.get("stream"):
            return web.json_response({"choices": [{"text": "x", "finish_reason": "length"}]})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n = body["max_tokens"]
        parts = []
        for i in range(n):
            choice = {"index": 0, "text": "x", "token_ids": [i],
                      "finish_reason": "length" if i == n - 1 else None}  # fmt: skip
            parts.append(f"data: {json.dumps({'choices': [choice]})}\n\n")
        usage = {"prompt_tokens": 16, "completion_tokens": n, "total_tokens": n + 16}
        parts.append(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n")
        await resp.write("".join(parts).encode())
        return resp

    async def main():
        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/completions", completions)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        print(runner.addresses[0][1], flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


def machine() -> str:
    return (f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"aiohttp {package_version('aiohttp')}")  # fmt: skip


def one_rate(url: str, rate: float, seconds: float, tmp: Path) -> dict:
    n = max(20, int(rate * seconds))
    arrival = ArrivalSpec(mode="open", rate=rate, process="constant")
    spec = WorkloadSpec(requests=n, warmup=0, arrival=arrival, prompt_len=LengthSpec(value=16),
                        output_len=LengthSpec(value=TOKENS))  # fmt: skip
    out = tmp / f"rate-{rate:g}"
    options = RunOptions(workload=spec, probes=ProbeOptions(device_sampling=False))
    record_http_run(options, out, http=HttpOptions(url=url, scrape_period_s=None))
    run = load_run(out)
    ev = run.request_events
    first = ev[ev["side"] == "client"].groupby(["request_id", "kind"], observed=True)["ts_ns"].min()
    wide = first.unstack("kind")
    sent = np.sort(wide["sent"].to_numpy(dtype="int64"))
    late = (wide["created"] - wide["scheduled_send"]).to_numpy(dtype="float64") / 1e6
    ok = (run.requests["finish_reason"] == "length").mean()
    health = run.manifest.extra["client_health"]
    return {
        "target": rate,
        "achieved": (len(sent) - 1) / ((sent[-1] - sent[0]) / 1e9),
        "late_p50": float(np.percentile(late, 50)),
        "late_p99": float(np.percentile(late, 99)),
        "late_max": float(late.max()),
        "ok": float(ok),
        "lag_p99": health["loop_lag_p99_ms"],
        "cpu": health["loop_cpu_pct_mean"],
        "bound": health["client_bound"],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rates", default="50,100,200,300,400,500")
    ap.add_argument("--null-server", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.null_server:
        null_server()
        return
    proc = subprocess.Popen([sys.executable, __file__, "--null-server"], stdout=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        url = f"http://127.0.0.1:{int(proc.stdout.readline())}"
        print(f"machine: {machine()}")
        print(
            f"null server: a separate process; {TOKENS} tokens per request, constant "
            f"arrivals, {args.seconds:g} s per rate, no concurrency cap"
        )
        print(f"{'target/s':>9} {'achieved/s':>11} {'ratio':>6} {'late p50 ms':>12} "
              f"{'late p99 ms':>12} {'late max ms':>12} {'ok':>5} {'loop lag p99 ms':>16} "
              f"{'loop CPU %':>10}  client-bound")  # fmt: skip
        with tempfile.TemporaryDirectory() as tmp:
            for rate in (float(r) for r in args.rates.split(",")):
                r = one_rate(url, rate, args.seconds, Path(tmp))
                ratio = r["achieved"] / r["target"]
                print(f"{r['target']:9.0f} {r['achieved']:11.1f} {ratio:6.3f} "
                      f"{r['late_p50']:12.3f} {r['late_p99']:12.3f} {r['late_max']:12.3f} "
                      f"{r['ok']:5.0%} {r['lag_p99']:16.2f} {r['cpu']:10.0f}  "
                      f"{'yes' if r['bound'] else 'no'}", flush=True)  # fmt: skip
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()

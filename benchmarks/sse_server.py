"""A minimal OpenAI-style SSE server for load-generator benchmarks (its own process).

Streams `max_tokens` one-token chunks (token_ids carried, usage at the end), the first after
`--ttft-ms` and the others `--itl-ms` apart, on /v1/completions and /v1/chat/completions,
so any OpenAI client (perfdiag's, aiperf's) can drive it. It records the monotonic time
each request arrived (headers read; CLOCK_MONOTONIC is one clock for the whole host) with
its x-request-id: `GET /arrivals` returns them as [ns, id] pairs and clears the list.
Prints its port on stdout.

    python benchmarks/sse_server.py [--ttft-ms 1] [--itl-ms 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time


def main() -> None:
    from aiohttp import web

    ap = argparse.ArgumentParser()
    ap.add_argument("--ttft-ms", type=float, default=1.0)
    ap.add_argument("--itl-ms", type=float, default=1.0)
    args = ap.parse_args()
    arrivals: list[tuple[int, str]] = []

    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": "null", "object": "model"}]})

    async def take_arrivals(request):
        out = list(arrivals)
        arrivals.clear()
        return web.json_response(out)

    async def generate(request):
        arrivals.append((time.monotonic_ns(), request.headers.get("x-request-id", "")))
        body = await request.json()
        chat = request.path.endswith("/chat/completions")
        n = int(body.get("max_completion_tokens") or body.get("max_tokens") or 8)
        if not body.get("stream"):
            await asyncio.sleep((args.ttft_ms + (n - 1) * args.itl_ms) / 1e3)
            msg = (
                {"message": {"role": "assistant", "content": "x" * n}}
                if chat
                else {"text": "x" * n}
            )
            usage = {"prompt_tokens": 16, "completion_tokens": n, "total_tokens": 16 + n}
            return web.json_response({"id": "x", "choices": [{"index": 0, **msg,
                                      "finish_reason": "length"}], "usage": usage})  # fmt: skip
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        kind = "chat.completion.chunk" if chat else "text_completion"
        await asyncio.sleep(args.ttft_ms / 1e3)
        for i in range(n):
            if i:
                await asyncio.sleep(args.itl_ms / 1e3)
            part = {"delta": {"content": "x"}} if chat else {"text": "x"}
            choice = {"index": 0, **part, "token_ids": [i],
                      "finish_reason": "length" if i == n - 1 else None}  # fmt: skip
            chunk = {"id": "x", "object": kind, "model": "null", "choices": [choice]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        usage = {"prompt_tokens": 16, "completion_tokens": n, "total_tokens": n + 16}
        tail = {"id": "x", "object": kind, "model": "null", "choices": [], "usage": usage}
        await resp.write(f"data: {json.dumps(tail)}\n\ndata: [DONE]\n\n".encode())
        return resp

    async def serve():
        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_get("/arrivals", take_arrivals)
        app.router.add_post("/v1/completions", generate)
        app.router.add_post("/v1/chat/completions", generate)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0, backlog=4096).start()
        print(runner.addresses[0][1], flush=True)
        await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    main()

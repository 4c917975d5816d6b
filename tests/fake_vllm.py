"""A vLLM look-alike for the launch and profiler tests (aiohttp, ready in under a second):
/health, /version, /v1/models (owned_by vllm), /metrics with `vllm:cache_config_info`,
streaming /v1/completions with token ids and usage, and — only when launched with
`--profiler-config` (as vLLM) — /start_profile and /stop_profile, which write a small
Kineto trace per tensor-parallel rank plus the frontend's, slowly, after answering.
Environment: FAKE_PROFILE_FAIL (start_profile answers 500), FAKE_STOP_S (stop's delay).
"""

import argparse
import asyncio
import json
import os
import time

from aiohttp import web

p = argparse.ArgumentParser()
p.add_argument("words", nargs="*")  # `vllm serve MODEL`, or none when run as a script
p.add_argument("--port", type=int)
p.add_argument("--max-num-seqs", type=int)
p.add_argument("--token-delay", type=float, default=0.0)
p.add_argument("--tensor-parallel-size", type=int, default=1)
p.add_argument("--profiler-config", type=json.loads)
a = p.parse_args()
print("INFO fake vLLM starting", flush=True)
INFO = (
    'vllm:cache_config_info{block_size="16",enable_prefix_caching="True",'
    'num_gpu_blocks="364"} 1.0\n'
)
FAIL = os.environ.get("FAKE_PROFILE_FAIL")
state = {"on": False, "steps": [], "base": None}


async def health(r):
    return web.Response(text="")


async def version(r):
    return web.json_response({"version": "0.0.fake"})


async def models(r):
    return web.json_response(
        {"object": "list", "data": [{"id": "m", "owned_by": "vllm", "max_model_len": 512}]}
    )


async def metrics(r):
    return web.Response(text=INFO + "vllm:num_requests_running 0.0\n")


async def completions(r):
    body = await r.json()
    if not body.get("stream"):
        return web.json_response({"choices": [{"text": "x", "finish_reason": "length"}]})
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(r)
    n = body["max_tokens"]
    for i in range(n):
        await asyncio.sleep(a.token_delay)
        choice = {
            "index": 0,
            "text": "ab",
            "token_ids": [i],
            "finish_reason": "length" if i == n - 1 else None,
        }
        await resp.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
    usage = {"prompt_tokens": 6, "completion_tokens": n, "total_tokens": n + 6}
    await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
    await resp.write(b"data: [DONE]\n\n")
    return resp


async def stepping():
    k = 0
    while state["on"]:
        t0 = time.time_ns()
        await asyncio.sleep(0.01)
        state["steps"].append(
            (f"execute_context_0(0)_generation_{k % 3}({k % 3})", t0, time.time_ns())
        )
        k += 1
        await asyncio.sleep(0.01)


async def start_profile(r):
    if FAIL:
        return web.Response(status=500, text="profiler exploded")
    state.update(on=True, steps=[], base=time.time_ns())
    asyncio.get_running_loop().create_task(stepping())
    return web.Response()


def trace(events):
    base = state["base"]
    return {
        "schemaVersion": 1,
        "baseTimeNanoseconds": base,
        "traceEvents": [
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": 7,
                "tid": 7,
                "ts": (t0 - base) / 1e3,
                "dur": (t1 - t0) / 1e3,
                "args": {},
            }
            for cat, name, t0, t1 in events
        ],
    }


async def write_traces(steps):
    out = a.profiler_config["torch_profiler_dir"]
    now = time.time_ns()
    front = [("user_annotation", "async_llm_frontend", state["base"], now)]
    with open(f"{out}/host_{os.getpid()}.async_llm.{now}.pt.trace.json", "w") as f:
        json.dump(trace(front), f)
    for rank in range(a.tensor_parallel_size):
        events = []
        for name, t0, t1 in steps:
            events += [("user_annotation", name, t0, t1), ("cpu_op", "aten::mm", t0, t1 - 1000)]
        text = json.dumps(trace(events))
        with open(f"{out}/dp0_pp0_tp{rank}_dcp0_pcp0_ep0_rank{rank}.{now}.pt.trace.json", "w") as f:
            f.write(text[: len(text) // 2])
            f.flush()
            await asyncio.sleep(0.8)  # written after /stop_profile answered, slowly
            f.write(text[len(text) // 2 :])
        with open(f"{out}/dp0_pp0_tp{rank}_dcp0_pcp0_ep0_rank{rank}.profiler_out.txt", "w") as f:
            f.write("table\n")


async def stop_profile(r):
    state["on"] = False
    await asyncio.sleep(float(os.environ.get("FAKE_STOP_S", "0.05")))
    asyncio.get_running_loop().create_task(write_traces(list(state["steps"])))
    return web.Response()


def main():
    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/version", version)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", completions)
    if a.profiler_config:  # as vLLM: the routes exist only with the profiler configured
        app.router.add_post("/start_profile", start_profile)
        app.router.add_post("/stop_profile", stop_profile)
    web.run_app(app, host="127.0.0.1", port=a.port, print=None)


if __name__ == "__main__":
    main()

"""Hand-built runs for the TUI's tests and snapshots, written with RunWriter.

A tiny, deterministic serving run: 12 requests arriving every 4 ms to an engine that
batches continuously with chunked prefill, one engine thread (phases, launch calls) and
one GPU stream (kernels with FLOPs and bytes), KV usage per step. Every time is fixed
(integer nanoseconds after T0) and the manifest's clock-derived fields are overwritten,
so a screen drawn from it is the same on every machine. `demo(path, chunk=…)` builds a
variant: a smaller chunk is the "one main variable changed" of a comparison, and
`flip` changes one request's output (a correctness failure).

Loaded by path (tests/data is not a package), as serving_runs.py is.
"""

from __future__ import annotations

import json
from pathlib import Path

from perfdiag.traces.schema import Counter, Request, RequestEvent, Span, Step
from perfdiag.traces.writer import RunWriter

T0 = 9_000_000_000_000
US = 1_000
MS = 1_000_000
THREAD = {"pid": 100, "tid": 1}
GPU = {"device": 0, "stream": 7}
MODEL = {"architecture": "llama", "vocab_size": 1000, "hidden_size": 256,
         "intermediate_size": 512, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
         "head_dim": 64}  # fmt: skip
PROMPTS = (40, 120, 24, 200, 60, 16, 90, 150, 32, 48, 180, 20)
OUTPUTS = (6, 4, 8, 5, 6, 8, 4, 6, 7, 5, 4, 8)


def demo(path: Path, *, chunk: int = 128, flip: str | None = None, run_id: str = "demo-a") -> Path:
    reqs = [f"req-{i:02d}" for i in range(len(PROMPTS))]
    arrive = {r: 1 * MS + i * 1 * MS for i, r in enumerate(reqs)}
    events, spans, steps, counters = [], [], [], []
    for r in reqs:
        t = arrive[r]
        events += [
            RequestEvent(r, "scheduled_send", T0 + t - 200 * US, "client"),
            RequestEvent(r, "created", T0 + t - 100 * US, "client"),
            RequestEvent(r, "sent", T0 + t, "client"),
            RequestEvent(r, "arrival", T0 + t + 100 * US),
            RequestEvent(r, "tokenize_end", T0 + t + 400 * US),
            RequestEvent(r, "queued", T0 + t + 400 * US),
        ]
    done_prompt = dict.fromkeys(reqs, 0)
    made = dict.fromkeys(reqs, 0)
    admitted: list[str] = []
    finished: set[str] = set()
    t, sid, corr = 0, 0, 0
    while len(finished) < len(reqs):
        waiting = [r for r in reqs if r not in admitted and arrive[r] + 400 * US <= t]
        if not waiting and len(admitted) == len(finished):
            t = min(arrive[r] + 400 * US for r in reqs if r not in admitted)
            continue
        budget, prefill, decode = chunk, [], []
        for r in admitted:
            if r in finished:
                continue
            if done_prompt[r] >= PROMPTS[reqs.index(r)]:
                decode.append(r)
                budget -= 1
        for r in [r for r in admitted if r not in finished and r not in decode] + waiting:
            left = PROMPTS[reqs.index(r)] - done_prompt[r]
            take = min(left, budget)
            if take <= 0:
                break
            if r not in admitted:
                admitted.append(r)
                events.append(RequestEvent(r, "scheduled", T0 + t, step_id=sid,
                                           num_cached_tokens=0))  # fmt: skip
            prefill.append((r, take))
            budget -= take
        n_tok = sum(k for _, k in prefill)
        dur = 600 * US + 8 * US * n_tok + 40 * US * len(decode)
        start, end = t, t + dur
        context = sum(done_prompt[r] + made[r] for r in decode)
        context += sum(done_prompt[r] + k for r, k in prefill)
        _phases(spans, sid, start, dur)
        corr = _kernels(spans, sid, start, dur, n_tok, len(decode), corr)
        sample = start + dur * 80 // 100
        for r, k in prefill:
            events.append(RequestEvent(r, "prefill_chunk", T0 + start + 50 * US, step_id=sid,
                                       num_tokens=k))  # fmt: skip
            done_prompt[r] += k
        emitted = decode + [r for r, _ in prefill if done_prompt[r] >= PROMPTS[reqs.index(r)]]
        for r in emitted:
            first = made[r] == 0
            made[r] += 1
            kind = "first_token" if first else "token"
            events.append(RequestEvent(r, kind, T0 + sample, step_id=sid, num_tokens=made[r]))
            events.append(RequestEvent(r, "first_token" if first else "chunk",
                                       T0 + end + 300 * US, "client", num_tokens=1))  # fmt: skip
            if first:
                events.append(RequestEvent(r, "chunk", T0 + end + 300 * US, "client",
                                           num_tokens=1))  # fmt: skip
            if made[r] >= OUTPUTS[reqs.index(r)]:
                finished.add(r)
                events.append(RequestEvent(r, "finished", T0 + end, detail="length"))
                events.append(RequestEvent(r, "done", T0 + end + 400 * US, "client"))
        running = len(admitted) - len(finished)
        used = sum(-(-(done_prompt[r] + made[r]) // 16) for r in admitted if r not in finished)
        steps.append(Step(sid, T0 + start, T0 + end, len(prefill), n_tok, len(decode), context,
                          len(waiting) - sum(1 for r, _ in prefill if r in waiting), running, 0,
                          0, used, 64 - used, 0))  # fmt: skip
        counters.append(Counter("kv_blocks_used", T0 + end, float(used), "engine"))
        sid += 1
        t = end + 900 * US  # the host loop between steps: output processing, scheduling
    requests = [
        Request(r, PROMPTS[i], OUTPUTS[i], 0, "length", is_warmup=(i == 0),
                output_digest=f"d{i:02d}{'x' if r == flip else ''}")
        for i, r in enumerate(reqs)
    ]  # fmt: skip
    config = {
        "run_options": {
            "engine": {"preset": "demo", "device": "cuda", "dtype": "float16", "chunk_size": chunk,
                       "max_seqs": 8, "prefix_cache": True, "policy": "fcfs"},
            "workload": {"name": "demo", "requests": len(reqs), "warmup": 1, "seed": 0,
                         "arrival": {"mode": "open", "rate": 1000.0, "process": "constant",
                                     "concurrency": None},
                         "prompt_len": {"kind": "uniform", "low": 16, "high": 200},
                         "output_len": {"kind": "uniform", "low": 4, "high": 8}},
        },
        "engine_config": {"model": MODEL, "dtype": "float16"},
    }  # fmt: skip
    env = {"perfdiag": "0.1.0", "python": "3.11.7", "implementation": "CPython",
           "platform": "Linux", "hostname": "node7", "cpu_model": "Test CPU", "cpu_count": 8,
           "git_revision": "0123456789abcdef", "packages": {"torch": "2.13.0", "triton": "3.9.0"},
           "cuda_runtime": "12.8",
           "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}]}  # fmt: skip
    command = ["perfdiag", "run", "--preset", "demo", "--chunk-size", str(chunk)]
    with RunWriter(path, command=command, config=config, environment_info=env) as w:
        w.table("requests").extend(requests)
        w.table("request_events").extend(events)
        w.table("steps").extend(steps)
        w.table("spans").extend(spans)
        w.table("counters").extend(counters)
    _pin_manifest(path, run_id)
    return path


def _phases(spans: list, sid: int, start: int, dur: int) -> None:
    edges = [0, 5, 15, 85, 95, 100]  # schedule, prepare, forward, sample, post-process (%)
    names = ("schedule", "prepare_inputs", "forward", "sample", "post_process")
    for name, a, b in zip(names, edges, edges[1:], strict=False):
        s = T0 + start + dur * a // 100
        spans.append(Span(name, "phase", s, dur * (b - a) // 100, step_id=sid, **THREAD))


def _kernels(spans: list, sid: int, start: int, dur: int, tokens: int, decodes: int,
             corr: int) -> int:  # fmt: skip
    """Four kernels per step on the GPU, each launched from the engine thread inside
    `forward`; FLOPs and bytes in proportion to the batch (rough, but consistent)."""
    n = max(tokens + decodes, 1)
    work = (("gemm_qkv", 2 * 256 * 768 * n, 2 * 256 * 768 + 4 * n * 1024),
            ("flash_attn_fwd", 4 * 4 * 64 * n * 64, 4 * n * 2048),
            ("rms_norm", 4 * 256 * n, 4 * 256 * n),
            ("gemm_mlp", 6 * 256 * 512 * n, 6 * 256 * 512 + 4 * n * 2048))  # fmt: skip
    t = start + dur * 15 // 100
    span_ns = dur * 70 // 100 // len(work)
    for name, flops, nbytes in work:
        corr += 1
        spans.append(Span("cudaLaunchKernel", "cuda_runtime", T0 + t, 8 * US, step_id=sid,
                          correlation=corr, **THREAD))  # fmt: skip
        spans.append(Span(name, "kernel", T0 + t + 20 * US, span_ns - 40 * US, step_id=sid,
                          correlation=corr, flops=flops, bytes=nbytes, **GPU))  # fmt: skip
        t += span_ns
    return corr


def _pin_manifest(path: Path, run_id: str) -> None:
    """Replace what the writer took from the clock and the host, for stable screens."""
    file = Path(path) / "manifest.json"
    m = json.loads(file.read_text())
    m.update(run_id=run_id, created_at="2026-11-30T10:00:00.000+00:00",
             ended_at="2026-11-30T10:00:01.000+00:00", perfdiag_version="0.1.0",
             writer={"pid": 1, "host": "node7"},
             clock={"clock": "monotonic", "monotonic_ns": T0, "wall_ns": 1_796_000_000 * 10**9,
                    "uncertainty_ns": 100, "resolution_ns": 1})  # fmt: skip
    file.write_text(json.dumps(m, indent=2) + "\n")

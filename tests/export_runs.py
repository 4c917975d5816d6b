"""A hand-built run for the export tests (written with RunWriter), and test helpers.

It holds one of everything the exporters must place: requests with prefill chunks, a
preemption and an abort; steps with their composition; CPU ops that nest, one that
partially overlaps its neighbour, zero-length and identical spans; launches with their
kernels (one graph launch with two), a kernel that starts before its step, copies, a
GPU collective and a CPU one, a GPU annotation, a span with no resource; counters out of
order with a NaN; findings naming steps and requests. Times are µs after T0, which is
far past float64's exact range in ns. Tests import it by name (pytest puts tests/ on sys.path).
"""

from __future__ import annotations

import json
from pathlib import Path

from perfdiag.traces.schema import Counter, Request, RequestEvent, Span, Step
from perfdiag.traces.writer import RunWriter

T0 = 1_700_000_000_123_456_789
PID, TID = 4242, 4243


def us(t: float) -> int:
    return T0 + round(t * 1000)


def engine(rid, kind, t, step=None, tokens=None, detail=None, cached=None):
    return RequestEvent(rid, kind, us(t), "engine", step, tokens, detail, cached)


EVENTS = [
    RequestEvent("r0", "sent", us(0), "client"),
    engine("r0", "arrival", 1, tokens=30),
    engine("r0", "tokenize_end", 2, tokens=30),
    engine("r0", "queued", 3, tokens=30),
    engine("r0", "scheduled", 11, step=0, tokens=16, cached=8),
    engine("r0", "prefill_chunk", 19, step=0, tokens=16),
    engine("r0", "prefill_chunk", 29, step=1, tokens=14),
    engine("r0", "first_token", 29, step=1, tokens=1),
    RequestEvent("r0", "first_token", us(30), "client"),
    engine("r0", "token", 39, step=2, tokens=2),
    engine("r0", "token", 49, step=3, tokens=3),
    engine("r0", "finished", 50, detail="length", tokens=3),
    RequestEvent("r0", "done", us(51), "client"),
    engine("r1", "arrival", 4, tokens=8),
    engine("r1", "queued", 5, tokens=8),
    engine("r1", "scheduled", 21, step=1, tokens=8, cached=0),
    engine("r1", "prefill_chunk", 29, step=1, tokens=8),
    engine("r1", "first_token", 29, step=1, tokens=1),
    engine("r1", "token", 39, step=2, tokens=2),
    engine("r1", "preempted", 41, step=3, tokens=9, detail="recompute"),
    engine("r1", "scheduled", 61, step=5, tokens=9, cached=8),
    engine("r1", "resumed", 61, step=5, tokens=9, detail="recompute"),
    engine("r1", "prefill_chunk", 69, step=5, tokens=1),
    engine("r1", "token", 79, step=6, tokens=3),
    engine("r1", "finished", 80, detail="length", tokens=3),
    engine("r2", "arrival", 52, tokens=4),
    engine("r2", "queued", 53, tokens=4),
    engine("r2", "scheduled", 61, step=5, tokens=4, cached=0),
    engine("r2", "prefill_chunk", 69, step=5, tokens=4),
    engine("r2", "first_token", 69, step=5, tokens=1),
    engine("r2", "aborted", 75),
    engine("r2", "finished", 75, detail="abort"),
]
REQUESTS = [
    Request("r0", 30, 3, 8, "length"),
    Request("r1", 8, 3, 0, "length"),
    Request("r2", 4, 1, 0, "abort", is_warmup=True),
]
STEPS = [
    Step(0, us(10), us(20), 1, 16, 0, 16, 1, 1, 0, 0, 2, 98, 1, num_cached_tokens=8),
    Step(1, us(20), us(30), 2, 22, 0, 38, 0, 2, 0, 0, 4, 96, 1),
    Step(2, us(30), us(40), 0, 0, 2, 40, 0, 2, 0, 0, 4, 96, 1),
    Step(3, us(40), us(50), 0, 0, 1, 33, 1, 1, 0, 1, 3, 97, 2),
    Step(5, us(60), us(70), 2, 5, 0, 14, 0, 2, 0, 0, 3, 97, 2),
    Step(6, us(70), us(80), 0, 0, 1, 10, 0, 1, 0, 0, 2, 98, 2),
]


def cpu(name, cat, t, dur, **kw):
    return Span(name, cat, us(t), round(dur * 1000), pid=PID, tid=TID, **kw)


def gpu(name, cat, t, dur, stream=7, **kw):
    return Span(name, cat, us(t), round(dur * 1000), device=0, stream=stream, **kw)


SPANS = [
    cpu("forward", "phase", 12, 7, step_id=0),
    cpu("aten::mm", "cpu_op", 12.5, 3, step_id=0, args='{"External id": 1}'),
    cpu("cudaLaunchKernel", "cuda_runtime", 13, 1, correlation=1, step_id=0),
    cpu("aten::add", "cpu_op", 17, 4, step_id=0),  # crosses the end of "forward" (19)
    cpu("aten::empty", "cpu_op", 18, 0, step_id=0),  # zero length
    cpu("aten::empty", "cpu_op", 18, 0, step_id=0),  # …twice at once
    cpu("cudaGraphLaunch", "cuda_runtime", 22, 1, correlation=2, step_id=1),
    cpu("cudaMemcpyAsync", "cuda_runtime", 24, 1, correlation=3, step_id=1),
    cpu("gloo:all_reduce", "comm", 26, 2, bytes=4096),
    cpu("cudaLaunchKernel", "cuda_runtime", 31, 1, correlation=4, step_id=2),
    gpu(
        "gemm",
        "kernel",
        14,
        3,
        correlation=1,
        step_id=0,
        flops=2**40 + 1,
        args='{"correlation": 1, "device": 0, "stream": 7, "grid": [1, 2, 3]}',
    ),
    gpu("graph_k1", "kernel", 23, 1, correlation=2, step_id=1),
    gpu("graph_k2", "kernel", 24, 1, correlation=2, step_id=1),
    gpu("Memcpy HtoD", "gpu_memcpy", 25, 0.5, correlation=3, bytes=1 << 20),
    gpu("early", "kernel", 29.5, 1, correlation=4, step_id=2),  # before its step (30)
    gpu("ncclKernel_AllReduce", "comm", 26, 3, stream=20, bytes=1 << 20),
    gpu("gpu annotation", "annotation", 22.5, 3),
    Span("orphan", "annotation", us(5), 1000),  # no pid/tid, no device
]
COUNTERS = [
    Counter("gpu_util_pct", us(30), 80.0, "gpu0"),
    Counter("gpu_util_pct", us(10), 50.0, "gpu0"),  # out of order on purpose
    Counter("power_w", us(10), 250.5, "gpu0"),
    Counter("sm_clock_mhz", us(10), 1410.0, "gpu0"),
    Counter("cpu_util_pct", us(10), float("nan"), "cpu0"),
    Counter("cpu_util_pct", us(20), 12.5, "cpu0"),
]
FINDINGS = {
    "run_id": "x",
    "findings": [
        {
            "check": "slow-steps",
            "severity": "warning",
            "title": "Steps 3 and 5 are slow",
            "explanation": "They wait.",
            "ids": [{"kind": "step", "label": "slowest", "ids": ["5", "3"]}],
        },
        {
            "check": "late",
            "severity": "critical",
            "title": "r1 was preempted",
            "explanation": "KV ran out.",
            "ids": [{"kind": "request", "ids": ["r1"]}],
        },
        {"check": "overall", "severity": "info", "title": "Run looks fine", "ids": []},
    ],
}


def write_rich_run(path: Path, with_findings: bool = True) -> Path:
    with RunWriter(path, command=["test"], config={}, environment_info={"test": True}) as w:
        w.table("requests").extend(REQUESTS)
        w.table("request_events").extend(EVENTS)
        w.table("steps").extend(STEPS)
        w.table("spans").extend(SPANS)
        w.table("counters").extend(COUNTERS)
    if with_findings:
        (path / "results").mkdir(exist_ok=True)
        (path / "results" / "findings.json").write_text(json.dumps(FINDINGS))
    return path

"""Small Kineto (PyTorch-profiler) traces written by tests, whose figures are known."""

from __future__ import annotations

import json

T0_US = 1_700_000_000_000_000
CPU = {"pid": 100, "tid": 100}
GPU = {"pid": 0, "tid": 7}


def synced_steps_trace(path, gemm_us: int = 300, extra_kernel: str | None = None, steps: int = 3):
    """`steps` ProfilerSteps of 420 µs: host prep 0–100, a launch 100–105, the gemm from
    110 (300 µs by default) and aten::item 104–415 around a cudaStreamSynchronize 105–412.
    `extra_kernel`: a 20 µs kernel launched at 95 (B of a diff)."""
    events = []

    def x(base, name, cat, start, dur, where=CPU, **args):
        events.append({"ph": "X", "cat": cat, "name": name, **where, "ts": base + start,
                       "dur": dur, "args": args})  # fmt: skip

    for k in range(steps):
        b = T0_US + 420 * k
        x(b, f"ProfilerStep#{k}", "user_annotation", 0, 420)
        x(b, "prep", "cpu_op", 0, 100)
        if extra_kernel:
            x(b, "cudaLaunchKernel", "cuda_runtime", 95, 3, correlation=1000 + k)
            x(b, extra_kernel, "kernel", 98, 10, where=GPU, correlation=1000 + k, device=0,
              stream=7)  # fmt: skip
        x(b, "cudaLaunchKernel", "cuda_runtime", 100, 5, correlation=k + 1)
        x(b, "gemm", "kernel", 110, gemm_us, where=GPU, correlation=k + 1, device=0, stream=7)
        x(b, "aten::item", "cpu_op", 104, 311)
        x(b, "cudaStreamSynchronize", "cuda_runtime", 105, 307)
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
           "traceEvents": events}  # fmt: skip
    path.write_text(json.dumps(doc))
    return path


def vllm_steps_trace(path, steps: int = 3):
    """A CPU worker's trace as vLLM's profiler writes it: per step of 1,000 µs, the step
    annotation `execute_context_…` over 0–600 (ops 0–250 and 300–600: 50 µs idle inside),
    then the engine loop's own host work 700–900 and nothing 600–700 and 900–1,000."""
    events = []

    def x(base, name, cat, start, dur):
        events.append({"ph": "X", "cat": cat, "name": name, **CPU, "ts": base + start,
                       "dur": dur, "args": {}})  # fmt: skip

    for k in range(steps):
        b = T0_US + 1_000 * k
        x(b, f"execute_context_1(64)_generation_{k}({k})", "user_annotation", 0, 600)
        x(b, "aten::linear", "cpu_op", 0, 250)
        x(b, "aten::linear", "cpu_op", 300, 300)
        x(b, "schedule", "python_function", 700, 200)
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path

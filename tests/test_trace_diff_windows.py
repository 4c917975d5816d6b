"""The trace diff's step windows are the same on both sides: a profiler step's CPU span,
with the GPU work its calls launched attributed to it by correlation id. A call made after
the last step is never "added" because one side's last step ran longer on the GPU."""

import json
from pathlib import Path

from perfdiag.analyzers.trace_diff import trace_diff
from perfdiag.traces.importers.kineto import import_kineto
from perfdiag.traces.reader import load_run

T0_US = 1_700_000_000_000_000
CPU = {"pid": 100, "tid": 100}
GPU = {"pid": 0, "tid": 7}


def _launch(events: list, corr: int, ts: int, kernel: str, start: int, dur: int) -> None:
    args = {"correlation": corr}
    events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", **CPU,
                   "ts": ts, "dur": 4, "args": args})  # fmt: skip
    events.append({"ph": "X", "cat": "kernel", "name": kernel, **GPU, "ts": start, "dur": dur,
                   "args": {**args, "device": 0, "stream": 7}})  # fmt: skip


def _trace(path: Path, tail_us: int) -> Path:
    """Two 1 ms ProfilerSteps, each launching one 10 µs gemm; the last also launches a
    `tail_kernel` of `tail_us` that starts 950 µs into it. After the last step (at +2050 µs,
    outside every step) the host calls cudaDeviceSynchronize."""
    events: list = []
    for s in range(2):
        t0 = T0_US + 1000 * s
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s + 1}",
                       **CPU, "ts": t0, "dur": 1000})  # fmt: skip
        _launch(events, 10 * s + 1, t0 + 10, "gemm_kernel", t0 + 20, 10)
    _launch(events, 99, T0_US + 1900, "tail_kernel", T0_US + 1950, tail_us)
    events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", **CPU,
                   "ts": T0_US + 2050, "dur": 10, "args": {"correlation": 200}})  # fmt: skip
    doc = {"schemaVersion": 1, "traceEvents": events,
           "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}]}  # fmt: skip
    path.write_text(json.dumps(doc))
    return path


def test_last_steps_that_differ_in_gpu_tail_add_no_call(tmp_path):
    import_kineto([_trace(tmp_path / "a.json", tail_us=20)], tmp_path / "a")  # ends +1970
    import_kineto([_trace(tmp_path / "b.json", tail_us=500)], tmp_path / "b")  # ends +2450
    d = trace_diff(load_run(tmp_path / "a"), load_run(tmp_path / "b"))
    assert d.basis_a.windows == d.basis_b.windows == 2
    assert not len(d.ops[d.ops["status"].isin(["added", "removed"])]), d.changed()
    assert "cudaDeviceSynchronize" not in set(d.ops["name"])  # outside every step, both sides
    rows = d.ops.set_index("name")
    # the tail kernel belongs to the last step on both sides (its launch is inside it)
    assert rows.loc["tail_kernel", ["calls_a", "calls_b"]].tolist() == [0.5, 0.5]
    assert rows.loc["tail_kernel", "time_delta_ns"] == (500 - 20) * 1000 / 2
    assert rows.loc["cudaLaunchKernel", "status"] == "same"
    assert d.basis_a.wall_ns_per_step == d.basis_b.wall_ns_per_step == 1_000_000

"""Steps that JIT-compiled a kernel (the Triton probe's "compiled" mark) are a warm-up cost:
the step cost model fits without them and names them; the roofline leaves those launches
out; the probe's cache count works on a JIT function's caches and says nothing otherwise."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from benchmarks.synthetic_steps import gpu_cost, timeline
from perfdiag.analyzers.jit_compile import compiled_launches, compiled_step_ids
from perfdiag.analyzers.step_cost import fit_step_cost
from perfdiag.probes.triton_probe import compiled_kernels

MS = 1e-3


def _with_compiles(tl, steps, extra_s):
    """The timeline with `extra_s` of host compile added to `steps` (their later steps
    shifted), marked compiled."""
    dur = tl.end - tl.start
    dur[steps] += extra_s * 1e9
    start = np.concatenate(([tl.start[0]], tl.start[0] + np.cumsum(dur)[:-1]))
    marked = np.zeros(len(dur), bool)
    marked[steps] = True
    return tl.__class__(**{**tl.__dict__, "start": start, "end": start + dur, "compiled": marked})


def test_a_gpu_run_priced_without_its_compile_steps():
    # A short GPU run meets most of its prefill shapes for the first time: half of its
    # prefill steps compile (the H200 check's run: 2 of 3), and Huber cannot outvote that.
    tl = timeline(gpu_cost, seed=3, steps=120, stalls=False)
    prefill = np.flatnonzero(tl.prefill_tokens > 0)
    hit = prefill[: len(prefill) // 2 + 1]
    truth = fit_step_cost(tl).slice_price_s(512)  # ~0.26 ms
    dirty = _with_compiles(tl, hit, 0.5)
    unmarked = fit_step_cost(dirty.__class__(**{**dirty.__dict__, "compiled": None}))
    marked = fit_step_cost(dirty)
    assert unmarked.slice_price_s(512) > 10 * truth  # what the run got before the mark
    assert abs(marked.slice_price_s(512) - truth) <= 0.15 * truth
    assert marked.jit_compile_steps == len(hit)
    assert f"{len(hit)} steps that JIT-compiled" in marked.priced_by
    # the compile steps stay in the per-step parts, inflated, their residual their own
    per = marked.per_step.set_index("step_id")
    assert per.loc[tl.step_id[hit], "inflated"].all()
    assert per.loc[tl.step_id[hit], "residual_s"].min() > 0.4


def test_too_few_clean_steps_is_no_model():
    tl = timeline(gpu_cost, seed=1, steps=12, stalls=False)
    assert fit_step_cost(tl) is not None
    assert fit_step_cost(_with_compiles(tl, np.arange(6), 0.2)) is None


def _spans(rows):
    cols = ["name", "category", "step_id", "args", "flops", "bytes", "dur_ns"]
    return pd.DataFrame(rows, columns=cols)


def test_compiled_launches_need_device_timed_launches():
    interp = _spans([("k", "triton_interpret", 0, json.dumps({"compiled": True}), 1, 1, 5)])
    assert compiled_launches(interp) is None and compiled_step_ids(interp) is None
    spans = _spans([
        ("k", "triton", 0, json.dumps({"grid": [1], "compiled": True}), 1, 1, 5),
        ("k", "triton", 1, json.dumps({"grid": [1]}), 1, 1, 5),
        ("k", "triton", 2, json.dumps({"grid": [2], "compiled": True}), 1, 1, 5),
        ("mm", "cpu_op", 3, None, None, None, 5),
    ])  # fmt: skip
    assert compiled_launches(spans).tolist() == [True, False, True, False]
    assert compiled_step_ids(spans).tolist() == [0, 2]


class _Jit:
    """A stand-in for triton's JITFunction: per-device (kernel cache, ...) tuples."""

    def __init__(self):
        self.device_caches = {0: ({}, {}, None, None, None)}

    def compile(self, key):
        self.device_caches[0][0][key] = object()


def test_the_cache_count_follows_a_jit_function_and_its_wrapper():
    jit = _Jit()
    assert compiled_kernels(jit) == 0
    jit.compile("a")
    assert compiled_kernels(jit) == 1

    class Tuner:  # an autotuner wraps the JIT function as .fn
        fn = jit

    assert compiled_kernels(Tuner()) == 1
    assert compiled_kernels(object()) is None


@pytest.mark.gpu
def test_the_probe_marks_the_launch_that_compiled():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from perfdiag.engine_ref.kernels import rms_norm
    from perfdiag.probes.triton_probe import TritonProbe

    rows = []
    probe = TritonProbe(rows.append, "cuda").attach()
    x, w = torch.randn(5, 37, device="cuda"), torch.randn(37, device="cuda")
    before = compiled_kernels(rms_norm._rms_norm_kernel)
    try:
        probe.begin(0)
        rms_norm.rms_norm(x, w, 1e-6)
        grew = compiled_kernels(rms_norm._rms_norm_kernel) > before
        rms_norm.rms_norm(x, w, 1e-6)  # the same specialisation: cached
        probe.end()
    finally:
        probe.detach()
    marks = [json.loads(r.args).get("compiled", False) for r in rows]
    assert before is not None  # this Triton exposes its JIT cache
    assert marks == [grew, False]

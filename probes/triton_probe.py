"""The Triton probe: every launch of engine_ref's kernels as a span with its FLOPs and bytes.

It attaches to `engine_ref.kernels.launch` (the one path every launch takes; with no
probe attached a launch costs one `is None` check) and performs each launch itself:

- kernel name, grid, compile-time meta-parameters (constexprs, num_warps), the shape,
  dtype and strides of every tensor argument and the scalar arguments go to `args` (JSON),
  with `timing` saying how the duration was measured;
- `flops` and `bytes` come from the kernel's own cost model (`flops()`/`bytes_moved()`
  beside it), so the roofline analyzer places each kernel;
- a launch that JIT-compiled its kernel (a new specialisation: shapes, dtypes, constexprs)
  says so, `"compiled": true`: its events enclose the host's compile, during which the
  device idled, so the span is not the kernel's cost (roofline and the step cost model
  leave it out); detected by the JIT cache growing, where Triton exposes it;
- on CUDA a launch is bracketed by two CUDA events (category `triton`); events are read
  when the step ends (the step has synchronised then), so timing adds no sync. The device
  clock has no fixed offset to the host's: a step's spans are placed at the host time of
  its first launch plus each event's device-side offset from that launch's start event,
  so durations and spacing are exact and the anchor is the enqueue time (at or before
  the true start);
- in Triton's CPU interpreter the launch runs synchronously in NumPy: host wall time,
  category `triton_interpret` (never a GPU figure).

Neither category occupies a resource in the timeline analyzers (a profiler window in the
same run records the same kernels exactly, as `kernel`). Steps replayed from a CUDA graph
launch nothing through Python; each replay is one `cuda_graph_replay` annotation.

It rides on the recorder's step-timer slot (`begin(step_id)` / `end()`), wrapping the CUDA
step timer when there is one, so launches carry the `step_id` they ran in.
"""

from __future__ import annotations

import json
import os
import threading
import time

from ..engine_ref.kernels import launch
from ..traces.schema import Span

CATEGORY_CUDA = "triton"
CATEGORY_INTERPRET = "triton_interpret"
FLUSH_EVERY = 4096  # pending CUDA launches before an early read (bounded memory)


def describe(kernel, grid, args, meta, timing: str) -> dict:
    """What a launch was: its grid, meta-parameters, tensors and scalars by argument name."""
    names = getattr(kernel, "arg_names", None) or [f"arg{i}" for i in range(len(args))]
    tensors, scalars = {}, {}
    for name, a in zip(names, args, strict=False):
        if hasattr(a, "shape") and hasattr(a, "dtype"):
            tensors[name] = {"shape": list(a.shape), "dtype": str(a.dtype).removeprefix("torch."),
                             "stride": list(a.stride())}  # fmt: skip
        elif isinstance(a, (bool, int, float, str)):
            scalars[name] = a
    return {"grid": [int(g) for g in grid], "meta": dict(meta), "tensors": tensors,
            "scalars": scalars, "timing": timing}  # fmt: skip


def compiled_kernels(kernel) -> int | None:
    """How many specialisations the kernel's JIT cache holds over all devices (None where
    this Triton does not expose it: then no launch is marked compiled)."""
    jit = kernel if hasattr(kernel, "device_caches") else getattr(kernel, "fn", None)
    try:
        return sum(len(c[0]) for c in jit.device_caches.values())
    except (AttributeError, TypeError, IndexError, KeyError):
        return None


def kernel_name(kernel) -> str:
    return getattr(kernel, "__name__", None) or kernel.fn.__name__


class TritonProbe:
    def __init__(self, append, device: str = "cpu", rank: int | None = None, step_timer=None):
        self._append = append
        self._rank = rank
        self._inner = step_timer
        self._step: int | None = None
        self._pid = os.getpid()
        self._cuda = device.startswith("cuda")
        self._pending: list[tuple] = []
        self._spare: list = []  # CUDA events for reuse
        self.launches = 0
        self.graph_replays = 0
        if self._cuda:
            import torch

            self._torch = torch
            self._device = torch.device(device)
            self._device_index = self._device.index or 0

    # -- attach ------------------------------------------------------------------------
    def attach(self) -> TritonProbe:
        launch.set_observer(self)
        return self

    def detach(self) -> None:
        if launch.observer() is self:
            launch.set_observer(None)
        self._flush()

    def summary(self) -> dict:
        """What the manifest says about the probe."""
        return {
            "launches": self.launches,
            "graph_replays": self.graph_replays,
            "category": CATEGORY_CUDA if self._cuda else CATEGORY_INTERPRET,
            "timing": "cuda_events" if self._cuda else "host_interpreter",
        }

    # -- the recorder's step-timer slot ------------------------------------------------
    def begin(self, step_id: int) -> None:
        self._step = step_id
        if self._inner is not None:
            self._inner.begin(step_id)

    def end(self) -> int | None:
        gpu_ns = self._inner.end() if self._inner is not None else None
        self._flush()
        self._step = None
        return gpu_ns

    # -- launch observer ---------------------------------------------------------------
    def on_launch(self, kernel, grid, args, meta, cost) -> None:
        if self._cuda and self._torch.cuda.is_current_stream_capturing():
            kernel[grid](*args, **meta)  # recorded into a graph, not run: nothing to time
            return
        flops, nbytes = cost()
        name = kernel_name(kernel)
        self.launches += 1
        if not self._cuda:
            t0 = time.monotonic_ns()
            kernel[grid](*args, **meta)
            dur = time.monotonic_ns() - t0
            info = json.dumps(describe(kernel, grid, args, meta, "host_interpreter"))
            self._append(Span(name, CATEGORY_INTERPRET, t0, dur, self._pid,
                              threading.get_native_id(), None, None, self._rank, self._step,
                              None, int(flops), int(nbytes), info))  # fmt: skip
            return
        start, end = self._event(), self._event()
        cached = compiled_kernels(kernel)
        host_ns = time.monotonic_ns()
        start.record()
        kernel[grid](*args, **meta)
        end.record()
        info = describe(kernel, grid, args, meta, "cuda_events")
        info["host_tid"] = threading.get_native_id()
        if cached is not None and compiled_kernels(kernel) != cached:
            info["compiled"] = True
        self._pending.append((name, host_ns, start, end, self._step, flops, nbytes, info))
        if len(self._pending) >= FLUSH_EVERY:
            self._flush()

    def on_graph_replay(self, batch_size: int, graph_size: int, start_ns: int, end_ns: int):
        self.graph_replays += 1
        info = json.dumps({"batch_size": batch_size, "graph_size": graph_size})
        self._append(Span("cuda_graph_replay", "annotation", start_ns, end_ns - start_ns,
                          self._pid, threading.get_native_id(), None, None, self._rank,
                          self._step, None, None, None, info))  # fmt: skip

    # -- CUDA events -------------------------------------------------------------------
    def _event(self):
        if self._spare:
            return self._spare.pop()
        return self._torch.cuda.Event(enable_timing=True)

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        if not pending:
            return
        pending[-1][3].synchronize()
        anchor_ns, anchor = pending[0][1], pending[0][2]
        for name, _, start, end, step, flops, nbytes, info in pending:
            t0 = anchor_ns + round(anchor.elapsed_time(start) * 1e6)  # ms → ns
            dur = round(start.elapsed_time(end) * 1e6)
            self._append(Span(name, CATEGORY_CUDA, t0, dur, None, None, self._device_index,
                              None, self._rank, step, None, int(flops), int(nbytes),
                              json.dumps(info)))  # fmt: skip
        self._spare.extend(e for p in pending for e in (p[2], p[3]))

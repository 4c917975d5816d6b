"""CUDA graphs for decode-only steps: capture once per batch size, replay per step.

A decode step launches a few kernels per layer, each costing microseconds of host time;
at small batch the GPU waits on the host (DOMAIN.md §9). A graph replays the whole
forward (and the logits) with one launch. Graphs fix shapes and addresses, so inputs go
through static buffers sized for the largest batch: a batch of B runs the smallest
captured size S ≥ B, its S − B padding rows writing K/V to slot −1 (skipped by the store
kernel) and attending over length 0 (zeros). Context lengths and block tables are read by
the kernels from the device, so one graph serves any lengths (kernel_backend "triton").
Fallback: a step with prefill chunks, a batch above the largest size, or a size whose
capture failed runs eagerly.

`mode="emulate"` (the CPU path, for tests) runs the same static-buffer forward eagerly
instead of replaying: padding, slot −1 and length-0 rows are exercised everywhere.
"""

from __future__ import annotations

import time

import torch

from .attention import AttentionMetadata
from .kernels import launch
from .kernels.backend import KernelMeta
from .kernels.decode_attention import choose_num_splits


class DecodeGraphs:
    def __init__(self, runner, batch_sizes, max_model_len: int, mode: str = "cuda") -> None:
        if mode not in ("cuda", "emulate"):
            raise ValueError(f"mode {mode!r}: 'cuda' or 'emulate'")
        self.runner, self.mode = runner, mode
        self.sizes = sorted(set(batch_sizes))
        dev, top = runner.device, self.sizes[-1]
        width = -(-max_model_len // runner.block_size)
        self.input_ids = torch.zeros(top, dtype=torch.long, device=dev)
        self.positions = torch.zeros(top, dtype=torch.long, device=dev)
        self.slots = torch.full((top,), -1, dtype=torch.long, device=dev)
        self.tables = torch.zeros((top, width), dtype=torch.int32, device=dev)
        self.lens = torch.zeros(top, dtype=torch.int32, device=dev)
        self.max_model_len = max_model_len
        self.graphs: dict[int, tuple] = {}  # size → (graph or None, logits buffer or meta)
        self.failed: dict[int, str] = {}  # size → why its capture failed
        self.replays = 0
        self.eager_fallbacks = 0  # decode-only steps no graph could serve
        self._pool = None

    def _meta(self, b: int) -> AttentionMetadata:
        cfg = self.runner.model.config
        splits = choose_num_splits(b, cfg.num_kv_heads, self.max_model_len, self.runner.num_sms)
        kernel = KernelMeta(self.tables[:b], self.lens[:b], None, splits, None, None, None)
        return AttentionMetadata(self.slots[:b], b, None, None, 0, [], kernel=kernel)

    def _forward(self, b: int, meta: AttentionMetadata) -> torch.Tensor:
        model = self.runner.model
        hidden = model(self.input_ids[:b], self.positions[:b], self.runner.kv_cache.layers, meta)
        return model.compute_logits(hidden)

    @torch.inference_mode()
    def capture(self) -> DecodeGraphs:
        """Capture every size, largest first (smaller graphs reuse its memory pool). A
        failure is recorded in `failed` and that size falls back to eager steps."""
        for b in reversed(self.sizes):
            try:
                self.graphs[b] = self._capture(b)
            except Exception as e:  # any capture error: eager for this size, never fatal
                self.failed[b] = f"{type(e).__name__}: {e}"
        return self

    def _capture(self, b: int) -> tuple:
        meta = self._meta(b)
        with launch.suspended():  # nothing to time: the launches are recorded, not run
            if self.mode == "emulate":
                self._forward(b, meta)
                return None, meta
            side = torch.cuda.Stream(self.runner.device)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up: compiles kernels, picks GEMM algorithms
                for _ in range(2):
                    self._forward(b, meta)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # an NVTX range names the capture in Nsight (replays sit inside the step's range)
            name = f"perfdiag cuda_graph capture {b}"
            with torch.cuda.nvtx.range(name), torch.cuda.graph(graph, pool=self._pool):
                logits = self._forward(b, meta)
            self._pool = graph.pool()
            return graph, logits

    def size_for(self, batch: int) -> int | None:
        return next((s for s in self.sizes if s >= batch and s in self.graphs), None)

    def run(self, inp) -> torch.Tensor | None:
        """Logits of the sampling rows, or None when this step must run eagerly."""
        meta = inp.meta
        b = meta.num_decode
        if meta.prefills or b == 0 or meta.kernel is None:
            return None
        size = self.size_for(b)
        if size is None:
            self.eager_fallbacks += 1
            return None
        km = meta.kernel
        width = km.decode_block_tables.shape[1]
        self.input_ids[:b].copy_(inp.input_ids)
        self.positions[:b].copy_(inp.positions)
        self.slots[:b].copy_(meta.slot_mapping)
        self.slots[b:size].fill_(-1)
        self.tables[:b, :width].copy_(km.decode_block_tables)
        self.lens[:b].copy_(km.decode_context_lens)
        self.lens[b:size].fill_(0)
        obs = launch.observer()
        t0 = time.monotonic_ns() if obs is not None else 0
        graph, held = self.graphs[size]
        if graph is None:
            with launch.suspended():  # as a replay: no launch goes through Python
                logits = self._forward(size, held)
        else:
            graph.replay()
            logits = held
        if obs is not None:
            obs.on_graph_replay(b, size, t0, time.monotonic_ns())
        self.replays += 1
        return logits[:b][inp.sample_idx]  # a copy: the buffer is overwritten next replay

"""Pipeline parallelism over torch.distributed: one process per stage, rank 0 schedules.

`EngineConfig(pipeline_parallel_size=N)` splits the layers into N stages of consecutive
layers (pipeline_split.py; `pipeline_layers` gives the counts). Rank 0 (this process) is
stage 0 and keeps the scheduler, the block manager and the sampler, as tensor
parallelism's rank 0 does; ranks 1…N-1 are `pipeline_worker` processes started, synced
and stopped by the same machinery (parallel.TensorParallel: TCP store on 127.0.0.1, gloo
on the CPU, NCCL on CUDA, plans over a gloo group, clock ping-pongs).

A step: rank 0 cuts the batch into m micro-batches of whole requests (`split_plan`, m =
`pipeline_microbatches`, default N) and broadcasts their plans and the step's swap copies;
then stage 0 runs its layers on micro-batch 0, hands the residual stream to stage 1 with
an isend and starts micro-batch 1 while stage 1 works on 0, and so on (GPipe's forward
schedule within a step: fill, overlap, drain). The last stage norms and sends the hidden
states of the rows that sample back to rank 0, which computes the logits and samples
exactly as a single process does. Steps do not overlap (the next step's batch depends on
this step's tokens), so each step fills and drains: the ideal bubble is (N-1)/(m+N-1).

KV: each stage's pool holds its layers only, with the same block count on every stage;
the block manager on rank 0 decides the blocks for all (block ids mean the same on each).

Records: every stage's compute, send and recv per micro-batch (`StageEvent`), on rank 0's
clock, to the observer's `on_pipeline_stages` (analyzers/pipeline.py reads them).
"""

from __future__ import annotations

import time
import weakref

import torch

from .hooks import StageEvent
from .model_runner import ModelInput, ModelRunner
from .parallel import TensorParallel, TPKVCache
from .pipeline_split import keep_stage, split_plan, stage_forward, stage_layers, stage_model_config


class PipelineParallel(TensorParallel):
    """Rank 0's side: the stage workers, the plan broadcast and the stage records."""

    worker_module = "perfdiag.engine_ref.pipeline_worker"
    label = "pipeline"

    def _world_size(self, config) -> int:
        return config.pipeline_parallel_size

    def __init__(self, config) -> None:
        super().__init__(config)
        self.stages = stage_layers(config.model.num_layers, self.tp, config.pipeline_layers)
        self.microbatches = config.pipeline_microbatches or self.tp
        self.stage_events: list[StageEvent] = []
        self._engine = lambda: None  # start_pipeline: the engine, whose observer gets them

    @property
    def observer(self):
        engine = self._engine()
        return None if engine is None else engine.observer

    def info(self) -> dict:
        return {
            "pipeline_parallel_size": self.tp,
            "pipeline_microbatches": self.microbatches,
            "stage_layers": [[r.start, r.stop] for r in self.stages],
            "backend": self.backend,
            "world_size": self.tp,
            "lm_head": "rank 0 computes logits from the last stage's hidden states",
            "clock_sync": [c._asdict() for c in self.clocks],
            "transfer_timing": "host clock around each send / recv call",
        }

    def _more_records(self, extra: tuple) -> None:
        if extra:
            self.stage_events.extend(extra[0])

    def take_records(self):
        out = super().take_records()
        events, self.stage_events = self.stage_events, []
        if self.observer is not None and events:
            self.observer.on_pipeline_stages(events)
        return out

    def close(self, observer=None) -> None:
        super().close(observer)
        if observer is not None and self.stage_events:
            observer.on_pipeline_stages(self.stage_events)
        self.stage_events = []

    def runner_class(self):
        return PPModelRunner


def start_pipeline(engine, num_blocks: int, num_cpu: int) -> None:
    """The engine's pipeline: workers started, rank 0's stage kept, its KV pool built
    (LLMEngine's constructor calls this in place of building the model)."""
    from .engine_build import build_model

    config = engine.config
    pp = PipelineParallel(config)
    pp._engine = weakref.ref(engine)  # its observer may be set after construction
    engine.tp = pp
    try:
        engine.model = build_model(config)
        keep_stage(engine.model, pp.stages[0])
        engine.kv_cache = TPKVCache(
            stage_model_config(config.model, pp.stages[0]), num_blocks, config.cache.block_size,
            num_cpu, torch.device(config.device), config.dtype, config.cache.kv_dtype,
        )  # fmt: skip
    except BaseException:
        pp.close()
        raise


class PPModelRunner(ModelRunner):
    """Rank 0's runner: stage 0 of every micro-batch, then the last stage's hidden states
    of the sampling rows back, and the logits."""

    def __init__(self, *a, tp: PipelineParallel, **kw) -> None:
        super().__init__(*a, **kw)
        self.tp = tp
        self.step_id = 0

    @torch.inference_mode()
    def forward(self, inp: ModelInput, all_logits: bool = False) -> torch.Tensor:
        pp = self.tp
        if pp.observer is None:
            pp.take_records()  # nobody records: drain the workers' pipes, keep no history
        swaps, self.kv_cache.pending = self.kv_cache.pending, []
        plans = split_plan(inp.plan, pp.microbatches)
        try:
            pp.send_plan(self.step_id, (plans, all_logits), swaps)
            hidden = self._run(plans, all_logits)
        except RuntimeError as e:
            raise pp.failed(e) from e
        pp.step_done()
        self.step_id += 1
        return self.model.compute_logits(hidden)

    def _run(self, plans, all_logits: bool) -> torch.Tensor:
        import torch.distributed as dist

        pp, step, last = self.tp, self.step_id, self.tp.tp - 1
        events, sends = pp.stage_events, []
        cuda = self.device.type == "cuda"
        for i, plan in enumerate(plans):
            mb = self.build(plan)
            t0 = time.monotonic_ns()
            x = stage_forward(self.model, mb.input_ids, mb.positions, self.kv_cache.layers,
                              mb.meta, first=True, last=False).contiguous()  # fmt: skip
            if cuda:
                torch.cuda.synchronize(self.device)
            t1 = time.monotonic_ns()
            sends.append((x, dist.isend(x, dst=1)))
            t2 = time.monotonic_ns()
            nbytes = x.numel() * x.element_size()
            events.append(StageEvent(0, step, i, "compute", t0, t1, 0, len(plan.ids)))
            events.append(StageEvent(0, step, i, "send", t1, t2, nbytes, len(plan.ids)))
        outs = []
        hidden_size = self.model.config.hidden_size
        for i, plan in enumerate(plans):
            rows = len(plan.ids) if all_logits else len(plan.sample_idx)
            if not rows:
                continue
            buf = torch.empty(rows, hidden_size, dtype=self.model.norm.weight.dtype,
                              device=self.device)  # fmt: skip
            t0 = time.monotonic_ns()
            dist.recv(buf, src=last)
            t1 = time.monotonic_ns()
            events.append(StageEvent(0, step, i, "recv_out", t0, t1,
                                     buf.numel() * buf.element_size(), rows))  # fmt: skip
            outs.append(buf)
        for _, work in sends:
            work.wait()
        if not outs:
            return torch.empty(0, hidden_size, dtype=self.model.norm.weight.dtype,
                               device=self.device)  # fmt: skip
        return torch.cat(outs)

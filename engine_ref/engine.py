"""The engine: requests in, one scheduled batch per `step()`, tokens out.

Threads: `step()` runs on one thread at a time (it holds the step lock). `add_request()` and
`abort()` may be called from any thread: they validate and tokenize on the caller's thread,
then queue the request or the abort; queued work is applied at once when no step is
running, else at the end of the running step. So an abort never frees KV that the step in
flight still reads or writes: release happens only after sampling has synchronised.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections import deque
from collections.abc import Sequence

import torch

from ..errors import ConfigError
from .async_step import OverlappedSteps
from .block_manager import BlockManager
from .config import EngineConfig
from .engine_build import build_model, local_kv_blocks
from .engine_intake import Prompt, RequestIntake
from .engine_records import StepRecords
from .hooks import NO_STEP, EngineObserver, PhaseEvent, StepEvent, StepPhase
from .host_tier import make_host_tier, report_host_tier
from .kv_cache import KVCache
from .loader import read_model_config
from .model_runner import ModelRunner
from .moe import placement
from .request import CompletionOutput, InvalidRequestError, Request, RequestOutput, SamplingParams
from .sampler import Sampler
from .scheduler import Scheduler
from .speculative.engine_steps import SpeculativeSteps
from .speculative.factory import make_proposer
from .speculative.proposer import Proposer
from .tokenizer import Tokenizer, load_tokenizer

__all__ = ["LLMEngine", "Prompt", "build_model", "local_kv_blocks"]


class LLMEngine(RequestIntake, StepRecords, SpeculativeSteps, OverlappedSteps):
    def __init__(
        self,
        config: EngineConfig | None = None,
        observer: EngineObserver | None = None,
        tokenizer: Tokenizer | None = None,
        proposer: Proposer | None = None,
    ) -> None:
        """`proposer`: drafts for speculative decoding instead of the one
        `config.speculative` names (which must be set: it gives K)."""
        self.config = config = config or EngineConfig()
        self.observer = observer
        device = torch.device(config.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"device {config.device!r} requested but CUDA is not available")
        mcfg, cc = config.model, config.cache
        self.tp = None  # parallel.TensorParallel: the worker ranks, when there are any
        num_blocks, num_cpu = local_kv_blocks(config)
        if config.tensor_parallel_size > 1:
            self._start_tensor_parallel(num_blocks, num_cpu)
        elif config.pipeline_parallel_size > 1:
            from .pipeline import start_pipeline

            start_pipeline(self, num_blocks, num_cpu)
        else:
            self.model = build_model(config)
            self.kv_cache = KVCache(mcfg, num_blocks, cc.block_size, num_cpu, device,
                                    config.dtype, cc.kv_dtype)  # fmt: skip
        self.block_manager = BlockManager(
            num_blocks,
            cc.block_size,
            num_cpu,
            cc.enable_prefix_caching,
            self.kv_cache,
            check=cc.check_ownership,
            host_tier=make_host_tier(config, self.kv_cache),  # --kv-offload-mb, else None
        )
        self.watermark_blocks = int(cc.watermark * num_blocks)
        self.scheduler = Scheduler(
            config.scheduler,
            self.block_manager,
            config.max_model_len,
            config.max_wait_ns,
            self.watermark_blocks,
            config.speculative.num_tokens if config.speculative else 0,
        )
        runner_cls, extra = ModelRunner, {}
        if self.tp is not None:
            runner_cls, extra = self.tp.runner_class(), {"tp": self.tp}
        self.runner = runner_cls(
            self.model,
            self.kv_cache,
            cc.block_size,
            Sampler(device, config.seed),
            guard=self.block_manager if cc.check_ownership else None,
            **extra,
        )
        if config.cuda_graphs:
            from .cuda_graphs import DecodeGraphs

            self.runner.graphs = DecodeGraphs(
                self.runner, config.cuda_graph_batch_sizes, config.max_model_len
            ).capture()
        self.proposer = proposer or make_proposer(config)  # speculative drafts, or None
        if self.proposer is not None:
            self.scheduler.on_release = self.proposer.release
        self.tokenizer = tokenizer or load_tokenizer(
            config.model_path, mcfg.bos_token_id, (mcfg.eos_token_ids or (None,))[0]
        )
        quant = "" if config.weight_format == "float" else f"+{config.weight_format}"
        self.fingerprint = mcfg.fingerprint(config.dtype + quant)
        eos = set(mcfg.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = frozenset(eos)
        self.device = device
        self.requests: dict[str, Request] = {}  # unfinished, by id
        self._inbox: deque[Request] = deque()
        self._aborts: deque[str] = deque()
        self._aborting: set[str] = set()  # ids in _aborts
        self._outputs: list[RequestOutput] = []  # finished outside a step, for the next step()
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._step_id = 0
        # Mixture of experts: the rank holding each expert (all on rank 0 without EP).
        self._expert_rank = None
        if mcfg.is_moe:
            self._expert_rank = placement(mcfg.num_experts, config.tensor_parallel_size,
                                          config.expert_placement)  # fmt: skip

    def _start_tensor_parallel(self, num_blocks: int, num_cpu: int) -> None:
        from .parallel import TensorParallel, TPKVCache
        from .parallel_shard import local_model_config, shard_model

        config = self.config
        tp = config.tensor_parallel_size
        self.tp = TensorParallel(config)
        try:
            self.model = build_model(config)
            shard_model(self.model, 0, tp, self.tp.comm, config.expert_placement)
            self.kv_cache = TPKVCache(
                local_model_config(config.model, tp), num_blocks, config.cache.block_size,
                num_cpu, torch.device(config.device), config.dtype, config.cache.kv_dtype,
            )  # fmt: skip
        except BaseException:
            self.tp.close()
            raise

    def close(self) -> None:
        """Stop the tensor-parallel workers (their last records go to the observer);
        nothing to do in a single process. Idempotent."""
        if self.tp is not None:
            self.tp.close(self.observer)

    def __enter__(self) -> LLMEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @classmethod
    def from_pretrained(cls, model_dir: str, observer: EngineObserver | None = None, **kw):
        """An engine for a local Hugging Face checkpoint; `kw` are EngineConfig fields."""
        cfg = EngineConfig(model=read_model_config(model_dir), model_path=str(model_dir), **kw)
        return cls(cfg, observer)

    # ---- one step -----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule one batch, run it, sample; returns what each touched request produced
        (and requests aborted since the last step)."""
        if self.config.async_scheduling:
            return self._step_overlapped()  # async_step.py: N+1 scheduled during N's forward
        with self._lock:
            self._apply_queued(NO_STEP)
            if not self.scheduler.has_work():
                outputs, self._outputs = self._outputs, []
                return outputs
            obs = self.observer
            step_id, t0 = self._begin_step()
            sched = self.scheduler.schedule(t0)
            report_host_tier(obs, self.block_manager.host_tier)  # --kv-offload-mb's records
            if not sched.scheduled:
                raise RuntimeError("engine_ref scheduler made no progress (a bug)")
            if obs is not None:
                t1 = time.monotonic_ns()
                obs.on_phase(PhaseEvent(step_id, StepPhase.SCHEDULE, t0, t1))
                self._schedule_events(sched, step_id, t1)
                counts = self._kv_and_queue_counts()
            drafts, draft_probs, t_drafted = self._draft(
                sched, step_id, t1 if obs is not None else 0
            )
            if t_drafted:
                t1 = t_drafted  # prepare follows the draft phase
            try:
                inp = self.runner.prepare(sched.scheduled, drafts)
                if obs is not None:
                    t2 = time.monotonic_ns()
                    obs.on_phase(PhaseEvent(step_id, StepPhase.PREPARE, t1, t2))
                if self.tp is not None:
                    self.runner.step_id = step_id
                logits = self.runner.forward(inp)
                if obs is not None:
                    t3 = time.monotonic_ns()
                    obs.on_phase(PhaseEvent(step_id, StepPhase.FORWARD, t2, t3))
                tokens, logprobs = self.runner.sample(logits, inp)
                verified = self.runner.verify(
                    logits, inp, [draft_probs[r.request_id] for r in inp.verify_reqs]
                )
            finally:
                self.runner.release()  # sampling copied the tokens to the host: step done
            if obs is not None:
                t4 = time.monotonic_ns()
                obs.on_phase(PhaseEvent(step_id, StepPhase.SAMPLE, t3, t4))
            if verified:  # the verified requests' tokens and KV are theirs to apply
                verifying = {id(r) for r in inp.verify_reqs}
                plain = [x for x in inp.batch if id(x[0]) not in verifying]
                outputs, comp = self._postprocess(
                    dataclasses.replace(inp, batch=plain), tokens, logprobs, step_id
                )
                spec_outputs, spec_events = self._apply_verified(inp, verified, step_id)
                outputs.extend(spec_outputs)
                comp = (comp[0], comp[1], comp[2] + len(verified))
            else:
                outputs, comp = self._postprocess(inp, tokens, logprobs, step_id)
            self._apply_queued(step_id)  # aborts that arrived mid-step: nothing is in flight now
            outputs.extend(self._outputs)
            self._outputs = []
            if obs is not None:
                t5 = time.monotonic_ns()
                obs.on_phase(PhaseEvent(step_id, StepPhase.POSTPROCESS, t4, t5))
                if self._expert_rank is not None:
                    obs.on_expert_loads(self._expert_loads(step_id))
                if verified:
                    obs.on_spec_decode(spec_events)
                obs.on_step(
                    StepEvent(
                        step_id,
                        t0,
                        t5,
                        *comp,
                        inp.num_context_tokens,
                        sched.num_cached_tokens,
                        *counts,
                        len(sched.preempted),
                        sched.blocked_by,
                    )
                )
                if self.tp is not None:
                    colls, rank_steps = self.tp.take_records()
                    obs.on_collectives(colls)
                    obs.on_rank_steps(rank_steps)
            elif self.tp is not None:
                self.tp.comm.take()  # nobody records: keep no history
            return outputs

    # ---- blocking batch API --------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[CompletionOutput]:
        """Run `prompts` to completion (stepping the engine) and return them in order.
        Outputs of other requests produced meanwhile are not returned to anyone."""
        plist = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise InvalidRequestError(f"{len(prompts)} prompts but {len(plist)} SamplingParams")
        rids: list[str] = []
        try:
            for prompt, p in zip(prompts, plist, strict=True):
                rids.append(self.add_request(prompt, p))
        except InvalidRequestError:
            for rid in rids:
                self.abort(rid)
            raise
        reqs = {rid: self.requests[rid] for rid in rids}
        pending = set(rids)
        while pending:
            for out in self.step():
                if out.finished:
                    pending.discard(out.request_id)
        results = []
        for rid in rids:
            r = reqs[rid]
            results.append(
                CompletionOutput(
                    rid,
                    list(r.prompt_token_ids),
                    list(r.output_token_ids),
                    list(r.output_logprobs),
                    self.tokenizer.decode(r.output_token_ids),
                    r.status.finish_reason,
                )
            )
        return results

    # ---- introspection --------------------------------------------------------------------------
    def is_drained(self) -> bool:
        """Nothing queued or held: every block free, every queue empty."""
        bm, s = self.block_manager, self.scheduler
        return (
            not self.has_unfinished_requests()
            and not s.has_work()
            and bm.num_free_blocks == bm.num_blocks
            and bm.num_free_cpu_blocks == bm.num_cpu_blocks
        )

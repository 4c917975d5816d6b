"""The engine: requests in, one scheduled batch per `step()`, tokens out.

Threads: `step()` runs on one thread at a time (it holds the step lock). `add_request()` and
`abort()` may be called from any thread: they validate and tokenize on the caller's thread,
then queue the request or the abort; queued work is applied at once when no step is
running, else at the end of the running step. So an abort never frees KV that the step in
flight still reads or writes: release happens only after sampling has synchronised.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Sequence

import torch

from ..errors import ConfigError
from .block_manager import BlockManager, hash_root
from .config import EngineConfig
from .gguf_loader import is_gguf, load_gguf_weights
from .hooks import (
    NO_STEP,
    EngineObserver,
    ExpertLoadEvent,
    PhaseEvent,
    RequestEvent,
    RequestEventKind,
    StepBegin,
    StepEvent,
    StepPhase,
)
from .kv_cache import KVCache, num_blocks_for_bytes, torch_dtype
from .loader import load_weights, read_model_config
from .model import LlamaModel, init_random_weights
from .model_runner import ModelInput, ModelRunner
from .moe import expert_loads, placement
from .request import (
    CompletionOutput,
    InvalidRequestError,
    Request,
    RequestOutput,
    SamplingParams,
)
from .sampler import Sampler
from .scheduler import Scheduler, SchedulerOutput
from .tokenizer import Tokenizer, load_tokenizer

K = RequestEventKind
Prompt = str | Sequence[int]


def build_model(config: EngineConfig) -> LlamaModel:
    kernels = config.resolved_kernel_backend
    if kernels == "triton":
        from .kernels._common import check_device

        check_device(config.device)
    elif kernels == "numba":
        try:
            import numba  # noqa: F401
        except ImportError:
            raise ConfigError(
                "kernel_backend 'numba' needs the numba package: pip install 'perfdiag[cpu]'"
            ) from None
    model = LlamaModel(config.model, config.attention_backend, kernels)
    packed: dict = {}
    if is_gguf(config.model_path):
        packed = load_gguf_weights(model, config.model_path, config.weight_format != "float")
    elif config.model_path is not None:
        load_weights(model, config.model_path)
    else:
        init_random_weights(model, config.model)
    model = model.to(device=config.device, dtype=torch_dtype(config.dtype)).eval()
    if config.weight_format != "float":  # weight-only quantisation (quant.py)
        from .quant import quantize_model

        quantize_model(model, config.weight_format, packed)
    if kernels == "numba":
        from .cpu_forward import warm_up

        warm_up(model)  # loads the compiled step now, not in the run's first decode step
    return model


def local_kv_blocks(config: EngineConfig) -> tuple[int, int]:
    """Device and CPU blocks of one rank's pool: `kv_cache_bytes` per rank, each rank
    holding its share of the KV heads (all of them without tensor parallelism)."""
    cc, mcfg = config.cache, config.model
    if config.tensor_parallel_size > 1:
        from .parallel import local_model_config

        mcfg = local_model_config(mcfg, config.tensor_parallel_size)
    num_blocks = cc.num_gpu_blocks or num_blocks_for_bytes(
        mcfg, cc.block_size, config.dtype, cc.kv_cache_bytes
    )
    return num_blocks, num_blocks if cc.num_cpu_blocks is None else cc.num_cpu_blocks


class LLMEngine:
    def __init__(
        self,
        config: EngineConfig | None = None,
        observer: EngineObserver | None = None,
        tokenizer: Tokenizer | None = None,
    ) -> None:
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
        else:
            self.model = build_model(config)
            self.kv_cache = KVCache(mcfg, num_blocks, cc.block_size, num_cpu, device,
                                    config.dtype)  # fmt: skip
        self.block_manager = BlockManager(
            num_blocks,
            cc.block_size,
            num_cpu,
            cc.enable_prefix_caching,
            self.kv_cache,
            check=cc.check_ownership,
        )
        self.watermark_blocks = int(cc.watermark * num_blocks)
        self.scheduler = Scheduler(
            config.scheduler,
            self.block_manager,
            config.max_model_len,
            config.max_wait_ns,
            self.watermark_blocks,
        )
        runner_cls, extra = ModelRunner, {}
        if self.tp is not None:
            from .parallel import TPModelRunner

            runner_cls, extra = TPModelRunner, {"tp": self.tp}
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
        from .parallel import TensorParallel, TPKVCache, local_model_config, shard_model

        config = self.config
        tp = config.tensor_parallel_size
        self.tp = TensorParallel(config)
        try:
            self.model = build_model(config)
            shard_model(self.model, 0, tp, self.tp.comm, config.expert_placement)
            self.kv_cache = TPKVCache(
                local_model_config(config.model, tp), num_blocks, config.cache.block_size,
                num_cpu, torch.device(config.device), config.dtype,
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

    # ---- requests in ------------------------------------------------------------------------
    def add_request(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        arrival_ns: int | None = None,
        cache_salt: str | None = None,
    ) -> str:
        """Queue a request; raises InvalidRequestError (and changes nothing) if it is bad."""
        arrival = time.monotonic_ns() if arrival_ns is None else int(arrival_ns)
        rid = f"req-{next(self._ids)}" if request_id is None else str(request_id)
        obs = self.observer
        if obs is not None:
            n = len(prompt) if isinstance(prompt, Sequence) and not isinstance(prompt, str) else 0
            obs.on_request(RequestEvent(rid, K.ARRIVED, arrival, NO_STEP, n))
        try:
            req = self._make_request(rid, prompt, params, arrival, cache_salt)
        except InvalidRequestError as e:
            if obs is not None:
                ts = time.monotonic_ns()
                obs.on_request(
                    RequestEvent(rid, K.FINISHED, ts, NO_STEP, 0, detail=f"rejected: {e}")
                )
            raise
        if obs is not None:
            ts = time.monotonic_ns()
            obs.on_request(RequestEvent(rid, K.TOKENIZED, ts, NO_STEP, req.num_prompt_tokens))
        self.requests[rid] = req
        self._inbox.append(req)
        self._apply_queued_if_idle()
        return rid

    def _make_request(self, rid, prompt, params, arrival, cache_salt) -> Request:
        if rid in self.requests:
            raise InvalidRequestError(f"request id {rid!r} is already in use")
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError("params must be a SamplingParams")
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt) if prompt else []  # no BOS-only "prompt"
        elif isinstance(prompt, Sequence) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            ids = list(prompt)
        else:
            raise InvalidRequestError("prompt must be a str or a sequence of int token ids")
        vocab, max_len = self.config.model.vocab_size, self.config.max_model_len
        if not ids:
            raise InvalidRequestError("empty prompt")
        if len(ids) >= max_len:
            raise InvalidRequestError(
                f"prompt of {len(ids)} tokens leaves no room to generate (max_model_len {max_len})"
            )
        bad = next((t for t in (*ids, *params.stop_token_ids) if not 0 <= t < vocab), None)
        if bad is not None:
            raise InvalidRequestError(f"token id {bad} outside the vocabulary [0, {vocab})")
        max_total = min(len(ids) + params.max_tokens, max_len)
        bm = self.block_manager
        if bm.blocks_for(max_total) > bm.num_blocks - self.watermark_blocks:
            raise InvalidRequestError(
                f"up to {max_total} tokens need {bm.blocks_for(max_total)} KV blocks; the pool "
                f"has {bm.num_blocks - self.watermark_blocks} to give"
            )
        gen = None
        if params.seed is not None:
            gen = torch.Generator(device=self.device).manual_seed(params.seed)
        return Request(
            request_id=rid,
            prompt_token_ids=tuple(ids),
            params=params,
            arrival_ns=arrival,
            max_total_tokens=max_total,
            eos_token_ids=self.eos_token_ids,
            hash_root=hash_root(self.fingerprint, cache_salt),
            generator=gen,
        )

    def abort(self, request_id: str) -> bool:
        """Cancel a request in any state. Its resources are released now if no step is
        running, else when the running step ends. False if unknown or already finished."""
        req = self.requests.get(request_id)
        if req is None or req.status.is_finished or request_id in self._aborting:
            return False
        self._aborting.add(request_id)
        obs = self.observer
        if obs is not None:
            ts = time.monotonic_ns()
            obs.on_request(RequestEvent(request_id, K.ABORTED, ts, NO_STEP, req.num_output_tokens))
        self._aborts.append(request_id)
        self._apply_queued_if_idle()
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests or self._outputs or self._inbox)

    def _apply_queued_if_idle(self) -> None:
        if self._lock.acquire(blocking=False):
            try:
                self._apply_queued(NO_STEP)
            finally:
                self._lock.release()

    def _apply_queued(self, step_id: int) -> None:
        """Move queued requests into the scheduler and apply queued aborts (lock held, no
        step in flight)."""
        obs = self.observer
        while self._inbox:
            req = self._inbox.popleft()
            self.scheduler.add(req)
            if obs is not None:
                ts = time.monotonic_ns()
                obs.on_request(
                    RequestEvent(req.request_id, K.QUEUED, ts, step_id, req.num_prompt_tokens)
                )
        while self._aborts:
            rid = self._aborts.popleft()
            self._aborting.discard(rid)
            req = self.requests.pop(rid, None)
            if req is None or req.status.is_finished:  # it finished on its own meanwhile
                continue
            self.scheduler.abort(req)
            self._outputs.append(
                RequestOutput(req.request_id, [], [], req.num_output_tokens, True, "abort")
            )
            if obs is not None:
                ts = time.monotonic_ns()
                obs.on_request(
                    RequestEvent(
                        req.request_id,
                        K.FINISHED,
                        ts,
                        step_id,
                        req.num_output_tokens,
                        detail="abort",
                    )
                )

    # ---- one step -----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule one batch, run it, sample; returns what each touched request produced
        (and requests aborted since the last step)."""
        with self._lock:
            self._apply_queued(NO_STEP)
            if not self.scheduler.has_work():
                outputs, self._outputs = self._outputs, []
                return outputs
            obs = self.observer
            step_id = self._step_id
            self._step_id += 1
            t0 = time.monotonic_ns()
            if obs is not None:
                obs.on_step_begin(StepBegin(step_id, t0))
            sched = self.scheduler.schedule(t0)
            if not sched.scheduled:
                raise RuntimeError("engine_ref scheduler made no progress (a bug)")
            if obs is not None:
                t1 = time.monotonic_ns()
                obs.on_phase(PhaseEvent(step_id, StepPhase.SCHEDULE, t0, t1))
                self._schedule_events(sched, step_id, t1)
                counts = self._kv_and_queue_counts()
            try:
                inp = self.runner.prepare(sched.scheduled)
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
            finally:
                self.runner.release()  # sampling copied the tokens to the host: step done
            if obs is not None:
                t4 = time.monotonic_ns()
                obs.on_phase(PhaseEvent(step_id, StepPhase.SAMPLE, t3, t4))
            outputs, comp = self._postprocess(inp, tokens, logprobs, step_id)
            self._apply_queued(step_id)  # aborts that arrived mid-step: nothing is in flight now
            outputs.extend(self._outputs)
            self._outputs = []
            if obs is not None:
                t5 = time.monotonic_ns()
                obs.on_phase(PhaseEvent(step_id, StepPhase.POSTPROCESS, t4, t5))
                if self._expert_rank is not None:
                    obs.on_expert_loads(self._expert_loads(step_id))
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

    def _expert_loads(self, step_id: int) -> list[ExpertLoadEvent]:
        """The step's tokens per (layer, expert), counted on the device by each MoE block's
        router and read here once (sampling has synchronised), with each expert's rank."""
        loads = expert_loads(self.model)
        if loads is None:
            return []
        ranks = self._expert_rank
        return [ExpertLoadEvent(ranks[e], step_id, layer, e, n)
                for layer, row in enumerate(loads.tolist()) for e, n in enumerate(row)]  # fmt: skip

    def _kv_and_queue_counts(self) -> tuple[int, ...]:
        bm, s = self.block_manager, self.scheduler
        return (
            bm.num_used_blocks,
            bm.num_free_blocks,
            bm.num_cached_blocks,
            bm.num_cpu_blocks - bm.num_free_cpu_blocks,
            len(s.waiting) + len(self._inbox),
            len(s.running),
            len(s.swapped),
        )

    def _schedule_events(self, sched: SchedulerOutput, step_id: int, ts: int) -> None:
        on = self.observer.on_request
        for req, mode, lost in sched.preempted:
            on(RequestEvent(req.request_id, K.PREEMPTED, ts, step_id, lost, detail=mode))
        n_new = dict((id(r), n) for r, n in sched.scheduled)
        for req, hits, resumed in sched.admitted:
            n = n_new[id(req)]
            on(RequestEvent(req.request_id, K.SCHEDULED, ts, step_id, n, num_cached_tokens=hits))
            if resumed:
                on(RequestEvent(req.request_id, K.RESUMED, ts, step_id, n, hits, "recompute"))
        for req in sched.swapped_in:
            on(RequestEvent(req.request_id, K.RESUMED, ts, step_id, n_new[id(req)], detail="swap"))

    def _postprocess(self, inp: ModelInput, tokens, logprobs, step_id: int):
        obs = self.observer
        ts = time.monotonic_ns() if obs is not None else 0
        bm = self.block_manager
        prefill_tokens = prefill_seqs = decode_seqs = 0
        for req, n in inp.batch:
            prev = req.num_computed_tokens
            req.num_computed_tokens = prev + n
            bm.cache_full_blocks(req, prev)
            if prev < req.num_tokens - 1 or req.num_output_tokens == 0:
                prefill_tokens += n
                prefill_seqs += 1
                if obs is not None:
                    obs.on_request(RequestEvent(req.request_id, K.PREFILL_CHUNK, ts, step_id, n))
            else:
                decode_seqs += 1
        outputs = []
        max_len = self.config.max_model_len
        for req, tok, lp in zip(inp.sample_reqs, tokens, logprobs, strict=True):
            req.append_token(tok, lp)
            status = req.check_stop(max_len)
            if obs is not None:
                kind = K.FIRST_TOKEN if req.num_output_tokens == 1 else K.TOKEN
                obs.on_request(
                    RequestEvent(req.request_id, kind, ts, step_id, req.num_output_tokens)
                )
            if status is not None:
                self.scheduler.finish(req, status)
                self.requests.pop(req.request_id, None)
                if obs is not None:
                    obs.on_request(
                        RequestEvent(
                            req.request_id,
                            K.FINISHED,
                            ts,
                            step_id,
                            req.num_output_tokens,
                            detail=status.finish_reason,
                        )
                    )
            outputs.append(
                RequestOutput(
                    req.request_id,
                    [tok],
                    [lp],
                    req.num_output_tokens,
                    status is not None,
                    status and status.finish_reason,
                )
            )
        return outputs, (prefill_tokens, prefill_seqs, decode_seqs)

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

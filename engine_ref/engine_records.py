"""One step's results applied and reported: sampled tokens appended, finished requests
released, and the observer's request, step, KV and expert-load records."""

from __future__ import annotations

import time

from .hooks import ExpertLoadEvent, RequestEvent, RequestEventKind, StepBegin
from .model_runner import ModelInput
from .moe import expert_loads
from .request import RequestOutput
from .scheduler import SchedulerOutput

K = RequestEventKind


class StepRecords:
    """LLMEngine's after-the-forward half (a mixin: the state is LLMEngine's)."""

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

    def _begin_step(self) -> tuple[int, int]:
        """The next step's id and start time, announced to the observer."""
        step_id, t0 = self._step_id, time.monotonic_ns()
        self._step_id += 1
        if self.observer is not None:
            self.observer.on_step_begin(StepBegin(step_id, t0))
        return step_id, t0

    def _advance(self, inp: ModelInput, step_id: int, ts: int | None = None):
        """Post-processing's first half, before the tokens exist (the overlapped step runs
        it alone): computed tokens, full blocks cached, prefill chunks reported. Returns
        the step's (prefill tokens, prefill sequences, decode sequences)."""
        obs, bm = self.observer, self.block_manager
        if ts is None:
            ts = time.monotonic_ns() if obs is not None else 0
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
        return prefill_tokens, prefill_seqs, decode_seqs

    def _postprocess(self, inp: ModelInput, tokens, logprobs, step_id: int):
        obs = self.observer
        ts = time.monotonic_ns() if obs is not None else 0
        comp = self._advance(inp, step_id, ts)
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
        return outputs, comp

"""Overlapped (asynchronous) scheduling: step N+1 is scheduled and its inputs prepared
while step N's forward runs (vLLM's --async-scheduling, SGLang's overlap scheduler).

Once step N's forward is launched the engine
  1. advances every scheduled request's computed tokens and caches its full blocks (what
     post-processing would do first; it needs no sampled token),
  2. gives each request that samples in N a placeholder for the token it will get, unless
     that token certainly ends it (its length limit): then it is not scheduled again,
  3. schedules N+1 and prepares its inputs, then takes the placeholders out again,
and only then waits for N's sampled tokens. When N+1 starts, requests that finished (a
stop token) or were aborted at N are dropped from its batch — their slots went with them
and the batch is prepared again without them — and the placeholders in the prepared input
ids are overwritten by the sampled tokens. A request the look-ahead preempted before its
token came back gets the token all the same (it is recomputed with it, as without overlap).

Differences from the plain loop, by design (as in vLLM): requests that arrive during step
N are admitted at N+2 at the earliest, and a request that stops at N still held its blocks
when N+1 was scheduled. Outputs are the same: every request's tokens depend on its own
tokens and generator only.

On CUDA the forward returns at launch, so the look-ahead runs while the device computes:
the part that ended before the device finished is recorded as hidden (HOST_HIDDEN; from
CUDA events: all of it while the forward's end event is pending, else up to the forward's
start plus its device time). On the CPU the forward returns when it is done: the same work
runs and all of it is exposed (no HOST_HIDDEN span).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from .hooks import NO_STEP, PhaseEvent, StepEvent
from .hooks import StepPhase as P
from .host_tier import report_host_tier
from .model_runner import ModelInput
from .request import Request, RequestStatus
from .scheduler import SchedulerOutput

PLACEHOLDER = 0  # any valid token id: overwritten before the forward reads it


@dataclass
class Ahead:
    """Step N+1 as scheduled and prepared during step N."""

    sched: SchedulerOutput
    inp: ModelInput
    holes: list[tuple[Request, int]]  # (request, offset in the flat ids) per placeholder


class OverlappedSteps:
    """LLMEngine's overlapped step loop (a mixin: the state is LLMEngine's)."""

    _ahead: Ahead | None = None

    def _step_overlapped(self):
        with self._lock:
            self._apply_queued(NO_STEP)
            ahead, self._ahead = self._ahead, None
            live = None
            if ahead is not None:
                live = [x for x in ahead.sched.scheduled if x[0].status == RequestStatus.RUNNING]
                if not live:
                    ahead = None  # everyone it planned for finished or was aborted
            if ahead is None and not self.scheduler.has_work():
                outputs, self._outputs = self._outputs, []
                return outputs
            obs = self.observer
            step_id, t0 = self._begin_step()
            if ahead is None:  # the first step, or after an idle engine: nothing overlapped
                sched = self.scheduler.schedule(t0)
                report_host_tier(obs, self.block_manager.host_tier)  # --kv-offload-mb's records
                if not sched.scheduled:
                    raise RuntimeError("engine_ref scheduler made no progress (a bug)")
                t1 = time.monotonic_ns()
                if obs is not None:
                    obs.on_phase(PhaseEvent(step_id, P.SCHEDULE, t0, t1))
                    self._schedule_events(sched, step_id, t1)
                inp = self.runner.prepare(sched.scheduled)
            else:
                sched, t1 = ahead.sched, t0
                inp = self._resolve_ahead(ahead, live)
            counts = self._kv_and_queue_counts() if obs is not None else ()
            t2 = time.monotonic_ns()
            if obs is not None:
                obs.on_phase(PhaseEvent(step_id, P.PREPARE, t1, t2))
            try:
                timer = _ForwardTimer(self.device) if obs is not None else None
                logits = self.runner.forward(inp)
                t3 = time.monotonic_ns()
                if timer is not None:
                    timer.launched()
                    obs.on_phase(PhaseEvent(step_id, P.FORWARD, t2, t3))
                comp = self._advance(inp, step_id)
                # The look-ahead may preempt a request this forward reads: its blocks are
                # freed on the host only, and any reuse is queued on the device after this
                # forward (one stream); the CPU forward is over already. So unpin now.
                self.runner.release()
                self._ahead = self._look_ahead(inp, step_id + 1)
                if obs is not None:
                    t4 = time.monotonic_ns()
                    hidden = timer.hidden_ns(t2, t3, t4)
                    if hidden:
                        obs.on_phase(PhaseEvent(step_id, P.HOST_HIDDEN, t3, t3 + hidden))
                tokens, logprobs = self.runner.sample(logits, inp)
            except BaseException:
                self._ahead = None
                raise
            finally:
                self.runner.release()  # sampling copied the tokens to the host: step done
            t5 = time.monotonic_ns() if obs is not None else 0
            if obs is not None:
                obs.on_phase(PhaseEvent(step_id, P.SAMPLE, t4, t5))
            outputs, _ = self._postprocess(dataclasses.replace(inp, batch=[]), tokens,
                                           logprobs, step_id)  # fmt: skip
            self._apply_queued(step_id)  # aborts that arrived mid-step: nothing is in flight now
            outputs.extend(self._outputs)
            self._outputs = []
            if obs is not None:
                t6 = time.monotonic_ns()
                obs.on_phase(PhaseEvent(step_id, P.POSTPROCESS, t5, t6))
                if self._expert_rank is not None:
                    obs.on_expert_loads(self._expert_loads(step_id))
                obs.on_step(StepEvent(step_id, t0, t6, *comp, inp.num_context_tokens,
                                      sched.num_cached_tokens, *counts, len(sched.preempted),
                                      sched.blocked_by))  # fmt: skip
            return outputs

    # ---- the halves of a step that move ------------------------------------------------------
    def _look_ahead(self, inp: ModelInput, next_id: int) -> Ahead | None:
        """Schedule and prepare step `next_id` while the current forward runs."""
        obs = self.observer
        t0 = time.monotonic_ns()
        max_len = self.config.max_model_len
        pending = [r for r in inp.sample_reqs
                   if r.num_output_tokens + 1 < r.params.max_tokens
                   and r.num_tokens + 1 < max_len]  # fmt: skip
        for r in pending:
            r.all_token_ids.append(PLACEHOLDER)
        try:
            if not self.scheduler.has_work():
                return None
            sched = self.scheduler.schedule(t0)
            report_host_tier(obs, self.block_manager.host_tier)
            t1 = time.monotonic_ns()
            if obs is not None:
                obs.on_phase(PhaseEvent(next_id - 1, P.SCHEDULE_AHEAD, t0, t1))
                self._schedule_events(sched, next_id, t1)
            if not sched.scheduled:
                return Ahead(sched, None, [])  # nothing fits yet: the next step schedules anew
            nxt = self.runner.prepare(sched.scheduled)
        finally:
            for r in pending:
                r.all_token_ids.pop()
        waiting = {id(r) for r in pending}
        holes, offset = [], 0
        for r, n in nxt.batch:
            if id(r) in waiting:
                holes.append((r, offset))  # n == 1: a decode of the placeholder
            offset += n
        if obs is not None:
            obs.on_phase(PhaseEvent(next_id - 1, P.PREPARE_AHEAD, t1, time.monotonic_ns()))
        return Ahead(sched, nxt, holes)

    def _resolve_ahead(self, ahead: Ahead, live: list[tuple[Request, int]]) -> ModelInput:
        """The look-ahead's inputs made true: prepared again without the requests that
        finished meanwhile, else with the sampled tokens written over the placeholders."""
        if ahead.inp is None or len(live) != len(ahead.sched.scheduled):
            return self.runner.prepare(live)
        inp = ahead.inp
        if ahead.holes:
            offsets = [off for _, off in ahead.holes]
            values = [r.all_token_ids[-1] for r, _ in ahead.holes]
            for off, tok in zip(offsets, values, strict=True):
                inp.plan.ids[off] = tok
            idx = torch.tensor(offsets, dtype=torch.long, device=inp.input_ids.device)
            inp.input_ids[idx] = torch.tensor(values, dtype=inp.input_ids.dtype,
                                              device=inp.input_ids.device)  # fmt: skip
        guard = self.runner.guard
        if guard is not None:  # the previous step's release unpinned what this one reads
            plan = inp.plan
            guard.pin(b for t in plan.decode_tables for b in t)
            guard.pin(b for p in plan.prefills for b in p[4])
        return inp


class _ForwardTimer:
    """When the device finished the forward, to tell hidden host time from exposed."""

    def __init__(self, device: torch.device) -> None:
        self.events = None
        if device.type == "cuda":
            self.events = (torch.cuda.Event(enable_timing=True),
                           torch.cuda.Event(enable_timing=True))  # fmt: skip
            self.events[0].record()

    def launched(self) -> None:
        if self.events is not None:
            self.events[1].record()

    def hidden_ns(self, fwd_start: int, launched: int, ahead_end: int) -> int:
        """Host ns of [launched, ahead_end] that ran while the forward still computed."""
        if self.events is None:
            return 0  # the CPU forward returned when it was done: nothing was hidden
        span = ahead_end - launched
        if not self.events[1].query():
            return span  # still computing: everything so far was hidden
        device_ns = int(self.events[0].elapsed_time(self.events[1]) * 1e6)
        # The device started no earlier than the launch began: its end is at least this.
        return max(0, min(span, fwd_start + device_ns - launched))

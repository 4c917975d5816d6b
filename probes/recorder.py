"""The always-on probes: engine hook events and client timings → the run's tables.

One object is both the engine's observer and the load client's sink, so a request's
engine-side and client-side lifecycle land in one table under one id. Every method is a
tuple build plus a list append (the writer's hot path); nothing here blocks the engine.
"""

from __future__ import annotations

import json
import os
import resource
import threading
import time

from ..engine_ref.hooks import (
    NO_STEP,
    CollectiveEvent,
    EngineObserver,
    ExpertLoadEvent,
    PhaseEvent,
    RankStepEvent,
    RequestEvent,
    RequestEventKind,
    SpecDecodeEvent,
    StageEvent,
    StepBegin,
    StepEvent,
)
from ..traces.writer import RunWriter
from .client import ClientResult
from .run_queue import ThreadRunDelay

# Engine hook kinds → the run format's request-event kinds.
ENGINE_KINDS = {
    RequestEventKind.ARRIVED: "arrival",
    RequestEventKind.TOKENIZED: "tokenize_end",
    RequestEventKind.QUEUED: "queued",
    RequestEventKind.SCHEDULED: "scheduled",
    RequestEventKind.PREFILL_CHUNK: "prefill_chunk",
    RequestEventKind.FIRST_TOKEN: "first_token",
    RequestEventKind.TOKEN: "token",
    RequestEventKind.PREEMPTED: "preempted",
    RequestEventKind.RESUMED: "resumed",
    RequestEventKind.FINISHED: "finished",
    RequestEventKind.ABORTED: "aborted",
}


class RunRecorder(EngineObserver):
    def __init__(self, writer: RunWriter, rank: int | None = None, step_timer=None,
                 window=None, decode=None, replica: int | None = None):  # fmt: skip
        self._event = writer.table("request_events").append
        self._step = writer.table("steps").append
        self._span = writer.table("spans").append
        self._request = writer.table("requests").append
        self._counter = writer.table("counters").append
        self._step_start_ns = 0  # the running step's start: its expert loads' timestamp
        self._rank = rank
        self._replica = replica  # data parallelism: this recorder's replica (its own thread)
        self._pid = os.getpid()
        self._cached: dict[str, int] = {}  # request → prefix-cache hits at first admission
        self._prompt_len: dict[str, int] = {}
        self.steps_recorded = 0
        self._timer = step_timer  # CudaStepTimer on a GPU: GPU time per step, NVTX ranges
        self._window = window  # ProfilerWindow: torch.profiler over chosen steps
        self._decode = decode  # with --record-text: token ids → text
        self._host_at_begin = (0, 0)  # (CPU ns, involuntary switches) at the step's start
        # A replica shares the process with the others: its steps count its thread's CPU.
        self._host_usage = _host_usage if replica is None else _thread_usage
        self._run_delay = ThreadRunDelay()  # the stepping thread's run-queue wait
        self._run_delay_at_begin: tuple[int | None, int | None] = (None, None)

    def _run_delay_since_begin(self) -> int | None:
        tid, begin = self._run_delay_at_begin
        waited = self._run_delay()
        if waited is None or begin is None or tid != self._run_delay.tid:
            return None  # not measured, or the step ended on another thread
        return waited - begin

    # -- engine side ---------------------------------------------------------------------
    def on_request(self, e: RequestEvent) -> None:
        kind = ENGINE_KINDS[e.kind]
        cached = None
        if kind == "scheduled":
            cached = e.num_cached_tokens
            self._cached.setdefault(e.request_id, cached)
        elif kind == "tokenize_end":
            self._prompt_len[e.request_id] = e.num_tokens
        step = None if e.step_id == NO_STEP else e.step_id
        self._event((e.request_id, kind, e.ts_ns, "engine", step, e.num_tokens,
                     e.detail or None, cached))  # fmt: skip

    def on_step_begin(self, e: StepBegin) -> None:
        # The step's row is written whole when it ends; here only what must start now.
        self._step_start_ns = e.start_ns
        if self._window is not None:
            self._window.on_step_begin(e.step_id, e.start_ns)
        if self._timer is not None:
            self._timer.begin(e.step_id)
        self._host_at_begin = self._host_usage()
        waited = self._run_delay()
        self._run_delay_at_begin = (self._run_delay.tid, waited)

    def on_phase(self, e: PhaseEvent) -> None:
        self._span((e.phase.value, "phase", e.start_ns, e.end_ns - e.start_ns, self._pid,
                    threading.get_native_id(), None, None, self._rank, e.step_id, None, None,
                    None, None))  # fmt: skip

    def on_step(self, e: StepEvent) -> None:
        cpu_ns, switches = self._host_usage()
        cpu_ns -= self._host_at_begin[0]
        switches -= self._host_at_begin[1]
        run_delay = self._run_delay_since_begin()
        gpu_time_ns = self._timer.end() if self._timer is not None else None
        if self._window is not None:
            self._window.on_step_end(e.step_id, e.end_ns)
        self._step((e.step_id, e.start_ns, e.end_ns, e.num_prefill_seqs, e.num_prefill_tokens,
                    e.num_decode_seqs, e.num_context_tokens, e.num_waiting, e.num_running,
                    e.num_swapped, e.num_preemptions, e.kv_blocks_used, e.kv_blocks_free,
                    e.kv_blocks_cached, gpu_time_ns, self._rank, e.num_cached_tokens,
                    e.cpu_blocks_used, cpu_ns, switches, e.blocked_by or None,
                    self._replica, run_delay))  # fmt: skip
        self.steps_recorded += 1

    def on_collectives(self, events: list[CollectiveEvent]) -> None:
        # Tensor parallelism: every rank's collectives, on rank 0's clock (the run's clock).
        span = self._span
        for e in events:
            span((e.name, "comm", e.start_ns, e.end_ns - e.start_ns, None, None, None, None,
                  e.rank, e.step_id, None, None, e.nbytes,
                  f'{{"group": "{e.group}", "seq": {e.seq}, '
                  f'"cpu_time_ns": {e.cpu_time_ns or 0}}}'))  # fmt: skip

    def on_rank_steps(self, events: list[RankStepEvent]) -> None:
        # A worker rank's forward of a step (rank 0's forward is its "forward" phase).
        span = self._span
        for e in events:
            host = None
            if e.cpu_time_ns is not None:
                host = (f'{{"cpu_time_ns": {e.cpu_time_ns}, '
                        f'"involuntary_switches": {e.involuntary_switches or 0}}}')  # fmt: skip
            span(("tp_forward", "python", e.start_ns, e.end_ns - e.start_ns, None, None, None,
                  None, e.rank, e.step_id, None, None, None, host))  # fmt: skip

    def on_pipeline_stages(self, events: list[StageEvent]) -> None:
        # Pipeline parallelism: each stage's compute (python) and send / recv (comm, no seq:
        # not a collective) per micro-batch, on rank 0's clock (analyzers/pipeline.py).
        span = self._span
        for e in events:
            cat = "python" if e.kind == "compute" else "comm"
            span((f"pp_{e.kind}", cat, e.start_ns, e.end_ns - e.start_ns, None, None, None,
                  None, e.stage, e.step_id, None, None, e.nbytes or None,
                  f'{{"group": "pp", "microbatch": {e.microbatch}, '
                  f'"tokens": {e.num_tokens}}}'))  # fmt: skip

    def on_expert_loads(self, events: list[ExpertLoadEvent]) -> None:
        # Counters at the step's start (its row's start_ns: how analyzers find the step),
        # scoped layer/expert/rank (analyzers/experts.py reads them back).
        counter, ts = self._counter, self._step_start_ns
        for e in events:
            counter(("expert_tokens", ts, float(e.tokens),
                     f"layer{e.layer}/expert{e.expert}/rank{e.rank}"))  # fmt: skip

    def on_spec_decode(self, events: list[SpecDecodeEvent]) -> None:
        # Speculative decoding: one row per counter per verified request, at the step's
        # start, scoped by the request id (acceptance by position follows from accepted
        # of drafted: positions 0..accepted-1 accepted, position accepted rejected).
        counter, ts = self._counter, self._step_start_ns
        for e in events:
            counter(("spec_drafted", ts, float(e.drafted), e.request_id))
            counter(("spec_accepted", ts, float(e.accepted), e.request_id))
            counter(("spec_emitted", ts, float(e.emitted), e.request_id))

    def on_kv_offload(self, restores, counts) -> None:
        # The prefix cache's host tier: per admission, counters at the step's start scoped
        # by the request id (its prefix hits by tier; bytes and ns of the host restore);
        # per step, the tier's traffic scoped "host" (docs/run_format.md, host tier).
        counter, ts = self._counter, self._step_start_ns
        for r in restores:
            counter(("kv_hit_device_tokens", ts, float(r.device_tokens), r.request_id))
            counter(("kv_hit_host_tokens", ts, float(r.host_tokens), r.request_id))
            if r.host_tokens:
                counter(("kv_restore_bytes", ts, float(r.restore_bytes), r.request_id))
                counter(("kv_restore_ns", ts, float(r.restore_ns), r.request_id))
        if counts.offloaded_blocks or counts.evicted_unused:
            counter(("kv_offload_blocks", ts, float(counts.offloaded_blocks), "host"))
            counter(("kv_offload_ns", ts, float(counts.offload_ns), "host"))
            counter(("kv_offload_evicted_unused", ts, float(counts.evicted_unused), "host"))
            counter(("kv_offload_blocks_used", ts, float(counts.host_blocks_used), "host"))

    def on_close(self) -> None:
        if self._window is not None:
            self._window.close()  # the profiler stops on the thread that started it

    # -- client side ---------------------------------------------------------------------
    def client_event(self, request_id: str, kind: str, ts_ns: int, num_tokens: int | None) -> None:
        self._event((request_id, kind, ts_ns, "client", None, num_tokens, None, None))

    def request_done(self, result: ClientResult) -> None:
        req = result.request
        rid = req.request_id
        prompt_len = req.prompt_len if req.prompt_len is not None else self._prompt_len.get(rid)
        args = {"max_tokens": req.max_tokens, "offset_s": req.offset_s}
        if self._decode is not None:  # --record-text: content, on request only
            prompt = req.prompt_text if req.prompt_ids is None else self._decode(req.prompt_ids)
            args["prompt_text"] = prompt
            args["output_text"] = self._decode(result.token_ids or [])
        if req.cancel_after_tokens is not None or req.cancel_after_s is not None:
            args["cancel_after_tokens"] = req.cancel_after_tokens
            args["cancel_after_s"] = req.cancel_after_s
        self._request((rid, prompt_len, result.output_tokens, self._cached.get(rid),
                       result.finish_reason, req.is_warmup, req.prefix_group,
                       result.output_digest, result.error, json.dumps(args),
                       self._replica))  # fmt: skip


def _host_usage() -> tuple[int, int]:
    """The process's CPU time (user + system, every thread) in ns and its involuntary
    context switches so far: one getrusage call (about a microsecond)."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return int((u.ru_utime + u.ru_stime) * 1e9), u.ru_nivcsw


def _thread_usage() -> tuple[int, int]:
    """The same for the calling thread alone: its CPU clock (exact, where getrusage counts
    in ticks) and its involuntary switches (Linux; the process's elsewhere)."""
    u = resource.getrusage(getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF))
    return time.thread_time_ns(), u.ru_nivcsw

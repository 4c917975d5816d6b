"""The hook interface: what an observer (perfdiag's probes) receives from the engine.

The engine holds at most one observer. Every hook site is guarded by a single
`if observer is not None`, and timestamps are taken inside the guard, so an engine without
an observer pays nothing else. Every timestamp is an int from `time.monotonic_ns()`.

Events map 1:1 to rows of the run's tables: `RequestEvent` to the requests table,
`StepEvent` to the engine-steps table, `PhaseEvent` to spans within a step.

Threads: step events and most request events come from the thread that calls `step()`;
ARRIVED, TOKENIZED, QUEUED and ABORTED may come from the thread that calls
`add_request()` / `abort()` (the asyncio loop, with `AsyncLLMEngine`). Observers must
tolerate that (appending to a list is enough in CPython).
"""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple

NO_STEP = -1  # step_id of an event that happened outside any step


class RequestEventKind(str, Enum):
    """What happened to a request. `num_tokens` of the event means, per kind:"""

    ARRIVED = "arrived"  # prompt tokens if given as ids, else 0; ts_ns = the arrival time
    TOKENIZED = "tokenized"  # prompt tokens
    QUEUED = "queued"  # prompt tokens; entered the waiting queue
    SCHEDULED = "scheduled"  # tokens scheduled at admission; num_cached_tokens = prefix hits
    PREFILL_CHUNK = "prefill_chunk"  # prompt (or recomputed) tokens computed in this step
    FIRST_TOKEN = "first_token"  # 1: the first output token was sampled
    TOKEN = "token"  # output tokens so far (2, 3, ...): one event per later output token
    PREEMPTED = "preempted"  # computed tokens at preemption; detail = "recompute" | "swap"
    RESUMED = "resumed"  # tokens to compute; detail = "recompute" | "swap"
    FINISHED = "finished"  # output tokens; detail = "stop" | "length" | "abort"
    ABORTED = "aborted"  # output tokens when abort() was called; FINISHED follows on release


class RequestEvent(NamedTuple):
    request_id: str
    kind: RequestEventKind
    ts_ns: int
    step_id: int
    num_tokens: int
    num_cached_tokens: int = 0
    detail: str = ""


class StepPhase(str, Enum):
    SCHEDULE = "schedule"  # admission, preemption, swap copies
    PREPARE = "prepare_inputs"  # token ids, positions, slot mapping, block tables
    # Speculative decoding: the proposer drafting for the step's running decodes (it runs
    # right after SCHEDULE, since the batch's layout needs the drafts); FORWARD then also
    # verifies the drafts and SAMPLE is the rejection sampling.
    DRAFT = "draft"
    FORWARD = "forward"  # model forward incl. logits (host time: on CUDA it ends at launch)
    SAMPLE = "sample"  # sampling; copies the tokens to the host, so it synchronises
    POSTPROCESS = "post_process"  # append tokens, stop checks, cache blocks, free, aborts
    # Overlapped scheduling (async_step.py): the NEXT step's scheduling and input
    # preparation, run inside this step between FORWARD's launch and SAMPLE's wait.
    SCHEDULE_AHEAD = "schedule_ahead"
    PREPARE_AHEAD = "prepare_ahead"
    # The part of [schedule_ahead, prepare_ahead] that ran while the device still computed
    # the forward (hidden host time; CUDA only, never on the CPU). A sub-span of those two,
    # not more time: exposed host time = schedule_ahead + prepare_ahead - host_hidden.
    HOST_HIDDEN = "host_hidden"


class StepBegin(NamedTuple):
    step_id: int
    start_ns: int


class PhaseEvent(NamedTuple):
    step_id: int
    phase: StepPhase
    start_ns: int
    end_ns: int


class StepEvent(NamedTuple):
    """One engine step. Counts describe the batch the step ran; KV counts and queue depths
    are taken after scheduling, i.e. the state the forward ran in."""

    step_id: int
    start_ns: int
    end_ns: int
    num_prefill_tokens: int
    num_prefill_seqs: int
    num_decode_seqs: int
    num_context_tokens: int  # sum of context lengths the attention read
    num_cached_tokens: int  # prefix-cache hits of requests admitted in this step
    kv_blocks_used: int  # referenced by a request
    kv_blocks_free: int  # allocatable: empty, or cached but unreferenced (evictable)
    kv_blocks_cached: int  # holding a registered prefix hash (referenced or not)
    cpu_blocks_used: int  # the swap tier
    num_waiting: int
    num_running: int
    num_swapped: int
    num_preemptions: int
    blocked_by: str = ""  # what held back the requests still waiting (scheduler.BLOCKED_BY)


class CollectiveEvent(NamedTuple):
    """One collective on one rank (tensor parallelism), on rank 0's clock. `seq` numbers
    the step's collectives in call order: the same seq on every rank is one collective."""

    rank: int
    step_id: int
    name: str  # all_reduce
    group: str  # tp
    nbytes: int  # the tensor each rank contributes
    start_ns: int
    end_ns: int
    seq: int
    cpu_time_ns: int | None = None  # the rank's process CPU time inside the call


class RankStepEvent(NamedTuple):
    """A worker rank's forward of one step, on rank 0's clock, with the host evidence of
    its process over it: CPU time it got and how often the kernel took a core from it (a
    straggler with a core to itself gets ~its wall time; one sharing a core does not)."""

    rank: int
    step_id: int
    start_ns: int
    end_ns: int
    cpu_time_ns: int | None = None
    involuntary_switches: int | None = None


class StageEvent(NamedTuple):
    """Pipeline parallelism: one stage's work on one micro-batch of a step, on rank 0's
    clock: `compute` (its layers), `send` (the call handing the activations on; on the
    CPU gloo copies them out inside it) or `recv` (from posting the receive to holding the
    data: waiting for the previous stage, then the transfer)."""

    stage: int  # = rank
    step_id: int
    microbatch: int
    kind: str  # compute, send, recv
    start_ns: int
    end_ns: int
    nbytes: int = 0  # send / recv: the activations' bytes
    num_tokens: int = 0


class ExpertLoadEvent(NamedTuple):
    """Mixture of experts: the tokens the router sent to one expert of one layer in one
    step (each token counts once per expert among its top-k), and the rank holding it."""

    rank: int
    step_id: int
    layer: int
    expert: int
    tokens: int


class SpecDecodeEvent(NamedTuple):
    """Speculative decoding: one verified request in one step. Drafts 0..accepted-1 were
    accepted and draft `accepted` (if any) rejected; `emitted` tokens were appended
    (accepted + 1, fewer when a stop or the length cap cut the run short)."""

    step_id: int
    request_id: str
    drafted: int
    accepted: int
    emitted: int


class EngineObserver:
    """Base class with no-op methods: subclass and override what you record."""

    def on_expert_loads(self, events: list[ExpertLoadEvent]) -> None:
        """Mixture of experts: every (layer, expert)'s tokens of the step, once per step
        after sampling and before `on_step`."""

    def on_collectives(self, events: list[CollectiveEvent]) -> None:
        """Tensor parallelism: collectives of every rank, after each step (workers' arrive
        a step or so late) and at `close`."""

    def on_rank_steps(self, events: list[RankStepEvent]) -> None:
        """Tensor parallelism: the workers' forwards, delivered like `on_collectives`."""

    def on_pipeline_stages(self, events: list[StageEvent]) -> None:
        """Pipeline parallelism: every stage's compute, send and recv per micro-batch,
        delivered like `on_collectives`."""

    def on_spec_decode(self, events: list[SpecDecodeEvent]) -> None:
        """Speculative decoding: the step's verified requests, once per step after
        sampling and before `on_step` (none in a step that verified nothing)."""

    def on_kv_offload(self, restores: list, counts) -> None:
        """The prefix cache's host tier (`--kv-offload-mb`): each admission's prefix hits by
        tier (host_tier.HostRestore) and the step's host-tier traffic (HostTierCounts), once
        per step right after scheduling."""

    def on_request(self, event: RequestEvent) -> None:
        pass

    def on_step_begin(self, event: StepBegin) -> None:
        pass

    def on_phase(self, event: PhaseEvent) -> None:
        pass

    def on_step(self, event: StepEvent) -> None:
        pass

    def on_close(self) -> None:
        """On the stepping thread, after its last step (`AsyncLLMEngine.close`): whatever
        is bound to that thread (a torch.profiler session) must end here."""


class RecordingObserver(EngineObserver):
    """Keeps every event in lists; used by tests and handy for quick looks."""

    def __init__(self) -> None:
        self.requests: list[RequestEvent] = []
        self.step_begins: list[StepBegin] = []
        self.phases: list[PhaseEvent] = []
        self.steps: list[StepEvent] = []
        self.spec: list[SpecDecodeEvent] = []

    def on_request(self, event: RequestEvent) -> None:
        self.requests.append(event)

    def on_step_begin(self, event: StepBegin) -> None:
        self.step_begins.append(event)

    def on_phase(self, event: PhaseEvent) -> None:
        self.phases.append(event)

    def on_step(self, event: StepEvent) -> None:
        self.steps.append(event)

    def on_spec_decode(self, events: list[SpecDecodeEvent]) -> None:
        self.spec.extend(events)

    def of(self, request_id: str) -> list[RequestEvent]:
        return [e for e in self.requests if e.request_id == request_id]

"""Continuous batching: which requests compute how many tokens in the next step.

Each step has a token budget (`max_num_batched_tokens`) and a sequence cap (`max_num_seqs`).
Order of service, one step:
  1. running requests, in admission order: one token for a decode, a chunk for a prefill.
     When the pool cannot hold a request's new tokens, the latest-admitted running request
     is preempted (swap to the CPU tier when possible in swap mode, else recompute) until
     it fits, or the request itself is the one preempted;
  2. if nobody was preempted: swapped requests come back first (swap-in),
  3. then waiting requests are admitted, in policy order: overdue ones (waiting longer
     than `max_wait_ms`) first, then preempted ones, then by arrival ("fcfs") or by the
     longest cached prefix ("prefix"). Admission stops at the first request that does not
     fit, so nothing overtakes the head of the line.
With speculative decoding (`spec_tokens` K > 0) a running decode also gets slots for up to
K draft tokens after its last one (within its token maximum and the step's budget), taken
like any decode's: they may preempt. The engine frees the ones verification rejects.
Admission keeps a reserve: the watermark plus the blocks running requests (and the new one)
need for their next `decode_reserve_tokens` tokens, unless nothing runs at all.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .block_manager import BlockManager
from .config import SchedulerConfig
from .request import Request, RequestStatus


@dataclass
class SchedulerOutput:
    scheduled: list[tuple[Request, int]] = field(default_factory=list)  # (request, new tokens)
    admitted: list[tuple[Request, int, bool]] = field(default_factory=list)  # (req, hits, resumed)
    swapped_in: list[Request] = field(default_factory=list)
    preempted: list[tuple[Request, str, int]] = field(default_factory=list)  # (req, mode, lost)
    num_cached_tokens: int = 0
    # Speculative decoding: draft slots allocated per running decode (request id -> k).
    lookahead: dict[str, int] = field(default_factory=dict)
    # Why a request still waits after this step's admission (BLOCKED_BY), "" when none does.
    blocked_by: str = ""


# What stopped admission while requests were waiting: the sequence cap, the token budget,
# free KV blocks, a preemption in this step (no admission then), or swapped requests
# that must come back first.
BLOCKED_BY = ("max_num_seqs", "token_budget", "kv_blocks", "preemption", "swapped")


class Scheduler:
    def __init__(
        self,
        cfg: SchedulerConfig,
        block_manager: BlockManager,
        max_model_len: int,
        max_wait_ns: int | None,
        watermark_blocks: int,
        spec_tokens: int = 0,
    ) -> None:
        self.cfg = cfg
        self.bm = block_manager
        self.max_model_len = max_model_len
        self.max_wait_ns = max_wait_ns
        self.watermark_blocks = watermark_blocks
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()
        self.spec_tokens = spec_tokens
        # Told the id of each request that finishes, aborts or is preempted (the proposer's
        # per-request state goes with it).
        self.on_release: Callable[[str], None] | None = None

    def add(self, req: Request) -> None:
        req.status = RequestStatus.WAITING
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    # ---- one step ---------------------------------------------------------------------------
    def schedule(self, now_ns: int) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.cfg.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = self._num_new_tokens(req, budget)
            if n == 0:
                i += 1
                continue
            k = self._lookahead(req, n, budget)
            while not self.bm.can_append(req, n + k):
                victim = self.running.pop()  # the latest admitted, never one already scheduled
                self._preempt(victim, out)
                if victim is req:
                    break
            else:
                self.bm.append_slots(req, n + k)
                out.scheduled.append((req, n))
                if k:
                    out.lookahead[req.request_id] = k
                budget -= n + k
                i += 1
                continue
            break  # req preempted itself: it was the last one
        if out.preempted:
            out.blocked_by = "preemption" if self.waiting or self.swapped else ""
            return out
        budget = self._swap_in(out, budget)
        if self.swapped:
            out.blocked_by = "swapped" if self.waiting else ""
        else:
            self._admit(out, budget, now_ns)
        return out

    def _num_new_tokens(self, req: Request, budget: int) -> int:
        n = req.num_tokens - req.num_computed_tokens
        if self.cfg.enable_chunked_prefill:
            return min(n, self.cfg.chunk_size, budget)
        return n if n <= budget else 0

    def _lookahead(self, req: Request, n: int, budget: int) -> int:
        """Draft slots for a running decode: K, fewer near its token maximum (k drafts
        emit up to k + 1 tokens) or the step's budget."""
        if not self.spec_tokens or n != 1 or req.num_output_tokens == 0:
            return 0
        return max(0, min(self.spec_tokens, req.max_total_tokens - req.num_tokens - 1,
                          budget - 1))  # fmt: skip

    def _growth(self, req: Request, held_blocks: int) -> int:
        """Blocks beyond `held_blocks` that `req` needs for its next `decode_reserve_tokens`
        tokens (never past its own maximum)."""
        target = min(req.num_tokens + self.cfg.decode_reserve_tokens, req.max_total_tokens)
        return max(0, self.bm.blocks_for(target) - held_blocks)

    def _reserve(self) -> int:
        if not self.running:
            return 0  # alone it always fits: add_request checked its maximum against the pool
        return self.watermark_blocks + sum(
            self._growth(r, len(r.block_table)) for r in self.running
        )

    def _swap_in(self, out: SchedulerOutput, budget: int) -> int:
        while self.swapped and len(self.running) < self.cfg.max_num_seqs and budget > 0:
            req = self.swapped[0]
            n = self._num_new_tokens(req, budget)
            reserve = self._reserve()
            if self.running:  # the returning request's own decode growth counts too
                held = max(
                    len(req.cpu_block_table), self.bm.blocks_for(req.num_computed_tokens + n)
                )
                reserve += self._growth(req, held)
            if n == 0 or not self.bm.can_swap_in(req, n, reserve):
                break
            self.swapped.popleft()
            self.bm.swap_in(req)
            self.bm.append_slots(req, n)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.scheduled.append((req, n))
            out.swapped_in.append(req)
            budget -= n
        return budget

    def _admit(self, out: SchedulerOutput, budget: int, now_ns: int) -> None:
        if not self.waiting:
            return
        reserve = self._reserve()
        for req in self._waiting_order(now_ns):
            if len(self.running) >= self.cfg.max_num_seqs:
                out.blocked_by = "max_num_seqs"
                break
            if budget <= 0:
                out.blocked_by = "token_budget"
                break
            hits = self.bm.find_cached_prefix(req)
            num_hit = len(hits) * self.bm.block_size
            n = req.num_tokens - num_hit
            if self.cfg.enable_chunked_prefill:
                n = min(n, self.cfg.chunk_size, budget)
            elif n > budget:
                out.blocked_by = "token_budget"
                break
            # The newcomer's own decode growth counts too, unless nothing else runs.
            own = self._growth(req, self.bm.blocks_for(num_hit + n)) if self.running else 0
            if not self.bm.can_allocate(hits, n, reserve + own):
                out.blocked_by = "kv_blocks"
                break
            resumed = req.status == RequestStatus.PREEMPTED
            self.bm.allocate(req, hits, n)
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = num_hit
            self.waiting.remove(req)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.scheduled.append((req, n))
            out.admitted.append((req, num_hit, resumed))
            out.num_cached_tokens += num_hit
            budget -= n
            reserve = self._reserve()

    def _waiting_order(self, now_ns: int) -> list[Request]:
        limit = self.max_wait_ns

        def key(item: tuple[int, Request]):
            idx, req = item
            overdue = limit is not None and now_ns - req.arrival_ns >= limit
            if overdue:
                return (0, req.arrival_ns, idx)
            preempted = req.status == RequestStatus.PREEMPTED
            if self.cfg.policy == "prefix" and not preempted:
                return (2, -len(self.bm.find_cached_prefix(req)), idx)
            return (1 if preempted else 2, 0, idx)

        return [r for _, r in sorted(enumerate(self.waiting), key=key)]

    # ---- preemption, finishing, aborting -----------------------------------------------------
    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        computed = req.num_computed_tokens
        req.num_preemptions += 1
        if self.cfg.preemption_mode == "swap" and self.bm.can_swap_out(req):
            self.bm.swap_out(req)
            req.status = RequestStatus.SWAPPED
            self._released(req)
            self.swapped.appendleft(req)  # victims go lowest priority first: this one is ahead
            out.preempted.append((req, "swap", computed))
            return
        self._released(req)
        self.bm.free(req)
        req.num_computed_tokens = 0
        req.status = RequestStatus.PREEMPTED
        self.waiting.insert(0, req)
        out.preempted.append((req, "recompute", computed))

    def finish(self, req: Request, status: RequestStatus) -> None:
        if req.status != RequestStatus.RUNNING:  # preempted by an overlapped look-ahead
            self.abort(req)  # before its last token came back (async_step.py)
        else:
            self.running.remove(req)
            self.bm.free(req)
            self._released(req)
        req.status = status

    def abort(self, req: Request) -> None:
        """Release everything `req` holds. Call only between steps (nothing in flight)."""
        if req.status == RequestStatus.RUNNING:
            self.running.remove(req)
        elif req.status == RequestStatus.SWAPPED:
            self.swapped.remove(req)
            self.bm.free_cpu(req)
        elif req.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
            self.waiting.remove(req)
        self.bm.free(req)
        req.status = RequestStatus.FINISHED_ABORTED
        self._released(req)

    def _released(self, req: Request) -> None:
        if self.on_release is not None:
            self.on_release(req.request_id)

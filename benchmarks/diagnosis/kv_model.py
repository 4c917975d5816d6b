"""Where a closed loop's KV pool starts to preempt: a Monte-Carlo of engine_ref's block
accounting, step by step, without running a model or the engine (pure Python, seeded).
The kv-too-small class's label: the pool at which the mean preemptions per request over
the draw's length distributions reach preemption-storm's 0.1 (one run of 24-48 requests
scatters around that mean).

Why a simulation and not a closed form: what preempts is not the requests' blocks at their
final length (k × ⌈(P+O)/B⌉, the old label) nor their mean, but the sum at one moment of
the running requests' blocks — each growing from ⌈P/B⌉ to ⌈(P+O−1)/B⌉ — against what
admission let in. engine_ref's admission (scheduler.py) keeps a reserve (the watermark
plus each running request's next `decode_reserve_tokens`), so a tight pool mostly makes
requests wait; a preemption needs the running set to outgrow the reserve before
completions free blocks. The victim (the latest admitted) frees everything, goes to the
head of the queue and returns at its current length, so it preempts again. A short run
also starts with all clients at once: the first wave grows in step, later waves drift
apart. These interact (admission depends on the reserve, which depends on the ages), so
the model replays the scheduler's rules rather than approximating them. Checked against
the engine: the 62 kept kv-too-small dev runs (seeds 1000, 2000, 2001), replayed with
their own requests' lengths, gave the engine's preemption count in 61, and 7 for 6 in one.

What it leaves out: time (a step is the unit; a client's next request arrives before
the next step, as measured in the dev runs: 0.4-0.8 ms after the last token, steps
1.6-18 ms), the overdue-first order (2 s waits), prefix-cache hits (a hit block counts as
taken all the same: the pool's occupancy does not change), speculative slots and swap
(the generator's kv-too-small draws use recompute).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

THRESHOLD = 0.1  # preemption-storm's warning threshold (playbooks/triage.yaml)


@dataclass(frozen=True)
class ClosedLoop:
    """A closed loop's workload and the engine limits that shape its KV occupancy."""

    clients: int
    requests: int  # all requests of the run (warm-up included: the engine serves them)
    prompt: tuple[int, int]  # uniform bounds, inclusive (probes/workload.py)
    output: tuple[int, int]
    block: int = 16
    max_seqs: int = 64
    budget: int = 2048  # max_num_batched_tokens
    chunk: int | None = 512  # None: no chunked prefill
    watermark: float = 0.01
    reserve_tokens: int = 16  # SchedulerConfig.decode_reserve_tokens

    def blocks(self, tokens: int) -> int:
        return -(-tokens // self.block)

    @property
    def longest(self) -> int:
        """Blocks of the longest request (the engine refuses a pool below it)."""
        return self.blocks(self.prompt[1] + self.output[1])

    @property
    def roomy(self) -> int:
        """A pool that never binds: every client at its longest (the sum of blocks can
        never exceed it)."""
        return self.clients * self.longest + 1


class _Req:
    __slots__ = ("computed", "end", "generated", "held", "output", "preempted", "prompt",
                 "sent", "tokens")  # fmt: skip

    def __init__(self, prompt: int, output: int) -> None:
        self.prompt, self.output, self.end = prompt, output, prompt + output
        self.tokens = prompt  # prompt + sampled outputs (the last one not yet computed)
        self.computed = self.generated = self.held = self.sent = 0
        self.preempted = False


def simulate(loop: ClosedLoop, pool: int, lengths: list[tuple[int, int]], ttft=None) -> int:
    """Preemptions in one run of `loop` on a pool of `pool` blocks; `lengths` holds each
    request's (prompt, output) in sending order. Mirrors scheduler.Scheduler.schedule
    (written for speed: the generator runs it a few hundred times per draw). With a list
    `ttft`, appends each request's steps from its send to its first token."""
    bs, ahead, chunk = loop.block, loop.reserve_tokens, loop.chunk
    water = int(loop.watermark * pool)
    queue = [_Req(p, o) for p, o in lengths]
    sent = min(loop.clients, len(queue))
    waiting, running = queue[:sent], []
    free = pool
    preemptions = 0

    def reserve() -> int:  # the watermark + each running request's next `ahead` tokens
        if not running:
            return 0
        total = water
        for r in running:
            t = r.tokens + ahead
            total += max(0, -(-(t if t < r.end else r.end) // bs) - r.held)
        return total

    step = 0
    while waiting or running:
        step += 1
        budget, scheduled, preempted = loop.budget, [], False
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            n = r.tokens - r.computed
            if chunk is not None:
                n = min(n, chunk, budget)
            elif n > budget:
                i += 1
                continue
            need = -(-(r.computed + n) // bs) - r.held
            while need > free:  # the latest admitted goes, until r fits or r itself went
                victim = running.pop()
                free += victim.held
                victim.held = victim.computed = 0
                victim.preempted = preempted = True
                waiting.insert(0, victim)
                preemptions += 1
                if victim is r:
                    break
            else:
                if need > 0:
                    free -= need
                    r.held += need
                scheduled.append((r, n))
                budget -= n
                i += 1
                continue
            break
        if waiting and not preempted:
            res = reserve()
            # preempted requests first, then arrival order (fcfs)
            for r in sorted(waiting, key=lambda r: not r.preempted):
                if len(running) >= loop.max_seqs or budget <= 0:
                    break
                n = r.tokens if chunk is None else min(r.tokens, chunk, budget)
                if n > budget:
                    break
                need = -(-n // bs)
                if running:  # the newcomer's own next `ahead` tokens, unless it runs alone
                    t = min(r.tokens + ahead, r.end)
                    need_all = need + res + max(0, -(-t // bs) - need)
                else:
                    need_all = need
                if free < need_all:
                    break
                free -= need
                r.held, r.preempted = need, False
                waiting.remove(r)
                running.append(r)
                scheduled.append((r, n))
                budget -= n
                res = reserve()
        for r, n in scheduled:  # the forward: a request whose tokens are all computed samples
            r.computed += n
            if r.computed == r.tokens:
                r.generated += 1
                r.tokens += 1
                if r.generated == 1 and ttft is not None:
                    ttft.append(step - r.sent)
                if r.generated == r.output:
                    running.remove(r)
                    free += r.held
                    if sent < len(queue):  # its client sends the next one
                        queue[sent].sent = step
                        waiting.append(queue[sent])
                        sent += 1
    return preemptions


def ttft_stretch(loop: ClosedLoop, pool: int, runs: int = 24, seed: int = 0) -> float:
    """Mean steps from a request's send to its first token on `pool` blocks over the same
    on a pool that never binds (every client at its longest): how much longer the pool's
    waits and re-queues make TTFT (slow-input's label beside kv-too-small)."""
    tight, loose = [], []
    for lengths in _runs(loop, runs, seed):
        simulate(loop, pool, lengths, tight)
        simulate(loop, loop.roomy, lengths, loose)
    mean_loose = sum(loose) / len(loose) if loose else 0.0
    return (sum(tight) / len(tight)) / mean_loose if tight and mean_loose > 0 else 1.0


def preemption_rate(loop: ClosedLoop, pool: int, runs: int = 24, seed: int = 0) -> float:
    """Mean preemptions per request over `runs` simulated runs of the loop's length
    distributions (the same draws for every pool: common random numbers)."""
    total = sum(simulate(loop, pool, lengths) for lengths in _runs(loop, runs, seed))
    return total / (runs * loop.requests)


def _runs(loop: ClosedLoop, runs: int, seed: int):
    """`runs` draws of every request's (prompt, output), the same for every pool (common
    random numbers)."""
    rng = random.Random(f"kv-model:{seed}")
    for _ in range(runs):
        yield [(rng.randint(*loop.prompt), rng.randint(*loop.output))
               for _ in range(loop.requests)]  # fmt: skip


def threshold_pool(loop: ClosedLoop, runs: int = 24, seed: int = 0) -> int:
    """The largest pool (blocks) the model predicts ≥ THRESHOLD preemptions per request
    for, by bisection between the longest request's pool (the engine refuses a smaller
    one; returned when even it stays below) and one that holds every client at its
    longest (no preemption possible). The mean rate over common draws falls with the pool
    but not strictly at one block's resolution: bisection returns a crossing."""
    lo = loop.longest + 1
    if preemption_rate(loop, lo, runs, seed) < THRESHOLD:
        return lo
    hi = loop.roomy
    while hi - lo > 1:  # rate(lo) ≥ THRESHOLD > rate(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if preemption_rate(loop, mid, runs, seed) >= THRESHOLD else (lo, mid)
    return lo

"""Labels priced at the load a run will see, not at the base's unloaded speed (issue 35).

Two of the generator's models read the engine's speed from its calibration, and the
first held-out reports showed where that speed was not the run's:

- over-capacity's ρ = offered / capacity. The calibration's capacity was requests over
  the whole of a closed loop at max_seqs clients, ramp and drain included, where the
  batch runs below the cap; an open loop above capacity keeps every slot full. Seeds
  1000-2001: the completion rate while the calibration's slots were full was 1.03-3.9×
  that figure, so draws labelled ×1.1-1.5 ran at ρ ≈ 1. The capacity is now the
  completion rate over the middle of the calibration's completions (all max_seqs slots
  full there: its measured batch is the cap), and the offered rate the schedule's own
  (the workload seed fixes it before the run: ±1/√n around the target).
- slow-input's share d / (d + TTFT) took TTFT unloaded (one client). A closed loop of k
  clients shares its prefill steps (TTFT at 14 clients was 4× one client's), and a
  second fault that queues requests adds its queue to TTFT: the same delay is then a
  smaller share. TTFT at the run's load is the calibration's, interpolated in clients
  between its one-client and max_seqs-client loops, plus the other fault's queue as its
  own model prices it.
- chunk-too-small beside another fault: the same TTFT at the run's load; under a cap
  below the clients the check counts the queue the extra steps make as the chunk's.
- client-cap took in flight ~ Poisson(λ·E2E) for every schedule. Half the draws send at
  constant intervals, where n in flight is about λ·E2E with no tail: seeds 2002-2003's
  draws labelled ×1.5-2.3 at cap 2-3 needed 0.5-1.5 in flight and never blocked. The
  label is now the run's own schedule (its send times and output lengths, drawn from the
  workload seed before the run) pushed through a client of `cap` slots.
- bursty took the gate on ca² at one noise (the rule wants two) and ca² as the model
  meant it, not as the seed drew it (37 requests: ca² 1.7 where 2.5 was meant). The label
  is now the schedule's own ca², gated as the rule gates it.
- A second fault that slows every step (host-bound's gap, a neighbour's share) lengthens
  the TTFT slow-input is a share of, and the E2E that fills the client's slots.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

STEADY = (0.2, 0.8)  # the calibration's completions taken as steady: ramp and drain left out


def saturated_rate(done_s: np.ndarray, slots: int) -> float:
    """Completions per second over the middle of a closed loop's completions (`done_s`:
    each request's completion time), where every one of its `slots` is full: the rate an
    engine with a queue sustains. NaN when the middle holds fewer than two turnovers of
    the slots (seed 1000's 24-request calibrations of 16 clients: the first wave's
    completions bunch together, and such a window read 2× the rate an overloaded run
    sustained)."""
    done = np.sort(np.asarray(done_s, dtype=float))
    done = done[np.isfinite(done)]
    a, b = (int(q * len(done)) for q in STEADY)
    if b - a < max(4, 2 * slots) or done[b] <= done[a]:
        return float("nan")
    return (b - a) / float(done[b] - done[a])


def schedule_rate(spec) -> float:
    """The rate the run's schedule offers its measured requests (a WorkloadSpec): drawn
    from the workload seed before anything runs, so a model may use it."""
    from perfdiag.probes.workload import plan

    sends = [r.offset_s for r in plan(spec, 2) if not r.is_warmup and r.offset_s is not None]
    if len(sends) < 2 or sends[-1] <= sends[0]:
        return float("nan")
    return (len(sends) - 1) / (sends[-1] - sends[0])


def fluid_wait(rho: float, send_s: float) -> float:
    """Mean wait of requests sent evenly over `send_s` seconds to a queue that grows by
    ρ − 1 seconds per second (ρ > 1; none below)."""
    return max(0.0, rho - 1) * send_s / 2


def ttft_at_clients(k: float, one_s: float, full_s: float, full_clients: int) -> float:
    """TTFT of a closed loop of k clients, none waiting for a slot: linear in k between the
    one-client and the full (max_seqs-client) calibration — each client adds its prompt
    to the steps the others' prefills run in."""
    if not math.isfinite(full_s) or full_clients <= 1:
        return one_s
    k = min(max(k, 1.0), full_clients)
    return one_s + (k - 1) / (full_clients - 1) * (full_s - one_s)


def input_share(delay_s: float, ttft_s: float) -> float:
    """slow-input's magnitude: the delay's share of TTFT, TTFT without the delay."""
    return delay_s / (delay_s + ttft_s) if delay_s + ttft_s > 0 else 0.0


def capacity(cal) -> float:
    """The saturated completion rate where the calibration measured it, else its capacity."""
    sat = getattr(cal, "saturated_rps", float("nan"))
    return sat if math.isfinite(sat) and sat > 0 else cal.capacity_rps


def base_ttft(d, cal) -> float:
    """TTFT of the draw's base at its own load (before any fault): a closed loop's k
    clients share prefill steps; an open loop at 20-60 % of capacity is taken unloaded."""
    if d.loop != "closed":
        return cal.ttft_s
    full = d.engine["max_seqs"] * d.engine.get("dp", 1)
    return ttft_at_clients(d.load, cal.ttft_s, getattr(cal, "ttft_full_s", math.nan), full)


def slowdown(d, scenario, cal, rels: dict, but: str) -> float:
    """How much longer every step runs with the draw's other faults than in the base
    (`but`: the class being labelled): host-bound's gap g per step of S, (S + g) / S; a
    neighbour taking a share L of step time, 1 / (1 − L)."""
    k = 1.0
    for f in d.faults:
        if f.cls == but:
            continue
        if f.cls == "host-bound" and scenario.faults is not None and cal.step_s > 0:
            k *= 1 + scenario.faults.step_gap_ms / 1e3 / cal.step_s
        elif f.cls == "neighbour":
            k /= max(0.05, 1 - 0.1 * rels[f.cls])
    return k


def schedule(spec) -> tuple[np.ndarray, np.ndarray]:
    """The run's planned send times (s) and output lengths, every request in order."""
    from perfdiag.probes.workload import plan

    reqs = [r for r in plan(spec, 2) if r.offset_s is not None]
    return (np.array([r.offset_s for r in reqs], dtype=float),
            np.array([r.max_tokens for r in reqs], dtype=float))  # fmt: skip


def blocked_share(sends: np.ndarray, e2e: np.ndarray, cap: int) -> float:
    """Share of requests that find `cap` requests in flight when due (analyzers/load.py's
    measure), each holding its slot for its E2E; a held request is sent when a slot
    frees, and the ones after it wait behind it."""
    busy: list[float] = []
    last, blocked = -math.inf, 0
    for due, hold in zip(sends, e2e, strict=True):
        while busy and busy[0] <= due:
            heapq.heappop(busy)
        sent = max(due, last)
        if len(busy) >= cap:
            blocked += 1
            sent = max(sent, heapq.heappop(busy))
        heapq.heappush(busy, sent + hold)
        last = sent
    return blocked / len(sends) if len(sends) else 0.0


def client_cap_label(sends, outputs, cap: int, ttft_s: float, e2e_s: float, rule=0.05) -> float:
    """1 / k: k the factor on every E2E (the same as on the rate) at which the schedule's
    blocked share reaches the rule's 0.05. E2E per request: the calibration's TTFT plus
    its output's tokens at the calibration's time per output token."""
    mean_out = float(np.mean(outputs)) if len(outputs) else 1.0
    tpot = (e2e_s - ttft_s) / max(mean_out - 1, 1.0)
    e2e = ttft_s + np.maximum(outputs - 1, 0) * max(tpot, 0.0)
    lo, hi = -12.0, 12.0  # log k
    if blocked_share(sends, e2e * math.exp(hi), cap) < rule:
        return 0.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if blocked_share(sends, e2e * math.exp(mid), cap) >= rule else (mid, hi)
    return math.exp(-hi)


def burst_share(ca2: float, rho: float, mu: float, ttft_s: float, cv2: float) -> float:
    """The bursts' share of TTFT by Kingman at one server of rate mu: the wait beyond a
    Poisson stream's, ρ/(1−ρ)·(ca² − 1)/(2μ), over TTFT with the whole wait."""
    big = rho / (1 - rho) / (2 * mu)
    return big * max(ca2 - 1, 0.0) / (ttft_s + kingman_wait(ca2, rho, mu, cv2))


def kingman_wait(ca2: float, rho: float, mu: float, cv2: float) -> float:
    """Kingman's mean queue wait at one server of rate mu: ρ/(1−ρ)·(ca² + cs²)/(2μ)."""
    return rho / (1 - rho) * (ca2 + cv2) / (2 * mu)


def schedule_ca2(sends: np.ndarray, warmup: int) -> tuple[float, int]:
    """ca² of the measured requests' send gaps, as the rule measures it, and the gaps'
    count ((1.0, 0) with fewer than two gaps)."""
    gaps = np.diff(np.sort(sends[warmup:]))
    if len(gaps) < 2 or gaps.mean() <= 0:
        return 1.0, 0
    return float(gaps.var() / gaps.mean() ** 2), len(gaps)


def bursty_label(sends: np.ndarray, warmup: int, share_of) -> float:
    """The bursts' share of TTFT at the schedule's own ca² (share_of(ca2)) over the rule's
    0.15, or ca² − 1 over twice its sampling noise 2.8/√n (the rule's gate), the smaller."""
    ca2, n = schedule_ca2(sends, warmup)
    if n == 0:
        return 0.0
    return min(share_of(ca2) / 0.15, (ca2 - 1) / (2 * 2.8 / math.sqrt(n)))


def over_capacity_label(rate_rps: float, cal) -> float:
    """ρ / 1.1: the schedule's rate over the saturated capacity, over the rule's ρ."""
    return rate_rps / capacity(cal) / 1.1


def slow_input_label(
    d, cal, delay_s: float, rels: dict, send_s: float, slower: float = 1.0, wait_s: float = 0.0
) -> float:
    """The delay's share of TTFT at the run's load, over the rule's 0.25. `rels`: the
    other faults' labels by class; `send_s`: an open loop's sending time; `slower`: every
    step's slowdown by the other fault (slowdown); `wait_s`: bursty arrivals' whole queue
    wait (Kingman's, the Poisson part too: g2007-0010 labelled ×1.25 by the bursts' part
    alone measured 0.08 of an 18 ms TTFT, 74 % of it queue). A
    cap below the clients (seq-cap, cold-starvation) queues each request (k/c − 1)
    unloaded E2Es (the seq-cap model), TTFT there runs at c clients; over-capacity's
    queue is the fluid model's mean wait; a small chunk or budget makes its share of TTFT
    extra steps."""
    ttft = (base_ttft(d, cal) + wait_s) * slower
    for f in d.faults:
        if f.cls in ("seq-cap", "cold-starvation"):
            k, c = f.knobs["clients"], f.knobs["cap"]
            full = d.engine["max_seqs"] * d.engine.get("dp", 1)
            ttft = ttft_at_clients(min(k, c), cal.ttft_s, getattr(cal, "ttft_full_s", math.nan),
                                   full) + max(0.0, k / c - 1) * cal.e2e_s  # fmt: skip
        elif f.cls == "over-capacity":
            ttft += fluid_wait(1.1 * rels[f.cls], send_s)
        elif f.cls in ("chunk-too-small", "token-budget"):
            ttft /= max(0.05, 1 - 0.15 * rels[f.cls])
    return input_share(delay_s, ttft) / 0.25


def sliced(prompt: tuple[int, int], chunk: float, cal) -> tuple[float, float]:
    """A prompt's mean cost beyond its first step and its mean TTFT, prompts uniform over
    the draw's range cut into n = ⌈P / chunk⌉ slices: (n − 1)·(F + g) and P·a + n·(F + g),
    each step paying the fixed cost F and the host's gap g before the next (what the
    rule counts). Over the range, not at the mean prompt: a mean prompt in one slice said
    ×0.00 where the longer half took two steps (g2005-0007: measured 0.14, 1.5 steps)."""
    p = np.arange(prompt[0], prompt[1] + 1, dtype=float)
    n = np.ceil(p / max(chunk, 1))
    step = cal.fixed_s + cal.gap_s
    return float(((n - 1) * step).mean()), float((p * cal.token_s + n * step).mean())


def slice_share(prompt: tuple[int, int], chunk: float, cal) -> float:
    """The slicing's share of TTFT alone: sliced's ratio of means (as the rule's)."""
    over, ttft = sliced(prompt, chunk, cal)
    return over / ttft if ttft > 0 else 0.0


def chunk_label(d, cal, rel: float, chunk: int, rels: dict, send_s: float, delay_s: float):
    """chunk-too-small's share at the run's TTFT, over the rule's 0.15. Alone its model is
    the slices' cost over TTFT (sliced); another fault's queue or delay adds to the TTFT
    the extra steps are a share of. Under a cap below the clients each request also waits
    (k/c − 1) services for the slots, and the extra steps lengthen every service: the
    check counts that queue as the chunk's (its closed-loop factor), so the overhead
    counts k/c times (g2000-0099: ×2.84 alone, ×0.82-1.0 measured beside
    cold-starvation's queue)."""
    ttft = sliced(d.prompt, chunk, cal)[1]  # the model's TTFT with the small chunk
    over = 0.15 * rel * ttft  # the extra steps' cost per request
    times = 1.0
    for f in d.faults:
        if f.cls in ("seq-cap", "cold-starvation"):
            times = max(1.0, f.knobs["clients"] / f.knobs["cap"])
            ttft += (times - 1) * (cal.e2e_s + over)
        elif f.cls == "over-capacity":
            ttft += fluid_wait(1.1 * rels[f.cls], send_s)
        elif f.cls == "slow-input":
            ttft += delay_s
    return times * over / ttft / 0.15 if ttft > 0 else rel

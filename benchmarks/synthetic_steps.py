"""Synthetic engine steps whose true cost is known: GPU-shaped (a roofline: launch +
max(weights and K/V read, compute)) and CPU-shaped (additive), with noise and stalls.
Shared by benchmarks/step_cost_models.py and tests/test_step_cost_roofline.py.

"Truth" for a slice is the generator's own noise-free step cost: what cutting 1024
prompt tokens into two steps of 512 instead of one step of 1024 costs, beside 8 decodes,
cost(512) × 2 − cost(1024)."""

from __future__ import annotations

import numpy as np

from perfdiag.analyzers.steptime import StepTimeline

MS, US = 1e-3, 1e-6
DECODES, CONTEXT = 8, 8 * 1000  # beside the slice whose price is checked


def gpu_cost(n, b, k, chunks):
    """H100-like: 0.3 ms launch + max(5.3 ms of weights + K/V at 38 ns a context token,
    40 µs a token of compute)."""
    return 0.3 * MS + np.maximum(5.3 * MS + 38e-9 * k, 40 * US * (n + b))


def cpu_cost(n, b, k, chunks):
    """Additive, as the reference engine on a CPU: fixed, per chunk, per token, per decode."""
    return 0.5 * MS + 1.5 * MS * chunks + 20 * US * n + 150 * US * b + 2e-9 * k


def timeline(cost, seed, steps=400, stalls=True, noise=0.01) -> StepTimeline:
    """`steps` steps, half carrying a prompt chunk, with relative `noise` (1 %: steps under
    CUDA graphs jitter) and, with `stalls`, one step in twenty stalled 20-100 ms."""
    rng = np.random.default_rng(seed)
    chunks = (rng.random(steps) < 0.5).astype(float)
    n = chunks * rng.integers(16, 2048, steps)
    b = rng.integers(1, 33, steps).astype(float)
    k = b * rng.integers(200, 2000, steps) + n
    dur = cost(n, b, k, chunks) * (1 + rng.normal(0, noise, steps))
    if stalls:  # a GC pause, a contended CPU
        hit = rng.random(steps) < 0.05
        dur[hit] += rng.uniform(20, 100, hit.sum()) * MS
    return steps_timeline(n, b, chunks, k, dur)


def steps_timeline(n, b, chunks, k, dur) -> StepTimeline:
    """Steps of these prefill tokens `n`, decodes `b`, chunks and context `k`, lasting
    `dur` seconds each, back to back with 50 µs between them."""
    steps = len(dur)
    end = np.cumsum(dur + 50 * US) * 1e9
    start = end - dur * 1e9
    nan = np.full(steps, np.nan)
    return StepTimeline(np.arange(steps), start, end, nan, n, b, chunks, k, nan, nan,
                        np.concatenate(([0.0], np.cumsum(dur)[:-1] * 1e9)), None)  # fmt: skip


def true_slice(cost) -> float:
    return float(2 * cost(512, DECODES, CONTEXT, 1) - cost(1024, DECODES, CONTEXT, 1))

"""The two-level bootstrap: a statistic's spread over repeated runs and, inside each, over
its requests (runs first, then groups), as a sweep's points and --verify-advice's repeats
judge it. Pure numpy, so playbooks and sweeps share it."""

from __future__ import annotations

import numpy as np

N_BOOT = 400


def two_level_bootstrap(samples: list[tuple[np.ndarray, np.ndarray]], q: float, rng) -> np.ndarray:
    """Percentile q of N_BOOT two-level resamples: repeats, then groups (requests)."""
    prepared = []
    for values, groups in samples:
        order = np.argsort(groups, kind="stable")
        v, g = values[order], groups[order]
        starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]]) if len(g) else np.zeros(0, int)
        prepared.append((v, starts, np.diff(np.r_[starts, len(v)])))
    prepared = [p for p in prepared if len(p[0])]
    if not prepared:
        return np.full(N_BOOT, np.nan)
    out = np.empty(N_BOOT)
    k = len(prepared)
    for b in range(N_BOOT):
        parts = []
        picks = rng.integers(0, k, k) if k > 1 else (0,)
        for p in picks:
            v, starts, lengths = prepared[p]
            chosen = rng.integers(0, len(starts), len(starts))
            ln = lengths[chosen]
            offsets = np.repeat(starts[chosen] - np.r_[0, np.cumsum(ln)[:-1]], ln)
            parts.append(v[offsets + np.arange(ln.sum())])
        out[b] = np.percentile(np.concatenate(parts), q)
    return out

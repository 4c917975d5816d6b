"""Each thread's innermost-op segments (critical_path_graph.py's `_flatten`) with numpy,
for threads whose spans nest: no span outlives the span it started in. Such a thread's
segments are its time cut at every start and end, each piece owned by the innermost span
open over it; that span is found by its depth (spans open when it started), not by a
stack walked span by span. A thread where some span does outlive its parent is cut by
`_flatten`'s loop, which clips it. Same segments, in the same order (tests compare the
two on real traces and on random spans); on a 412k-event training trace 0.18 → 0.08 s.
"""

from __future__ import annotations

import numpy as np


def innermost_segments(new_thread: np.ndarray, s: np.ndarray, e: np.ndarray,
                       span: np.ndarray, loop) -> dict[str, np.ndarray]:  # fmt: skip
    """Spans sorted by thread, start, longest first (`new_thread` marks each thread's
    first): the segments `loop(new_thread, s, e, span)` gives, as int64 columns."""
    firsts = np.flatnonzero(new_thread)
    bounds = np.r_[firsts, len(s)]
    out = []
    for code, (lo, hi) in enumerate(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)):
        part = _nested(s[lo:hi], e[lo:hi])
        if part is None:  # a span outlives its parent: the loop clips it
            one = np.zeros(hi - lo, bool)
            one[0] = True
            cols = loop(one.tolist(), s[lo:hi].tolist(), e[lo:hi].tolist(),
                        span[lo:hi].tolist())  # fmt: skip
            start, end, owner = cols["start"], cols["end"], cols["span"]
        else:
            start, end, at = part
            owner = span[lo:hi][at]
        out.append((np.full(len(start), code, np.int64), start, end, owner))
    if not out:
        empty = np.zeros(0, np.int64)
        return {"thread": empty, "start": empty, "end": empty, "span": empty}
    th, st, en, ow = (np.concatenate(c).astype(np.int64) for c in zip(*out, strict=True))
    return {"thread": th, "start": st, "end": en, "span": ow}


def _nested(s: np.ndarray, e: np.ndarray):
    """One thread's segments (start, end, index of the owning span), or None when some
    span ends after the span it started in."""
    n = len(s)
    idx = np.arange(n)
    by_end = np.sort(e)
    # Spans open when span i starts, of those before it: i minus those ended by then. An
    # ended span at or after i can only be a zero-length one at i's start (they sort
    # last among spans of one start): i itself, or one after it.
    zero = (e == s).astype(np.int64)
    zc = np.cumsum(zero)
    group_end = np.searchsorted(s, s, side="right") - 1
    ended_after = zc[group_end] - zc + zero
    ended_before = np.searchsorted(by_end, s, side="right") - ended_after
    level = idx - ended_before
    # Spans by (level, index): the parent of span i is the latest span before it one
    # level up; the owner of a piece the latest span started by then at its depth - 1.
    key = level * (n + 1) + idx
    small = level.astype(np.int16) if level.max(initial=0) < 2**15 else level
    by_key = np.argsort(small, kind="stable")  # by level, then index (a radix sort)
    sorted_key = key[by_key]

    def latest(at_level, before):  # the latest span <= `before` with this level, or -1
        q = at_level * (n + 1) + before
        pos = np.searchsorted(sorted_key, q, side="right") - 1
        j = np.where(pos >= 0, by_key[np.maximum(pos, 0)], -1)
        ok = (j >= 0) & (level[np.maximum(j, 0)] == at_level) & (at_level >= 0)
        return np.where(ok, j, -1)

    inner = level > 0
    parent = latest(level[inner] - 1, idx[inner] - 1)
    if (parent < 0).any() or (e[inner] > e[parent]).any():
        return None
    cuts = np.sort(np.concatenate([s, by_end]), kind="stable")  # two sorted runs: a merge
    cuts = cuts[np.r_[True, cuts[1:] != cuts[:-1]]]  # (np.unique sorted them anew: 10x slower)
    lo, hi = cuts[:-1], cuts[1:]
    started = np.searchsorted(s, lo, side="right")
    depth = started - np.searchsorted(by_end, lo, side="right")
    covered = depth > 0
    lo, hi = lo[covered], hi[covered]
    owner = latest(depth[covered] - 1, started[covered] - 1)
    if (owner < 0).any():
        return None
    return lo, hi, owner

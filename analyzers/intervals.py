"""Interval algebra on integer-nanosecond [start, end) intervals, vectorised with numpy.

Everything the timeline needs reduces to three operations: the union of many intervals
(optionally per group: a thread, a stream, a rank), the time a union covers inside
arbitrary windows, and gaps between the pieces of a union. None loops in Python over
intervals; sums stay in int64, so nanoseconds are never rounded.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

I64 = np.int64


def _as_i64(a) -> np.ndarray:
    return np.asarray(a, dtype=I64)


@dataclass(frozen=True)
class Union:
    """Disjoint, sorted intervals; `group` labels them when built per group."""

    start: np.ndarray
    end: np.ndarray
    group: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.start)

    @property
    def total_ns(self) -> int:
        return int((self.end - self.start).sum())

    def of_group(self, key) -> Union:
        mask = self.group == key
        return Union(self.start[mask], self.end[mask])

    def coverage(self) -> Coverage:
        return Coverage(self.start, self.end)


def union(starts, ends, groups=None) -> Union:
    """The union of intervals, per group when `groups` (integer codes) is given.
    Touching intervals merge; empty ones (end <= start) are dropped."""
    s, e = _as_i64(starts), _as_i64(ends)
    keep = e > s
    s, e = s[keep], e[keep]
    g = None if groups is None else _as_i64(groups)[keep]
    if len(s) == 0:
        empty = np.empty(0, I64)
        return Union(empty, empty, None if g is None else empty)
    order = np.argsort(s, kind="stable") if g is None else np.lexsort((s, g))
    s, e = s[order], e[order]
    if g is None:
        run_max = np.maximum.accumulate(e)
        new = np.empty(len(s), bool)
        new[0] = True
        new[1:] = s[1:] > run_max[:-1]
    else:
        g = g[order]
        # A running maximum that restarts in each group: offset every group above the
        # previous groups' values, accumulate, then remove the offset.
        change = np.empty(len(s), bool)
        change[0] = True
        change[1:] = g[1:] != g[:-1]
        span = int(e.max()) - int(s.min()) + 1
        rank = np.cumsum(change) - 1
        base = int(s.min())
        shifted = (e - base) + rank.astype(I64) * span
        run_max = np.maximum.accumulate(shifted) - rank.astype(I64) * span + base
        new = change.copy()
        new[1:] |= s[1:] > run_max[:-1]
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, len(s) - 1]
    return Union(s[first], run_max[last], None if g is None else g[first])


class Coverage:
    """How much of (-inf, t] a disjoint sorted union covers, for many t at once."""

    def __init__(self, start: np.ndarray, end: np.ndarray):
        self.start, self.end = _as_i64(start), _as_i64(end)
        self.cum = np.concatenate([[0], np.cumsum(self.end - self.start)]).astype(I64)

    def at(self, t) -> np.ndarray:
        t = _as_i64(t)
        i = np.searchsorted(self.start, t, side="right") - 1  # last piece starting <= t
        inside = np.zeros(t.shape, I64)
        ok = i >= 0
        j = i[ok]
        inside[ok] = np.minimum(t[ok], self.end[j]) - self.start[j]
        return self.cum[np.maximum(i, 0)] * ok + inside

    def between(self, a, b) -> np.ndarray:
        """Covered time inside each window [a, b)."""
        return self.at(b) - self.at(a)

    def contains(self, t) -> np.ndarray:
        """Whether each t lies inside a piece (start <= t <= end)."""
        t = _as_i64(t)
        i = np.searchsorted(self.start, t, side="right") - 1
        ok = i >= 0
        out = np.zeros(t.shape, bool)
        out[ok] = self.end[i[ok]] >= t[ok]
        return out


def gaps(u: Union) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gaps between consecutive pieces of a union, within each group:
    (gap start, gap end, index of the piece that follows the gap)."""
    if len(u) < 2:
        empty = np.empty(0, I64)
        return empty, empty, empty
    nxt = np.arange(1, len(u))
    ok = np.ones(len(u) - 1, bool) if u.group is None else u.group[1:] == u.group[:-1]
    return u.end[:-1][ok], u.start[1:][ok], nxt[ok]


def overlap_ns(a: Union, b: Union, lo, hi) -> np.ndarray:
    """|A ∩ B| inside each window [lo, hi): |A| + |B| - |A ∪ B|."""
    both = union(np.r_[a.start, b.start], np.r_[a.end, b.end])
    in_a, in_b = a.coverage().between(lo, hi), b.coverage().between(lo, hi)
    return in_a + in_b - both.coverage().between(lo, hi)

"""The innermost-op segments with numpy (analyzers/critical_path_segments.py) are the
loop's (`_flatten`): the same segments in the same order, on random spans — nested, with
zero-length and equal spans, spans sharing starts and ends, and spans that outlive their
parent (which the loop clips) — and on every real trace's CPU spans."""

import numpy as np
import pytest
from test_critical_path import KINETO

from perfdiag.analyzers.critical_path_graph import _flatten
from perfdiag.analyzers.critical_path_segments import innermost_segments


def _sorted(thread, s, e):
    order = np.lexsort((-e, s, thread))
    thread, s, e = thread[order], s[order], e[order]
    new = np.r_[True, thread[1:] != thread[:-1]]
    return new, s, e, order.astype(np.int64)


def _same(new, s, e, span):
    want = _flatten(new.tolist(), s.tolist(), e.tolist(), span.tolist())
    got = innermost_segments(new, s, e, span, _flatten)
    for k in ("thread", "start", "end", "span"):
        assert got[k].tolist() == want[k].tolist(), k
    return len(want["start"])


def _nested_spans(rng, n, grid):
    """A random call tree on a coarse time grid (many equal times), by recursion."""
    out = []

    def fill(lo, hi, depth):
        t = lo
        while t < hi and len(out) < n:
            a = int(rng.integers(t, hi + 1))
            b = int(rng.integers(a, hi + 1)) if rng.random() < 0.8 else a  # some zero-length
            out.append((a, b))
            if depth < 6 and b > a and rng.random() < 0.6:
                fill(a, b, depth + 1)
            t = b if rng.random() < 0.7 else a  # siblings that touch, or share a start

    fill(0, grid, 0)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_random_nested_spans(seed):
    rng = np.random.default_rng(seed)
    spans, thread = [], []
    for t in range(int(rng.integers(1, 4))):
        mine = _nested_spans(rng, 200, int(rng.integers(5, 400)))
        if rng.random() < 0.3 and mine:
            mine.append(mine[int(rng.integers(len(mine)))])  # an identical twin
        spans += mine
        thread += [t] * len(mine)
    s = np.asarray([a for a, _ in spans], np.int64)
    e = np.asarray([b for _, b in spans], np.int64)
    _same(*_sorted(np.asarray(thread), s, e))


@pytest.mark.parametrize("seed", range(20))
def test_random_overlapping_spans_fall_back_to_the_loop(seed):
    rng = np.random.default_rng(1000 + seed)
    n = int(rng.integers(1, 300))
    s = rng.integers(0, 50, n)
    e = s + rng.integers(0, 30, n)  # spans that overlap without nesting, clipped by the loop
    thread = rng.integers(0, 3, n)
    _same(*_sorted(thread, s.astype(np.int64), e.astype(np.int64)))


def test_real_traces(tmp_path, cli):
    from perfdiag.analyzers.spans import cls_mask, timeline_spans
    from perfdiag.traces.reader import load_run

    total = 0
    for path in sorted(KINETO.glob("*.json.gz")):
        run = tmp_path / path.name.split(".")[0]
        assert cli("import", str(path), "-o", str(run)).returncode == 0
        df = timeline_spans(load_run(run))
        mask = ~df["on_gpu"].to_numpy() & cls_mask(df, "cpu", "runtime", "comm")
        mask &= df["end_ns"].to_numpy() >= df["start_ns"].to_numpy()
        rows = np.flatnonzero(mask)
        pid = df["pid"].astype("float64").fillna(-1).to_numpy()[rows]
        tid = df["tid"].astype("float64").fillna(-1).to_numpy()[rows]
        s, e = df["start_ns"].to_numpy(np.int64)[rows], df["end_ns"].to_numpy(np.int64)[rows]
        order = np.lexsort((-e, s, tid, pid))
        pid, tid = pid[order], tid[order]
        new = np.r_[True, (pid[1:] != pid[:-1]) | (tid[1:] != tid[:-1])] if len(rows) else []
        if len(rows):
            total += _same(np.asarray(new), s[order], e[order], rows[order])
    assert total > 50_000


def test_nested_spans_take_the_numpy_path_and_overlapping_ones_the_loop():
    from perfdiag.analyzers.critical_path_segments import _nested

    took = 0
    for seed in range(40):
        m = _nested_spans(np.random.default_rng(seed), 200, 300)
        s, e = np.asarray([a for a, _ in m]), np.asarray([b for _, b in m])
        o = np.lexsort((-e, s))
        took += _nested(s[o], e[o]) is not None
    assert took >= 20  # the comparisons above test the numpy path, not only the loop's
    s, e = np.asarray([0, 5]), np.asarray([10, 15])  # the second outlives the first
    assert _nested(s, e) is None

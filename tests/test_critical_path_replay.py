"""The fast replay (analyzers/critical_path_replay.py: chains by cumulative sums, only the
cross-linked nodes one by one) gives exactly the node-by-node replay's times, on a real
trace's graph with random what-if weights (halved, a sync's edge taken out)."""

import numpy as np
from test_critical_path import KINETO

from perfdiag.analyzers import critical_path_graph as cg
from perfdiag.analyzers.critical_path import GONE


def test_fast_replay_equals_node_by_node(tmp_path, cli, monkeypatch):
    from perfdiag.analyzers import critical_path_replay

    monkeypatch.setattr(critical_path_replay, "_BLOCK", 1000)  # many blocks in latest()
    cli("import", str(KINETO / "a100_alexnet_cuda_sync.json.gz"), "-o", str(tmp_path / "run"))
    from perfdiag.analyzers.spans import timeline_spans
    from perfdiag.traces.reader import load_run

    g = cg.build(timeline_spans(load_run(tmp_path / "run")))
    assert np.array_equal(cg.replay(g), g.time) and np.array_equal(cg.replay_each(g), g.time)
    rng = np.random.default_rng(36)
    for _ in range(5):
        w = g.weights.copy()
        w[rng.random(w.shape) < 0.3] //= 2
        w[(g.kinds == cg.SYNC) & (rng.random(w.shape) < 0.5)] = GONE
        fast = cg.replay(g, w)
        assert np.array_equal(fast, cg.replay_each(g, w))
        assert not np.array_equal(fast, g.time)  # the weights did change something
        among = rng.random(len(g.time)) < 0.7  # the latest of some nodes, block by block
        assert cg.replay_latest(g, w, among) == fast[among].max()


def _walk_each(g, sink: int, lo: int):
    """The path back from `sink`, node by node (the reference for `_back_from`)."""
    nodes, cols, n = [], [], sink
    while n != g.source and g.time[n] > lo:
        b = int(g.binding[n])
        if b < 0:
            break
        nodes.append(n)
        cols.append(b)
        n = int(g.preds[n, b])
    return nodes[::-1], cols[::-1]


def test_walk_by_runs_equals_node_by_node(tmp_path, cli):
    """The walk takes each chain's run of nodes as a range: the same nodes and edges as
    stepping back one node at a time, whichever time it stops at."""
    from perfdiag.analyzers.critical_path import _back_from

    cli("import", str(KINETO / "a100_alexnet_cuda_sync.json.gz"), "-o", str(tmp_path / "run"))
    from perfdiag.analyzers.spans import timeline_spans
    from perfdiag.traces.reader import load_run

    g = cg.build(timeline_spans(load_run(tmp_path / "run")))
    ends = g.time[1 : g.source : 2]
    sink = 2 * int(np.argmax(ends)) + 1
    lows = np.quantile(g.time, [0, 0.1, 0.5, 0.9, 0.999]).astype(np.int64)
    for lo in [int(g.time.min()) - 1, *lows.tolist()]:
        nodes, cols = _back_from(g, sink, lo)
        want_nodes, want_cols = _walk_each(g, sink, lo)
        assert nodes.tolist() == want_nodes and cols.tolist() == want_cols
    assert len(want_nodes) == 0 or len(_back_from(g, sink, int(g.time.min()) - 1)[0]) > 100


def test_order_of_some_nodes_is_the_whole_orders(tmp_path, cli):
    """A replay orders only the nodes it visits, from their equal-time ancestors: the
    order the whole graph's topological sort gives them."""
    cli("import", str(KINETO / "a100_alexnet_cuda_sync.json.gz"), "-o", str(tmp_path / "run"))
    from perfdiag.analyzers.spans import timeline_spans
    from perfdiag.traces.reader import load_run

    g = cg.build(timeline_spans(load_run(tmp_path / "run")))
    whole = g.order
    rng = np.random.default_rng(7)
    for share in (0.02, 0.3, 1.0):
        nodes = np.flatnonzero(rng.random(len(g.time)) < share)
        picked = np.zeros(len(g.time), bool)
        picked[nodes] = True
        assert cg.order_of(g.time, g.preds, nodes).tolist() == whole[picked[whole]].tolist()
    # equal times do occur, so the depth tie-break is exercised
    assert (g.time[whole][1:] == g.time[whole][:-1]).sum() > 100

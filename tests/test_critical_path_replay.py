"""The fast replay (analyzers/critical_path_replay.py: chains by cumulative sums, only the
cross-linked nodes one by one) gives exactly the node-by-node replay's times, on a real
trace's graph with random what-if weights (halved, a sync's edge taken out)."""

import numpy as np
from test_critical_path import KINETO

from perfdiag.analyzers import critical_path_graph as cg
from perfdiag.analyzers.critical_path import GONE


def test_fast_replay_equals_node_by_node(tmp_path, cli):
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

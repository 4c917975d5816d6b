"""Replaying a critical-path graph (critical_path_graph.py) fast: the graph is mostly
chains (a thread's segments, a stream's ops, each node waiting only on the node before
it), and along a chain a node's time is its chain's last cross-linked node's time plus
the weights since (a cumulative sum). Only the nodes that a launch, a sync, a thread
wait or a stream wait touches — a small share of a trace's nodes — need the max over
their predecessors, one by one in topological order; every other node is filled in
with numpy afterwards. Same answer as visiting every node, several times faster.
"""

from __future__ import annotations

import numpy as np

# Rows turned into Python lists at a time: seven lists of ints for every cross-linked node
# at once were ~45 MB of a 412k-event trace's peak; 64k rows cost no time.
_CHUNK = 1 << 16
# Nodes per block when only the latest replayed time is wanted.
_BLOCK = 1 << 17


class Replay:
    """A graph's chain structure, worked out once for all its replays."""

    def __init__(self, time: np.ndarray, preds: np.ndarray, order_of):
        """`order_of(nodes)`: those nodes (ascending) in a topological order."""
        n = len(time)
        src = n - 1
        ids = np.int32 if n < 2**31 else np.int64  # per-node arrays: half as large
        idx = np.arange(n, dtype=ids)
        p0 = preds[:, 0]
        self.chain = p0 == idx - 1  # waits on the node just before it in its chain
        crossing = preds[:, 1:] >= 0
        # Only the nodes a cross edge arrives at (and chain starts) go one by one; a node a
        # cross edge leaves from is read off its chain's last such node before it (its
        # anchor) plus the chain's weights since: half the nodes of the loop on a training
        # trace (a launch call's start is a plain chain node).
        key = ~self.chain | crossing.any(axis=1)
        key[src] = True
        self.anchor = np.where(key, idx, 0)
        np.maximum.accumulate(self.anchor, out=self.anchor)
        del idx
        # The loop works on the cross-linked nodes alone, numbered 0..k-1 (the source last).
        self.nodes = np.flatnonzero(key)
        slot = np.full(n, -1, ids)
        slot[self.nodes] = np.arange(len(self.nodes))
        self.key = order_of(self.nodes[:-1])  # topological (the source is last: not it)
        self.p0_chain = self.chain[self.key]
        a = np.where(self.p0_chain, self.anchor[np.maximum(p0[self.key], 0)], src)
        self.a = a
        self.a_slot = slot[a]
        self.slot = slot[self.key]
        # A cross edge's source as its anchor's slot and the source's place on the chain.
        self.cross = []
        for c in (1, 2):
            p = preds[self.key, c]
            has = p >= 0
            src_node = np.where(has, p, src)
            self.cross.append((has, src_node, self.anchor[src_node],
                               np.where(has, slot[self.anchor[src_node]], -1)))  # fmt: skip
        self.anchor_slot = slot[self.anchor]
        self.start = time[self.nodes]

    def __call__(self, weights: np.ndarray) -> np.ndarray:
        t, along = self._key_times(weights)
        return t[self.anchor_slot] + (along - along[self.anchor])

    def latest(self, weights: np.ndarray, among: np.ndarray) -> int:
        """The latest replayed time of the nodes `among` selects, a block of nodes at a
        time: no whole-graph temporaries (four of 7.6 MB at a 412k-event trace)."""
        t, along = self._key_times(weights)
        best = None
        for lo in range(0, len(along), _BLOCK):
            sl = slice(lo, lo + _BLOCK)
            pick = among[sl]
            if not pick.any():
                continue
            times = t[self.anchor_slot[sl][pick]] + (along[sl][pick] - along[self.anchor[sl][pick]])
            top = int(times.max())
            best = top if best is None else max(best, top)
        if best is None:
            raise ValueError("latest() of no nodes")
        return best

    def _key_times(self, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The cross-linked nodes' times, and each node's chain weights so far."""
        along = np.where(self.chain, weights[:, 0], 0)
        np.cumsum(along, out=along)  # a chain's weights so far (differences within one chain)
        key = self.key
        d0 = np.where(self.p0_chain, along[key] - along[self.a], weights[key, 0])
        (h1, s1, a1, p1), (h2, s2, a2, p2) = self.cross
        w1 = np.where(h1, weights[key, 1] + along[s1] - along[a1], 0)
        w2 = np.where(h2, weights[key, 2] + along[s2] - along[a2], 0)
        t = self.start.tolist()
        cols = (self.slot, self.a_slot, d0, p1, w1, p2, w2)
        for lo in range(0, len(key), _CHUNK):  # a chunk's rows as lists at a time, not all
            rows = zip(*(c[lo : lo + _CHUNK].tolist() for c in cols), strict=True)
            for n, a0, d, p1, w1, p2, w2 in rows:
                best = t[a0] + d
                if p1 >= 0 and t[p1] + w1 > best:
                    best = t[p1] + w1
                if p2 >= 0 and t[p2] + w2 > best:
                    best = t[p2] + w2
                t[n] = best
        return np.asarray(t, np.int64), along

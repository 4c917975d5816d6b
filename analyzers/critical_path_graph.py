"""The dependency graph of one rank's trace, for the critical path (critical_path.py).

Every CPU segment (the innermost op on a thread, between its children) and every GPU op
has a start node and an end node, at their observed times. An edge p → n says n could
not happen before p plus the edge's weight; each node has at most three predecessors:

- a thread's previous segment (the host gap between them), or, when the thread sat idle
  while another thread of its process worked, that thread's last segment to end in the
  gap (it waited for it: autograd's backward thread, a join);
- a segment's or op's own start (its duration);
- a GPU op's previous op on its stream (kernel-to-kernel gap) and its launch call (launch
  latency), or, when it started later than both allow, the last op to end on another
  stream of its device (an event wait);
- a blocking call's end (blocking_calls.py): the GPU op it waited for, when that op
  ended inside the call (a copy to pageable memory: its copy; a stream synchronize: its
  stream's last op). The call's own duration then weighs only its return latency: the
  rest of its time is the device's.

The edge a node waited on last is its *binding* edge and weighs exactly the observed
gap; every other edge weighs at most its observed gap (a typical gap of the rank's own).
So a replay (`replay`) of the unchanged graph reproduces every observed time, and a
replay with some weights scaled tells what the trace would have taken under the model.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import blocking_calls
from .critical_path_replay import Replay
from .critical_path_segments import innermost_segments
from .gaps import HOST_BUSY_FRACTION  # one rule for what is busy
from .intervals import union
from .spans import CLASS_CODE, GPU_CLASSES, cls_mask

# Edge kinds: what a segment of the path spent its time on.
DUR_CPU, DUR_API, DUR_GPU, HOST_GAP, THREAD_WAIT, LAUNCH, GPU_GAP, STREAM_WAIT, SYNC, START = range(
    10
)
_BLOCK = 1 << 17  # nodes per block in `_settle_weights`
KIND_NAMES = ("cpu", "cuda_api", "gpu", "host_gap", "thread_wait", "launch", "gpu_gap",
              "stream_wait", "sync", "start")  # fmt: skip


@dataclass
class Graph:
    """One rank's graph. Activities 0..n_cpu-1 are CPU segments, then the GPU ops; node
    2a is activity a's start, 2a+1 its end; the last node is the source (trace start)."""

    time: np.ndarray  # observed ns, per node
    preds: np.ndarray  # (nodes, 3) predecessor node, -1 for none
    weights: np.ndarray  # (nodes, 3) edge weight ns
    kinds: np.ndarray  # (nodes, 3) edge kind
    binding: np.ndarray  # per node: which of its three edges it waited on (-1: source)
    name: np.ndarray  # per activity: op or kernel name (object)
    cls: np.ndarray  # per activity: breakdown class code
    resource: np.ndarray  # per activity: "pid P tid T" or "gpu D stream S" (object)
    blocking: np.ndarray  # per activity: a call's return that waited for the device
    n_cpu: int

    @property
    def order(self) -> np.ndarray:
        """Every node in a topological order (replay_each's; a replay orders only the
        nodes it visits one by one, `order_of`)."""
        if "_order" not in self.__dict__:
            self.__dict__["_order"] = _topological(self.time, self.preds)
        return self.__dict__["_order"]

    @property
    def source(self) -> int:
        return len(self.time) - 1

    @property
    def n_activities(self) -> int:
        return len(self.name)


def build(df: pd.DataFrame) -> Graph:
    """The graph of one rank's spans (a frame from `spans.prepare`, one rank only)."""
    seg = _cpu_segments(df)
    gpu = _gpu_ops(df)
    n_cpu, n_gpu = len(seg), len(gpu)
    n_act = n_cpu + n_gpu
    t0 = int(min(seg["start"].min() if n_cpu else np.iinfo(np.int64).max,
                 gpu["start"].min() if n_gpu else np.iinfo(np.int64).max))  # fmt: skip
    src = 2 * n_act
    time = np.empty(src + 1, np.int64)
    starts = np.r_[seg["start"].to_numpy(np.int64), gpu["start"].to_numpy(np.int64)]
    ends = np.r_[seg["end"].to_numpy(np.int64), gpu["end"].to_numpy(np.int64)]
    time[0:src:2], time[1:src:2], time[src] = starts, ends, t0
    del starts, ends
    preds = np.full((src + 1, 3), -1, np.int32 if src < 2**31 else np.int64)
    kinds = np.full((src + 1, 3), START, np.int8)

    # Durations: every activity's end waits on its own start.
    act = np.arange(n_act)
    cls = np.r_[seg["cls"].to_numpy(np.int8), gpu["cls"].to_numpy(np.int8)]
    preds[2 * act + 1, 0] = 2 * act
    dur_kind = np.where(act < n_cpu, DUR_CPU, DUR_GPU)
    dur_kind[:n_cpu][cls[:n_cpu] == CLASS_CODE["runtime"]] = DUR_API
    kinds[2 * act + 1, 0] = dur_kind

    _thread_edges(seg, time, preds, kinds, src)
    _gpu_edges(df, seg, gpu, n_cpu, time, preds, kinds, src)
    blocking = np.zeros(n_act, bool)
    call, op, at_end = blocking_calls.waits(df, seg, gpu)
    preds[2 * call + 1, 1] = 2 * (n_cpu + op) + at_end
    kinds[2 * call + 1, 1] = SYNC
    blocking[call] = True

    binding = _binding(time, preds, kinds)
    # Allocated only now, when every other edge is known (its 23 MB at a 412k-event trace
    # were held through the thread edges' peak); each edge's weight is set here.
    weights = np.zeros((src + 1, 3), np.int64)
    _settle_weights(time, preds, weights, kinds, binding)
    every = slice(None)
    name = np.r_[_names(seg["name"], every), _names(gpu["name"], every)]
    resource = np.r_[_names(seg["resource"], every), _names(gpu["resource"], every)]
    return Graph(time, preds, weights, kinds, binding, name, cls, resource, blocking, n_cpu)


def _cpu_segments(df: pd.DataFrame) -> pd.DataFrame:
    """Each thread's time cut where its innermost recorded op changes: a segment belongs
    to the innermost op, so nested ops are counted once (self time)."""
    mask = ~df["on_gpu"].to_numpy() & cls_mask(df, "cpu", "runtime", "comm")
    mask &= df["end_ns"].to_numpy() >= df["start_ns"].to_numpy()
    rows = np.flatnonzero(mask)
    cols: dict[str, list] = {"thread": [], "start": [], "end": [], "span": []}
    if len(rows):
        pid = df["pid"].astype("float64").fillna(-1).to_numpy()[rows]
        tid = df["tid"].astype("float64").fillna(-1).to_numpy()[rows]
        s, e = df["start_ns"].to_numpy(np.int64)[rows], df["end_ns"].to_numpy(np.int64)[rows]
        order = np.lexsort((-e, s, tid, pid))
        pid, tid = pid[order], tid[order]
        new = np.r_[True, (pid[1:] != pid[:-1]) | (tid[1:] != tid[:-1])]
        cols = innermost_segments(new, s[order], e[order], rows[order], _flatten)
    seg = pd.DataFrame(cols)
    if not len(seg):
        return pd.DataFrame({"thread": pd.Series(dtype="int64"), "start": pd.Series(dtype="int64"),
                             "end": pd.Series(dtype="int64"), "span": pd.Series(dtype="int64"),
                             "name": pd.Series(dtype=object), "cls": pd.Series(dtype="int8"),
                             "resource": pd.Series(dtype=object),
                             "pid": pd.Series(dtype="float64")})  # fmt: skip
    pos = seg["span"].to_numpy()
    seg["name"] = _categorical(df["name"], pos)
    seg["cls"] = df["cls"].to_numpy()[pos]
    pid = df["pid"].astype("float64").to_numpy()[pos]
    seg["pid"] = np.nan_to_num(pid, nan=-1.0)
    tid = df["tid"].astype("float64").to_numpy()[pos]
    thread = seg["thread"].to_numpy()  # segments come thread by thread: one name each
    first = np.r_[True, thread[1:] != thread[:-1]]
    names = [f"pid {_id(a)} tid {_id(b)}" for a, b in zip(pid[first], tid[first], strict=True)]
    uniq, code = np.unique(np.asarray(names, dtype=object), return_inverse=True)
    seg["resource"] = pd.Categorical.from_codes(code[np.cumsum(first) - 1], uniq)
    return seg


def _categorical(col: pd.Series, rows: np.ndarray):
    """These rows of a name column, kept categorical: a DataFrame column of str objects
    becomes an Arrow string column, and each later `to_numpy` a new str per row."""
    if not isinstance(col.dtype, pd.CategoricalDtype):
        col = col.astype("category")
    return pd.Categorical.from_codes(col.cat.codes.to_numpy()[rows], dtype=col.dtype)


def _names(col: pd.Series, rows) -> np.ndarray:
    """Names of these rows, each distinct name one shared str (a categorical's categories):
    not a new str per row, which at 400k spans is tens of MB."""
    if not isinstance(col.dtype, pd.CategoricalDtype):
        return col.to_numpy(object)[rows]
    cats = np.r_[np.asarray(col.cat.categories, dtype=object), np.asarray([""], dtype=object)]
    return cats[col.cat.codes.to_numpy()[rows]]  # code -1 (missing) → ""


def _id(v: float) -> str:
    return "-" if v != v else str(int(v))


def _flatten(new_thread, s, e, span) -> dict[str, np.ndarray]:
    """Segments of the innermost open span, with a stack per thread (spans sorted by
    thread, start, longest first). A span that outlives its parent is cut at the
    parent's end (imported traces are not always well nested). The one loop over
    spans in the critical path: kept lean (local appends, no calls per segment). The
    segments gather in int64 arrays, 8 bytes each, not lists of int objects (~40 each:
    at 440k segments, 55 MB less at the critical path's peak)."""
    th, st, en, ro = (array("q") for _ in range(4))
    ends: list[int] = []  # the open spans' ends and rows, innermost last
    rows: list[int] = []
    code, cursor = -1, 0
    for new, si, ei, row in zip(new_thread, s, e, span, strict=True):
        if new:
            while ends:  # the previous thread's open spans, innermost first
                end, r = ends.pop(), rows.pop()
                if end > cursor:
                    th.append(code), st.append(cursor), en.append(end), ro.append(r)
                    cursor = end
            code, cursor = code + 1, si
        while ends and ends[-1] <= si:  # spans that ended before this one starts
            end, r = ends.pop(), rows.pop()
            if end > cursor:
                th.append(code), st.append(cursor), en.append(end), ro.append(r)
                cursor = end
        if ends:
            if si > cursor:  # the enclosing span ran until this child began
                th.append(code), st.append(cursor), en.append(si), ro.append(rows[-1])
            if ends[-1] < ei:
                ei = ends[-1]
        if si > cursor:
            cursor = si
        ends.append(ei)
        rows.append(row)
    while ends:
        end, r = ends.pop(), rows.pop()
        if end > cursor:
            th.append(code), st.append(cursor), en.append(end), ro.append(r)
            cursor = end
    return {"thread": np.frombuffer(th, np.int64), "start": np.frombuffer(st, np.int64),
            "end": np.frombuffer(en, np.int64), "span": np.frombuffer(ro, np.int64)}  # fmt: skip


def _gpu_ops(df: pd.DataFrame) -> pd.DataFrame:
    on = np.flatnonzero(df["on_gpu"].to_numpy() & cls_mask(df, *GPU_CLASSES))
    f = pd.DataFrame(
        {
            "start": df["start_ns"].to_numpy(np.int64)[on],
            "end": df["end_ns"].to_numpy(np.int64)[on],
            "name": _categorical(df["name"], on),
            "cls": df["cls"].to_numpy()[on],
            "device": df["device"].astype("float64").fillna(-1).to_numpy()[on],
            "stream": df["stream"].astype("float64").fillna(-1).to_numpy()[on],
            "correlation": df["correlation"].astype("float64").to_numpy()[on],
        }
    )
    f = f.sort_values(["device", "stream", "start"], kind="stable", ignore_index=True)
    d = f["device"].astype("int64").astype(str).to_numpy(object)
    s = f["stream"].astype("int64").astype(str).to_numpy(object)
    f["resource"] = pd.Series("gpu " + d + " stream " + s, dtype="category")
    return f


def _thread_edges(seg, time, preds, kinds, src) -> None:
    """Each segment waits on its thread's previous one; a gap during which other
    threads of the process were busy waits on the last of their segments to end in it."""
    n = len(seg)
    if not n:
        return
    thread = seg["thread"].to_numpy()
    s, e = seg["start"].to_numpy(np.int64), seg["end"].to_numpy(np.int64)
    node = 2 * np.arange(n)
    first = np.r_[True, thread[1:] != thread[:-1]]
    preds[node, 0] = np.where(first, src, node - 1)
    kinds[node, 0] = np.where(first, START, HOST_GAP)
    gap_from = np.where(first, time[src], np.r_[0, e[:-1]])
    pid = seg["pid"].to_numpy()
    for p in np.unique(pid):
        mine = pid == p
        if len(np.unique(thread[mine])) < 2:
            continue
        for t in np.unique(thread[mine]):
            me = np.flatnonzero(mine & (thread == t))
            other = np.flatnonzero(mine & (thread != t))
            lo, hi = gap_from[me], s[me]
            has_gap = hi > lo
            if not has_gap.any():
                continue
            by_end = other[np.argsort(e[other], kind="stable")]
            ends = e[by_end]
            k = np.searchsorted(ends, hi, side="right") - 1
            ok = has_gap & (k >= 0)
            ok[ok] &= ends[k[ok]] > lo[ok]
            busy = union(s[other], e[other]).coverage().between(lo, hi)
            ok &= busy >= HOST_BUSY_FRACTION * np.maximum(hi - lo, 1)
            waits = me[ok]
            preds[2 * waits, 1] = 2 * by_end[k[ok]] + 1
            kinds[2 * waits, 1] = THREAD_WAIT


def _gpu_edges(df, seg, gpu, n_cpu, time, preds, kinds, src) -> None:
    """Each GPU op waits on its stream's previous op and on its launch call; one that
    started later than both allow waits on the last op to end on another stream."""
    m = len(gpu)
    if not m:
        return
    node = 2 * (n_cpu + np.arange(m))
    key = gpu["device"].to_numpy() * 1e9 + gpu["stream"].to_numpy()
    first = np.r_[True, key[1:] != key[:-1]]
    preds[node, 0] = np.where(first, src, node - 1)
    kinds[node, 0] = np.where(first, START, GPU_GAP)
    launch = _launch_segments(df, seg, gpu)
    linked = launch >= 0
    preds[node[linked], 1] = 2 * launch[linked]
    kinds[node[linked], 1] = LAUNCH
    # Event waits: the op started after both its stream and its launch (plus the rank's
    # typical launch latency) allowed; the op that ended last on another stream of the
    # device before it started is what it waited for.
    start = gpu["start"].to_numpy(np.int64)
    ready_stream = time[preds[node, 0]]
    ready_launch = np.where(linked, time[np.maximum(preds[node, 1], 0)], np.iinfo(np.int64).min)
    launch_bound = linked & (ready_launch >= ready_stream)
    latency = start[launch_bound] - ready_launch[launch_bound]
    typical = int(np.median(latency)) if len(latency) else 0
    ready = np.maximum(ready_stream, np.where(linked, ready_launch + typical, ready_stream))
    late = start > ready
    if not late.any():
        return
    end = gpu["end"].to_numpy(np.int64)
    dev = gpu["device"].to_numpy()
    for d in np.unique(dev[late]):
        on_dev = np.flatnonzero(dev == d)
        if len(np.unique(key[on_dev])) < 2:
            continue
        by_end = on_dev[np.argsort(end[on_dev], kind="stable")]
        ends = end[by_end]
        for j in np.flatnonzero(late & (dev == d)):
            k = np.searchsorted(ends, start[j], side="right") - 1
            while k >= 0 and key[by_end[k]] == key[j]:
                k -= 1  # the op's own stream is its stream edge
            if k >= 0 and ends[k] > ready[j]:
                preds[node[j], 2] = 2 * (n_cpu + by_end[k]) + 1
                kinds[node[j], 2] = STREAM_WAIT


def _launch_segments(df, seg, gpu) -> np.ndarray:
    """Per GPU op, the CPU segment where its launch call begins (-1: no launch)."""
    out = np.full(len(gpu), -1, np.int64)
    corr = gpu["correlation"].to_numpy()
    if not len(seg) or np.isnan(corr).all():
        return out
    calls = seg[(seg["cls"].to_numpy() == CLASS_CODE["runtime"])]
    calls = calls.drop_duplicates("span")  # a call's first segment: where it begins
    if not len(calls):
        return out
    c = df["correlation"].astype("float64").to_numpy()[calls["span"].to_numpy()]
    keep = ~np.isnan(c)
    by_corr = pd.Series(calls.index.to_numpy()[keep], index=c[keep])
    by_corr = by_corr[~by_corr.index.duplicated(keep="first")]
    hit = by_corr.reindex(corr).to_numpy()
    ok = ~np.isnan(hit)
    out[ok] = hit[ok].astype(np.int64)
    return out


def _binding(time, preds, kinds) -> np.ndarray:
    """Per node, the predecessor it waited on last (ties: its own chain, column 0).
    Column by column: no (nodes, 3) temporaries (a 400k-span trace has ~1M nodes)."""
    low = np.iinfo(np.int64).min
    best = np.full(len(time), low, np.int64)
    binding = np.full(len(time), -1, np.int8)
    for c in range(3):
        at = _pred_time(time, preds[:, c], low)
        later = at > best  # strictly: a tie stays with the lower column
        best[later] = at[later]
        binding[later] = c
    # A tie with the trace's start goes to the real edge (a launch at the first instant).
    rows = np.flatnonzero(binding >= 0)
    tie = rows[kinds[rows, binding[rows]] == START]
    for c in range(3):
        p = preds[tie, c]
        real = (p >= 0) & (kinds[tie, c] != START) & (time[np.maximum(p, 0)] == best[tie])
        binding[tie[real]] = c
        tie = tie[~real]
    return binding


def _pred_time(time, pred, missing) -> np.ndarray:
    return np.where(pred >= 0, time[np.maximum(pred, 0)], missing)


def _settle_weights(time, preds, weights, kinds, binding) -> None:
    """Binding edges weigh the observed gap; the others at most their observed gap: a
    stream or launch edge the rank's typical (median binding) gap of its kind, a sync
    call's own duration its return latency, a thread's own gap while it was woken by
    another the rank's typical host gap. Column by column, as `_binding`."""
    typical = {}
    for kind in (GPU_GAP, LAUNCH, HOST_GAP):
        on, near = [], []
        for c in range(3):
            of_kind = (kinds[:, c] == kind) & (preds[:, c] >= 0)
            rows = np.flatnonzero(of_kind)
            obs = np.maximum(time[rows] - time[preds[rows, c]], 0)
            on.append(obs[binding[rows] == c])
            near.append(obs)
        bound = np.concatenate(on)
        if not len(bound) and kind == LAUNCH:
            bound = np.concatenate(near)
        typical[kind] = int(np.median(bound)) if len(bound) else 0
    # A block of nodes at a time: whole-graph temporaries were ~55 MB at 950k nodes.
    for lo in range(0, len(time), _BLOCK):
        nodes = np.arange(lo, min(len(time), lo + _BLOCK))
        bind = binding[nodes]
        ok = bind >= 0
        # a blocking call's own duration (waited out by the device): at most its return
        # latency, what it took after the device was done (its binding edge's gap)
        ret = np.zeros(len(nodes), np.int64)
        ret[ok] = np.maximum(time[nodes[ok]] - time[preds[nodes[ok], bind[ok]]], 0)
        for c in range(3):
            has = preds[nodes, c] >= 0
            rows = nodes[has]
            obs = np.maximum(time[rows] - time[preds[rows, c]], 0)
            kind = kinds[rows, c]
            w = obs.copy()  # binding edges and the kinds not named below: the observed gap
            loose = bind[has] != c
            for k, t in typical.items():
                sel = loose & (kind == k)
                w[sel] = np.minimum(obs[sel], t)
            w[loose & (kind == START)] = 0  # the trace's start holds back no one
            dur = loose & ((kind == DUR_CPU) | (kind == DUR_API))
            w[dur] = np.minimum(obs[dur], ret[has][dur])
            weights[rows, c] = w


def _topological(time, preds) -> np.ndarray:
    """Nodes in time order, ties broken by the depth of chains of equal-time edges (a
    zero-length segment's start and end, a segment starting where the last ended)."""
    same = np.zeros(preds.shape, bool)
    for c in range(3):
        p = preds[:, c]
        same[:, c] = (p >= 0) & (time[np.maximum(p, 0)] == time)
    rows = np.flatnonzero(same.any(axis=1))  # only these can have a depth
    depth = _depths(time, preds, rows)
    return np.lexsort((depth, time)).astype(np.int32 if len(time) < 2**31 else np.int64)


def _depths(time, preds, rows) -> np.ndarray:
    """Per node, the length of its longest chain of equal-time edges back, worked out over
    `rows` (every other node: 0), which hold every equal-time predecessor of their own."""
    p = np.maximum(preds[rows], 0)
    same = (preds[rows] >= 0) & (time[p] == time[rows][:, None])
    depth = np.zeros(len(time), np.int64)
    for _ in range(len(rows)):
        new = np.where(same, depth[p] + 1, 0).max(axis=1)
        if np.array_equal(new, depth[rows]):
            break
        depth[rows] = new
    return depth


def order_of(time, preds, nodes: np.ndarray) -> np.ndarray:
    """`nodes` (ascending) in `_topological`'s order, from their own equal-time ancestors
    alone: a replay visits ~4 % of a training trace's nodes one by one, and ordering all
    950k of a 412k-event trace cost ~0.1 s and ~40 MB."""
    seen = np.zeros(len(time), bool)
    seen[nodes] = True
    members, frontier = [nodes], nodes
    while len(frontier):  # the nodes' equal-time predecessors, theirs, and so on
        p = preds[frontier]
        same = (p >= 0) & (time[np.maximum(p, 0)] == time[frontier][:, None])
        up = np.unique(p[same])
        frontier = up[~seen[up]]
        seen[frontier] = True
        members.append(frontier)
    rows = np.concatenate(members)
    depth = _depths(time, preds, rows)
    return nodes[np.lexsort((depth[nodes], time[nodes]))]


def replay(g: Graph, weights: np.ndarray | None = None) -> np.ndarray:
    """Every node's time under the graph's model with these edge weights: the latest
    of its predecessors' times plus the edges' weights (the source keeps its time)."""
    return _replayer(g)(g.weights if weights is None else weights)


def replay_latest(g: Graph, weights: np.ndarray, among: np.ndarray) -> int:
    """`replay(g, weights)[among].max()` without the whole replayed array."""
    return _replayer(g).latest(weights, among)


def _replayer(g: Graph) -> Replay:
    """The graph's chain structure, worked out on its first replay and kept."""
    r = g.__dict__.get("_replay")
    if r is None:
        r = g.__dict__["_replay"] = Replay(
            g.time, g.preds, lambda nodes: order_of(g.time, g.preds, nodes)
        )
    return r


def replay_each(g: Graph, weights: np.ndarray | None = None) -> np.ndarray:
    """`replay` node by node (the reference the fast one is tested against)."""
    w = g.weights if weights is None else weights
    p0, p1, p2 = (g.preds[:, i].tolist() for i in range(3))
    w0, w1, w2 = (w[:, i].tolist() for i in range(3))
    t = g.time.tolist()
    src = g.source
    for n in g.order.tolist():
        if n == src:
            continue
        best = t[p0[n]] + w0[n]
        a = p1[n]
        if a >= 0 and t[a] + w1[n] > best:
            best = t[a] + w1[n]
        a = p2[n]
        if a >= 0 and t[a] + w2[n] > best:
            best = t[a] + w2[n]
        t[n] = best
    return np.asarray(t, np.int64)

"""Flows between slices: request ↔ step, step ↔ kernel, launch ↔ GPU op, and one
collective across its ranks (in the order they entered it: the last arrow ends at the
rank the others waited for).

Every flow has exactly two ends. Its origin (`flows_out`) is whichever end starts first;
on a tie, the end written first: requests are written before steps, steps before spans,
and CPU threads before GPU queues, because Perfetto orders events of equal timestamp as
they appear in the file. Pairs are found with Arrow/numpy joins and stored per span row
as CSR arrays, so a million spans cost a few arrays rather than a million lists.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from .sink import FLOW_COLLECTIVE, FLOW_LAUNCH, FLOW_STEP_KERNEL, flow_id

LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")


class RowFlows:
    """Flow ids per span row, out and in, as CSR."""

    def __init__(self, n_rows: int, rows_out, ids_out, rows_in, ids_in):
        self.out_ptr, self.out_ids = _csr(n_rows, rows_out, ids_out)
        self.in_ptr, self.in_ids = _csr(n_rows, rows_in, ids_in)
        self.count = len(self.out_ids) + len(self.in_ids)

    def chunk(self, rows: np.ndarray) -> tuple[list, list]:
        """(flows_out, flows_in) lists for these rows; () where a row has none."""
        return _gather(self.out_ptr, self.out_ids, rows), _gather(self.in_ptr, self.in_ids, rows)


def _csr(n: int, rows, ids) -> tuple[np.ndarray, np.ndarray]:
    rows = np.asarray(rows, dtype=np.int64)
    ids = np.asarray(ids, dtype=np.int64)
    order = np.argsort(rows, kind="stable")
    ptr = np.searchsorted(rows[order], np.arange(n + 1))
    return ptr, ids[order]


def _gather(ptr: np.ndarray, ids: np.ndarray, rows: np.ndarray) -> list:
    lo, hi = ptr[rows], ptr[rows + 1]
    out: list = [()] * len(rows)
    for i in np.flatnonzero(hi > lo).tolist():
        out[i] = ids[lo[i] : hi[i]].tolist()
    return out


class StepFlows:
    """Flow ids per (rank, step_id) on the step side, filled by the request and span passes."""

    def __init__(self) -> None:
        self.out: dict[tuple, list[int]] = defaultdict(list)
        self.into: dict[tuple, list[int]] = defaultdict(list)


def span_flows(
    cols: dict[str, np.ndarray],
    categories: list[str],
    category_codes: np.ndarray,
    steps: dict[tuple, int],
    step_flows: StepFlows,
) -> RowFlows:
    """Launch → GPU op (same rank and correlation id; the first launch when a trace
    repeats an id) and step → kernel (a kernel's step_id, same rank). `cols` hold the
    spans' columns with nulls as -1; `steps` maps (rank, step_id) → the step's start."""
    n = len(cols["start_ns"])
    start = cols["start_ns"]
    gpu = cols["device"] >= 0
    launch_codes = [i for i, c in enumerate(categories) if c in LAUNCH_CATEGORIES]
    launch = np.isin(category_codes, launch_codes) & ~gpu & (cols["correlation"] >= 0)
    rows_out, ids_out, rows_in, ids_in = [], [], [], []

    # launch -> GPU op: match on (rank, correlation)
    target = gpu & (cols["correlation"] >= 0)
    li, gi = np.flatnonzero(launch), np.flatnonzero(target)
    if len(li) and len(gi):
        lkey = _key(cols["rank"][li], cols["correlation"][li])
        first = np.unique(lkey, return_index=True)[1]
        li, lkey = li[first], lkey[first]
        order = np.argsort(lkey)
        li, lkey = li[order], lkey[order]
        gkey = _key(cols["rank"][gi], cols["correlation"][gi])
        pos = np.searchsorted(lkey, gkey)
        ok = pos < len(lkey)
        ok[ok] = lkey[pos[ok]] == gkey[ok]
        g, la = gi[ok], li[pos[ok]]
        ids = (FLOW_LAUNCH << 40) + 1 + g  # one flow per GPU op: its row names it
        cpu_first = start[la] <= start[g]  # ties: CPU threads are written first
        rows_out += [la[cpu_first], g[~cpu_first]]
        ids_out += [ids[cpu_first], ids[~cpu_first]]
        rows_in += [g[cpu_first], la[~cpu_first]]
        ids_in += [ids[cpu_first], ids[~cpu_first]]

    # step -> kernel
    kernel_code = categories.index("kernel") if "kernel" in categories else -1
    ki = np.flatnonzero(gpu & (category_codes == kernel_code) & (cols["step_id"] >= 0))
    if len(ki) and steps:
        ranks, sids = cols["rank"][ki].tolist(), cols["step_id"][ki].tolist()
        kstart = start[ki].tolist()
        krows_in, kids_in, krows_out, kids_out = [], [], [], []
        for row, rank, sid, ks in zip(ki.tolist(), ranks, sids, kstart, strict=True):
            key = (rank, sid)
            s = steps.get(key)
            if s is None:
                continue
            fid = flow_id(FLOW_STEP_KERNEL, row)
            if s <= ks:  # steps are written before spans
                step_flows.out[key].append(fid)
                krows_in.append(row)
                kids_in.append(fid)
            else:
                step_flows.into[key].append(fid)
                krows_out.append(row)
                kids_out.append(fid)
        rows_out.append(krows_out)
        ids_out.append(kids_out)
        rows_in.append(krows_in)
        ids_in.append(kids_in)
    for part, acc in zip(_collective_flows(cols, categories, category_codes),
                         (rows_out, ids_out, rows_in, ids_in), strict=True):  # fmt: skip
        acc.append(part)
    cat = np.concatenate
    return RowFlows(
        n,
        cat([np.asarray(r, np.int64) for r in rows_out]) if rows_out else [],
        cat([np.asarray(r, np.int64) for r in ids_out]) if ids_out else [],
        cat([np.asarray(r, np.int64) for r in rows_in]) if rows_in else [],
        cat([np.asarray(r, np.int64) for r in ids_in]) if ids_in else [],
    )


def _collective_flows(cols, categories, category_codes) -> tuple[np.ndarray, ...]:
    """(rows_out, ids_out, rows_in, ids_in) chaining each collective's spans over its
    ranks. A collective is the k-th comm span of a step on every rank (each rank calls the
    step's collectives in the same order: what `seq` numbers)."""
    empty = (np.zeros(0, np.int64),) * 4
    if "comm" not in categories:
        return empty
    ci = np.flatnonzero(
        (category_codes == categories.index("comm")) & (cols["rank"] >= 0) & (cols["step_id"] >= 0)
    )
    if len(ci) < 2:
        return empty
    rank, step, start = cols["rank"][ci], cols["step_id"][ci], cols["start_ns"][ci]
    order = np.lexsort((start, step, rank))
    ci, rank, step, start = ci[order], rank[order], step[order], start[order]
    new = np.r_[True, (rank[1:] != rank[:-1]) | (step[1:] != step[:-1])]
    first = np.maximum.accumulate(np.where(new, np.arange(len(ci)), 0))
    k = np.arange(len(ci)) - first  # the span's call order within its rank's step
    order = np.lexsort((rank, start, k, step))  # each collective, its ranks by entry
    ci, step, k = ci[order], step[order], k[order]
    same = (step[1:] == step[:-1]) & (k[1:] == k[:-1])
    src, dst = ci[:-1][same], ci[1:][same]
    ids = (FLOW_COLLECTIVE << 40) + 1 + dst  # one flow into each later rank's span
    return src, ids, dst, ids


def _key(rank: np.ndarray, corr: np.ndarray) -> np.ndarray:
    # correlation ids are < 2^47 in every tracer we know; ranks < 2^16
    return (rank.astype(np.int64) + 1) * (1 << 47) + corr.astype(np.int64)

"""How much slower a pipeline stage computes while another stage computes (the contention
factor k), and the pipelined window of a step at m micro-batches with it.

Why: stages that share cores compute slower overlapped than alone. On a 2-vCPU host two
stages computed 10–50 % slower once more micro-batches overlapped them (at m = 1 they
alternate, each with the host to itself), so a model that holds a stage's compute constant
advised an m that made E2E p50 59 % worse (BENCHMARKS.md, "Pipeline parallelism on the CPU").

k, by what the run shows (`contention`):
- "measured" (stages overlapped: m ≥ 2): each compute span's overlap f, the share of its
  time another stage was computing. Per stage and regime (micro-batches of ≥ LARGE_TOKENS:
  time per token; of ≤ SMALL_TOKENS: time per micro-batch), the time per unit of spans
  overlapped at least half their time over that of the others; k is the mean of these
  ratios weighted by the overlapped spans' time, at least 1. It needs MIN_SPANS spans on
  each side;
- "cuda": stages on GPUs of their own share nothing: k = 1;
- "cores" (no overlap to measure, on the CPU): a stage's cores are rank 0's CPU time per
  second of its step not spent waiting for the last stage (the steps table; the 90th
  percentile over steps, as the busiest steps show what it uses unimpeded: contention only
  lowers it); p stages need p times that, the host has its logical cores (the sampler's,
  else the manifest's) less what other processes used (the sampler). Needing more than
  1 − HEADROOM of that, overlapped stages would share cores with each other or with
  whatever else runs (rank 0's host work, the OS, neighbours): no micro-batch count is
  predicted to pay (`blocked`). Otherwise k = 1;
- "assumed": nothing of the above recorded: k = 1 (a core per stage), said so.

The window (`makespan`): GPipe with equal stages, micro-batch i costing c_i alone on every
stage; stage s starts micro-batch i when stage s − 1 finished it and s finished i − 1;
while two or more stages compute, each advances at 1/k of its speed alone. For equal
micro-batches that is 2 slots alone (stage 0's first, the last stage's last) and m + p − 3
overlapped; at k = 1, Σ c + (p − 1)·max c; m = 1 never overlaps.

Pure pandas over a run; no torch.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

from .run_config import section

# A micro-batch of at most this many tokens shows the floor; of at least LARGE, the slope
# (the same regimes as analyzers/pipeline.py's cost model).
SMALL_TOKENS, LARGE_TOKENS = 8, 64
OVERLAPPED = 0.5  # a span is "overlapped" when another stage computed ≥ half its time
MIN_SPANS = 2  # per side (overlapped, alone), over all stages, to measure k
HEADROOM = 0.1  # stages filling ≥ 90 % of the free cores leave none for anything else


class Contention(NamedTuple):
    k: float  # a stage's compute overlapped / alone (≥ 1)
    model: str  # measured, cores, cuda, assumed
    blocked: bool = False  # the stages need more cores than the host had free
    spans: tuple[int, int] = (0, 0)  # measured: (overlapped, alone) spans it rests on
    need_cores: float = float("nan")  # cores: p × a stage's cores
    cores: int | None = None  # cores: the host's logical cores
    others_cores: float = 0.0  # cores: what other processes used (sampler; 0 unknown)

    def describe(self, stages: int) -> str:
        """One sentence: the model used and its k."""
        if self.model == "measured":
            n_over, n_alone = self.spans
            return (f"overlapped stages computed ×{self.k:.2f} as long as alone (measured "
                    f"over {n_over} overlapped and {n_alone} lone compute spans)")  # fmt: skip
        if self.model == "cuda":
            return ("each stage has a GPU of its own: overlapped stages taken as fast as "
                    "alone (k = 1)")  # fmt: skip
        if self.model == "assumed":
            return ("neither overlap nor CPU time recorded: a core per stage assumed, "
                    "overlapped stages as fast as alone (k = 1)")  # fmt: skip
        free = (self.cores or 0) - self.others_cores
        host = (f"{self.cores} cores" + (f", {self.others_cores:.1f} of them used by other "
                f"processes" if self.others_cores >= 0.05 else ""))  # fmt: skip
        if self.blocked:
            return (f"no overlap to measure (1 micro-batch: the stages alternate); the "
                    f"{stages} stages keep {self.need_cores:.1f} cores busy while computing "
                    f"and the host has {host}: overlapped they would fill the "
                    f"{free:.1f} free and share them with everything else")  # fmt: skip
        return (f"no overlap to measure; the {stages} stages keep {self.need_cores:.1f} "
                f"cores busy while computing and the host has {host}: cores enough for "
                f"each, overlapped stages taken as fast as alone (k = 1)")  # fmt: skip


def overlap_fraction(comp: pd.DataFrame) -> np.ndarray:
    """Per compute span (kind compute: stage, start_ns, end_ns), the share of its time at
    least one other stage was computing."""
    start = comp["start_ns"].to_numpy(np.float64)
    end = comp["end_ns"].to_numpy(np.float64)
    stage = comp["stage"].to_numpy(np.int64)
    out = np.zeros(len(comp))
    for s in np.unique(stage):
        mine, other = stage == s, stage != s
        if not other.any():
            continue
        lo, hi = _union(start[other], end[other])
        a, b = start[mine], end[mine]
        busy = _covered(lo, hi, b) - _covered(lo, hi, a)
        out[mine] = np.where(b > a, busy / np.maximum(b - a, 1.0), 0.0)
    return out


def _union(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Intervals as disjoint sorted ones (more than one other stage may compute at once)."""
    order = np.argsort(start, kind="stable")
    merged: list[list[float]] = []
    for a, b in zip(start[order], end[order], strict=True):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    arr = np.array(merged, dtype=np.float64).reshape(-1, 2)
    return arr[:, 0], arr[:, 1]


def _covered(lo: np.ndarray, hi: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Time inside the disjoint sorted intervals [lo, hi) before each t."""
    before = np.concatenate([[0.0], np.cumsum(hi - lo)])
    at = np.searchsorted(lo, t, side="right") - 1
    i = np.maximum(at, 0)
    return np.where(at >= 0, before[i] + np.minimum(t - lo[i], hi[i] - lo[i]), 0.0)


def measured(comp: pd.DataFrame, f: np.ndarray) -> Contention | None:
    """k from the run's compute spans and their overlap `f`; None without enough of both
    overlapped and lone spans."""
    dur = (comp["end_ns"] - comp["start_ns"]).to_numpy(np.float64)
    tokens = comp["tokens"].to_numpy(np.float64)
    stage = comp["stage"].to_numpy(np.int64)
    over = f >= OVERLAPPED
    ratios, weights, n_over, n_alone = [], [], 0, 0
    large, small = tokens >= LARGE_TOKENS, (tokens <= SMALL_TOKENS) & (tokens > 0)
    for regime, units in ((large, tokens), (small, np.ones(len(dur)))):
        for s in np.unique(stage):
            o, a = regime & (stage == s) & over, regime & (stage == s) & ~over
            if not o.any() or not a.any():
                continue
            per_alone = dur[a].sum() / units[a].sum()
            if per_alone > 0:
                ratios.append(dur[o].sum() / units[o].sum() / per_alone)
                weights.append(dur[o].sum())
                n_over, n_alone = n_over + int(o.sum()), n_alone + int(a.sum())
    if n_over < MIN_SPANS or n_alone < MIN_SPANS:
        return None
    k = float(np.average(ratios, weights=weights))
    return Contention(max(k, 1.0), "measured", spans=(n_over, n_alone))


def contention(
    run, comp: pd.DataFrame, f: np.ndarray, spans: pd.DataFrame, stages: int
) -> Contention:
    """The run's contention factor (the module's docstring has the models)."""
    got = measured(comp, f)
    if got is not None:
        return got
    config = run.manifest.config
    device = str(section(config, "engine_config").get("device")
                 or section(config, "run_options", "engine").get("device") or "cpu")  # fmt: skip
    if device.startswith("cuda"):
        return Contention(1.0, "cuda")
    stage_cores = _stage_cores(run, spans)
    cores, others = _host_cores(run)
    if stage_cores is None or cores is None:
        return Contention(1.0, "assumed")
    need = stages * stage_cores
    blocked = need >= (1.0 - HEADROOM) * (cores - others)
    return Contention(1.0, "cores", blocked, need_cores=need, cores=cores, others_cores=others)


def _stage_cores(run, spans: pd.DataFrame) -> float | None:
    """Rank 0's CPU time per second of its step not spent waiting for the last stage:
    the 90th percentile over steps (unimpeded; contention only lowers it)."""
    st = run.steps
    if not len(st) or not {"cpu_time_ns", "start_ns", "end_ns"} <= set(st.columns):
        return None
    st = st[st["cpu_time_ns"].notna().to_numpy()]
    if "rank" in st and st["rank"].notna().any():
        st = st[st["rank"].fillna(0).to_numpy() == 0]
    out = spans[(spans["kind"] == "recv_out").to_numpy() & (spans["stage"] == 0).to_numpy()]
    waited = (out["end_ns"] - out["start_ns"]).groupby(out["step_id"]).sum()
    wall = (st["end_ns"] - st["start_ns"]).to_numpy(np.float64)
    active = wall - waited.reindex(st["step_id"]).fillna(0).to_numpy(np.float64)
    cpu = st["cpu_time_ns"].to_numpy(np.float64)
    ratio = cpu[active > 0] / active[active > 0]
    return float(np.percentile(ratio, 90)) if len(ratio) and ratio.max() > 0 else None


def _host_cores(run) -> tuple[int | None, float]:
    """(logical cores, mean cores other processes used): the sampler's, else the
    manifest's cores and 0 for the others (not recorded)."""
    from .host import _samples

    counters = getattr(run, "counters", None)
    if counters is not None and len(counters):
        s = _samples(run)
        if s.cores:
            others = float(s.others.mean()) if s.others is not None and len(s.others) else 0.0
            return int(s.cores), others
    env = getattr(run.manifest, "environment", None)
    n = env.get("cpu_count") if isinstance(env, dict) else getattr(env, "cpu_count", None)
    return (int(n), 0.0) if n else (None, 0.0)


def isolated_ns(comp: pd.DataFrame, f: np.ndarray, k: float) -> np.ndarray:
    """Each compute span's duration as the stage alone would have taken it: its lone part
    plus its overlapped part / k."""
    dur = (comp["end_ns"] - comp["start_ns"]).to_numpy(np.float64)
    return dur * (1.0 - f + f / k)


def makespan(costs: list[float], stages: int, k: float) -> float:
    """The window of one step's micro-batches costing `costs` alone on every stage, each
    stage at 1/k of its speed while another computes (the module's docstring)."""
    m = len(costs)
    done = [0] * stages  # micro-batches each stage has finished
    left: list[float | None] = [None] * stages  # work left of the one it runs
    t = 0.0
    while done[-1] < m:
        for s in range(stages):
            if left[s] is None and done[s] < m and (s == 0 or done[s - 1] > done[s]):
                left[s] = float(costs[done[s]])
        active = [s for s in range(stages) if left[s] is not None]
        work = min(left[s] for s in active)
        t += work * (k if len(active) > 1 else 1.0)
        for s in active:
            left[s] -= work
            if left[s] <= 1e-12 * max(work, 1.0):
                left[s], done[s] = None, done[s] + 1
    return t

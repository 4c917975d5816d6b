"""The engine's step timeline as arrays, for critical paths over steps.

Steps of one engine run one after another, so "how much of [a, b] did steps occupy" is
the difference of one cumulative function: `busy(b) - busy(a)`, a binary search per
query. Everything on the path that no step covers is host/scheduler time between steps.

Where a step's work is shared (prefill chunks and decodes in one batch), its duration is
split by the run's step cost model (step_cost.py) into the fixed cost of a step, its
prefill tokens at their marginal cost, its decodes, and — for inflated steps only — the
residual no batch explains (`StepParts`). Without a model (too few steps) a step splits
in proportion to token counts and has no fixed cost or residual.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..traces.reader import Run
from .intervals import union
from .jit_compile import compiled_step_ids
from .replicas import busiest_replica


@dataclass(frozen=True)
class WorkWeights:
    prefill_weight: float = 1.0  # per prefill token
    decode_weight: float = 1.0  # per decoding sequence


@dataclass(frozen=True)
class StepTimeline:
    step_id: np.ndarray  # int64, in time order
    start: np.ndarray  # float64 ns relative to the lifecycle's origin
    end: np.ndarray
    sample_start: np.ndarray  # when sampling began (host-timed runs); NaN: unknown
    prefill_tokens: np.ndarray
    decode_seqs: np.ndarray
    prefill_seqs: np.ndarray
    context_tokens: np.ndarray
    in_system: np.ndarray  # running + waiting + swapped after scheduling (NaN: unknown)
    waiting: np.ndarray
    cum: np.ndarray  # busy time of all steps before each step
    rank: int | None  # the rank kept when several recorded steps
    origin_ns: int = 0  # the clock value that times here are relative to
    replica: int | None = None  # data parallelism: the replica whose steps these are
    # Steps that JIT-compiled a kernel (jit_compile.py); None: the run cannot say.
    compiled: np.ndarray | None = None

    @classmethod
    def from_run(cls, run: Run, origin_ns: int) -> StepTimeline | None:
        steps = run.steps
        if len(steps) == 0:
            return None
        rank = None
        ranks = steps["rank"].dropna().unique()
        if len(ranks) > 1:  # ranks run concurrently: follow the lowest one's timeline
            rank = int(min(ranks))
            steps = steps[steps["rank"].eq(rank).fillna(False).to_numpy()]
        # Replicas step side by side: follow the busiest one's (replicas.py).
        replica = busiest_replica(steps)
        if replica is not None:
            steps = steps[steps["replica"].eq(replica).fillna(False).to_numpy()]
        steps = steps.drop_duplicates("step_id").sort_values("start_ns", kind="stable")
        start = (steps["start_ns"].to_numpy(np.int64) - origin_ns).astype(np.float64)
        end = (steps["end_ns"].to_numpy(np.int64) - origin_ns).astype(np.float64)
        end = np.maximum(end, start)
        end[:-1] = np.minimum(end[:-1], start[1:])  # defensive: never count overlap twice
        dur = end - start
        cum = np.concatenate(([0.0], np.cumsum(dur)[:-1]))
        ids = steps["step_id"].to_numpy(np.int64)
        host_timed = steps["gpu_time_ns"].isna().all()
        sample = _sample_starts(run, ids, origin_ns, rank) if host_timed else None
        compiled = compiled_step_ids(run.spans)
        return cls(
            step_id=ids,
            start=start,
            end=end,
            sample_start=np.full(len(ids), np.nan) if sample is None else sample,
            prefill_tokens=steps["num_prefill_tokens"].to_numpy(np.float64),
            decode_seqs=steps["num_decode_seqs"].to_numpy(np.float64),
            prefill_seqs=steps["num_prefill_seqs"].to_numpy(np.float64),
            context_tokens=steps["num_context_tokens"].to_numpy(np.float64),
            in_system=_counts(steps, ("num_running", "num_waiting", "num_swapped")),
            waiting=_counts(steps, ("num_waiting",)),
            cum=cum,
            rank=rank,
            origin_ns=origin_ns,
            replica=replica,
            compiled=None if compiled is None else np.isin(ids, compiled),
        )

    def __len__(self) -> int:
        return len(self.step_id)

    def index_of(self, step_ids: np.ndarray) -> np.ndarray:
        """Positions of `step_ids` (float, NaN allowed) in the timeline; -1 if unknown."""
        ids = np.asarray(step_ids, dtype=np.float64)
        known = ~np.isnan(ids)
        pos = pd.Index(self.step_id).get_indexer(ids[known].astype(np.int64))
        out = np.full(len(ids), -1, dtype=np.int64)
        out[known] = pos
        return out

    def busy(self, t: np.ndarray) -> np.ndarray:
        """Step time in [-inf, t] for each t (NaN stays NaN)."""
        t = np.asarray(t, dtype=np.float64)
        i = np.searchsorted(self.start, np.nan_to_num(t, nan=-np.inf), side="right") - 1
        safe = np.clip(i, 0, len(self.start) - 1)
        partial = np.clip(t - self.start[safe], 0.0, self.end[safe] - self.start[safe])
        out = np.where(i >= 0, self.cum[safe] + partial, 0.0)
        return np.where(np.isnan(t), np.nan, out)

    def busy_between(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.maximum(self.busy(b) - self.busy(a), 0.0)

    def busy_share(self) -> float:
        """Step time over the steps' span: how loaded the engine was (NaN: no span)."""
        if not len(self.start):
            return float("nan")
        span = float(self.end[-1] - self.start[0])
        return float(self.busy(self.end[-1:])[0] / span) if span > 0 else float("nan")

    def prefill_share(self, pos: np.ndarray, weights: WorkWeights) -> np.ndarray:
        """Fraction of the work of the steps at `pos` that was prefill (NaN for -1)."""
        p = self.prefill_tokens[pos] * weights.prefill_weight
        d = self.decode_seqs[pos] * weights.decode_weight
        total = p + d
        share = np.divide(p, total, out=np.zeros(len(pos)), where=total > 0)
        return np.where(pos >= 0, share, np.nan)


@dataclass(frozen=True)
class StepParts:
    """Each step's time (ns) split into fixed cost, prefill work, decode work and
    residual (parts add up to the step's duration), with cumulative sums so that the
    parts inside any window [a, b] cost two binary searches."""

    timeline: StepTimeline
    fixed: np.ndarray
    prefill: np.ndarray
    decode: np.ndarray
    residual: np.ndarray
    # Of `prefill`: what the prompts' chunks cost beyond their tokens (the cost model's
    # per-chunk term), paid once per chunk; zeros without a model.
    chunk: np.ndarray

    NAMES = ("fixed", "prefill", "decode", "residual")

    @classmethod
    def from_model(cls, timeline: StepTimeline, model) -> StepParts:
        """From a fitted StepCostModel (its per_step table, in timeline order), or by
        token counts when `model` is None."""
        if model is None:
            return cls.by_weights(timeline, WorkWeights())
        dur = timeline.end - timeline.start
        ps = model.per_step
        parts = [ps[f"{n}_s"].to_numpy(np.float64) * 1e9 for n in ("fixed", "prefill", "decode",
                                                                   "residual")]  # fmt: skip
        total = sum(parts)
        # The model's parts add up to the measured step; the timeline may have trimmed an
        # overlap (end clipped to the next start): scale to the timeline's duration.
        k = np.divide(dur, total, out=np.zeros(len(dur)), where=total > 0)
        chunk = ps["chunk_s"].to_numpy(np.float64) * 1e9 * k
        return cls(timeline, *(p * k for p in parts), chunk)

    @classmethod
    def by_weights(cls, timeline: StepTimeline, weights: WorkWeights) -> StepParts:
        """Each step split between prefill and decode in proportion to its work, with no
        fixed cost and no residual."""
        dur = timeline.end - timeline.start
        share = timeline.prefill_share(np.arange(len(timeline)), weights)
        zero = np.zeros(len(dur))
        return cls(timeline, zero, dur * share, dur * (1 - share), zero.copy(), zero.copy())

    def __post_init__(self) -> None:
        for name in self.NAMES:
            cum = np.concatenate(([0.0], np.cumsum(getattr(self, name))))
            object.__setattr__(self, f"_cum_{name}", cum)

    def between(self, a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
        """Each part's time inside [a, b] (steps cut by a window count pro rata)."""
        return {n: np.maximum(self._at(n, b) - self._at(n, a), 0.0) for n in self.NAMES}

    def _at(self, name: str, t: np.ndarray) -> np.ndarray:
        tl = self.timeline
        t = np.asarray(t, dtype=np.float64)
        i = np.searchsorted(tl.start, np.nan_to_num(t, nan=-np.inf), side="right") - 1
        safe = np.clip(i, 0, len(tl.start) - 1)
        dur = tl.end[safe] - tl.start[safe]
        frac = np.divide(np.clip(t - tl.start[safe], 0.0, dur), dur, out=np.zeros(len(safe)),
                         where=dur > 0)  # fmt: skip
        part = getattr(self, name)
        cum = getattr(self, f"_cum_{name}")
        out = np.where(i >= 0, cum[safe] + frac * part[safe], 0.0)
        return np.where(np.isnan(t), np.nan, out)

    def of(self, pos: np.ndarray) -> dict[str, np.ndarray]:
        """The parts of the steps at `pos` (positions in the timeline, all valid)."""
        return {n: getattr(self, n)[pos] for n in self.NAMES}


class Stalls:
    """Intervals in which a probe held the engine (profiler start/stop, …), in ns relative
    to the lifecycle's origin: how much of any window [a, b] they cover (intervals.py
    does the union and the coverage; NaN windows cover nothing)."""

    def __init__(self, start: np.ndarray, end: np.ndarray):
        u = union(np.rint(start), np.rint(end))
        self._cover = u.coverage()
        self.total = float(u.total_ns)

    def between(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        ok = np.isfinite(a) & np.isfinite(b)
        out = np.zeros(np.broadcast(a, b).shape)
        if ok.any() and self.total > 0:
            lo, hi = (
                np.rint(np.broadcast_to(a, out.shape)[ok]),
                np.rint(np.broadcast_to(b, out.shape)[ok]),
            )
            out[ok] = np.maximum(self._cover.between(lo, hi), 0)
        return out


NO_STALLS = Stalls(np.zeros(0), np.zeros(0))


def _sample_starts(run: Run, ids: np.ndarray, origin_ns: int, rank: int | None):
    """Start of each step's `sample` phase. Only on host-timed runs: on a GPU the
    forward phase ends at launch and `sample` absorbs the wait for the device."""
    spans = run.spans
    if len(spans) == 0:
        return None
    sel = (spans["category"] == "phase").to_numpy() & (spans["name"] == "sample").to_numpy()
    sel &= spans["step_id"].notna().to_numpy()
    if rank is not None:
        sel &= spans["rank"].eq(rank).fillna(False).to_numpy()
    if not sel.any():
        return None
    phase = spans[sel]
    out = np.full(len(ids), np.nan)
    pos = pd.Index(ids).get_indexer(phase["step_id"].to_numpy(np.int64))
    found = pos >= 0
    out[pos[found]] = (phase["start_ns"].to_numpy(np.int64)[found] - origin_ns).astype(np.float64)
    return out


def _counts(steps: pd.DataFrame, columns) -> np.ndarray:
    """Sum of queue-depth columns; a null swapped count is 0, a null other is unknown."""
    out = np.zeros(len(steps))
    for col in columns:
        v = steps[col].to_numpy(dtype=np.float64, na_value=np.nan)
        out += np.nan_to_num(v) if col == "num_swapped" else v
    return out

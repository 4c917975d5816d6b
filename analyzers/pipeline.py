"""Pipeline parallelism: bubbles, stage imbalance and transfers, from every stage's spans.

The engine (engine_ref/pipeline.py) records per step, stage and micro-batch a `pp_compute`
span (its layers) and `pp_send` / `pp_recv` spans (comm; `pp_recv_out`: rank 0 taking the
last stage's hidden states back), all on rank 0's clock, args {"microbatch", "tokens"}.

Definitions (per step, then summed over steps):
- the window W: from stage 0's first compute to the end of the step's last pipeline span
  (rank 0 holding the last hidden states);
- the measured bubble fraction: 1 − Σ_stages compute / (p · W), the stage-time not spent
  computing (fill and drain, waiting on a slower stage, and transfers);
- the expected bubble: (p − 1)/(m + p − 1) for p stages of equal cost and m micro-batches
  (GPipe's fill and drain, transfers free); the gap to the measured one is imbalance and
  transfer, reported apart;
- transfer: a receive's time after its send began (recv end − max(recv start, send
  start)), the rest of the receive being a wait for the previous stage; the transfer share
  is Σ transfer / (p · W);
- imbalance: a stage's compute against the mean stage's (`imbalance` = max / mean − 1).

Advice (for playbooks/facts_pipeline.py): the micro-batch count with the shortest predicted
pipelined time over the run's own steps. Each step's requests (decodes of 1 token, its
prefill tokens shared among its prefills, from the steps table) are cut into m
micro-batches of whole requests as the engine cuts them; a micro-batch of n tokens costs
the slowest stage c(n) = max(a, b·n) — at least a (its small micro-batches' median:
reading the stage's weights, per-call overheads), b per token once its tokens outweigh
that (its large micro-batches' median per token: a roofline's two regimes) — and the
step takes GPipe's window with equal stages plus p·h (h the median exposed transfer per
hop): Σ c + (p − 1)·max c when overlapped stages compute as fast as alone, else with the
overlapped part slowed by the contention factor k (analyzers/pipeline_overlap.py: measured
from the run's spans, or from the cores the stages need; a and b are fitted on the spans'
durations as a stage alone would have taken them). More micro-batches shrink the fill and
drain but, once a micro-batch drops to the floor a or one request fills it, only add
floors and hops, and with k > 1 slow every overlapped stage. The layer move
that best evens the stages (each stage's per-layer cost measured as its compute / its
layers) and its predicted forward time.

Pure pandas over a run; no torch.
"""

from __future__ import annotations

import itertools
import json
from typing import NamedTuple

import numpy as np
import pandas as pd

from . import pipeline_overlap as overlap
from .pipeline_overlap import LARGE_TOKENS, SMALL_TOKENS, Contention
from .run_config import section

STAGE_COLUMNS = ["stage", "layers", "compute_ns", "share", "per_layer_ns", "recv_wait_ns",
                 "transfer_ns", "bytes"]  # fmt: skip


class PipelineSummary(NamedTuple):
    stages: int
    microbatches: float  # median micro-batches per step (fewer than asked when requests are)
    microbatches_asked: int
    steps: int
    window_ns: int  # Σ W
    bubble: float  # measured
    expected_bubble: float  # (p − 1)/(m + p − 1) at the median m
    transfer_share: float
    imbalance: float  # slowest stage's compute / mean − 1
    slowest_stage: int
    per_stage: pd.DataFrame  # STAGE_COLUMNS
    median_requests: float  # requests per step (the most micro-batches a step can hold)
    mb_fixed_ns: float = 0.0  # a: the slowest stage's floor per micro-batch
    ns_per_token: float = 0.0  # b: its time per token above the floor
    hop_ns: float = 0.0  # h: median exposed transfer of one hop
    tokens_per_step: float = 0.0  # T (median)
    step_requests: tuple = ()  # per step, each request's tokens (from the steps table)
    contention: Contention = Contention(1.0, "assumed")  # overlapped stages' slowdown k
    steps_ns: int = 0  # Σ step wall time (the steps table; 0: not recorded)


def pipeline_spans(run) -> pd.DataFrame:
    """The pp_* spans with their micro-batch and tokens (empty when the run has none)."""
    sp = run.spans
    if not len(sp):
        return pd.DataFrame()
    sel = sp["name"].astype(str).str.startswith("pp_").to_numpy() & sp["rank"].notna().to_numpy()
    sp = sp[sel & sp["step_id"].notna().to_numpy()]
    if not len(sp):
        return pd.DataFrame()
    args = [json.loads(a) if isinstance(a, str) else {} for a in sp["args"]]
    return pd.DataFrame(
        {
            "kind": sp["name"].astype(str).str[3:].to_numpy(),
            "stage": sp["rank"].to_numpy(np.int64),
            "step_id": sp["step_id"].to_numpy(np.int64),
            "microbatch": np.array([a.get("microbatch", 0) for a in args], dtype=np.int64),
            "tokens": np.array([a.get("tokens", 0) for a in args], dtype=np.int64),
            "start_ns": sp["start_ns"].to_numpy(np.int64),
            "end_ns": (sp["start_ns"] + sp["dur_ns"]).to_numpy(np.int64),
            "bytes": sp["bytes"].fillna(0).to_numpy(np.int64),
        }
    )


def stage_layers(run, stages: int) -> list[list[int]]:
    """[first, stop) layers of each stage, from the manifest (even split if unrecorded)."""
    par = section(run.manifest.config, "parallel")
    got = par.get("stage_layers")
    if got and len(got) == stages:
        return [list(r) for r in got]
    layers = int(section(run.manifest.config, "engine_config", "model").get("num_layers", stages))
    out, first = [], 0
    for s in range(stages):
        n = layers // stages + (s < layers % stages)
        out.append([first, first + n])
        first += n
    return out


def _transfers(df: pd.DataFrame, stages: int) -> pd.DataFrame:
    """Each receive's wait and transfer (against the matching send's start)."""
    recv = df[df["kind"].isin(["recv", "recv_out"]).to_numpy()].copy()
    send = df[(df["kind"] == "send").to_numpy()]
    # the sender of a stage's recv is the previous stage; of rank 0's recv_out, the last
    src = np.where(recv["kind"] == "recv_out", stages - 1, recv["stage"] - 1)
    recv["src"] = src
    send_start = send.set_index(["stage", "step_id", "microbatch"])["start_ns"]
    send_start = send_start[~send_start.index.duplicated()]
    key = pd.MultiIndex.from_arrays([recv["src"], recv["step_id"], recv["microbatch"]])
    began = send_start.reindex(key).to_numpy(dtype=np.float64)
    began = np.where(np.isnan(began), recv["start_ns"].to_numpy(np.float64), began)
    moved_from = np.maximum(recv["start_ns"].to_numpy(np.float64), began)
    recv["transfer_ns"] = np.maximum(recv["end_ns"].to_numpy(np.float64) - moved_from, 0)
    recv["wait_ns"] = (recv["end_ns"] - recv["start_ns"]).to_numpy(np.float64) - recv[
        "transfer_ns"
    ].to_numpy(np.float64)
    return recv


def expected_bubble(stages: int, microbatches: float) -> float:
    return (stages - 1) / (microbatches + stages - 1) if microbatches > 0 else 1.0


def summarize(run) -> PipelineSummary | None:
    """The run's pipeline figures; None without pipeline spans."""
    df = pipeline_spans(run)
    if not len(df):
        return None
    par = section(run.manifest.config, "parallel")
    p = int(par.get("pipeline_parallel_size") or df["stage"].max() + 1)
    asked = int(par.get("pipeline_microbatches") or p)
    comp = df[(df["kind"] == "compute").to_numpy()]
    steps = df.groupby("step_id").agg(first=("start_ns", "min"), last=("end_ns", "max"))
    c0 = comp[(comp["stage"] == 0).to_numpy()].groupby("step_id")["start_ns"].min()
    first = c0.reindex(steps.index).fillna(steps["first"]).to_numpy(np.int64)
    window = int(np.maximum(steps["last"].to_numpy(np.int64) - first, 0).sum())
    mbs = comp.groupby("step_id")["microbatch"].nunique()
    m = float(mbs.median())
    by_stage = (comp["end_ns"] - comp["start_ns"]).groupby(comp["stage"]).sum()
    by_stage = by_stage.reindex(range(p), fill_value=0).astype(np.int64)
    rx = _transfers(df, p)
    transfer = float(rx["transfer_ns"].sum())
    layers = stage_layers(run, p)
    nl = np.array([b - a for a, b in layers], dtype=np.float64)
    total = float(by_stage.sum())
    mean = total / p if p else 0.0
    recv_stage = rx[rx["kind"] == "recv"].groupby("stage")
    per = pd.DataFrame(
        {
            "stage": np.arange(p),
            "layers": nl.astype(np.int64),
            "compute_ns": by_stage.to_numpy(),
            "share": by_stage.to_numpy() / total if total else np.zeros(p),
            "per_layer_ns": by_stage.to_numpy() / np.maximum(nl, 1),
            "recv_wait_ns": recv_stage["wait_ns"].sum().reindex(range(p), fill_value=0.0)
            .to_numpy(),
            "transfer_ns": recv_stage["transfer_ns"].sum().reindex(range(p), fill_value=0.0)
            .to_numpy(),
            "bytes": df[(df["kind"] == "send").to_numpy()].groupby("stage")["bytes"].sum()
            .reindex(range(p), fill_value=0).to_numpy(np.int64),
        }
    )  # fmt: skip
    slowest = int(by_stage.to_numpy().argmax())
    reqs = comp[(comp["stage"] == 0).to_numpy()].groupby("step_id")["microbatch"].count()
    f = overlap.overlap_fraction(comp)
    cont = overlap.contention(run, comp, f, df, p)
    alone = comp.assign(end_ns=comp["start_ns"] + overlap.isolated_ns(comp, f, cont.k))
    a, b = _microbatch_cost(alone[(alone["stage"] == slowest).to_numpy()])
    tokens = comp[(comp["stage"] == 0).to_numpy()].groupby("step_id")["tokens"].sum()
    return PipelineSummary(
        stages=p,
        microbatches=m,
        microbatches_asked=asked,
        steps=len(steps),
        window_ns=window,
        bubble=1.0 - total / (p * window) if window else 0.0,
        expected_bubble=expected_bubble(p, m),
        transfer_share=transfer / (p * window) if window else 0.0,
        imbalance=float(by_stage.max() / mean - 1.0) if mean else 0.0,
        slowest_stage=slowest,
        per_stage=per,
        median_requests=float(_requests_per_step(run, reqs)),
        mb_fixed_ns=a,
        ns_per_token=b,
        hop_ns=float(rx["transfer_ns"].median()) if len(rx) else 0.0,
        tokens_per_step=float(tokens.median()) if len(tokens) else 0.0,
        step_requests=_step_requests(run, tokens),
        contention=cont,
        steps_ns=_steps_ns(run),
    )


def _steps_ns(run) -> int:
    st = run.steps
    if not len(st) or not {"start_ns", "end_ns"} <= set(st.columns):
        return 0
    return int((st["end_ns"] - st["start_ns"]).clip(lower=0).sum())


def _step_requests(run, tokens: pd.Series) -> tuple:
    """Each step's requests as token counts: its decodes 1 each, its prefill tokens shared
    evenly among its prefills (the steps table); without one, each step as one request."""
    st = run.steps
    cols = {"num_prefill_seqs", "num_prefill_tokens", "num_decode_seqs"}
    if not len(st) or not cols <= set(st.columns):
        return tuple((int(t),) for t in tokens)
    out = []
    for np_, pt, nd in zip(st["num_prefill_seqs"], st["num_prefill_tokens"],
                           st["num_decode_seqs"], strict=True):  # fmt: skip
        np_, pt, nd = int(np_), int(pt), int(nd)
        pre = [pt // np_ + (i < pt % np_) for i in range(np_)] if np_ else []
        out.append(tuple([1] * nd + pre))
    return tuple(out)


def split_sizes(sizes: tuple, m: int) -> list[int]:
    """Tokens per micro-batch when requests of `sizes` tokens are cut into at most m runs
    of whole requests where the cumulative tokens cross k/m of the total (the engine's
    pipeline_split.split_plan rule)."""
    m = max(1, min(m, len(sizes)))
    total = sum(sizes)
    cuts, seen, k = [0], 0, 1
    for i, n in enumerate(sizes):
        if k < m and i > cuts[-1] and (seen * m >= k * total or len(sizes) - i == m - k):
            cuts.append(i)
            k += 1
        seen += n
    cuts.append(len(sizes))
    return [sum(sizes[a:b]) for a, b in itertools.pairwise(cuts)]


def _microbatch_cost(comp: pd.DataFrame) -> tuple[float, float]:
    """(floor ns per micro-batch, ns per token above it) of one stage, from its compute
    spans: the floor is its small micro-batches' median time (0 without any), the slope its
    large ones' median time per token (without any, all its time per token)."""
    x = comp["tokens"].to_numpy(np.float64)
    y = (comp["end_ns"] - comp["start_ns"]).to_numpy(np.float64)
    if not len(x) or x.mean() <= 0:
        return 0.0, 0.0
    small, large = x <= SMALL_TOKENS, x >= LARGE_TOKENS
    a = float(np.median(y[small])) if small.any() else 0.0
    b = float(np.median(y[large] / x[large])) if large.any() else float(y.sum() / x.sum())
    return a, b


def predicted_window(s: PipelineSummary, m: int) -> float:
    """The pipelined time of the run's steps cut into m micro-batches (the module's
    docstring has the model)."""
    total, seen = 0.0, {}
    for sizes in s.step_requests:
        if not sizes:
            continue
        if sizes not in seen:  # decode steps repeat
            c = [max(s.mb_fixed_ns, s.ns_per_token * n) for n in split_sizes(sizes, m)]
            seen[sizes] = overlap.makespan(c, s.stages, s.contention.k) + s.stages * s.hop_ns
        total += seen[sizes]
    return total


def _requests_per_step(run, fallback: pd.Series) -> float:
    st = run.steps
    if len(st) and {"num_prefill_seqs", "num_decode_seqs"} <= set(st.columns):
        return float((st["num_prefill_seqs"] + st["num_decode_seqs"]).median())
    return float(fallback.max()) if len(fallback) else 0.0


class MicrobatchAdvice(NamedTuple):
    microbatches: int
    expected_bubble: float
    forward_ratio: float  # predicted window then / at the run's micro-batches


# Of micro-batch counts predicted within this of the shortest window, the fewest is advised.
_WITHIN = 0.05


def microbatch_advice(s: PipelineSummary) -> MicrobatchAdvice:
    """The fewest micro-batches (no more than a step's requests: a micro-batch holds whole
    requests) whose predicted window is within 5 % of the shortest, and what it predicts."""
    cap = max(int(s.median_requests), 1)
    now = max(round(s.microbatches), 1)
    if s.contention.blocked:  # the stages would share cores: no count is priced to pay
        return MicrobatchAdvice(now, expected_bubble(s.stages, now), 1.0)
    w = {m: predicted_window(s, m) for m in range(1, max(cap, now) + 1)}
    if w[now] <= 0:
        return MicrobatchAdvice(now, expected_bubble(s.stages, now), 1.0)
    best = min(w[m] for m in range(1, cap + 1))
    m_new = min(m for m in range(1, cap + 1) if w[m] <= best * (1 + _WITHIN))
    return MicrobatchAdvice(m_new, expected_bubble(s.stages, m_new), w[m_new] / w[now])


class LayerMove(NamedTuple):
    from_stage: int
    to_stage: int
    layers: list[int]  # the layers to move
    new_split: list[int]  # layers per stage after the move
    forward_ratio: float  # predicted slowest stage's compute / now


def layer_move(s: PipelineSummary, layers: list[list[int]]) -> LayerMove | None:
    """The move of boundary layers from the slowest stage to a neighbour that most lowers
    the slowest stage's compute (per-layer costs measured per stage); None if none helps."""
    comp = s.per_stage["compute_ns"].to_numpy(np.float64)
    per = s.per_stage["per_layer_ns"].to_numpy(np.float64)
    n = s.per_stage["layers"].to_numpy(np.int64)
    src = s.slowest_stage
    best = None
    for dst in (src - 1, src + 1):
        if not 0 <= dst < s.stages:
            continue
        for k in range(1, int(n[src])):
            new = comp.copy()
            new[src] -= k * per[src]
            new[dst] += k * per[src]  # the moved layers keep their cost
            ratio = new.max() / comp.max()
            if ratio < 0.99 and (best is None or ratio < best[0]):
                best = (ratio, dst, k)
    if best is None:
        return None
    ratio, dst, k = best
    a, b = layers[src]
    moved = list(range(a, a + k)) if dst < src else list(range(b - k, b))
    split = [int(x) for x in n]
    split[src] -= k
    split[dst] += k
    return LayerMove(src, dst, moved, split, float(ratio))

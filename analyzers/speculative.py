"""Speculative decoding: how many drafts the target accepted, what a step with drafting and
verification cost against the tokens it gained, and the K the measured acceptance favours.

What the engine records (issue 38's format): per verified request per step, counters
`spec_drafted`, `spec_accepted`, `spec_emitted` scoped by request id at the step's start
(`ts_ns` = the step's `start_ns`); a `draft` phase span per step in which the proposer ran,
after which `forward` is the target's verify forward and `sample` the rejection sampling.
Accepted n of k drafted means positions 0..n-1 accepted and position n (n < k) rejected.

The model (Leviathan et al., 2023): with each draft token accepted independently with
probability α, a verify of K drafts yields E = (1 − α^(K+1)) / (1 − α) tokens per target
forward, and costs 1 + K·c target forwards, c the cost of one draft position over one
target forward: expected speedup E / (1 + K·c). Its assumptions: acceptance i.i.d. over
positions (real acceptance falls with the position: see `by_position`), and a verify
forward of K+1 tokens that costs one plain forward (true where the weights' read
dominates, as on a GPU at small batch; on a CPU a verify costs more per token verified).
For the n-gram proposer c is host time per draft position, not a model's forward.

Here α for the model is the per-position maximum-likelihood estimate (accepted positions
over tried ones: accepted plus rejections); `acceptance` is accepted / drafted, what vLLM
reports, lower when drafts are long, since positions after a rejection count as drafted.
c is measured from the `draft` phase; the plain forward it is measured against is, in
order: a baseline run without speculation (the same load), a fit of this run's verify
forwards on their batch and drafted tokens (when the drafted tokens vary apart from the
batch; what the verify path costs beyond a plain decode at zero drafts is then counted as
plain, so the speedup is an upper bound: on the tiny preset on a 2-core CPU, ngram:4 read
1.24× this way and 0.38× against a baseline run, its verify forward 2.17 ms against a
plain decode's 0.54 ms), or the verify forward itself (Leviathan's assumption, said so).
Where the verify forward is measured to cost more than a plain one, its extra per draft
position (v) joins the prediction: speedup(K) = E(K) · (1 + o) / (1 + o + K·(c + v)), o the
step's other host work over a plain forward; without it (v = 0, o = 0) this is Leviathan's
formula.

Pure pandas over a run; no torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .run_config import section

COUNTERS = ("spec_drafted", "spec_accepted", "spec_emitted")
VERIFY_COLUMNS = ["step_id", "request_id", "drafted", "accepted", "emitted"]
MAX_K = 16  # the engine's bound on K (engine_ref/speculative/spec_config.py)
MIN_FIT_STEPS = 8  # fewer steps and a three-term least-squares fit is noise
DRAFT_PHASE = "draft"
VERIFY_PHASES = ("forward", "sample")


def has_speculation(run) -> bool:
    """The run recorded speculative counters (never inferred from anything else)."""
    c = run.counters
    return bool(len(c)) and bool(c["name"].isin(COUNTERS).any())


def verifies(run) -> pd.DataFrame:
    """One row per verified request per step: drafted, accepted and emitted tokens (empty
    when the run recorded no speculative counters)."""
    c = run.counters
    if not len(c):
        return _empty()
    c = c[c["name"].isin(COUNTERS).to_numpy()]
    if not len(c):
        return _empty()
    wide = c.pivot_table(index=["ts_ns", "scope"], columns="name", values="value",
                         aggfunc="sum", observed=True).reset_index()  # fmt: skip
    for name in COUNTERS:
        if name not in wide:
            wide[name] = np.nan
    steps = _steps(run)
    step_of = pd.Series(steps["step_id"].to_numpy(), index=steps["start_ns"].to_numpy())
    step_of = step_of[~step_of.index.duplicated()]
    df = pd.DataFrame(
        {
            "step_id": step_of.reindex(wide["ts_ns"].to_numpy()).to_numpy(),
            "request_id": wide["scope"].astype(str).to_numpy(),
            "drafted": wide["spec_drafted"].to_numpy(),
            "accepted": wide["spec_accepted"].to_numpy(),
            "emitted": wide["spec_emitted"].to_numpy(),
        }
    )
    df = df.dropna(subset=["step_id", "drafted", "accepted"])
    if not len(df):
        return _empty()
    df["emitted"] = df["emitted"].fillna(df["accepted"] + 1)
    for col in ("step_id", "drafted", "accepted", "emitted"):
        df[col] = df[col].astype("int64")
    return df.sort_values(["step_id", "request_id"], ignore_index=True)[VERIFY_COLUMNS]


def _empty() -> pd.DataFrame:
    return pd.DataFrame(
        {k: pd.Series(dtype="object" if k == "request_id" else "int64") for k in VERIFY_COLUMNS}
    )


def _steps(run) -> pd.DataFrame:
    """The scheduling rank's steps (rank 0's, or the only rank's)."""
    st = run.steps
    if len(st) and "rank" in st and st["rank"].notna().any():
        st = st[st["rank"].eq(st["rank"].min()).fillna(False).to_numpy()]
    return st


def expected_tokens(alpha: float, k) -> np.ndarray:
    """E[tokens per target forward] = (1 − α^(K+1)) / (1 − α) (K + 1 at α = 1)."""
    k = np.asarray(k, dtype=np.float64)
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1.0)) / (1.0 - alpha)


def predicted_speedup(alpha: float, k, c: float, v: float = 0.0, o: float = 0.0) -> np.ndarray:
    """E(K) · (1 + o) / (1 + o + K·(c + v)): Leviathan's E / (1 + K·c) when v = o = 0."""
    k = np.asarray(k, dtype=np.float64)
    return expected_tokens(alpha, k) * (1.0 + o) / (1.0 + o + k * (c + v))


def by_position(v: pd.DataFrame, k: int) -> list[float]:
    """Per draft position i: of the verifies that drafted a position i, the share whose
    drafts were accepted through it (accepted > i over drafted > i). vLLM's per-position
    counters over its drafts say the same; under i.i.d. acceptance it is α^(i+1)."""
    d, a = v["drafted"].to_numpy(), v["accepted"].to_numpy()
    out = []
    for i in range(k):
        n = int((d > i).sum())
        out.append(float((a > i).sum()) / n if n else float("nan"))
    return out


@dataclass(frozen=True)
class StepCosts:
    """Mean seconds per speculative step, and what a plain forward costs."""

    steps: int  # steps with a draft phase
    draft_s: float  # the proposer (draft phase)
    verify_s: float  # the target's verify forward + rejection sampling
    other_s: float  # the rest of the step (schedule, prepare, post-process)
    step_s: float
    positions: float  # draft positions per step (the longest draft in the step), mean
    plain_forward_s: float  # a forward + sample without drafts over the same batch
    plain_source: str  # where plain_forward_s comes from


@dataclass(frozen=True)
class SpecSummary:
    method: str | None  # ngram | draft (None: not in the manifest)
    k: int  # drafts per request per step: the configured K, else the longest draft seen
    draft: str | None  # the draft model, for method draft
    verifies: int  # request-verifications (one request in one step)
    drafted: int
    accepted: int
    emitted: int
    acceptance: float  # accepted / drafted
    alpha: float  # per-position acceptance (accepted / (accepted + rejections)): the model's α
    mean_accepted: float  # accepted drafts per verify
    tokens_per_forward: float  # tokens emitted per request per target forward
    draft_fill: float  # drafted / (verifies × K): how often the proposer had K to offer
    position_acceptance: list = field(default_factory=list)  # by_position
    expected_tokens: float = float("nan")  # E at α and K
    drafted_steps: float = float("nan")  # a server's decode steps with a draft (share)
    # Costs (NaN without phases)
    steps: int = 0
    draft_ms: float = float("nan")  # per step
    verify_ms: float = float("nan")
    other_ms: float = float("nan")
    step_ms: float = float("nan")
    plain_forward_ms: float = float("nan")
    plain_source: str = ""
    c: float = float("nan")  # draft cost per position / plain forward
    v: float = float("nan")  # verify's extra per draft position / plain forward (0: assumed)
    o: float = float("nan")  # other step work / plain forward
    leviathan_speedup: float = float("nan")  # E / (1 + K·c)
    predicted_speedup: float = float("nan")  # with v and o
    modelled_speedup: float = float("nan")  # measured tokens/forward × plain step / spec step
    best_k: int | None = None  # argmax over K = 1..16 of the predicted speedup
    best_speedup: float = float("nan")
    best_gain: float = float("nan")  # best_speedup / predicted_speedup − 1
    # Against a baseline run without speculation (the same load), when given
    baseline_tokens_per_s: float = float("nan")
    tokens_per_s: float = float("nan")
    measured_speedup: float = float("nan")


def config_of(run) -> dict:
    """The manifest's `engine_config.speculative` ({} when absent or off)."""
    spec = section(run.manifest.config or {}, "engine_config").get("speculative")
    return spec if isinstance(spec, dict) else {}


def step_costs(run, v: pd.DataFrame, baseline=None) -> StepCosts | None:
    """Per speculative step: draft, verify and other time, and the plain forward the
    costs are measured against (see the module docstring); None without draft phases."""
    sp = run.spans
    if not len(sp) or "category" not in sp:
        return None
    ph = sp[(sp["category"] == "phase").to_numpy() & sp["step_id"].notna().to_numpy()]
    if not len(ph):
        return None
    per = ph.pivot_table(index="step_id", columns="name", values="dur_ns", aggfunc="sum",
                         observed=True) / 1e9  # fmt: skip
    if DRAFT_PHASE not in per:
        return None
    per = per[per[DRAFT_PHASE].notna()]
    if not len(per):
        return None
    per.index = per.index.astype(np.int64)
    st = _steps(run).drop_duplicates("step_id").set_index("step_id")
    st = st.reindex(per.index)
    step_s = ((st["end_ns"] - st["start_ns"]) / 1e9).to_numpy("float64")
    draft_s = per[DRAFT_PHASE].to_numpy("float64")
    verify_s = sum(per[p].fillna(0.0) for p in VERIFY_PHASES if p in per)
    verify_s = np.asarray(verify_s, dtype=np.float64) * np.ones(len(per))
    other_s = np.clip(np.nan_to_num(step_s - draft_s - verify_s), 0.0, None)
    g = v.groupby("step_id")
    batch = g.size().reindex(per.index).fillna(0).to_numpy("float64")
    drafted = g["drafted"].sum().reindex(per.index).fillna(0).to_numpy("float64")
    positions = g["drafted"].max().reindex(per.index).fillna(0).to_numpy("float64")
    plain, source = _plain_forward(batch, drafted, verify_s, baseline)
    return StepCosts(
        steps=len(per),
        draft_s=float(np.mean(draft_s)),
        verify_s=float(np.mean(verify_s)),
        other_s=float(np.mean(other_s)),
        step_s=float(np.nanmean(step_s)) if np.isfinite(step_s).any() else float("nan"),
        positions=float(np.mean(positions)),
        plain_forward_s=plain,
        plain_source=source,
    )


def _plain_forward(batch, drafted, verify_s, baseline) -> tuple[float, str]:
    """What forward + sample cost without drafts over these batches (see the docstring)."""
    if baseline is not None:
        got = _baseline_forward(baseline, batch)
        if got is not None:
            return got, "the baseline run's decode steps of the same batch sizes"
    live = batch > 0
    if live.sum() >= MIN_FIT_STEPS:
        x = np.column_stack([np.ones(live.sum()), batch[live], drafted[live]])
        if np.linalg.matrix_rank(x) == 3 and np.linalg.cond(x) < 1e6:
            coef, *_ = np.linalg.lstsq(x, verify_s[live], rcond=None)
            plain = float(np.mean(coef[0] + coef[1] * batch[live]))
            if plain > 0 and coef[2] >= 0:
                return plain, (
                    "a fit of the verify forwards on batch size and drafted tokens, at zero "
                    "drafts (the verify path's own fixed cost counts as plain: the speedup "
                    "is an upper bound; a run without speculation measures it)"
                )
    return float(np.mean(verify_s)), (
        "assumed equal to the verify forward (Leviathan et al.'s assumption: a run "
        "without speculation measures it)"
    )


def _baseline_forward(baseline, batch: np.ndarray) -> float | None:
    """Mean forward + sample of the baseline's pure decode steps, matched per batch size
    (the nearest size the baseline ran), over this run's speculative steps."""
    sp = baseline.spans
    if not len(sp):
        return None
    ph = sp[(sp["category"] == "phase").to_numpy() & sp["step_id"].notna().to_numpy()
            & sp["name"].isin(VERIFY_PHASES).to_numpy()]  # fmt: skip
    if not len(ph):
        return None
    fwd = ph.groupby(ph["step_id"].astype(np.int64))["dur_ns"].sum() / 1e9
    st = _steps(baseline).drop_duplicates("step_id").set_index("step_id")
    decode = st[(st["num_prefill_tokens"].fillna(0) == 0).to_numpy()
                & (st["num_decode_seqs"].fillna(0) > 0).to_numpy()]  # fmt: skip
    fwd = fwd.reindex(decode.index).dropna()
    if not len(fwd):
        return None
    by_size = fwd.groupby(decode.loc[fwd.index, "num_decode_seqs"].to_numpy()).median()
    sizes = by_size.index.to_numpy("float64")
    live = batch[batch > 0]
    if not len(live):
        return None
    nearest = np.abs(live[:, None] - sizes[None, :]).argmin(axis=1)
    return float(by_size.to_numpy("float64")[nearest].mean())


def summarize(run, baseline=None, baseline_tokens_per_s: float | None = None,
              tokens_per_s: float | None = None) -> SpecSummary | None:  # fmt: skip
    """The run's speculation in a few numbers; None without speculative counters.
    `baseline`: a run of the same load without speculation (its plain forwards price c;
    with both throughputs given, the measured speedup)."""
    v = verifies(run)
    if not len(v):
        return None
    cfg = config_of(run)
    k = int(cfg.get("num_tokens") or 0) or int(v["drafted"].max()) or 1
    drafted, accepted = int(v["drafted"].sum()), int(v["accepted"].sum())
    emitted, n = int(v["emitted"].sum()), len(v)
    rejections = int((v["accepted"] < v["drafted"]).sum())
    tried = accepted + rejections
    alpha = accepted / tried if tried else float("nan")
    out = dict(
        method=cfg.get("method"),
        k=k,
        draft=cfg.get("draft"),
        verifies=n,
        drafted=drafted,
        accepted=accepted,
        emitted=emitted,
        acceptance=accepted / drafted if drafted else float("nan"),
        alpha=alpha,
        mean_accepted=accepted / n,
        tokens_per_forward=emitted / n,
        draft_fill=drafted / (n * k),
        position_acceptance=by_position(v, k),
        expected_tokens=float(expected_tokens(alpha, k)) if tried else float("nan"),
    )
    costs = step_costs(run, v, baseline)
    if costs is not None and costs.plain_forward_s > 0 and tried:
        out.update(_priced(costs, alpha, k, emitted / n))
    if baseline_tokens_per_s and tokens_per_s:
        out.update(baseline_tokens_per_s=baseline_tokens_per_s, tokens_per_s=tokens_per_s,
                   measured_speedup=tokens_per_s / baseline_tokens_per_s)  # fmt: skip
    return SpecSummary(**out)


def _priced(costs: StepCosts, alpha: float, k: int, tokens_per_forward: float) -> dict:
    plain = costs.plain_forward_s
    c = costs.draft_s / max(costs.positions, 1.0) / plain
    extra = max(costs.verify_s - plain, 0.0)
    v = extra / max(costs.positions, 1.0) / plain
    o = costs.other_s / plain
    ks = np.arange(1, MAX_K + 1)
    curve = predicted_speedup(alpha, ks, c, v, o)
    best = int(ks[int(np.argmax(curve))])
    now = float(predicted_speedup(alpha, k, c, v, o))
    spec_step = costs.draft_s + costs.verify_s + costs.other_s
    return dict(
        steps=costs.steps,
        draft_ms=costs.draft_s * 1e3,
        verify_ms=costs.verify_s * 1e3,
        other_ms=costs.other_s * 1e3,
        step_ms=costs.step_s * 1e3,
        plain_forward_ms=plain * 1e3,
        plain_source=costs.plain_source,
        c=c,
        v=v,
        o=o,
        leviathan_speedup=float(predicted_speedup(alpha, k, c)),
        predicted_speedup=now,
        modelled_speedup=tokens_per_forward * (plain + costs.other_s) / spec_step,
        best_k=best,
        best_speedup=float(curve.max()),
        best_gain=float(curve.max()) / now - 1.0 if now > 0 else float("nan"),
    )


def from_server(sm, launched: dict | None = None) -> SpecSummary | None:
    """The same acceptance figures from a server's own counters (vLLM's
    spec_decode_num_drafts / _num_draft_tokens / _num_accepted_tokens / _per_pos, over the
    run: analyzers/server_metrics.py); None when it exported none. A draft is one
    request's verify: it emits its accepted tokens plus the target's own (a request's
    last verify may emit more than its max_tokens keeps). Tokens per target forward are
    over every decode step, drafted or not, when the generated tokens and finished
    requests are in the counters (else per draft). `launched`: vLLM's
    --speculative-config as launched (method, num_speculative_tokens), when known. Costs
    are not in the counters: nothing here is priced."""
    launched = launched or {}
    drafts = sm.counters.get("spec_drafts")
    drafted = sm.counters.get("spec_draft_tokens")
    accepted = sm.counters.get("spec_accepted_tokens")
    if not drafts or drafted is None or accepted is None or drafts <= 0:
        return None
    per_pos = {int(p): n for p, n in sm.by_label.get("spec_accepted_by_position", {}).items()
               if str(p).isdigit()}  # fmt: skip
    k = (max(per_pos, default=-1) + 1 or int(launched.get("num_speculative_tokens") or 0)
         or max(round(drafted / drafts), 1))  # fmt: skip
    position = [per_pos.get(i, 0.0) / drafts for i in range(k)] if per_pos else []
    # Drafts with a rejection: those that did not accept position K−1, when every draft is K
    # long. vLLM's n-gram proposer drafts fewer near the text's end, and a short draft
    # accepted whole had none; each rejection rejects at least one drafted token, which
    # bounds them (exact at full drafts; otherwise α is a lower bound).
    rejections = min(drafts - per_pos[k - 1], drafted - accepted) if per_pos else float("nan")
    tried = accepted + rejections
    alpha = accepted / tried if tried and tried == tried else float("nan")
    method = launched.get("method")
    # A draft is counted only where the proposer offered tokens (n-gram lookup often finds
    # no match): each decode step of a request emits 1 + its accepted drafts and the first
    # token is the prefill's, so the steps come from the generated tokens.
    per_forward, drafted_steps = (accepted + drafts) / drafts, float("nan")
    generated = sm.counters.get("generation_tokens")
    finished = sm.counters.get("requests_finished")
    if generated and finished is not None and generated - finished - accepted >= drafts:
        steps = generated - finished - accepted
        per_forward, drafted_steps = (generated - finished) / steps, drafts / steps
    return SpecSummary(
        method=str(method) if method else None,
        k=int(k),
        draft=launched.get("model") if method == "draft_model" else None,
        verifies=int(drafts),
        drafted=int(drafted),
        accepted=int(accepted),
        emitted=int(accepted + drafts),
        acceptance=accepted / drafted if drafted else float("nan"),
        alpha=alpha,
        mean_accepted=accepted / drafts,
        tokens_per_forward=per_forward,
        draft_fill=drafted / (drafts * k),
        position_acceptance=position,
        expected_tokens=float(expected_tokens(alpha, k)) if alpha == alpha else float("nan"),
        drafted_steps=drafted_steps,
    )


def priced_from_chunks(s: SpecSummary, step_s: float, plain_s: float) -> SpecSummary:
    """A server's speculation priced from the client's side (its counters hold no times):
    `step_s` the mean gap between a request's chunks in this run (one server step each),
    `plain_s` the same in a baseline run of the same load without speculation. Their
    difference over the draft positions a step carries is what a position costs, draft and
    verify together (c here, v = 0). Only a share d of the steps drafted (the proposer
    found nothing in the rest; K does not change that), so speedup(K) =
    (1 + d·(E(K) − 1)) / (1 + d·K·c): Leviathan's E / (1 + K·c) at d = 1."""
    if not (step_s > 0 and plain_s > 0) or s.alpha != s.alpha:
        return s
    d = s.drafted_steps if s.drafted_steps == s.drafted_steps else 1.0
    c = max(step_s / plain_s - 1.0, 0.0) / max(s.k * s.draft_fill * d, 1e-9)
    ks = np.arange(1, MAX_K + 1)

    def speedup(k):
        return (1.0 + d * (expected_tokens(s.alpha, k) - 1.0)) / (1.0 + d * np.asarray(k) * c)

    curve = speedup(ks)
    now = float(speedup(s.k))
    return dataclasses.replace(
        s,
        step_ms=step_s * 1e3,
        plain_forward_ms=plain_s * 1e3,
        plain_source=(
            "the baseline run's gaps between a request's chunks (a server step without "
            "drafts), against this run's; draft and verify are not told apart"
        ),
        c=c,
        v=0.0,
        o=0.0,
        leviathan_speedup=now,
        predicted_speedup=now,
        modelled_speedup=s.tokens_per_forward * plain_s / step_s,
        best_k=int(ks[int(np.argmax(curve))]),
        best_speedup=float(curve.max()),
        best_gain=float(curve.max()) / now - 1.0 if now > 0 else float("nan"),
    )

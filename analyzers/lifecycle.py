"""Each request's lifecycle as one row: the `request_events` long table pivoted into
first/last times per kind, joined with the `requests` table (outcome, token counts).

Times are kept relative to the run's origin (its earliest request event or step) as
float64 nanoseconds: exact for any run shorter than 104 days, NaN where an event is
absent, so every analysis can subtract arrays without masks or rounding. `origin_ns`
maps them back to the run's monotonic clock.

Latencies are measured where the user sees them, on the client (`basis="client"`). A run
with no client events (engine-only recording) falls back to the engine's view
(`basis="engine"`: arrival → tokens sampled), and says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..traces.reader import Run

# requests.finish_reason → outcome. "abort" is the engine's own abort (the client's
# cancellations arrive as "cancelled"), so it counts as a failure.
OUTCOME_OF_REASON = {
    "stop": "ok",
    "length": "ok",
    "cancelled": "cancelled",
    "timeout": "timeout",
    "rejected": "rejected",
    "error": "error",
    "abort": "error",
}
OUTCOMES = ("ok", "cancelled", "timeout", "rejected", "error", "unfinished")
CLIENT_TIMES = ("scheduled_send", "created", "sent", "first_token", "done")
ENGINE_TIMES = ("arrival", "tokenize_end", "queued", "finished")
ENGINE_KINDS = ("scheduled", "prefill_chunk", "first_token", "token", "preempted", "resumed",
                "finished")  # fmt: skip


@dataclass(frozen=True)
class Missing:
    """An analysis that could not run: what it needs that the run lacks (table names,
    or `table.side` / `table.column` for a part of one)."""

    analysis: str
    needs: tuple[str, ...]


@dataclass(frozen=True)
class Lifecycle:
    origin_ns: int
    basis: str  # client | engine
    requests: pd.DataFrame  # one row per request; row position = request code
    deliveries: pd.DataFrame  # code, t, tokens: every delivery, sorted by (code, t)
    engine: pd.DataFrame  # code, kind, t, step, num_tokens, num_cached, detail (ENGINE_KINDS)

    @property
    def has_engine(self) -> bool:
        return len(self.engine) > 0


def build_lifecycle(run: Run) -> Lifecycle | Missing:
    """Pivot a run's request events; Missing when it has no requests at all."""
    req = run.requests
    ev = run.request_events
    if len(req) == 0 and len(ev) == 0:
        return Missing("lifecycle", ("requests", "request_events"))
    origin = _origin(ev, run.steps)
    ev_code, req_code, uniques = _codes(ev["request_id"], req["request_id"])
    n = len(uniques)
    t = (ev["ts_ns"].to_numpy(np.int64) - origin).astype(np.float64)
    kind = ev["kind"].astype("category")
    kcode = kind.cat.codes.to_numpy()
    kind_cats = list(kind.cat.categories)
    client = (ev["side"] == "client").to_numpy(dtype=bool, na_value=False)

    def mask(name: str, on_client: bool) -> np.ndarray:
        if name not in kind_cats:
            return np.zeros(len(ev), dtype=bool)
        return (kcode == kind_cats.index(name)) & (client if on_client else ~client)

    out = pd.DataFrame({"request_id": pd.array(uniques, dtype="string")})
    _join_requests(out, req, req_code, n)
    for name in CLIENT_TIMES:
        out[f"t_{name}"] = _first(n, ev_code, t, mask(name, True))
    out = out.rename(columns={"t_first_token": "t_first"})
    for name in ENGINE_TIMES:
        out[f"t_{name}"] = _first(n, ev_code, t, mask(name, False))
    steps = ev["step_id"].to_numpy(dtype="float64", na_value=np.nan)
    sched, first_tok = mask("scheduled", False), mask("first_token", False)
    out["t_first_sched"], out["step_first_sched"] = _first_with(n, ev_code, t, steps, sched)
    out["t_engine_first"], out["step_engine_first"] = _first_with(n, ev_code, t, steps, first_tok)
    if out["outcome"].eq("unfinished").any():
        _outcome_from_engine(out, ev, ev_code, mask("finished", False))

    chunk = mask("chunk", True)
    basis = "client" if chunk.any() or mask("sent", True).any() else "engine"
    if basis == "client":
        tokens = ev["num_tokens"].to_numpy(dtype="float64", na_value=1.0)
        deliveries = _sorted(ev_code[chunk], t[chunk], tokens[chunk])
    else:  # engine view: each sampled token is a delivery, arrival is the send
        sampled = mask("token", False) | first_tok
        deliveries = _sorted(ev_code[sampled], t[sampled], np.ones(int(sampled.sum())))
        out["t_sent"], out["t_first"] = out["t_arrival"], out["t_engine_first"]
        out["t_done"] = out["t_finished"]
    delivered = np.bincount(deliveries["code"], deliveries["tokens"], minlength=n)
    out["n_chunks"] = np.bincount(deliveries["code"], minlength=n)
    out["output_tokens"] = np.where(out["n_chunks"] > 0, delivered, out["output_tokens"])
    last = np.full(n, np.nan)
    last[deliveries["code"]] = deliveries["t"]  # sorted by time: the last write is the last
    out["t_last_chunk"] = last

    keep = np.zeros(len(ev), dtype=bool)
    for name in ENGINE_KINDS:
        keep |= mask(name, False)
    to_engine = np.array([ENGINE_KINDS.index(k) if k in ENGINE_KINDS else -1 for k in kind_cats])
    engine = pd.DataFrame(
        {
            "code": ev_code[keep],
            # categoricals: comparing 1M rows to a kind is a comparison of small ints
            "kind": pd.Categorical.from_codes(to_engine[kcode[keep]], categories=ENGINE_KINDS),
            "t": t[keep],
            "step": steps[keep],
            "num_tokens": ev["num_tokens"].to_numpy(dtype="float64", na_value=np.nan)[keep],
            "num_cached": ev["num_cached_tokens"].to_numpy("float64", na_value=np.nan)[keep],
            "detail": _categorical(ev["detail"][keep]),
        }
    )
    return Lifecycle(int(origin), basis, out, deliveries, engine)


def _codes(ev_ids: pd.Series, req_ids: pd.Series):
    """Dense request codes for events and requests (factorised once, on Arrow strings)."""
    ev_code, ev_uniques = pd.factorize(ev_ids)
    ev_uniques = pd.Index(ev_uniques, dtype="string")
    req_code = ev_uniques.get_indexer(req_ids.astype("string"))
    new = req_code < 0  # requests with no events at all
    req_code[new] = len(ev_uniques) + np.arange(int(new.sum()))
    uniques = ev_uniques.append(pd.Index(req_ids[new].astype("string"), dtype="string"))
    return ev_code, req_code, uniques.to_numpy(dtype=object)


def _categorical(values: pd.Series) -> pd.Categorical:
    codes, uniques = pd.factorize(values)  # on Arrow strings: a dictionary encoding
    return pd.Categorical.from_codes(codes, categories=pd.Index(uniques, dtype=object))


def _origin(ev: pd.DataFrame, steps: pd.DataFrame) -> int:
    lows = []
    if len(ev):
        lows.append(int(ev["ts_ns"].min()))
    if len(steps):
        lows.append(int(steps["start_ns"].min()))
    return min(lows) if lows else 0


def _join_requests(out: pd.DataFrame, req: pd.DataFrame, code: np.ndarray, n: int) -> None:
    def take(col: str, fill, dtype: str):
        arr = np.full(n, fill, dtype=dtype)
        if len(req):
            arr[code] = req[col].to_numpy(dtype=dtype, na_value=fill)
        return arr

    reason = np.full(n, None, dtype=object)
    if len(req):
        reason[code] = req["finish_reason"].astype(object).to_numpy()
    out["finish_reason"] = reason
    out["outcome"] = (
        pd.Series(reason, dtype=object).map(OUTCOME_OF_REASON).fillna("unfinished").to_numpy()
    )
    warm = np.zeros(n, dtype=bool)
    if len(req):
        warm[code] = req["is_warmup"].to_numpy(dtype=bool)
    out["is_warmup"] = warm
    for col in ("prompt_tokens", "output_tokens", "cached_tokens", "prefix_group", "replica"):
        out[col] = take(col, np.nan, "float64")


def _first(n: int, code: np.ndarray, t: np.ndarray, mask: np.ndarray) -> np.ndarray:
    out = np.full(n, np.inf)
    np.minimum.at(out, code[mask], t[mask])
    out[np.isinf(out)] = np.nan
    return out


def _first_with(n, code, t, values, mask) -> tuple[np.ndarray, np.ndarray]:
    """The first time of the masked events per request, and `values` at that event."""
    first = _first(n, code, t, mask)
    c, tt, v = code[mask], t[mask], values[mask]
    at_first = tt == first[c]
    picked = np.full(n, np.nan)
    picked[c[at_first]] = v[at_first]
    return first, picked


def _outcome_from_engine(out: pd.DataFrame, ev, code, finished: np.ndarray) -> None:
    """Requests with no `requests` row: take the outcome from the engine's `finished`."""
    detail = ev["detail"][finished].fillna("").astype(str).to_numpy()
    reason = np.where(pd.Series(detail).str.startswith("rejected").to_numpy(), "rejected", detail)
    mapped = pd.Series(reason, dtype=object).map(OUTCOME_OF_REASON).to_numpy()
    unfinished = out["outcome"].to_numpy() == "unfinished"
    target = code[finished]
    ok = unfinished[target] & pd.notna(mapped)
    outcome = out["outcome"].to_numpy(copy=True)
    outcome[target[ok]] = mapped[ok]
    out["outcome"] = outcome


def _sorted(code: np.ndarray, t: np.ndarray, tokens: np.ndarray) -> pd.DataFrame:
    order = np.lexsort((t, code))
    return pd.DataFrame({"code": code[order], "t": t[order], "tokens": tokens[order]})

"""Why requests missed an SLO: which target they missed, and what the missed latency
was made of — the TTFT critical path of the requests that missed TTFT, the causes of the
token gaps of those that missed TPOT or ITL. What `perfdiag capacity` reports as the
limit at the load where the SLO breaks, when the triage (which judges health, not an
SLO) names nothing."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .itl import CAUSES
from .lifecycle import Missing
from .serving import ServingAnalysis
from .slo import Slo, judge
from .ttft import PARTS


@dataclass(frozen=True)
class SloMisses:
    judged: int
    missed: dict[str, int]  # per target (ttft, tpot, itl, e2e) and "failed"
    binding: str | None  # the target most requests missed
    parts: tuple[tuple[str, float], ...]  # what the binding target's latency was, shares

    def text(self) -> str:
        if self.binding is None:
            return "no request missed the SLO"
        n = self.missed[self.binding]
        what = ", ".join(f"{name} {share:.0%}" for name, share in self.parts[:3])
        made = f"; their {self.binding.upper()} was {what}" if what else ""
        return f"{n} of {self.judged} requests missed {self.binding.upper()}{made}"


def slo_misses(s: ServingAnalysis, slo: Slo) -> SloMisses | None:
    m = s.metrics
    if isinstance(m, Missing):
        return None
    pr = m.per_request
    verdict = judge(slo, pr)
    judged = pr["in_window"].to_numpy(bool) & (pr["outcome"] != "cancelled").to_numpy()
    ok = (pr["outcome"] == "ok").to_numpy()
    missed = {"failed": int((judged & ~ok).sum())}
    for target in ("ttft", "tpot", "itl", "e2e"):
        col = f"meets_{target}"
        if col in verdict:
            missed[target] = int((judged & ok & ~verdict[col].to_numpy(bool)).sum())
    binding = max(missed, key=missed.get) if any(missed.values()) else None
    parts: tuple[tuple[str, float], ...] = ()
    if binding in ("ttft", "e2e") and not isinstance(s.ttft, Missing):
        sel = judged & ~verdict[f"meets_{binding}"].to_numpy(bool)
        parts = _ttft_parts(s, pr["request_id"].to_numpy()[sel])
    elif binding in ("tpot", "itl") and not isinstance(s.itl, Missing):
        sel = judged & ok & ~verdict[f"meets_{binding}"].to_numpy(bool)
        parts = _gap_causes(s, np.flatnonzero(sel))
    return SloMisses(int(judged.sum()), missed, binding, parts)


def _ttft_parts(s: ServingAnalysis, request_ids) -> tuple[tuple[str, float], ...]:
    t = s.ttft.per_request
    t = t[t["request_id"].isin(set(request_ids))]
    total = float(t["ttft_s"].sum())
    if total <= 0:
        return ()
    shares = {p.removesuffix("_s"): float(t[p].sum()) / total for p in PARTS}
    return _ranked(shares)


def _gap_causes(s: ServingAnalysis, codes) -> tuple[tuple[str, float], ...]:
    g = s.itl.per_gap
    g = g[g["code"].isin(set(codes.tolist()))]
    total = float(g["gap_s"].sum())
    if total <= 0:
        return ()
    shares = {c: float(g[f"{c}_s"].sum()) / total for c in CAUSES}
    return _ranked(shares)


def _ranked(shares: dict[str, float]) -> tuple[tuple[str, float], ...]:
    return tuple(sorted(((k, v) for k, v in shares.items() if v > 0), key=lambda kv: -kv[1]))

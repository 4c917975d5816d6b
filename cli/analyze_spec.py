"""`perfdiag analyze --details`: speculative decoding's figures, printed only for a run that
recorded the spec_* counters (analyzers/speculative.py)."""

from __future__ import annotations

from rich.table import Table

from .app import out
from .fit import fit


def _num(x, digits: int = 2, unit: str = "") -> str:
    return "–" if x is None or x != x else f"{round(x, digits) + 0.0:,.{digits}f}{unit}"


def _pct(x) -> str:
    return "–" if x is None or x != x else f"{x:.1%}"


def print_speculative(s) -> None:
    method = f"{s.method}, K = {s.k}" if s.method else f"K = {s.k}"
    t = Table("speculative decoding", "value", title=f"speculative decoding ({method})")
    t.add_row("acceptance rate (accepted / drafted)", _pct(s.acceptance))
    t.add_row("α per position tried (the model's)", _pct(s.alpha))
    t.add_row("mean accepted length per verify", _num(s.mean_accepted))
    t.add_row("tokens per target forward (per request)", _num(s.tokens_per_forward))
    t.add_row("expected at α and K (Leviathan et al.)", _num(s.expected_tokens))
    positions = " · ".join(_pct(x) for x in s.position_acceptance)
    t.add_row("accepted through position 0, 1, …", positions or "–")
    t.add_row("verifies (request × step)", f"{s.verifies:,}")
    if s.draft_ms == s.draft_ms:
        t.add_row("draft / verify / rest per step (ms)",
                  f"{_num(s.draft_ms)} / {_num(s.verify_ms)} / {_num(s.other_ms)}")  # fmt: skip
        t.add_row(f"plain forward (ms), {s.plain_source}", _num(s.plain_forward_ms))
        t.add_row("draft/target cost ratio c", _num(s.c, 3))
        t.add_row("expected speedup E / (1 + K·c)", _num(s.leviathan_speedup, 2, "×"))
        t.add_row("predicted with verify and host costs", _num(s.predicted_speedup, 2, "×"))
        t.add_row("best K (predicted speedup)", f"{s.best_k} ({_num(s.best_speedup, 2, '×')})")
    out.print(fit(t, out))

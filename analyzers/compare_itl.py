"""ITL in `compare` is per chunk (DOMAIN.md §4), as is each request's worst gap. When
chunks carry several tokens (speculative decoding emits several a step; some servers
stream several a chunk), a longer gap between chunks is no slower token: those rows then
carry a note pointing at TPOT, the per-token figure, and when TPOT improved (a TPOT row
better, none worse) they do not decide the comparison on their own: the step-7
regression check passes over them (speculation read as ITL +24 % "worse" while TPOT
fell by 72 %)."""

from __future__ import annotations

from dataclasses import replace

from .compare_metrics import MetricDelta
from .findings import value_text

# Mean tokens a chunk above which chunks carry several: an occasional merged chunk in a
# one-token stream stays below it.
SEVERAL = 1.05
PER_CHUNK = ("itl.", "stall.")  # the metrics measured between chunks


def note_per_chunk_rows(deltas: tuple[MetricDelta, ...], a, b) -> tuple[MetricDelta, ...]:
    """`deltas` of two ServingAnalysis results, the per-chunk rows noted when either
    side's chunks carry several tokens; unchanged otherwise."""
    ta, tb = (s.metrics.tokens_per_chunk.mean for s in (a, b))
    tpot = {d.metric: d for d in deltas if d.metric.startswith("tpot.")}
    if not (ta > SEVERAL or tb > SEVERAL) or "tpot.p50" not in tpot:
        return deltas
    verdicts = {d.verdict for d in tpot.values()}
    improved = "better" in verdicts and "worse" not in verdicts
    p50 = tpot["tpot.p50"]
    moved = value_text(p50.relative, "%", True) if p50.relative == p50.relative else "–"
    note = (f"ITL and worst gaps are per chunk, and a chunk carries {tb:.2f} tokens in B "
            f"({ta:.2f} in A): per token, read TPOT (p50 {moved}, {p50.verdict})")  # fmt: skip
    if improved:
        note += "; the per-chunk rows do not call the run worse on their own"
    return tuple(
        replace(d, note=note, decisive=not improved) if d.metric.startswith(PER_CHUNK) else d
        for d in deltas
    )

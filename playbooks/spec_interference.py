"""What others' work in a request's prefill steps would be with speculation at its best K,
or off (the model by which `spec-k-mismatch` and `spec-no-speedup` explain
`ttft-prefill-interference`).

A prompt's prefill shares its steps with the running requests' verify forwards. Under
the speculative model (analyzers/speculative.py) a step with K draft positions costs
(1 + o + K·(c + v)) plain forwards: the proposer's c and the verify's v per position are
work the running requests bring to every step, none of it the prompt's own. With K′
positions a step sheds (K − K′)·(c + v) plain forwards, a share

    f = (K − K′)·(c + v)·plain / (the mean speculative step)

of its time; in the steps of a request's prefill window all of it comes out of others'
work (the request drafts nothing before its first token). So others' work shrinks by f of
the window's step time, and TTFT by as much; the check's share is taken again.
"""

from __future__ import annotations

import numpy as np

from ..analyzers.ttft import prefill_steps_s
from .facts import TriageContext, ev
from .facts_speculative import summary


def spec_evidence(ctx: TriageContext, per_request) -> tuple:
    """For a speculative run with costs: others' share of TTFT at the best K
    (`without_spec_k_mismatch`) and without speculation (`without_spec_no_speedup`), as
    evaluate.py reads `without_<root>`. () for a run without speculation or its costs."""
    got = summary(ctx)
    if not isinstance(got, tuple):
        return ()
    s = got[0]
    per_position = (s.c + s.v) * s.plain_forward_ms
    if not (per_position > 0 and s.step_ms > 0 and s.k > 0):
        return ()
    out = ()
    if s.best_k is not None and s.best_k < s.k:
        shed = (s.k - s.best_k) * per_position / s.step_ms
        out += (
            ev("spec_shed", "step time shed at the best K (model)", min(shed, 1.0), "%"),
            ev(
                "without_spec_k_mismatch",
                "others' share of TTFT then (model)",
                _share_shed(per_request, shed),
                "%",
            ),
        )
    off = s.k * per_position / s.step_ms
    out += (
        ev(
            "without_spec_no_speedup",
            "others' share of TTFT without speculation (model)",
            _share_shed(per_request, off),
            "%",
        ),
    )
    return out


def _share_shed(per_request, shed: float) -> float:
    """Others' mean share of TTFT when every step of each prefill window sheds a share
    `shed` of its time, all of it others' work."""
    others = per_request["prefill_others_s"].to_numpy("float64")
    saved = np.minimum(others, min(max(shed, 0.0), 1.0) * prefill_steps_s(per_request))
    ttft = float(per_request["ttft_s"].mean() - saved.mean())
    return float((others.mean() - saved.mean()) / ttft) if ttft > 0 else float("nan")

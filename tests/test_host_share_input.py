"""host-bound measures the engine's own host work: time between steps in which the loop
that drives the steps was taking a request in (engine arrival -> tokenize_end: the
input delay, validation, tokenisation) is the input's (slow-input's), not the engine's
(issue 35: g2000-0058, slow-input + over-capacity, read host-bound critical because
465 of its 546 ms of gaps were input processing)."""

from __future__ import annotations

import pytest

from perfdiag import load_run
from perfdiag.playbooks.facts import TriageContext, evaluate_fact
from perfdiag.traces.schema import Request, RequestEvent, Span, Step
from perfdiag.traces.writer import RunWriter

MS = 1_000_000
PHASES = (("schedule", 0.2), ("forward", 1.8), ("sample", 0.2), ("post_process", 0.2))


def _write(path, steps=60, input_ms=2.0, host_gap_ms=1.0, input_in_gap=True):
    """Decode steps of 2.4 ms (0.4 ms host in phases, 2.0 ms device); after each, one
    request taken in for `input_ms` on the driving loop — inside the gap before the
    next step (`input_in_gap`), or while the step runs — then `host_gap_ms` of the
    engine's own host work before the next step starts."""
    events, rows, spans, t = [], [], [], 0
    for s in range(steps):
        start = t
        for name, dur in PHASES:
            spans.append(Span(name, "phase", t, round(dur * MS), step_id=s))
            t += round(dur * MS)
        rows.append(Step(s, start, t, num_decode_seqs=4, num_waiting=0, num_running=4, rank=0))
        rid = f"in{s}"
        at = t if input_in_gap else start
        done = at + round(input_ms * MS)
        events += [RequestEvent(rid, "arrival", at, num_tokens=32),
                   RequestEvent(rid, "tokenize_end", done, num_tokens=32),
                   RequestEvent(rid, "queued", done, num_tokens=32)]  # fmt: skip
        t += round(((input_ms if input_in_gap else 0.0) + host_gap_ms) * MS)
    with RunWriter(path, command=["test"], config={}, environment_info={"test": True}) as w:
        w.table("requests").extend(Request(f"in{s}", 32) for s in range(steps))
        w.table("request_events").extend(events)
        w.table("steps").extend(rows)
        w.table("spans").extend(spans)
    return load_run(path)


def _host_share(run):
    fact = evaluate_fact("host_share", TriageContext(run), {})
    return fact.value, {e.name: e.value for e in fact.evidence}


def test_input_between_steps_is_not_host_work(tmp_path):
    value, ev = _host_share(_write(tmp_path / "r"))
    # Per step: 0.4 ms in phases + 1.0 ms of host gap against 2.0 ms of device time; the
    # 2 ms of input in each gap is shown apart (the last step has no gap after it).
    assert ev["gap_ms"] == pytest.approx(1.0 * 59 / 60, rel=1e-3)
    assert ev["input_gap_ms"] == pytest.approx(2.0 * 59 / 60, rel=1e-3)
    assert value == pytest.approx(1.383 / (1.383 + 2.0), rel=1e-2)  # 0.41, not 0.62


def test_input_while_a_step_runs_changes_nothing(tmp_path):
    # Input taken in while the step thread computes never held a step back.
    value, ev = _host_share(_write(tmp_path / "r", input_in_gap=False))
    assert ev["input_gap_ms"] == 0.0
    assert ev["gap_ms"] == pytest.approx(1.0 * 59 / 60, rel=1e-3)
    assert value == pytest.approx(1.383 / 3.383, rel=1e-2)


def test_engine_host_gaps_alone_still_count(tmp_path):
    # No input at all in the gaps: the step_gap_ms kind of host work is all host-bound's.
    value, ev = _host_share(_write(tmp_path / "r", input_ms=0.0, host_gap_ms=3.0))
    assert ev["input_gap_ms"] == 0.0
    assert value == pytest.approx((0.4 + 3.0 * 59 / 60) / (0.4 + 3.0 * 59 / 60 + 2.0), rel=1e-2)

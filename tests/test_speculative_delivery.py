"""What speculation changes outside its own analyzer: a step that emits several tokens
delivered in one chunk is explained once per gap in the ITL attribution (analyzers/
itl.py; it was counted once per token, leaving a negative remainder of 178 % of the
gaps), and the diagnosis suite's slow-proposer fault (probes/faults.py) spends its time
inside the draft phase while the fault observer still forwards the spec counters."""

from __future__ import annotations

import time

from spec_runs import plain_run, spec_run, write_run

from perfdiag import load_run
from perfdiag.analyzers.serving import analyze_serving
from perfdiag.engine_ref.hooks import EngineObserver
from perfdiag.probes.faults import FaultObserver, FaultOptions


def test_several_tokens_of_one_step_in_one_chunk_leave_nothing_unexplained(tmp_path):
    a = analyze_serving(load_run(write_run(tmp_path / "s", spec_run(alpha=0.9, steps=60),
                                           client=True)))  # fmt: skip
    assert a.metrics.tokens_per_chunk.mean > 3  # several tokens per delivery
    assert a.itl.remainder_share < 0.01
    p = analyze_serving(load_run(write_run(tmp_path / "p", plain_run(steps=60), client=True)))
    assert p.itl.remainder_share < 0.01


class _Seen(EngineObserver):
    def __init__(self):
        self.spec = []

    def on_spec_decode(self, events):
        self.spec.append(events)


def test_the_fault_observer_forwards_the_spec_counters():
    inner = _Seen()
    FaultObserver(inner, FaultOptions(step_gap_ms=1.0)).on_spec_decode(["e"])
    assert inner.spec == [["e"]]


class _Proposer:
    name = "ngram"

    def propose(self, requests, k):
        return ["p"] * len(requests)

    def release(self, request_id):
        return request_id


def test_a_slow_proposer_spends_its_time_inside_propose():
    engine = type("E", (), {})()
    engine.proposer = _Proposer()
    faults = FaultOptions(draft_delay_ms=20.0)
    assert faults.active and faults.to_dict()["draft_delay_ms"] == 20.0
    faults.slow_proposer(engine)
    t0 = time.perf_counter()
    assert engine.proposer.propose([1, 2], 4) == ["p", "p"]
    assert time.perf_counter() - t0 >= 0.019
    assert engine.proposer.name == "ngram" and engine.proposer.release("r") == "r"
    FaultOptions().slow_proposer(engine)  # no fault: nothing wrapped again
    assert engine.proposer.inner.__class__ is _Proposer

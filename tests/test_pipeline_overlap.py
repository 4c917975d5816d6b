"""pp-bubbles prices the slowdown of overlapped stages (analyzers/pipeline_overlap.py):
measured from the run's own spans when stages overlapped (m ≥ 2), from the cores the
stages need against the machine's when they did not (m = 1), none on CUDA. On a 2-vCPU
host two overlapped stages computed 10–50 % slower, and the constant-compute model's
advised m = 4 made E2E p50 59 % worse (BENCHMARKS.md, "Pipeline parallelism on the CPU")."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest
from test_pipeline_analysis import _run

from perfdiag.analyzers import pipeline as P
from perfdiag.analyzers import pipeline_overlap as O
from perfdiag.playbooks import facts_pipeline as F
from perfdiag.playbooks.facts import TriageContext


def _ctx(run):
    return TriageContext(run, serving=SimpleNamespace())


def _value(fact, name):
    return next(e.value for e in fact.evidence if e.name == name)


def _contended(p, m, cost, k, tokens, steps=3):
    """GPipe forward of `steps` steps, m equal micro-batches of `tokens` tokens costing a
    stage `cost` ms alone; in a slot where two or more stages compute, each takes k times
    as long (stages sharing cores). Slot t runs micro-batch t − s on stage s."""
    ev, t0 = [], 0.0
    for step in range(steps):
        t, ends = t0, {}
        for slot in range(m + p - 1):
            active = [s for s in range(p) if 0 <= slot - s < m]
            dur = cost * (k if len(active) > 1 else 1.0)
            for s in active:
                i = slot - s
                if s:  # waiting from its previous micro-batch (or the step's start)
                    ev.append(("recv", s, step, i, ends.get((s, i - 1), t0), t, 64, tokens))
                ev.append(("compute", s, step, i, t, t + dur, 0, tokens))
                ev.append(("send", s, step, i, t + dur, t + dur, 64, tokens))
                ends[(s, i)] = t + dur
            t += dur
        for i in range(m):
            ev.append(("recv_out", 0, step, i, ends[(0, m - 1)], ends[(p - 1, i)], 16, tokens))
        t0 = t + 5.0
    return ev


def _pp(k, m=2, requests=4, tokens=200, cost=10.0):
    return _run(_contended(2, m, cost, k, tokens), 2, m, requests=requests)


def test_the_contention_factor_is_measured_from_overlapped_spans():
    s = P.summarize(_pp(1.5))
    assert s.contention.model == "measured"
    assert s.contention.k == pytest.approx(1.5)
    # the cost model prices a stage alone: 10 ms for 200 tokens, overlapped or not
    assert s.ns_per_token == pytest.approx(50e3)
    assert P.summarize(_pp(1.0)).contention.k == pytest.approx(1.0)


def test_overlap_slower_by_half_predicts_too_little_to_advise():
    """m = 2, four requests of 100 tokens a step: 10 ms alone per micro-batch, 15 ms
    overlapped: 35 ms a step. At m = 4: 5 + 3 × 7.5 + 5 = 32.5 ms (×0.93, 7 % less):
    below the 10 % an advice must be predicted to gain, so information only."""
    fact = F.pp_bubbles(_ctx(_pp(1.5)))
    assert _value(fact, "ratio") == pytest.approx(32.5 / 35)
    assert fact.max_severity == "info" and fact.action is None
    assert "1.50" in _value(fact, "overlap") and "measured" in _value(fact, "overlap")
    advice = _value(fact, "advice")
    assert "not predicted to pay enough" in advice and "--pp-microbatches" not in advice


def test_overlap_twice_as_slow_predicts_no_gain():
    """k = 2 on two stages: every overlapped slot costs both stages' time, so more
    micro-batches only move the same work around (m = 4: 5 + 3 × 10 + 5 = 40 = m = 2's)."""
    fact = F.pp_bubbles(_ctx(_pp(2.0)))
    # m = 1, 2 and 4 all take 40 ms: the fewest within 5 % of the shortest is m = 1
    assert _value(fact, "m_new") == 1 and _value(fact, "ratio") == pytest.approx(1.0)
    assert fact.max_severity == "info" and fact.action is None
    assert "not predicted to pay" in _value(fact, "advice")


def test_without_contention_the_old_advice_stands():
    """The same spans with overlapped stages as fast as alone (k = 1): 30 ms at m = 2,
    25 at m = 4 (×0.83, 17 % less): a warning with the count to set."""
    fact = F.pp_bubbles(_ctx(_pp(1.0)))
    assert _value(fact, "m_new") == 4 and _value(fact, "ratio") == pytest.approx(25 / 30)
    assert fact.action.flags == "--pp-microbatches 4" and fact.max_severity == "warning"


def _one_microbatch(cpu_per_active_s, cores, device="cpu"):
    """m = 1 (no overlap to measure) with the steps table rank 0 records: its CPU time
    `cpu_per_active_s` per second of the step it did not spend waiting for the last stage."""
    run = _run(_contended(2, 1, 10.0, 1.0, 400), 2, 1, requests=8)
    sp = P.pipeline_spans(run)
    first = sp.groupby("step_id")["start_ns"].min()
    last = sp.groupby("step_id")["end_ns"].max()
    out = sp[sp["kind"] == "recv_out"]
    wait = (out["end_ns"] - out["start_ns"]).groupby(out["step_id"]).sum()
    run.steps = run.steps.assign(
        step_id=first.index.to_numpy(), start_ns=first.to_numpy(), end_ns=last.to_numpy(),
        cpu_time_ns=((last - first - wait) * cpu_per_active_s).to_numpy().astype("int64"),
    )  # fmt: skip
    run.manifest.config["engine_config"]["device"] = device
    run.manifest.environment = {"cpu_count": cores}
    run.counters = pd.DataFrame()
    return run


def test_stages_needing_more_cores_than_the_host_has_predict_no_gain():
    """Each stage keeps 1.1 cores busy while it computes: two need 2.2 of the 2 the
    machine has, so overlapped they would share cores: no count is advised, and why."""
    fact = F.pp_bubbles(_ctx(_one_microbatch(1.1, 2)))
    assert fact.max_severity == "info" and fact.action is None
    text = _value(fact, "advice") + _value(fact, "overlap")
    assert "2.2" in text and "2 cores" in text and "not predicted to pay" in text


def test_stages_filling_the_cores_predict_no_gain():
    """1.9 of 2 cores (≥ 90 %): nothing is left for rank 0's host work, the OS or a
    neighbour, which would then take a stage's core; 1.6 of 2 leaves room."""
    assert P.summarize(_one_microbatch(0.95, 2)).contention.blocked
    fact = F.pp_bubbles(_ctx(_one_microbatch(0.8, 2)))
    assert not P.summarize(_one_microbatch(0.8, 2)).contention.blocked
    assert fact.action is not None and "1.6 cores" in _value(fact, "overlap")


def test_stages_with_cores_of_their_own_keep_the_advice():
    for run in (_one_microbatch(1.1, 8), _one_microbatch(1.1, 2, device="cuda")):
        fact = F.pp_bubbles(_ctx(run))
        assert fact.action is not None and fact.action.flags.startswith("--pp-microbatches")
        assert fact.max_severity in ("warning", "critical")
        assert P.summarize(run).contention.k == 1.0


def test_the_window_with_contention_follows_the_schedule():
    """Equal micro-batches on p stages: 2 slots alone (fill's first, drain's last), the
    m + p − 3 others overlapped; m = 1 never overlaps."""
    assert O.makespan([10.0] * 4, 2, 1.5) == pytest.approx(2 * 10 + 3 * 15)
    assert O.makespan([10.0] * 4, 3, 2.0) == pytest.approx(2 * 10 + 4 * 20)
    assert O.makespan([10.0], 3, 2.0) == pytest.approx(30)
    # k = 1: GPipe's Σ c + (p − 1) · max c, whatever the sizes
    assert O.makespan([3.0, 7.0, 2.0], 3, 1.0) == pytest.approx(12 + 2 * 7)

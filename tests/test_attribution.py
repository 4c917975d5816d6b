"""Attribution by the step cost model on a synthetic run with known costs: a decoding
request beside prefill chunks, one step stalled for no reason its batch explains, and a
probe (a profiler starting) holding the engine between two steps."""

import numpy as np
import pytest
import serving_runs as runs

from perfdiag import load_run
from perfdiag.analyzers.serving import analyze_serving
from perfdiag.playbooks.evaluate import run_triage
from perfdiag.playbooks.facts import TriageContext
from perfdiag.traces.schema import Request, Span

MS = 1e-3
FIXED, PER_TOKEN, PER_SEQ = 5.0, 0.1, 1.0  # ms
STALLED, STALL = 22, 50.0  # step 22 (decodes only) takes 50 ms more than its batch
PROBE_AFTER, PROBE = 30, 300.0  # a 300 ms probe between steps 30 and 31
N = 40


def extra_decodes(i: int) -> int:
    return i % 4  # other decoding sequences beside A, so the per-sequence cost is identified


def prefill_tokens(i: int) -> int:
    return 20 * (i // 5) if i % 5 == 0 and i else 0  # P1..P7: 20, 40, … 140 tokens


def build(path):
    requests, events, steps, t = [Request("A", 20, N, 0, "length")], [], [], 10.0
    events += [runs.client("A", "sent", 0), runs.engine("A", "tokenize_end", 0.5, tokens=20),
               runs.engine("A", "scheduled", t, step=0, tokens=20, cached=0)]  # fmt: skip
    spans = []
    for i in range(N):
        p, d = (20, 0) if i == 0 else (prefill_tokens(i), 1 + extra_decodes(i))
        dur = FIXED + PER_TOKEN * p + PER_SEQ * d + (STALL if i == STALLED else 0.0)
        start, end = t, t + dur
        seqs = int(p > 0)
        steps.append(runs.step(i, start, end, pf_seqs=seqs, pf_tokens=p, decode=d))
        if i == 0:
            events += [runs.engine("A", "prefill_chunk", end, step=0, tokens=20),
                       runs.engine("A", "first_token", end, step=0, tokens=1),
                       runs.client("A", "first_token", end + 0.2)]  # fmt: skip
        else:
            events.append(runs.engine("A", "token", end, step=i, tokens=i + 1))
        events.append(runs.client("A", "chunk", end + 0.2, 1))
        if p and i:
            rid = f"P{i // 5}"
            requests.append(Request(rid, p, 1, 0, "length"))
            events += [runs.client(rid, "sent", start - 1.0),
                       runs.engine(rid, "tokenize_end", start - 0.8, tokens=p),
                       runs.engine(rid, "scheduled", start + 0.1, step=i, tokens=p, cached=0),
                       runs.engine(rid, "prefill_chunk", end, step=i, tokens=p),
                       runs.engine(rid, "first_token", end, step=i, tokens=1),
                       runs.engine(rid, "finished", end, step=i, tokens=1, detail="length"),
                       runs.client(rid, "first_token", end + 0.2),
                       runs.client(rid, "chunk", end + 0.2, 1),
                       runs.client(rid, "done", end + 0.3, 1)]  # fmt: skip
        t = end + 0.5
        if i == PROBE_AFTER:
            spans.append(Span("profiler_start", "probe", runs.ns(end + 0.25), round(PROBE * 1e6)))
            t += PROBE
    events += [runs.engine("A", "finished", t, step=N - 1, tokens=N, detail="length"),
               runs.client("A", "done", t, N)]  # fmt: skip
    return runs.write(path, requests, events, steps, spans)


@pytest.fixture(scope="module")
def analysis(tmp_path_factory):
    run = load_run(build(tmp_path_factory.mktemp("attr") / "run"))
    return run, analyze_serving(run, steady=False)


def gap(a, step: int):
    g = a.itl.per_gap
    rows = g[g["request_id"].astype(str).eq("A").to_numpy()]
    return rows.iloc[step - 1]  # gap k ends with the token of step k


def test_the_model_recovers_the_costs_and_finds_the_stalled_step(analysis):
    _, a = analysis
    m = a.step_cost
    assert m.fixed_s == pytest.approx(FIXED * MS, rel=1e-3)
    assert m.per_prefill_token_s == pytest.approx(PER_TOKEN * MS, rel=1e-3)
    assert m.per_decode_seq_s == pytest.approx(PER_SEQ * MS, rel=1e-3)
    assert list(m.outlier_steps["step_id"]) == [STALLED]
    assert m.inflated_s == pytest.approx(STALL * MS, rel=1e-3)


def test_a_gap_beside_a_prefill_chunk_pays_the_chunk_at_its_marginal_cost(analysis):
    _, a = analysis
    g = gap(a, 10)  # step 10: 40 prefill tokens, 1 + 2 decodes
    assert g["interference_s"] == pytest.approx(40 * PER_TOKEN * MS, rel=1e-3)
    assert g["decode_s"] == pytest.approx((FIXED + 3 * PER_SEQ) * MS, rel=1e-3)
    assert g["inflation_s"] == pytest.approx(0, abs=1e-6)


def test_a_stalled_step_is_inflation_not_decode_or_prefill(analysis):
    _, a = analysis
    g = gap(a, STALLED)
    assert g["inflation_s"] == pytest.approx(STALL * MS, rel=1e-3)
    assert g["decode_s"] == pytest.approx((FIXED + (1 + extra_decodes(STALLED)) * PER_SEQ) * MS,
                                          rel=1e-3)  # fmt: skip
    assert g["interference_s"] == pytest.approx(0, abs=1e-6)


def test_a_probe_stall_is_the_probes_and_flags_the_gap(analysis):
    _, a = analysis
    g = gap(a, PROBE_AFTER + 1)
    assert g["probe_s"] == pytest.approx(PROBE * MS, rel=1e-6)
    assert g["host_gap_s"] == pytest.approx(0.3 * MS, rel=1e-3)
    # the tail is chosen without probe time: this 300 ms gap is not an engine spike
    assert a.itl.tail.probe_s < PROBE * MS / 2


def test_a_prefill_splits_into_own_tokens_step_overhead_and_others(analysis):
    _, a = analysis
    pr = a.ttft.per_request.set_index("request_id")
    row = pr.loc["P3"]  # step 15: 60 tokens, 1 + 3 decodes
    assert row["prefill_own_s"] == pytest.approx(60 * PER_TOKEN * MS, rel=1e-3)
    assert row["step_overhead_s"] == pytest.approx(FIXED * MS, rel=1e-3)
    assert row["prefill_others_s"] == pytest.approx(4 * PER_SEQ * MS, rel=1e-3)
    parts = [c for c in pr.columns if c.endswith("_s") and c not in ("ttft_s", "client_wait_s")]
    assert np.allclose(pr[parts].sum(axis=1), pr["ttft_s"], rtol=1e-9)


def test_the_gate_names_the_probe_and_the_engine_findings_ignore_it(analysis):
    run, a = analysis
    triage = run_triage(TriageContext(run, a))
    probe = triage.by_check("probe-stalls")
    assert probe is not None and probe.severity in ("warning", "critical")
    assert "profiler_start" in probe.title
    assert not any(f.check in ("itl-host-gaps", "itl-delivery-stalls", "queue-dominates-ttft")
                   and f.severity != "info" for f in triage.findings)  # fmt: skip

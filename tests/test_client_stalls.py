"""The gate's `client-stalled` check (playbooks/facts_client.py): perfdiag's load client
stalls, and what its stalls did to the latencies it measured.

The runs are client-only (what `perfdiag run --target` records): a request sent every 20 ms,
first token 50 ms later, then 9 more chunks 20 ms apart (about ten streams at once). With a
stall, the client's loop is blocked from 1000 to 1300 ms: every client event due then is
stamped when it runs again, bunched 0.05 ms apart from 1300 ms, and LoopMonitor's window
ending at 1305 ms (a row's ts is its window's END) records a lag of 290 ms. Times in ms
after T0 (tests/data/serving_runs.py).
"""

from __future__ import annotations

import pytest
import serving_runs as runs
from serving_runs import client, ns

from perfdiag.playbooks.evaluate import run_triage
from perfdiag.playbooks.facts import TriageContext, evaluate_fact
from perfdiag.playbooks.facts_client import stall_parts, stall_windows
from perfdiag.traces.reader import load_run
from perfdiag.traces.schema import Counter, Request
from perfdiag.traces.writer import RunWriter

STALL = (1000.0, 1300.0)  # ms: the loop blocked
SLOW = "slow"  # queued across the stall: sent 900, first token at 1350, nothing stamped inside


def _stamp(ms: float, held: list[float]) -> float:
    """When the client stamps an event due at `ms`: late, bunched, if due in the stall."""
    if STALL[0] <= ms < STALL[1]:
        held.append(ms)
        return STALL[1] + 0.05 * (len(held) - 1)
    return ms


def _write(path, *, stall: bool = True, counters: bool = True, n: int = 50):
    held: list[float] = []
    stamp = (lambda ms: _stamp(ms, held)) if stall else (lambda ms: ms)
    requests, events = [], []
    plan = [(f"r{i:03d}", i * 20.0, 50.0) for i in range(n)] + [(SLOW, 900.0, 450.0)]
    for rid, due, ttft in sorted(plan, key=lambda p: p[1]):
        requests.append(Request(rid, 16, 10, None, "length"))
        events += [client(rid, "scheduled_send", due), client(rid, "created", stamp(due))]
        sent = stamp(due)
        events.append(client(rid, "sent", sent))
        for j in range(10):
            at = stamp(max(due + ttft + 20 * j, sent))
            if j == 0:
                events.append(client(rid, "first_token", at))
            events.append(client(rid, "chunk", at, 1))
        events.append(client(rid, "done", at, 10))
    config = {
        "run_options": {"workload": {"arrival": {"mode": "open", "rate": 50, "concurrency": None}}},
        "target": {"url": "http://127.0.0.1:8000", "model": "m"},
    }
    with RunWriter(path, command=["test"], config=config, environment_info={"test": True}) as w:
        w.table("requests").extend(requests)
        w.table("request_events").extend(events)
        if counters:
            ends = [250.0, 500.0, 750.0, 1000.0, 1305.0] + [1305.0 + 250 * k for k in range(1, 7)]
            for end in ends:
                lag = 0.29 if stall and end == 1305.0 else 0.001
                w.table("counters").extend(
                    [
                        Counter("client_loop_lag_max_s", ns(end), lag, "client"),
                        Counter("client_loop_cpu_pct", ns(end), 5.0, "client"),
                    ]
                )
    return load_run(path)


def _outcome(triage, check: str):
    return next(c for s in triage.steps for c in s.checks if c.check == check)


def test_a_row_closes_its_window_and_the_next_begins_there(tmp_path):
    w = stall_windows(_write(tmp_path / "r"))
    assert w["end_ns"].tolist()[:5] == [ns(250), ns(500), ns(750), ns(1000), ns(1305)]
    assert w["start_ns"].iloc[0] == ns(0)  # the first reaches back one window (0.25 s)
    assert w["start_ns"].iloc[4] == ns(1000)  # the stall's window: (1000, 1305]
    assert w["lag_s"].iloc[4] == pytest.approx(0.29)


def test_a_stall_names_the_requests_it_touched_and_the_tail_without_them(tmp_path):
    ctx = TriageContext(_write(tmp_path / "r"))
    fact = evaluate_fact("client_stalls", ctx, {})
    v = fact.values()
    assert v["stalls"] == 1 and v["largest_ms"] == pytest.approx(290)
    assert v["total_ms"] == pytest.approx(290) and v["threshold_ms"] == 20
    # Stamped inside (1000, 1305]: r039-r047 (chunks due from 1000 on), r048 and r049 (first
    # token due 1010 and 1030) — never the slow request, queued across the stall (sent 900,
    # first token 1350) but stamped nothing inside it: the stall delayed nothing it measured.
    assert v["touched"] == 11 and v["bunched"] >= 5
    touched = {i.label: i.ids for i in fact.ids}["stamped inside a client stall"]
    assert touched[:2] == ("r048", "r049")  # the most stall time first: 290 ms, 270 + 0 ms
    # The tail is the stall's: without the touched requests the ITL p99 is the server's 20 ms
    assert v["itl_p99_ms"] > 300 and v["itl_p99_untouched_ms"] == pytest.approx(20, abs=0.01)
    assert v["ttft_p99_ms"] > v["ttft_p99_untouched_ms"]
    assert v["itl_share"] > 0.9 and fact.value == max(v["itl_share"], v["ttft_share"])
    assert v["source"].startswith("client (perfdiag's load generator")

    triage = run_triage(ctx)
    f = triage.by_check("client-stalled")
    assert f is not None and f.step == 0
    # the value passes critical's threshold, but the stall does not double what the typical
    # request measured: it qualifies the tail (a warning), not a critical finding
    assert f.severity == "warning"
    assert f.ids[0].kind == "request" and f.ids[0].ids[0] == "r048"
    assert "20.0 ms without those requests" in f.explanation
    assert any("own core or machine" in r for r in f.recommendations)


def test_the_charged_stall_is_bounded_by_the_lag_and_the_window(tmp_path):
    """r048's first token was due at 1010 and stamped at ~1300: its TTFT holds the stall
    since its send, at most the lag (290 ms). r045's chunks due at 1010-1130 were stamped
    bunched at ~1300: one gap per stream is charged (the longest: 990 → 1300, less the 10 ms
    before the window began), the bunched ones nothing."""
    ctx = TriageContext(_write(tmp_path / "r"))
    parts = stall_parts(ctx)
    m = ctx.get("metrics")
    pr = m.per_request.reset_index(drop=True)
    row = {rid: i for i, rid in enumerate(pr["request_id"])}
    assert pr["ttft_s"][row["r048"]] == pytest.approx(0.34, abs=0.005)  # + its place in the bunch
    assert parts.ttft_s[row["r048"]] == pytest.approx(0.29)
    assert parts.ttft_s[row["r038"]] == 0 and not parts.touched[row[SLOW]]
    mine = (m.gaps["code"] == row["r045"]).to_numpy()
    charged = parts.gap_s[mine]
    assert (charged > 0).sum() == 1 and charged.max() == pytest.approx(0.29, abs=0.001)
    assert m.gaps["gap_s"][mine].max() == pytest.approx(0.31, abs=0.002)
    assert parts.bunched[row["r045"]] and not parts.bunched[row["r040"]]  # 2 chunks held


def test_no_stall_passes(tmp_path):
    ctx = TriageContext(_write(tmp_path / "r", stall=False))
    fact = evaluate_fact("client_stalls", ctx, {})
    assert fact.value == 0.0 and fact.values()["stalls"] == 0
    assert fact.values()["touched"] == 0
    outcome = _outcome(run_triage(ctx), "client-stalled")
    assert outcome.status == "passed" and outcome.value == 0.0


def test_a_run_without_client_counters_is_not_evaluated(tmp_path):
    ctx = TriageContext(_write(tmp_path / "r", counters=False))
    outcome = _outcome(run_triage(ctx), "client-stalled")
    assert outcome.status == "not-evaluated"
    assert "client_loop_lag_max_s" in outcome.reason and "--target" in outcome.reason


def test_an_engine_run_has_no_client_counters(tmp_path):
    path = runs.basic(tmp_path / "basic")
    outcome = _outcome(run_triage(TriageContext(load_run(path))), "client-stalled")
    assert outcome.status == "not-evaluated"


def test_a_real_vllm_run_whose_client_stalled_a_second():
    """tests/data/vllm/runs/light: the client's loop lagged 1010 ms once (and 100-300 ms a few
    times) on the 2-core machine vLLM shared; the ITL p99 was 171 ms, 56 ms without the
    requests it touched. A warning in the gate; the light load still raises nothing critical."""
    from pathlib import Path

    run = load_run(Path(__file__).parent / "data" / "vllm" / "runs" / "light")
    triage = run_triage(TriageContext(run))
    f = triage.by_check("client-stalled")
    assert f is not None and f.severity == "warning"
    ev = {e.name: e.value for e in f.evidence}
    assert ev["largest_ms"] == pytest.approx(1010, abs=1)
    assert ev["itl_p99_untouched_ms"] < 0.5 * ev["itl_p99_ms"]
    assert {"req-000002", "req-000003", "req-000004"} <= set(f.ids[0].ids)
    assert not [x.check for x in triage.findings if x.severity == "critical"]

"""Load checks on hand-built client timelines: offered rate, lateness, back-pressure under
a cap, in-flight concurrency, Little's law and saturation."""

import numpy as np
import pytest
import serving_runs as runs

from perfdiag import load_run
from perfdiag.analyzers.lifecycle import build_lifecycle
from perfdiag.analyzers.load import load_checks
from perfdiag.analyzers.steady_state import find_window
from perfdiag.analyzers.steptime import StepTimeline

MS = 1e-3


def check(path, steady=True):
    run = load_run(path)
    lc = build_lifecycle(run)
    window = find_window(lc.requests, lc.origin_ns, steady=steady)
    arrival = run.manifest.config.get("run_options", {}).get("workload", {}).get("arrival")
    return load_checks(lc, window, StepTimeline.from_run(run, lc.origin_ns), arrival or {})


def test_steady_open_loop(tmp_path):
    # a request every 10 ms, each in flight 50 ms: five in flight in the steady state
    c = check(runs.steady(tmp_path / "steady"))
    o = c.offered
    assert o.mode == "open" and o.target_rate_rps == 100
    assert o.planned_rate_rps == pytest.approx(100) and o.offered_rate_rps == pytest.approx(100)
    assert o.offered_vs_target == pytest.approx(1) and not o.under_delivered
    assert o.lateness_s.max == 0 and o.late_share == 0
    assert c.in_flight.mean == pytest.approx(5) and c.in_flight.peak == 5
    assert c.in_flight.mean_run == pytest.approx(60 * 50 / 640)  # 60 × 50 ms over 640 ms
    ll = c.littles_law
    # window [50, 590]: 55 sends in 540 ms, each 50 ms in the system
    assert ll.arrival_rate_rps == pytest.approx(55 / 0.54)
    assert ll.mean_time_in_system_s == pytest.approx(50 * MS)
    assert ll.client_in_flight == pytest.approx(5)
    assert ll.lambda_w == pytest.approx(55 / 0.54 * 0.05)
    assert ll.agrees and ll.lambda_w_vs_client == pytest.approx(55 / 54 - 1)
    assert np.isnan(ll.engine_in_system)  # no steps recorded
    assert not c.back_pressure.fired and c.back_pressure.concurrency_cap is None
    assert c.saturation.saturated is None  # no queue depths to judge by


def capped(path, cap=2, n=10):
    """Due every 1 ms, served 5 ms each, at most `cap` in flight: a request waits for a
    slot when `cap` are in flight (r2 waits 3 ms, r4 6 ms, …)."""
    requests, events, free = [], [], [0.0] * cap
    for i in range(n):
        rid = f"r{i}"
        slot = int(np.argmin(free))
        sent = max(float(i), free[slot])
        free[slot] = sent + 5
        requests.append(runs.Request(rid, 4, 1, None, "stop"))
        events += [
            runs.client(rid, "scheduled_send", i), runs.client(rid, "created", i),
            runs.client(rid, "sent", sent), runs.client(rid, "first_token", sent + 5),
            runs.client(rid, "chunk", sent + 5, 1), runs.client(rid, "done", sent + 5, 1),
        ]  # fmt: skip
    arrival = {"mode": "open", "rate": 1000.0, "concurrency": cap}
    return runs.write(path, requests, events, arrival=arrival)


def test_back_pressure_fires_when_the_cap_is_full(tmp_path):
    bp = check(capped(tmp_path / "capped"), steady=False).back_pressure
    assert bp.concurrency_cap == 2 and bp.fired
    assert bp.blocked_share == pytest.approx(0.8)  # all but the first two found it full
    # waits: r2, r3 3 ms; r4, r5 6; r6, r7 9; r8, r9 12
    assert bp.blocked_wait_s.count == 8 and bp.blocked_wait_s.p50 == pytest.approx(7.5 * MS)
    assert bp.total_wait_s == pytest.approx(60 * MS)
    o = check(tmp_path / "capped", steady=False).offered
    assert o.offered_rate_rps == pytest.approx(9 / (21 * MS))
    # the client issued every request on time: the cap held them, the client was not late
    assert o.issued_rate_rps == pytest.approx(1000) and not o.under_delivered


def late_client(path, n=10):
    """Due every 1 ms, but the client issues one only every 2 ms (a busy event loop)."""
    requests, events = [], []
    for i in range(n):
        rid = f"l{i}"
        requests.append(runs.Request(rid, 4, 1, None, "stop"))
        events += [
            runs.client(rid, "scheduled_send", i), runs.client(rid, "created", 2 * i),
            runs.client(rid, "sent", 2 * i), runs.client(rid, "first_token", 2 * i + 5),
            runs.client(rid, "chunk", 2 * i + 5, 1), runs.client(rid, "done", 2 * i + 5, 1),
        ]  # fmt: skip
    return runs.write(path, requests, events, arrival={"mode": "open", "rate": 1000.0})


def test_a_client_that_issues_late_fell_behind_its_plan(tmp_path):
    o = check(late_client(tmp_path / "late"), steady=False).offered
    assert o.issued_rate_rps == pytest.approx(500) and o.under_delivered
    assert o.late_share == pytest.approx(0.8)  # l2…l9: i ms late, more than 1 ms


def test_a_cap_that_is_never_reached_is_no_back_pressure(tmp_path):
    bp = check(capped(tmp_path / "wide", cap=20), steady=False).back_pressure
    assert not bp.fired and bp.blocked_share == 0 and bp.total_wait_s == 0


def growing_queue(path, waiting_slope):
    """Sends every 10 ms; completions every 20 ms; steps every 10 ms whose waiting queue
    grows by `waiting_slope` per step."""
    requests, events, steps = [], [], []
    for i in range(60):
        rid, sent = f"q{i:02d}", i * 10.0
        done = 50 + 20.0 * i
        requests.append(runs.Request(rid, 4, 1, None, "stop"))
        events += [
            runs.client(rid, "sent", sent), runs.client(rid, "first_token", done),
            runs.client(rid, "chunk", done, 1), runs.client(rid, "done", done, 1),
        ]  # fmt: skip
    for k in range(125):
        steps.append(runs.step(k, k * 10.0, k * 10.0 + 8, decode=1, running=1,
                               waiting=int(waiting_slope * k)))  # fmt: skip
    return runs.write(path, requests, events, steps, arrival={"mode": "open", "rate": 100})


def test_saturation_needs_a_growing_queue_and_arrivals_above_completions(tmp_path):
    s = check(growing_queue(tmp_path / "grow", 0.5)).saturation
    assert s.arrival_rate_rps > 1.1 * s.completion_rate_rps
    assert s.queue_slope_per_s == pytest.approx(50, rel=0.05)  # 0.5 per 10 ms step
    assert s.saturated
    flat = check(growing_queue(tmp_path / "flat", 0.0)).saturation
    assert flat.queue_slope_per_s == 0 and flat.saturated is False


def test_engine_in_system_from_queue_depths(tmp_path):
    # running 1 + waiting 0 on every step, steps back to back: the engine holds 1
    ll = check(growing_queue(tmp_path / "flat", 0.0)).littles_law
    assert ll.engine_in_system == pytest.approx(1.0)

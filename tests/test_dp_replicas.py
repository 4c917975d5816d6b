"""Data-parallel replicas: the router's policies on synthetic loads, and a `--dp 2` run
recorded from the CLI whose tables name each request's and each step's replica."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from perfdiag import load_run
from perfdiag.analyzers.replicas import analyze_replicas, busiest_replica, step_lanes
from perfdiag.cli import app
from perfdiag.engine_ref.router import REL_BOUND, Router, RouterPolicy
from perfdiag.errors import ConfigError


def _keys(*names: str) -> list[bytes]:
    return [n.encode() for n in names]


# ---- policies ---------------------------------------------------------------------------
def test_round_robin_takes_replicas_in_turn_whatever_their_load():
    r = Router(RouterPolicy.parse("round-robin"), 3)
    got = [r.route(f"r{i}", 100 * (i + 1), 10).replica for i in range(7)]
    assert got == [0, 1, 2, 0, 1, 2, 0]
    assert r.routed == [3, 2, 2]


def test_least_loaded_picks_the_replica_with_fewest_outstanding_tokens():
    r = Router(RouterPolicy.parse("least-loaded"), 2)
    assert r.route("a", 1000, 100).replica == 0
    assert r.route("b", 10, 10).replica == 1
    assert r.route("c", 10, 10).replica == 1  # 1100 outstanding on 0, 20 on 1
    assert r.tokens == [1100, 40]
    r.progress("a", 1)  # a's prompt is prefilled and one token came back
    assert r.tokens[0] == 99
    r.finish("a")
    assert r.tokens == [0, 40] and r.requests == [0, 2]
    assert r.route("d", 5, 5).replica == 0


def test_least_loaded_breaks_ties_in_turn():
    r = Router(RouterPolicy.parse("least-loaded"), 2)
    first = r.route("a", 10, 10).replica
    r.finish("a")
    assert r.route("b", 10, 10).replica != first


def test_weighted_splits_in_proportion_and_ignores_load():
    r = Router(RouterPolicy.parse("weighted:3,1"), 2)
    got = [r.route(f"r{i}", 10, 10).replica for i in range(8)]
    assert got.count(0) == 6 and got.count(1) == 2
    assert got[:4].count(0) == 3  # smooth: the split holds in every window of 4


def test_prefix_aware_keeps_a_prefix_group_on_one_replica():
    r = Router(RouterPolicy.parse("prefix-aware"), 2)
    a, b = _keys("A0", "A1"), _keys("B0")
    first = r.route("a0", 40, 8, a).replica
    other = r.route("b0", 40, 8, b).replica
    assert other != first  # a new prefix goes to the least-loaded replica
    for i in range(1, 3):  # within the bound: the group stays where its prefix is
        assert r.route(f"a{i}", 40, 8, a).replica == first
        assert r.route(f"b{i}", 40, 8, b).replica == other
    assert r.reasons["prefix"] == 4
    # a longer prompt of the group matches its first block (longest known prefix first)
    assert r.route("a9", 60, 8, [*a, b"A2"]).replica == first


def test_prefix_aware_falls_back_when_the_prefix_replica_is_overloaded():
    r = Router(RouterPolicy.parse("prefix-aware"), 2)
    hot = _keys("H0")
    home = r.route("h0", 50, 50, hot).replica
    got = [r.route(f"h{i}", 50, 50, hot).replica for i in range(1, 6)]
    # home may carry max(REL_BOUND × mean, 2 requests) more than the idlest replica
    assert got[:2] == [home, home]
    assert got[2] != home and r.reasons["prefix-overloaded"] >= 1
    gap = abs(r.tokens[0] - r.tokens[1])
    assert gap <= max(REL_BOUND * sum(r.tokens) / 2, 2 * 100) + 100
    # the fallback replica now holds the prefix too: the group may use both
    assert set(got) == {0, 1}


def test_router_policies_are_validated():
    with pytest.raises(ConfigError, match="one of"):
        RouterPolicy.parse("random")
    with pytest.raises(ConfigError, match="weighted:W1"):
        RouterPolicy.parse("weighted:a,b")
    with pytest.raises(ConfigError, match="one per replica"):
        Router(RouterPolicy.parse("weighted:3,1"), 3)
    with pytest.raises(ConfigError, match="replicas must be"):
        Router(RouterPolicy(), 0)
    assert str(RouterPolicy.parse("weighted:3,1")) == "weighted:3,1"


# ---- a recorded --dp 2 run ----------------------------------------------------------------
@pytest.fixture(scope="module")
def dp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("dp") / "run"
    res = CliRunner().invoke(app, [
        "run", "--preset", "tiny", "--dp", "2", "--router", "prefix-aware", "-n", "16",
        "--rate", "200", "--prompt-len", "40", "--output-len", "12", "--shared-prefix", "4:32",
        "--warmup", "0", "--no-device-sampling", "-q", "-o", str(out),
    ])  # fmt: skip
    assert res.exit_code == 0, res.output
    return load_run(out)


def test_every_request_is_served_by_exactly_one_replica(dp_run):
    req, steps = dp_run.requests, dp_run.steps
    assert len(req) == 16 and req["replica"].notna().all()
    assert set(req["replica"].astype(int)) == {0, 1}
    assert steps["step_id"].is_unique  # step ids name one step across replicas
    assert set(steps["replica"].astype(int)) == {0, 1}
    # every engine event of a request happens in a step of its replica
    ev = dp_run.request_events
    ev = ev[ev["step_id"].notna()].merge(steps[["step_id", "replica"]], on="step_id")
    served = ev.merge(req[["request_id", "replica"]], on="request_id", suffixes=("", "_req"))
    assert len(served) and (served["replica"] == served["replica_req"]).all()


def test_each_replica_steps_one_after_another(dp_run):
    steps = dp_run.steps
    for _, s in steps.groupby("replica"):
        s = s.sort_values("start_ns")
        assert (s["start_ns"].to_numpy()[1:] >= s["end_ns"].to_numpy()[:-1]).all()
    lanes = step_lanes(steps)
    assert len(np.unique(lanes)) == 2
    assert busiest_replica(steps) in (0, 1)


def test_the_manifest_records_the_replicas_and_the_router(dp_run):
    m = dp_run.manifest
    assert m.config["data_parallel"] == {"size": 2, "router": "prefix-aware"}
    assert m.config["run_options"]["engine"]["dp"] == 2
    router = m.extra["router"]
    assert router["policy"] == "prefix-aware" and sum(router["routed"]) == 16
    assert router["torch_threads_per_replica"] >= 1


def test_the_replica_analysis_adds_up(dp_run):
    a = analyze_replicas(dp_run)
    per = a.per_replica
    assert a.replicas == 2 and per["requests"].sum() == 16
    req = dp_run.requests
    assert per["output_tokens"].sum() == req["output_tokens"].sum()
    assert per["steps"].sum() == len(dp_run.steps)
    assert a.imbalance >= 1.0 and 0 <= a.lost_share <= 1
    # prefix-aware: each group keeps to one replica unless the bound moved it
    spread = req.groupby("prefix_group")["replica"].nunique()
    assert a.scattered_groups == int((spread > 1).sum())
    assert a.cached_tokens > 0


def test_analyze_works_on_a_dp_run(dp_run):
    res = CliRunner().invoke(app, ["analyze", str(dp_run.path), "--json"])
    assert res.exit_code == 0, res.output
    findings = json.loads(res.output)
    text = json.dumps(findings)
    assert "events-out-of-order" not in text or "CRITICAL" not in text


def test_dp_refuses_what_it_does_not_combine_with(tmp_path):
    runner = CliRunner()
    refused = (
        (["--tp", "2"], "--dp and --tp"),
        (["--router", "weighted:1,1,1"], "one per"),
        (["--profile-steps", "1:2"], "profile-steps"),
    )
    for extra, match in refused:
        res = runner.invoke(app, ["run", "--preset", "tiny", "--dp", "2", "-n", "2", "-q",
                                  "-o", str(tmp_path / "x"), *extra])  # fmt: skip
        assert res.exit_code == 1 and match in str(res.exception), res.output
        assert not (tmp_path / "x").exists()


# ---- the analysis and the check on a hand-built run ---------------------------------------
def _two_replicas(path, heavy_share: int, queued: bool = True):
    """Replica 0 serves `heavy_share` requests for each one replica 1 serves, all alike
    (prompt 20, output 10), each replica's steps back to back from its first request:
    replica 0 is busy `heavy_share` times as long. `queued`: all arrive at once (and wait
    their turn), else each arrives as its replica gets to it."""
    from perfdiag.traces.schema import Request, RequestEvent, Step
    from perfdiag.traces.writer import RunWriter

    ms = 1_000_000
    t0 = 10**12
    reqs, events, steps = [], [], []
    sid = 0
    for replica, n in ((0, heavy_share * 4), (1, 4)):
        t = t0
        for i in range(n):
            rid = f"r{replica}-{i}"
            reqs.append(Request(rid, 20, 10, 0, "length", replica=replica))
            came = t0 if queued else t
            events += [
                RequestEvent(rid, "arrival", came),
                RequestEvent(rid, "queued", came),
                RequestEvent(rid, "scheduled", t, "engine", sid),
                RequestEvent(rid, "first_token", t + 5 * ms, "engine", sid, 1),
            ]
            for _ in range(2):  # two 5 ms steps per request, one after another
                waiting = 1 if queued and t > t0 else 0
                steps.append(Step(sid, t, t + 5 * ms, num_waiting=waiting, replica=replica,
                                  kv_blocks_used=2, kv_blocks_free=8))  # fmt: skip
                sid += 1
                t += 5 * ms
            events.append(RequestEvent(rid, "finished", t, "engine", sid - 1))
    config = {"data_parallel": {"size": 2, "router": "weighted:3,1"},
              "run_options": {"engine": {"dp": 2, "router": "weighted:3,1"}}}  # fmt: skip
    with RunWriter(path, command=["test"], config=config, environment_info={}) as w:
        w.table("requests").extend(reqs)
        w.table("request_events").extend(events)
        w.table("steps").extend(steps)
    return load_run(path)


def test_the_imbalance_model_on_a_three_to_one_split(tmp_path):
    a = analyze_replicas(_two_replicas(tmp_path / "run", 3))
    per = a.per_replica.set_index("replica")
    assert list(per["requests"]) == [12, 4]
    assert a.imbalance == pytest.approx(1.5)  # 12 of 16 requests' tokens: 0.75 / 0.5
    assert a.busiest == 0 and a.idlest == 1
    # replica 0 busy 120 ms of a 120 ms span; beyond an even share: 120 × (1 − 1/1.5)
    assert a.span_s == pytest.approx(0.120)
    assert a.excess_s == pytest.approx(0.040) and a.excess_share == pytest.approx(1 / 3)
    # replica 1 had nothing from 40 ms on while replica 0 held requests back until 120
    assert a.lost_s == pytest.approx(0.080, abs=0.006)
    assert a.queue_excess_s > 0
    assert a.balanced_imbalance == pytest.approx(1.0)


def test_an_even_split_is_not_an_imbalance(tmp_path):
    a = analyze_replicas(_two_replicas(tmp_path / "run", 1))
    assert a.imbalance == pytest.approx(1.0) and a.excess_share == pytest.approx(0.0)
    assert a.lost_s == pytest.approx(0.0)


def test_the_check_names_the_replica_and_advises_a_balanced_router(tmp_path):
    from perfdiag.playbooks.evaluate import run_triage
    from perfdiag.playbooks.facts import TriageContext

    triage = run_triage(TriageContext(_two_replicas(tmp_path / "run", 3)))
    f = triage.by_check("dp-imbalance")
    assert f is not None and f.severity == "critical"  # 33 % of the run ≥ 20 %
    assert "Replica 0" in f.title and "weighted:3,1" in f.title
    assert f.action.flags == "--router least-loaded"
    even = run_triage(TriageContext(_two_replicas(tmp_path / "even", 1)))
    fired = even.by_check("dp-imbalance")
    assert fired is None or fired.severity == "info"


def test_dp_1_records_one_engine_as_before(tmp_path):
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["run", "--preset", "tiny", "-n", "4", "--warmup", "0",
                                   "--no-device-sampling", "-q", "-o", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    run = load_run(out)
    assert run.steps["replica"].isna().all() and run.requests["replica"].isna().all()
    assert "data_parallel" not in run.manifest.config and "router" not in run.manifest.extra
    assert list(run.steps["step_id"]) == list(range(len(run.steps)))  # the engine's own ids
    assert analyze_replicas(run) is None


def test_a_skew_its_users_did_not_pay_for_is_at_most_a_warning(tmp_path):
    from perfdiag.playbooks.evaluate import run_triage
    from perfdiag.playbooks.facts import TriageContext

    run = _two_replicas(tmp_path / "run", 3, queued=False)
    assert analyze_replicas(run).excess_share == pytest.approx(1 / 3)
    f = run_triage(TriageContext(run)).by_check("dp-imbalance")
    assert f is not None and f.severity == "warning"  # the same TTFT and ITL on both


def test_the_export_gives_each_replica_its_scheduler_lane(dp_run, tmp_path):
    out = tmp_path / "trace.json"
    res = CliRunner().invoke(app, ["export", str(dp_run.path), "-f", "chrome", "-o", str(out)])
    assert res.exit_code == 0, res.output
    events = json.loads(out.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e["name"] == "process_name"}  # fmt: skip
    lanes: dict[str, set[int]] = {}
    for e in events:
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("step "):
            lanes.setdefault(names[e["pid"]], set()).add(e["args"]["step_id"])
    assert set(lanes) == {"Scheduler · replica 0", "Scheduler · replica 1"}
    steps = dp_run.steps
    for r in (0, 1):  # each replica's steps, and only them, on its lane
        mine = set(steps.loc[steps["replica"] == r, "step_id"])
        assert lanes[f"Scheduler · replica {r}"] == mine

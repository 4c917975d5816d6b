"""Findings: ranking (qualifiers, root causes, consequences), the gate on broken data,
findings.json, report.md with figures, and runs that lack tables (steps not evaluated,
with the reason)."""

import json
import math
from pathlib import Path

import pytest
import serving_runs as runs
import yaml
from typer.testing import CliRunner

from perfdiag import load_run
from perfdiag.analyzers.findings import Evidence, Finding, value_text
from perfdiag.cli import app
from perfdiag.playbooks.evaluate import _rank, queue_share_without_loss, run_triage
from perfdiag.playbooks.facts import TriageContext
from perfdiag.playbooks.schema import load_playbook
from perfdiag.traces.schema import Request, Step

KINETO = Path(__file__).parent / "data" / "kineto_excerpt.json"


@pytest.fixture(autouse=True)
def wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps at the terminal's width


def cli(*args):
    result = CliRunner().invoke(app, [*map(str, args)], terminal_width=200)
    assert result.exit_code == 0, result.output
    return result.stdout


def _check(cid, fact="run_status", extra=None):
    return {
        "id": cid,
        "fact": fact,
        "in": ["x"],
        "severity": "warning",
        "title": cid,
        "explanation": "e",
        "next": ["n"],
        **(extra or {}),
    }


@pytest.fixture
def chain_book(tmp_path):
    """gate g; step 1 r; step 2 a (root); step 3 b follows a; step 4 c follows b; d free."""
    data = {
        "playbook": "t",
        "title": "t",
        "steps": [
            {"step": 0, "title": "gate", "explanation": "e", "checks": [_check("g")]},
            {"step": 1, "title": "one", "explanation": "e", "checks": [_check("r")]},
            {"step": 2, "title": "two", "explanation": "e", "checks": [_check("a")]},
            {
                "step": 3,
                "title": "three",
                "explanation": "e",
                "checks": [_check("b", extra={"consequence_of": ["a"]})],
            },
            {
                "step": 4,
                "title": "four",
                "explanation": "e",
                "checks": [_check("c", extra={"consequence_of": ["b"]}), _check("d")],
            },
        ],
    }
    path = tmp_path / "chain.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_playbook(path)


def _f(check, step, severity, impact):
    return Finding(check, step, "", severity, check, "", (), (), (), (), 0.0, impact)


def test_ranking_puts_qualifiers_then_root_causes_then_consequences(chain_book):
    findings = [
        _f("c", 4, "critical", 0.9),  # follows b, which follows a: a's consequence
        _f("d", 4, "warning", 0.9),
        _f("b", 3, "critical", 0.8),
        _f("a", 2, "warning", 0.1),
        _f("r", 1, "warning", 0.5),
        _f("g", 0, "info", 0.0),
    ]
    ranked = _rank(findings, chain_book)
    # a explains two critical findings: it ranks as critical, before the warning d
    assert [f.check for f in ranked] == ["r", "a", "d", "c", "b", "g"]
    assert [f.rank for f in ranked] == [1, 2, 3, 4, 5, 6]
    by = {f.check: f for f in ranked}
    assert by["c"].consequence_of == "a" and by["b"].consequence_of == "a"
    assert by["d"].consequence_of is None and by["a"].consequence_of is None


def test_a_consequence_whose_root_did_not_fire_is_a_root(chain_book):
    ranked = _rank([_f("b", 3, "critical", 0.5), _f("d", 4, "warning", 0.9)], chain_book)
    assert [f.check for f in ranked] == ["b", "d"]  # critical before warning
    assert ranked[0].consequence_of is None


def _share_check(cid, extra=None):
    ladder = {"at_least": {"warning": 0.25, "critical": 0.4}, "time_share": True}
    if cid == "lost":
        ladder = {**ladder, "slows_everything": True}
    c = _check(cid, "ttft_part_share", {**ladder, **(extra or {})})
    c["params"] = {"part": "input_s"}
    del c["in"], c["severity"]
    return c


def _f_value(check, step, severity, value):
    return Finding(check, step, "", severity, check, "", (), (), (), (), value, value)


def test_a_time_lost_explains_a_share_of_time_only_as_far_as_it_goes(tmp_path):
    """A root that slows everything alike explains a share of time only when that share,
    less the root's, would fall below its threshold; a queue (not a share) is explained
    whatever the root's size."""
    queue = {**_check("q", "ttft_part_share", {"consequence_of": ["lost"]}),
             "params": {"part": "queue_s"}, "at_least": 0.3}  # fmt: skip
    del queue["in"]
    data = {"playbook": "t", "title": "t", "steps": [
        {"step": 2, "title": "two", "explanation": "e", "checks": [_share_check("lost")]},
        {"step": 3, "title": "three", "explanation": "e", "checks": [
            _share_check("slow", {"consequence_of": ["lost"]}), queue]},
    ]}  # fmt: skip
    path = tmp_path / "shares.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    book = load_playbook(path)

    def ranked(lost, slow):
        found = [_f_value("lost", 2, "warning", lost), _f_value("slow", 3, "critical", slow),
                 _f_value("q", 3, "warning", 0.9)]  # fmt: skip
        return {f.check: f for f in _rank(found, book)}

    small = ranked(lost=0.11, slow=0.6)  # 0.6 - 0.11 is still above 0.25: its own cause
    assert small["slow"].consequence_of is None and small["slow"].rank == 1
    assert small["slow"].cause == ("in part from", "lost")
    assert small["q"].consequence_of == "lost"
    large = ranked(lost=0.45, slow=0.6)  # without the lost time, 0.15: below 0.25
    assert large["slow"].consequence_of == "lost" and large["lost"].rank == 1
    assert large["slow"].cause == ("follows from", "lost") and large["lost"].cause is None


def test_the_root_of_a_critical_finding_is_named_before_a_larger_warning():
    """CI's tp-slow-rank run: a small neighbour (warning) beside a collective wait
    (warning) that explains a critical communication share — the wait is what to fix."""
    book = load_playbook()
    found = [_f("host-contention", 4, "warning", 0.3), _f("collective-wait", 4, "warning", 0.1),
             _f("comm-share", 4, "critical", 0.6)]  # fmt: skip
    ranked = _rank(found, book)
    assert [f.check for f in ranked][:2] == ["collective-wait", "host-contention"]
    assert ranked[2].consequence_of == "collective-wait"


def test_a_queue_follows_the_largest_of_the_roots_that_explain_it():
    """A queue behind slow input (critical) and a small neighbour (warning) is the
    input's: the neighbour, first in the playbook's list, does not take it."""
    book = load_playbook()
    found = [_f_value("host-contention", 4, "warning", 0.12),
             _f_value("slow-input", 3, "critical", 0.5),
             _f_value("over-capacity", 2, "critical", 0.4)]  # fmt: skip
    by = {f.check: f for f in _rank(found, book)}
    assert by["over-capacity"].consequence_of == "slow-input"
    assert by["slow-input"].rank == 1 and by["host-contention"].rank == 2


def test_a_queue_at_light_load_is_not_a_small_neighbours():
    """CI's bursty run: arrivals in bursts make 41 % of TTFT queue wait at an engine busy
    16 % of the time; a neighbour taking 12 % of step time shortens that queue only a
    little, so the bursts stay the cause. On an engine busy 97 % of the time the same
    neighbour makes the queue (Kingman: wait ∝ ρ / (1 − ρ)); at 90 % busy the queue
    without it would still fire, so the bursts stay a cause of their own."""
    book = load_playbook()

    def ranked(busy):
        busy_evidence = (Evidence("engine_busy_pct", "engine busy", busy, "%"),)
        found = [Finding("host-contention", 4, "", "warning", "", "", (), busy_evidence, (), (),
                         0.12, 0.12),
                 _f_value("bursty-load", 2, "warning", 0.41),
                 _f_value("queue-dominates-ttft", 3, "critical", 0.53)]  # fmt: skip
        return {f.check: f for f in _rank(found, book)}

    light = ranked(busy=0.16)
    assert light["bursty-load"].consequence_of is None and light["bursty-load"].rank == 1
    assert light["queue-dominates-ttft"].consequence_of == "bursty-load"
    loaded = ranked(busy=0.97)
    assert loaded["bursty-load"].consequence_of == "host-contention"
    assert loaded["host-contention"].rank == 1
    busy = ranked(busy=0.9)
    assert busy["bursty-load"].consequence_of is None
    assert busy["bursty-load"].cause == ("in part from", "host-contention")
    unknown = ranked(busy=float("nan"))  # no load known: the neighbour takes the queue
    assert unknown["bursty-load"].consequence_of == "host-contention"


def test_a_closed_loops_queue_is_its_limits_not_a_neighbours():
    """Issue 35's case: 8 clients under a sequence cap of 2 beside an 11 % neighbour, the
    engine busy 99 % of the time. In a closed loop the queue is structural — n clients
    under a cap c wait about (n − c) / c service times each whatever the service time —
    so the neighbour explains none of it (not even in part): the cap is named first. The
    same queue in an open loop at that load is the neighbour's (Kingman)."""
    book = load_playbook()

    def ranked(loop):
        busy = (Evidence("engine_busy_pct", "engine busy", 0.99, "%"),)
        queue = (Evidence("loop", "arrivals", loop),)
        found = [Finding("host-contention", 4, "", "warning", "", "", (), busy, (), (),
                         0.11, 0.11),
                 Finding("queue-dominates-ttft", 3, "", "critical", "", "", (), queue, (), (),
                         0.7, 0.7)]  # fmt: skip
        return {f.check: f for f in _rank(found, book)}

    closed = ranked("closed loop")
    assert closed["queue-dominates-ttft"].rank == 1
    assert closed["queue-dominates-ttft"].consequence_of is None
    assert closed["queue-dominates-ttft"].in_part_from is None
    opened = ranked("open loop")
    assert opened["queue-dominates-ttft"].consequence_of == "host-contention"


def test_gaps_between_the_steps_of_a_sliced_prompt_are_the_slicings():
    """test_advice's sliced run: prompts cut into 14 steps of 16 tokens wait through 14
    gaps between steps instead of one (26-29 % of TTFT locally; in one CI run this was
    named first) — the slicing is what to fix."""
    book = load_playbook()
    found = [_f_value("ttft-host-gaps", 3, "critical", 0.45),
             _f_value("chunk-too-small", 3, "warning", 0.3)]  # fmt: skip
    by = {f.check: f for f in _rank(found, book)}
    assert by["chunk-too-small"].rank == 1
    assert by["ttft-host-gaps"].consequence_of == "chunk-too-small"


def test_a_sliced_prompts_host_gaps_are_host_bounds_unless_the_slicing_stands_alone():
    """chunk-too-small counts the host gaps between a prompt's steps (g2007-0002: 51 ms a
    step, 6.9 steps a prompt: 0.11 of TTFT without them, 0.53 with). With the gaps gone
    (`without_host_bound`) a slicing still above its threshold is a cause of its own;
    below it, the gaps are host-bound's and so is the finding."""
    book = load_playbook()

    def ranked(without):
        alone = (Evidence("without_host_bound", "share without the gaps", without),)
        found = [_f_value("host-bound", 3, "critical", 0.61),
                 Finding("chunk-too-small", 3, "", "critical", "", "", (), alone, (), (),
                         0.52, 0.52)]  # fmt: skip
        return {f.check: f for f in _rank(found, book)}

    stands = ranked(0.18)["chunk-too-small"]
    assert stands.consequence_of is None and stands.rank == 2
    assert stands.cause == ("in part from", "host-bound")
    assert ranked(0.05)["chunk-too-small"].consequence_of == "host-bound"


def test_bursts_at_the_slots_load_are_no_neighbours():
    """g2004-0008: bursts make 27 % of TTFT (the queue 71 %) in an open loop whose engine
    steps 61 % of the time, beside a neighbour taking 41 %. Read as if the bursts' part
    were the whole queue at the engine's busy share, they fall to 12 % without it (the
    neighbour's). The bursts are a part of the queue, which shrinks by Kingman's factor
    as a whole, and the queue's ρ is the sequence slots' load (arrivals × service ÷
    slots: 0.47): the bursts keep ~19 % — a cause of their own."""
    book = load_playbook()

    def ranked(*queue):
        busy = (Evidence("engine_busy_pct", "engine busy", 0.61, "%"),)
        found = [Finding("host-contention", 4, "", "warning", "", "", (), busy, (), (),
                         0.41, 0.41),
                 Finding("bursty-load", 2, "", "warning", "", "", (), queue, (), (),
                         0.268, 0.268)]  # fmt: skip
        return {f.check: f for f in _rank(found, book)}["bursty-load"]

    assert queue_share_without_loss(0.268, 0.41, 0.61) < 0.15
    assert ranked().consequence_of == "host-contention"
    whole = Evidence("queue_pct", "queue", 0.71, "%")
    slots = Evidence("slot_load", "slots' load", 0.47, "%")
    found = ranked(whole, slots)
    assert found.consequence_of is None and found.cause == ("in part from", "host-contention")
    share = queue_share_without_loss(0.71, 0.41, 0.47) * 0.268 / 0.71
    assert 0.15 < share < 0.25


def test_the_slots_load_is_arrivals_times_service_over_the_slots_where_the_cap_held():
    from types import SimpleNamespace

    import pandas as pd

    from perfdiag.playbooks.facts_load import _slot_load

    def ctx(replicas):
        steps = pd.DataFrame({"replica": replicas}) if replicas else pd.DataFrame()
        return SimpleNamespace(run=SimpleNamespace(steps=steps))

    cap = SimpleNamespace(binding="max_num_seqs", max_num_seqs=4)
    assert _slot_load(ctx([]), cap, 33.36, 0.0562) == pytest.approx(33.36 * 0.0562 / 4)
    assert _slot_load(ctx([0, 1, 0]), cap, 33.36, 0.0562) == pytest.approx(33.36 * 0.0562 / 8)
    kv = SimpleNamespace(binding="kv_blocks", max_num_seqs=4)  # another limit held it
    assert math.isnan(_slot_load(ctx([]), kv, 33.36, 0.0562))
    assert math.isnan(_slot_load(ctx([]), None, 33.36, 0.0562))


def test_a_queue_without_the_loss():
    assert queue_share_without_loss(0.4, 0.0, 0.5) == pytest.approx(0.4)  # no loss
    light, heavy = (queue_share_without_loss(0.4, 0.12, b) for b in (0.16, 0.97))
    assert 0.3 < light < 0.4 and heavy < 0.15  # the nearer saturation, the more it shrinks
    assert queue_share_without_loss(0.4, 0.12, 1.0) == 0.0  # saturated: the loss's
    assert queue_share_without_loss(0.4, 0.3, 0.2) < queue_share_without_loss(0.4, 0.1, 0.2)


def test_evidence_reads_as_people_write_it():
    assert Evidence("x", "x", 0.423, "%").text() == "42%"
    assert Evidence("x", "x", 0.05, "%").text() == "5.0%"
    assert Evidence("x", "x", 12.345, "ms").text() == "12.3 ms"
    assert Evidence("x", "x", 1234.5, "ms").text() == "1,234 ms"
    assert Evidence("x", "x", 20480, "tokens").text() == "20,480 tokens"
    assert Evidence("x", "x", float("nan"), "ms").text() == "not measured"
    assert Evidence("x", "x", None, "ms").text() == "not measured"
    assert Evidence("x", "x", 0.0, "%").text() == "0%"
    assert Evidence("x", "x", 1.6e-15, "%").text() == "<0.01%"  # rounding noise
    assert Evidence("x", "x", 0.00064, "%").text() == "0.064%"
    assert value_text(1163.67, "ms", signed=True) == "+1,164 ms"
    assert value_text(-0.25, "%", signed=True) == "-25%"
    assert Evidence("x", "x", True).text() == "yes"


def test_the_gate_catches_contradictory_times(tmp_path):
    c, e = runs.client, runs.engine
    events = []
    for i in range(10):
        rid, t = f"r{i}", 10.0 * i
        first = t + 5 if rid != "r3" else t - 1  # r3's first token before it was sent
        events += [
            c(rid, "sent", t),
            c(rid, "first_token", first),
            c(rid, "chunk", first, 1),
            c(rid, "done", t + 6),
            e(rid, "arrival", t + 1),
            e(rid, "first_token", t + 4),
            e(rid, "finished", t + 5),
        ]
    reqs = [Request(f"r{i}", 4, 1, finish_reason="stop") for i in range(10)]
    path = runs.write(tmp_path / "bad", reqs, events)
    triage = run_triage(TriageContext(load_run(path)))
    f = triage.by_check("events-out-of-order")
    assert f is not None and f.severity == "critical"  # 1 of 10 requests > 5 %
    assert f.ids[0].ids == ("r3",)
    assert f in triage.qualifiers and triage.top is not f


def test_the_gate_names_requests_with_missing_milestones(tmp_path):
    c, e = runs.client, runs.engine
    events = []
    for i in range(10):
        rid, t = f"r{i}", 10.0 * i
        events += [c(rid, "sent", t), c(rid, "first_token", t + 5), c(rid, "chunk", t + 5, 1)]
        events += [c(rid, "done", t + 6), e(rid, "arrival", t + 1), e(rid, "finished", t + 5)]
        if rid not in ("r2", "r5", "r7"):  # three requests lose their engine first token
            events.append(e(rid, "first_token", t + 4))
    reqs = [Request(f"r{i}", 4, 1, finish_reason="stop") for i in range(10)]
    path = runs.write(tmp_path / "gaps", reqs, events)
    f = run_triage(TriageContext(load_run(path))).by_check("lifecycles-incomplete")
    assert f is not None and f.severity == "critical"  # 3 of 10: above the 20 % line
    assert f.ids[0].ids == ("r2", "r5", "r7")
    values = {x.name: x.value for x in f.evidence}
    assert values["incomplete"] == 3 and values["missing"] == "engine.first_token ×3"


def test_findings_json_and_the_triage_on_the_terminal(tmp_path):
    path = runs.preempt(tmp_path / "p")
    text = cli("analyze", path)
    assert "Top cause: CRITICAL Preemption storm" in text
    assert text.index("Data and reproducibility") < text.index("Top cause") < text.index("Triage")
    assert "not evaluated: noisy-repeats, repeats-differ — no repeated runs given" in text
    data = json.loads((path / "results" / "findings.json").read_text())
    top = next(f for f in data["findings"] if f["step"] > 1)
    assert data["top"] == top["check"]
    assert top["check"] == "preemption-storm" and top["severity"] == "critical"
    assert {"name": "preemptions", "label": "preemptions", "value": 2, "unit": ""} in top[
        "evidence"
    ]
    assert [s["step"] for s in data["steps"]] == list(range(8))
    assert data["steps"][6]["status"] == "not-evaluated"


def test_report_md_has_the_verdict_evidence_and_figures(tmp_path):
    path = runs.preempt(tmp_path / "p")
    cli("analyze", path)
    report = (path / "results" / "report.md").read_text()
    assert "**Top cause: Preemption storm" in report
    assert "| preemptions | 2 |" in report
    assert "![steps](steps.png)" in report and "## Triage steps" in report
    png = (path / "results" / "steps.png").read_bytes()
    assert png.startswith(b"\x89PNG")


def test_details_and_scenario_focus(tmp_path):
    path = runs.preempt(tmp_path / "p")
    text = cli("analyze", path, "--details", "--scenario", "preemption-storm", "--no-report")
    assert "Preemption storm (present): 1 finding(s) on its route" in text
    assert "steps and their cost" in text  # the detailed tables
    assert not (path / "results" / "report.md").exists()


def test_an_imported_trace_gets_the_steps_it_can(tmp_path):
    out = tmp_path / "imported"
    cli("import", KINETO, "--out", out)
    text = cli("analyze", out)
    # the serving-only steps and checks: said once to apply to no bare trace (issue 36)
    assert "not applicable to a profiler trace without requests" in " ".join(text.split())
    assert "the run lacks requests, request_events" not in text
    assert "host-bound" not in text and "2 Does the load arrive" not in text
    data = json.loads((out / "results" / "findings.json").read_text())
    status = {s["step"]: s["status"] for s in data["steps"]}
    assert 2 not in status and 3 not in status and 5 not in status
    assert {"host-bound", "kv-exhausted", "client-back-pressure"} <= set(data["not_applicable"])
    assert status[0] in ("pass", "partial", "fired")
    skipped = [c for s in data["steps"] for c in s["checks"] if c["status"] == "not-evaluated"]
    assert skipped and all(c["reason"] for c in skipped)
    tables = [f["title"] for f in data["findings"] if f["check"] == "tables-missing"]
    assert not any("requests" in t or "steps" in t for t in tables)  # a trace has none to miss


def test_repeats_measure_the_noise_and_must_share_a_configuration(tmp_path):
    a = runs.steady(tmp_path / "a", lasts_ms=50)
    b = runs.steady(tmp_path / "b", lasts_ms=60)  # the same configuration, slower
    text = cli("analyze", a, "--repeat", b, "--no-report")
    assert "Repeats of this configuration vary by up to 18%" in text
    data = json.loads((a / "results" / "findings.json").read_text())
    noisy = next(f for f in data["findings"] if f["check"] == "noisy-repeats")
    assert noisy["severity"] == "warning"
    assert {e["name"]: e["value"] for e in noisy["evidence"]}["ttft_p50_spread"] == pytest.approx(
        10 / 55
    )
    assert not any(f["check"] == "repeats-differ" for f in data["findings"])
    c = runs.steady(tmp_path / "c", every_ms=20)  # another arrival rate: not a repeat
    text = cli("analyze", a, "--repeat", c, "--no-report")
    assert "The repeats are not of one configuration: workload.arrival.rate differ" in text


def test_host_time_from_cuda_step_timing(tmp_path):
    # 20 steps of 4 ms wall with 1 ms of GPU work, 1 ms apart, two requests running:
    # host = 3 ms in each step + 1 ms after it = 4 of every 5 ms busy.
    steps = [
        Step(i, runs.ns(5 * i), runs.ns(5 * i + 4), num_decode_seqs=2, num_running=2,
             num_waiting=0, gpu_time_ns=runs.MS)
        for i in range(20)
    ]  # fmt: skip
    path = runs.write(tmp_path / "gpu", [], [], steps)
    triage = run_triage(TriageContext(load_run(path)))
    f = triage.by_check("host-bound")
    assert f is not None and f.severity == "critical"
    values = {e.name: e.value for e in f.evidence}
    assert values["timing"] == "CUDA events"
    assert f.value == pytest.approx((19 * 4 + 3) / (19 * 4 + 3 + 20 * 1))  # no gap after the last


def test_the_gate_reports_a_partial_run_dropped_rows_and_an_empty_profiler_window(tmp_path):
    from perfdiag.traces.writer import RunWriter

    path = tmp_path / "partial"
    w = RunWriter(path, command=["t"], config={}, environment_info={})
    steps = w.table("steps")
    for i in range(10):
        steps.append(Step(i, runs.ns(i), runs.ns(i + 0.5), num_decode_seqs=1, num_running=1))
    with pytest.warns(UserWarning, match="dropped a malformed"):
        steps.append(("not", "a", "step"))
        w.flush()
    w.update_manifest(extra={"profiler_window": {"requested_steps": [50, 60],
                                                 "captured_steps": None,
                                                 "reason": "the run ended first"}})  # fmt: skip
    w.close("interrupted")
    triage = run_triage(TriageContext(load_run(path)))
    gate = {f.check: f for f in triage.qualifiers}
    assert gate["run-incomplete"].title.startswith("The run is interrupted")
    assert gate["dropped-records"].severity == "critical"  # 1 of 11 rows
    assert (
        gate["profiler-window-empty"].title == "The profiler window (50..60) covers no engine step"
    )
    assert "the run ended first" in gate["profiler-window-empty"].explanation


def test_missed_slos_follow_from_the_cause(tmp_path):
    path = runs.preempt(tmp_path / "p")
    cli("analyze", path, "--slo", "ttft=5ms", "--no-report")
    data = json.loads((path / "results" / "findings.json").read_text())
    slo = next(f for f in data["findings"] if f["check"] == "slo-missed")
    assert slo["value"] == 0.0 and slo["severity"] == "critical"  # D 5.5 ms, F 12.2 ms
    assert slo["consequence_of"] == "preemption-storm" and data["top"] == "preemption-storm"

"""The diagnosis fault generator (benchmarks/diagnosis/generate.py) and its report
(report.py): deterministic draws, magnitudes on both sides of every threshold, labels by
construction, the report's arithmetic on made-up results, the held-out banner."""

from __future__ import annotations

import dataclasses
import importlib
import math
import sys
from collections import Counter
from pathlib import Path

import pytest

from perfdiag.playbooks.schema import load_playbook

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
generate = importlib.import_module("benchmarks.diagnosis.generate")
report = importlib.import_module("benchmarks.diagnosis.report")
diagnosis_main = importlib.import_module("benchmarks.diagnosis.__main__")
kv_model = importlib.import_module("benchmarks.diagnosis.kv_model")

DRAWS = [generate.draw(0, i) for i in range(500)]


def test_a_draw_is_deterministic_per_seed_and_index():
    assert generate.draw(3, 17) == generate.draw(3, 17)
    assert generate.draw(3, 17) != generate.draw(4, 17)
    # the index-th draw does not depend on how many are drawn
    assert generate.draw(0, 5) == DRAWS[5]


def test_the_mix_holds_healthy_single_and_two_fault_draws():
    counts = Counter(len(d.faults) for d in DRAWS)
    assert 0.18 < counts[0] / len(DRAWS) < 0.32  # ~25 % healthy
    assert counts[1] > counts[2] > 50
    for d in DRAWS:
        if len(d.faults) == 2:
            a, b = (generate.BY_NAME[f.cls] for f in d.faults)
            assert not (a.knobs & b.knobs) and a.pairable and b.pairable
            assert len({a.loop, b.loop} - {None}) <= 1


def test_every_class_is_drawn_on_both_sides_of_its_threshold():
    sides: dict[str, set] = {c.name: set() for c in generate.CLASSES}
    for d in DRAWS:
        for f in d.faults:
            sides[f.cls].add(generate.label_relative(f, d) >= 1)
    assert all(s == {True, False} for s in sides.values()), sides


def test_the_rules_are_the_playbooks_warning_thresholds():
    playbook = load_playbook(ROOT / "playbooks" / "triage.yaml")
    warning = {c.id: c.threshold for s in playbook.steps for c in s.checks}
    for c in generate.CLASSES:
        assert c.rule == pytest.approx(warning[c.check]), c.name


def _calibration(**kw):
    base = dict(capacity_rps=20.0, ttft_s=0.01, e2e_s=0.1, fixed_s=0.002, token_s=4e-5,
                step_s=0.005, host_share=0.2)  # fmt: skip
    return generate.Calibration(**(base | kw))


def _one(cls: str, index_from: int = 0):
    return next(d for d in DRAWS[index_from:] if [f.cls for f in d.faults] == [cls])


def test_labels_follow_from_the_knobs_by_construction():
    cal = _calibration()
    # over-capacity: the rate is the drawn relative × 1.1 × capacity; the label the
    # schedule's own rate over 1.1 × capacity (load_labels)
    d = _one("over-capacity")
    scenario, (rel,) = generate.build(d, cal)
    assert scenario.workload["arrival"].rate == pytest.approx(d.faults[0].relative * 1.1 * 20.0)
    planned = generate.schedule_rate(scenario.options().workload)
    assert rel == pytest.approx(planned / 1.1 / 20.0)
    # seq-cap: clients over the cap against 1 + 0.3/0.7 · TTFT/E2E
    d = _one("seq-cap")
    scenario, (rel,) = generate.build(d, cal)
    k, c = d.faults[0].knobs["clients"], d.faults[0].knobs["cap"]
    assert scenario.engine["max_seqs"] == c and scenario.workload["arrival"].concurrency == k
    assert rel == pytest.approx(k / c / (1 + 0.3 / 0.7 * 0.1))
    # slow input: d / (d + TTFT) = 0.25 × relative
    d = _one("slow-input")
    scenario, (rel,) = generate.build(d, cal)
    delay = scenario.faults.input_delay_ms / 1e3
    assert delay / (delay + 0.01) == pytest.approx(0.25 * rel, rel=1e-3)
    # prefix cache off: the share of prompt tokens a cache could serve, exactly
    d = _one("prefix-cache-off")
    scenario, (rel,) = generate.build(d, cal)
    p = scenario.workload["shared_prefix"]
    rest = sum(d.prompt) / 2
    share = (1 - p.groups / d.requests) * (p.length // 16 * 16) / (p.length + rest)
    assert scenario.engine["prefix_cache"] is False and rel == pytest.approx(share / 0.2)
    # a healthy draw injects nothing and stays under the cap
    d = next(d for d in DRAWS if not d.faults and d.loop == "closed")
    scenario, rels = generate.build(d, cal)
    assert rels == [] and scenario.faults is None and scenario.neighbours == 0
    assert scenario.workload["arrival"].concurrency <= scenario.engine["max_seqs"]


def test_kv_too_small_pools_sit_where_the_closed_loop_model_crosses_the_rule():
    """A kv-too-small draw's pool is `relative` times smaller than the one at which the
    closed-loop model (kv_model.py) predicts 0.1 preemptions per request, so the model
    predicts the rule fires above ×1 and not below. The old label (clients × a mean
    request's blocks at its final length) put ×1.15 at pools the model gives 0.01-0.07."""
    assert generate.BY_NAME["kv-too-small"].rule == kv_model.THRESHOLD
    cal = _calibration()
    kv = [d for d in DRAWS if [f.cls for f in d.faults] == ["kv-too-small"]][:2]
    for d in kv:
        for rel in (0.87, 1.15):
            drawn = dataclasses.replace(d, faults=(dataclasses.replace(d.faults[0], relative=rel),))
            scenario, (built,) = generate.build(drawn, cal)
            pool = scenario.engine["kv_blocks"]
            loop = generate.kv_loop(drawn, scenario.engine, None)
            assert built == pytest.approx(kv_model.threshold_pool(loop) / pool)
            assert built == pytest.approx(rel, rel=0.03)
            assert (kv_model.preemption_rate(loop, pool) >= 0.1) == (rel >= 1), (d.name, rel)


def test_kv_too_small_prompts_include_a_shared_prefix():
    """Paired with prefix-cache-off, every prompt carries the shared prefix: the model's
    prompts (and the longest request the pool must hold) are that much longer."""
    d = next(d for d in DRAWS if {f.cls for f in d.faults} == {"kv-too-small", "prefix-cache-off"})
    scenario, _ = generate.build(d, _calibration())
    prefix = scenario.workload["shared_prefix"]
    loop = generate.kv_loop(d, scenario.engine, prefix)
    assert loop.prompt == (d.prompt[0] + prefix.length, d.prompt[1] + prefix.length)
    assert scenario.engine["kv_blocks"] > loop.longest


def test_client_cap_threshold_is_the_poisson_tail():
    for cap in (1, 2, 3):
        x = generate.threshold_in_flight(cap)
        tail = 1 - sum(math.exp(-x) * x**i / math.factorial(i) for i in range(cap))
        assert tail == pytest.approx(0.05, abs=1e-6)
    assert generate.threshold_in_flight(1) == pytest.approx(-math.log(0.95), rel=1e-6)


def _run(draw, faults, top3, critical=(), warning=(), k=0):
    return {"draw": draw, "workload_seed": k, "preset": "tiny", "loop": "open",
            "faults": [{"class": c, "check": chk, "relative": r} for c, chk, r in faults],
            "top": top3[0] if top3 else "none", "top3": list(top3),
            "critical": list(critical), "warning": list(warning), "record_s": 2.0}  # fmt: skip


def test_report_arithmetic_on_made_up_results():
    oc = ("over-capacity", "over-capacity")
    runs = [
        _run("a", [(*oc, 0.3)], ["bursty-load"]),  # below threshold, missed
        _run("a", [(*oc, 0.7)], ["over-capacity"], k=1),  # below, found
        _run("b", [(*oc, 1.2)], ["over-capacity"]),
        _run("b", [(*oc, 2.5)], ["host-contention", "over-capacity"], k=1),  # miss: not top
        # two faults above: both in the top three counts, a third place is enough
        _run(
            "c",
            [(*oc, 1.1), ("slow-input", "slow-input", 1.6)],
            ["over-capacity", "x", "slow-input"],
        ),
        _run(
            "d",
            [(*oc, 1.1), ("slow-input", "slow-input", 1.6)],
            ["over-capacity", "x", "y", "slow-input"],
        ),
        # healthy: every seed counts
        _run("h", [], [], k=0),
        _run("h", [], ["step-inflation"], critical=["step-inflation"], k=1),
        _run("i", [], ["itl-prefill-interference"], warning=["itl-prefill-interference"]),
    ]
    s = report.summarise(runs)
    assert s["healthy_runs"] == 3 and s["healthy_critical"] == 1 and s["healthy_warning"] == 1
    assert s["single_above"] == [1, 2]
    assert s["double_above"] == [1, 2]
    curve = s["curve"]["over-capacity"]
    assert curve == [[0, 1], [1, 1], [3, 3], [0, 0], [0, 1]]
    assert s["curve"]["slow-input"] == [[0, 0], [0, 0], [0, 0], [1, 2], [0, 0]]
    assert s["confusion"]["over-capacity"] == {"over-capacity": 1, "host-contention": 1}
    assert s["confusion"]["(healthy)"] == {"none": 1, "step-inflation": 1,
                                           "itl-prefill-interference": 1}  # fmt: skip
    assert len(s["misses"]) == 2 and "×2.50" in s["misses"][0]
    text = "\n".join(report.lines(s))
    assert "healthy runs (all seeds) with a critical finding: 1/3" in text
    assert "1/2 (50 %)" in text


def test_a_label_whose_range_straddles_the_threshold_is_not_scored():
    """A neighbour labelled x1.4 whose floor is x0 (the engine's demand between one core
    and its busy cores) is scored neither above nor below: its runs count on their own
    line, and a floor at or above the threshold scores as before."""
    nb = {"class": "neighbour", "check": "host-contention", "relative": 1.4}
    tb = {"class": "token-budget", "check": "chunk-too-small", "relative": 1.8}
    runs = [
        _run("a", [], ["chunk-too-small"]),  # faults set below
        _run("b", [], ["chunk-too-small"]),
        _run("c", [], ["x"]),
        _run("d", [], ["host-contention"]),
    ]
    runs[0]["faults"] = [tb, {**nb, "relative_low": 0.0}]  # straddles: not scored
    runs[1]["faults"] = [tb, {**nb, "relative_low": 1.1}]  # above: a miss
    runs[2]["faults"] = [{**nb, "relative_low": 0.5}]  # straddles, one fault
    runs[3]["faults"] = [{**nb, "relative": 0.9, "relative_low": 0.2}]  # below
    s = report.summarise(runs)
    assert s["double_above"] == [0, 1] and s["single_above"] == [0, 0]
    assert len(s["straddling"]) == 2 and "neighbour ×0.00–1.40" in " ".join(s["straddling"])
    assert len(s["misses"]) == 1 and "neighbour ×1.10–1.40" in s["misses"][0]
    text = "\n".join(report.lines(s))
    assert "not scored: a label whose range straddles its threshold" in text
    # reports written before floors existed score as they did
    assert report.above({"relative": 1.2}) and not report.straddles({"relative": 1.2})


def test_held_out_seeds_print_the_banner(monkeypatch, capsys):
    assert generate.held_out(1000) and not generate.held_out(999)
    monkeypatch.setattr(generate, "run_draw", lambda d, root, seeds: [])
    assert diagnosis_main.main(["--generate", "1", "--seed", "1000", "--no-verify"]) == 0
    assert generate.HELD_OUT_BANNER in capsys.readouterr().out
    assert diagnosis_main.main(["--generate", "1", "--seed", "7", "--no-verify"]) == 0
    assert generate.HELD_OUT_BANNER not in capsys.readouterr().out


def test_bad_generator_arguments_are_one_line_and_exit_1(capsys):
    assert diagnosis_main.main(["--generate", "0"]) == 1
    assert capsys.readouterr().out.startswith("error:")


def test_summary_counts_false_alarms_over_every_seed_and_names_why_not_applicable():
    rows = [
        {"expected": "none critical", "ok": True, "seeds": [True, False], "stable": True,
         "advice": None, "seconds": 1.0},
        {"expected": "slow-input", "ok": True, "seeds": [True, True], "stable": True,
         "seconds": 1.0, "advice": {"verdict": "not applicable", "kind": "code"}},
        {"expected": "host-contention", "ok": True, "seeds": [True], "stable": None,
         "seconds": 1.0, "advice": {"verdict": "not applicable", "kind": "environment"}},
    ]  # fmt: skip
    text = "\n".join(diagnosis_main.summary(rows))
    assert "critical false alarms on healthy runs (all seeds): 1/2" in text
    assert "1 code, 1 environment" in text and "code changes" not in text


def test_two_tiny_draws_record_calibrate_and_triage(tmp_path):
    # a healthy closed loop and a slow-input fault below its threshold, 16 requests each
    results = []
    for index in (13, 2):
        d = generate.draw(0, index, requests=16)
        assert d.preset == "tiny" and d.loop == "closed"
        results += generate.run_draw(d, tmp_path, seeds=1)
    healthy, slow = results
    cal = healthy["calibration"]
    assert cal["capacity_rps"] > 0 and 0 < cal["ttft_s"] < cal["e2e_s"]
    assert 0 < cal["fixed_s"] < cal["step_s"] * 10 and cal["token_s"] > 0
    assert healthy["faults"] == [] and not healthy["critical"]
    assert slow["faults"][0]["class"] == "slow-input"
    drawn = generate.draw(0, 2).faults[0].relative
    assert slow["faults"][0]["relative"] == pytest.approx(drawn, abs=1e-3)
    assert len(slow["top3"]) <= 3 and slow["record_s"] > 0


def test_requests_change_nothing_else_in_a_draw():
    for i in range(50):
        a, b = generate.draw(0, i), generate.draw(0, i, requests=16)
        assert b.requests == 16 and a == dataclasses.replace(b, requests=a.requests)


def test_every_draw_builds_an_engine_the_engine_accepts(monkeypatch):
    """Seed 1's dev run stopped at a draw the engine refused (no chunking with a token
    budget below the context): every draw, base and with its faults applied, must be a
    configuration the engine takes."""
    cal = generate.Calibration(10.0, 0.05, 0.2, 0.01, 2e-4, 0.03, 0.01)
    # kv-too-small's pool at its floor, the smallest the generator sets (the model's
    # threshold pool costs ~1 s a draw; its own tests are in test_diagnosis_kv_model.py)
    monkeypatch.setattr(generate, "_threshold_pool", lambda loop: loop.longest + 1)
    for d in DRAWS + [generate.draw(1, i) for i in range(500)]:
        scenario, _ = generate.build(d, cal)
        scenario.options().engine.engine_config()  # raises ConfigError when refused


def test_draws_record_with_the_cpu_sampler_as_a_user_does():
    """perfdiag run samples CPU by default, and that sampler is what tells another
    process's load from the engine's: a generator that switched it off judged the
    neighbour class without its evidence (seed 1000: 8 of 14 lone neighbour runs missed)."""
    cal = generate.Calibration(10.0, 0.05, 0.2, 0.01, 2e-4, 0.03, 0.01)
    for d in DRAWS[:5]:
        scenario, _ = generate.build(d, cal)
        assert scenario.options().probes.device_sampling


def test_reports_of_several_seeds_combine_from_their_saved_results(tmp_path, capsys):
    import json

    oc = ("over-capacity", "over-capacity")
    a = [_run("a", [(*oc, 1.2)], ["over-capacity"])]
    b = [_run("b", [(*oc, 1.5)], ["host-contention"]), _run("h", [], [])]
    for name, runs in (("a", a), ("b", b)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"runs": runs}))
    assert report.main([str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    assert capsys.readouterr().out.splitlines() == report.lines(report.summarise(a + b))
    assert report.main([str(tmp_path / "missing.json")]) == 1
    assert "not a generator report" in capsys.readouterr().out


def test_the_neighbour_label_is_fair_sharing_with_the_engines_cores():
    """Runnable threads share the cores: the engine's T busy cores beside L·cores of
    burners wait 1 − cores / (T + L·cores) of the time. The old label (busy share ·
    b/(1 + b)) called one burner on two cores x3.3 where the one-thread engine lost 2 %
    (seed 2000's g2000-0072); a one-thread engine beside one burner on two cores loses
    nothing by this model."""
    d = next(d for d in DRAWS if [f.cls for f in d.faults] == ["neighbour"])
    per_core, cores = d.faults[0].knobs["per_core"], generate.machine_cores()
    for engine in (1.0, 1.6):
        scenario, (rel,) = generate.build(d, _calibration(engine_cores=engine))
        expected = max(0.0, 1 - cores / (engine + per_core * cores)) / 0.1
        assert rel == pytest.approx(expected) and scenario.neighbours == per_core
    assert generate.label_relative(d.faults[0], d) == pytest.approx(
        max(0.0, 1 - cores / (1 + per_core * cores)) / 0.1
    )
    one = generate.Fault("neighbour", float("nan"), {"per_core": 1 / cores})
    assert generate.relative_of(one, d, _calibration(engine_cores=1.0)) == 0


def test_the_neighbour_labels_floor_counts_one_core_of_engine_demand():
    """Fair sharing needs the engine's demand, known between its stepping thread's one
    core and its calibrated busy cores (which count spinning intra-op threads): the floor
    is the label at one core, and a one-core engine's label is its own floor."""
    d = next(d for d in DRAWS if [f.cls for f in d.faults] == ["neighbour"])
    cores = generate.machine_cores()
    f = generate.Fault("neighbour", float("nan"), {"per_core": 0.4})
    two = _calibration(engine_cores=1.6)
    rel = generate.relative_of(f, d, two)
    floor = generate.relative_floor(f, two, rel)
    assert floor == pytest.approx(max(0.0, 1 - cores / (1 + 0.4 * cores)) / 0.1)
    assert floor < rel
    one = _calibration(engine_cores=1.0)
    assert generate.relative_floor(f, one, generate.relative_of(f, d, one)) == pytest.approx(
        generate.relative_of(f, d, one)
    )
    other = generate.Fault("host-bound", 1.3, {})
    assert generate.relative_floor(other, two, 1.3) == 1.3


def test_a_long_prefix_beside_long_prompts_leaves_room_for_outputs():
    """Seed 2003's draw 85 (cold-starvation's 128-token prefix, chunk-too-small's
    192-384-token prompts, tiny's 512-token context) drew outputs of -4..-8 tokens and
    stopped the held-out run: the prompts give way."""
    d = generate.draw(2003, 85)
    assert 1 <= d.output[0] <= d.output[1]
    assert d.prefix[1] + d.prompt[1] + d.output[1] <= generate.CONTEXT[d.preset] - 8
    for seed, index in ((4, 3), (4, 169), (8, 102)):
        d = generate.draw(seed, index)
        assert 1 <= d.output[0] <= d.output[1]
    cal = generate.Calibration(10.0, 0.05, 0.2, 0.01, 2e-4, 0.03, 0.01)
    generate.build(d, cal)[0].options().engine.engine_config()


def test_a_draw_the_engine_refuses_is_reported_not_fatal(tmp_path, monkeypatch, capsys):
    """A refused draw stopped seed 2003's held-out run at its 86th draw and lost the 170
    runs before it (no report was written): it is now listed and the run goes on."""
    import json

    from benchmarks.diagnosis import __main__ as cli
    from perfdiag.errors import ConfigError

    def run_draw(d, root, seeds):
        if d.index == 1:
            raise ConfigError("need 1 <= low <= high, got -4..-8")
        return [{**_run(d.name, [], [], k=k), "cause": "nothing", "top_severity": ""}
                for k in range(seeds)]  # fmt: skip

    monkeypatch.setattr(generate, "run_draw", run_draw)
    out = tmp_path / "r.json"
    assert cli.main(["--generate", "3", "--seed", "5", "--seeds", "1", "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert len(saved["runs"]) == 2
    refused = {"draw": "g5-0001", "error": "need 1 <= low <= high, got -4..-8"}
    assert saved["not_recorded"] == [refused]
    assert "not recorded: g5-0001" in capsys.readouterr().out


def test_a_tight_pool_stretches_ttft_in_the_kv_model_and_a_roomy_one_does_not():
    """slow-input's label beside kv-too-small (g2005-0042: ×1.35 labelled, 0.046 of TTFT
    measured under a queue of 84 %): the pool's waits and re-queues lengthen the steps
    from a send to its first token, by the same replay that labels the pool."""
    loop = kv_model.ClosedLoop(clients=8, requests=32, prompt=(32, 96), output=(16, 48),
                               max_seqs=8, budget=512, chunk=256)  # fmt: skip
    at = kv_model.threshold_pool(loop)
    assert kv_model.ttft_stretch(loop, loop.clients * loop.longest + 1) == pytest.approx(1.0)
    assert kv_model.ttft_stretch(loop, at) > 1.5
    assert kv_model.ttft_stretch(loop, max(loop.longest + 1, at // 2)) >= kv_model.ttft_stretch(
        loop, at
    )

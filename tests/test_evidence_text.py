"""What users read in a finding's evidence (issue 37 item 7): no empty rows (the default
run's itl-prefill-interference carried a "token budget" row with nothing in it), and a
step cost the model could not identify reads "not identified", never "0 µs"."""

from __future__ import annotations

import dataclasses

import pytest
import tui_runs

from perfdiag import load_run
from perfdiag.playbooks.facts import Fact, TriageContext, evaluate_fact
from perfdiag.playbooks.schema import load_playbook


@pytest.fixture(scope="module")
def demo_ctx(tmp_path_factory):
    return TriageContext(load_run(tui_runs.demo(tmp_path_factory.mktemp("ev") / "demo")))


def _facts(ctx):
    for step in load_playbook().steps:
        for check in step.checks:
            got = evaluate_fact(check.fact, ctx, dict(check.params))
            if isinstance(got, Fact):
                yield check.id, got


def test_no_fact_gives_an_empty_evidence_row(demo_ctx):
    seen = 0
    for check, f in _facts(demo_ctx):
        for e in f.evidence:
            seen += 1
            assert e.text().strip(), f"{check}: evidence {e.name!r} ({e.label}) is empty"
    assert seen > 50  # the run exercises most facts


def test_itl_interference_names_no_token_budget_row_it_cannot_fill(demo_ctx):
    f = evaluate_fact("itl_tail_share", demo_ctx, {"cause": "interference"})
    assert "budget_advice" not in {e.name for e in f.evidence}


def _unidentified(ctx):
    """The run's step cost model as if its steps could not price a prefill token apart
    from its chunk (the chunk term kept, the token term dropped)."""
    cost = ctx.get("step_cost")
    terms = tuple(t for t in cost.terms if t != "prefill_tokens")
    fake = dataclasses.replace(cost, per_prefill_token_s=0.0, terms=terms)
    ctx.serving = dataclasses.replace(ctx.serving, step_cost=fake)
    return ctx


@pytest.mark.parametrize("fact_name", ["chunk_overhead", "step_inflation"])
def test_an_unidentified_token_cost_reads_not_identified(tmp_path, fact_name):
    ctx = _unidentified(TriageContext(load_run(tui_runs.demo(tmp_path / "demo"))))
    f = evaluate_fact(fact_name, ctx, {})
    assert isinstance(f, Fact), f
    rows = {e.label: e.text() for e in f.evidence}
    assert rows["per prefill token"].startswith("not identified"), rows
    from perfdiag.playbooks import template

    check = next(c for s in load_playbook().steps for c in s.checks if c.fact == fact_name)
    text = template.render(check.explanation, f.values())
    assert "0 µs" not in text and "not measured" not in text, text


def _render(check_id: str, part: str, **values) -> str:
    from perfdiag.playbooks import template

    return template.render(getattr(load_playbook().check(check_id), part), values)


def test_verdict_lines_give_their_numbers_units():
    regressed = _render("latency-regressed", "title", metric="TTFT p50", relative=0.12,
                        a=100.0, b=112.0, unit="ms")  # fmt: skip
    assert "(100.00 → 112.00 ms)" in regressed, regressed
    why = _render("latency-regressed", "explanation", ci_low=4.0, ci_high=20.0, worse="x",
                  unit="ms")  # fmt: skip
    assert "4.00 to 20.00 ms" in why, why
    little = _render("littles-law", "title", value=0.2, lambda_w=1.19, client_l=1.5)
    assert "1.19 requests" in little and "1.50 requests" in little, little
    drawn = _render("schedule-vs-target", "title", planned_rps=1.8, target_rps=2.0)
    assert drawn.endswith("2.0 req/s"), drawn


def test_the_regression_fact_provides_its_unit():
    from perfdiag.playbooks.facts import load_registry

    assert "unit" in load_registry()["latency_regression"].provides

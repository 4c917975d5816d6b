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

    check = next(
        c for s in load_playbook().steps for c in s.checks if c.fact == fact_name
    )
    text = template.render(check.explanation, f.values())
    assert "0 µs" not in text and "not measured" not in text, text

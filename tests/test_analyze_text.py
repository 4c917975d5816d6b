"""What `perfdiag analyze --details` says (issue 37 item 7): two completion rates in one
output each say which requests they count, and a step cost the model could not identify
reads "not identified", never "0.000"."""

from __future__ import annotations

import dataclasses
import re

import pytest
import tui_runs

from perfdiag import load_run
from perfdiag.analyzers.serving import analyze_serving
from perfdiag.cli import analyze_tables
from perfdiag.cli.app import out


@pytest.fixture(scope="module")
def serving(tmp_path_factory):
    return analyze_serving(load_run(tui_runs.demo(tmp_path_factory.mktemp("at") / "demo")))


def _text(fn, *args) -> str:
    # Restore the private field, not the width read back: setting `out.width` to what it
    # reads fixes a width that was dynamic (COLUMNS), and later tests then wrap at 80.
    saved = out._width
    out.width = 200
    try:
        with out.capture() as cap:
            fn(*args)
    finally:
        out._width = saved
    return cap.get()


def _row(text: str, start: str) -> str:
    lines = [x for x in text.splitlines() if start in x]
    assert lines, (start, text)
    return lines[0]


def test_each_completion_rate_says_which_requests_it_counts(serving):
    text = _text(analyze_tables.print_tables, serving)
    done = _row(text, "requests/s (completed")
    assert "warm-up excluded" in done, done
    load = _row(text, "completions")
    assert load is not done and "warm-up included" in load, load


def _prices(text: str) -> list[str]:
    cell = _row(text, "per prefill token").split("(µs)")[1].strip(" │")
    return [x.strip(" │") for x in cell.split(" / ")]


def test_an_unidentified_prefill_token_price_is_said_so(serving):
    cost = serving.step_cost
    assert "prefill_tokens" in cost.terms
    known = _prices(
        _text(analyze_tables._scheduler, serving.composition, cost, serving.preemptions)
    )
    assert re.fullmatch(r"[\d,.]+", known[0]), known
    terms = tuple(t for t in cost.terms if t != "prefill_tokens")
    fake = dataclasses.replace(cost, per_prefill_token_s=0.0, terms=terms)
    prices = _prices(
        _text(analyze_tables._scheduler, serving.composition, fake, serving.preemptions)
    )
    assert prices[0] == "not identified", prices
    # the demo's steps cannot price context tokens either: no "0.0000" for them
    assert "context_tokens" not in cost.terms and prices[2] == "not identified", prices

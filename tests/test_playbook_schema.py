"""Playbooks load and validate: the packaged ones are complete, and every way a playbook
can be malformed is one PlaybookError naming the file, the place and the problem."""

import copy

import pytest
import yaml
from typer.testing import CliRunner

from perfdiag.cli import app
from perfdiag.errors import PerfdiagError
from perfdiag.playbooks import template
from perfdiag.playbooks.facts import load_registry
from perfdiag.playbooks.schema import (
    SCENARIOS_FILE,
    TRIAGE_FILE,
    Condition,
    PlaybookError,
    load_playbook,
    load_scenarios,
)

BASE = yaml.safe_load(TRIAGE_FILE.read_text())


def test_the_packaged_playbooks_cover_the_gate_and_the_seven_steps():
    book = load_playbook()
    assert [s.step for s in book.steps] == [0, 1, 2, 3, 4, 5, 6, 7]
    facts = load_registry()
    for step in book.steps:
        assert step.checks, f"step {step.step} has no checks"
        for check in step.checks:
            assert check.fact in facts
    scenarios = {s.id for s in load_scenarios(book)}
    assert scenarios == {
        "high-ttft",
        "itl-spikes",
        "low-throughput",
        "preemption-storm",
        "multi-gpu-scaling",
    }


def _write(tmp_path, data, name="book.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _mutate(fn):
    data = copy.deepcopy(BASE)
    fn(data)
    return data


def _check(data, check_id):
    return next(c for s in data["steps"] for c in s["checks"] if c["id"] == check_id)


BROKEN = {
    "unknown fact": (
        lambda d: _check(d, "slow-input").update(fact="tokenizer_speed"),
        "steps[3].checks[0] (slow-input): unknown fact 'tokenizer_speed'",
    ),
    "missing parameter": (
        lambda d: _check(d, "slow-input").pop("params"),
        "needs parameter 'part'",
    ),
    "bad parameter choice": (
        lambda d: _check(d, "slow-input").update(params={"part": "gpu_s"}),
        "parameter 'part' must be one of",
    ),
    "unknown parameter": (
        lambda d: _check(d, "host-bound").update(params={"cause": "x"}),
        "fact 'host_share' has no parameter 'cause'",
    ),
    "unknown template field": (
        lambda d: _check(d, "host-bound").update(title="host {gpu_ms:.1f} ms"),
        "fact 'host_share' provides no gpu_ms",
    ),
    "attribute access in a template": (
        lambda d: _check(d, "host-bound").update(title="{value.__class__}"),
        "use a plain lowercase name",
    ),
    "conversion in a template": (
        lambda d: _check(d, "host-bound").update(title="{value!r}"),
        "no conversions",
    ),
    "two conditions": (
        lambda d: _check(d, "host-bound").update(below=0.1),
        "give exactly one condition",
    ),
    "thresholds out of order": (
        lambda d: _check(d, "host-bound").update(at_least={"warning": 0.6, "critical": 0.5}),
        "thresholds must get higher with severity",
    ),
    "unknown severity": (
        lambda d: _check(d, "host-bound").update(at_least={"fatal": 0.5}),
        "keys must be severities",
    ),
    "single threshold without severity": (
        lambda d: _check(d, "host-bound").update(at_least=0.5),
        "needs a `severity`",
    ),
    "a warning without next": (
        lambda d: _check(d, "host-bound").pop("next"),
        "needs `next`",
    ),
    "duplicate id": (
        lambda d: _check(d, "host-bound").update(id="slow-input"),
        "duplicate id 'slow-input'",
    ),
    "unknown consequence": (
        lambda d: _check(d, "host-bound").update(consequence_of=["gremlins"]),
        "consequence_of names 'gremlins'",
    ),
    "consequence cycle": (
        lambda d: _check(d, "slow-input").update(consequence_of=["host-bound"]),
        "cycle",
    ),
    "unknown figure": (
        lambda d: _check(d, "host-bound").update(figures=["flamegraph"]),
        "unknown figure 'flamegraph'",
    ),
    "unknown key": (
        lambda d: _check(d, "host-bound").update(eval="1+1"),
        "unknown keys eval",
    ),
    "steps out of order": (
        lambda d: d["steps"].reverse(),
        "steps run 0 (the gate) to 7, in order",
    ),
    "missing title": (
        lambda d: _check(d, "host-bound").pop("title"),
        "missing `title`",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_malformed_playbook_names_the_file_and_the_problem(tmp_path, case):
    mutate, message = BROKEN[case]
    path = _write(tmp_path, _mutate(mutate))
    with pytest.raises(PlaybookError) as err:
        load_playbook(path)
    assert str(err.value).startswith(f"{path}: ")
    assert message in str(err.value)
    assert isinstance(err.value, PerfdiagError)


def test_bad_yaml_and_a_missing_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("playbook: x\nsteps: [\n")
    with pytest.raises(PlaybookError, match=r"bad\.yaml: line \d+: not valid YAML"):
        load_playbook(path)
    with pytest.raises(PlaybookError, match="cannot read it"):
        load_playbook(tmp_path / "absent.yaml")


def test_scenarios_must_route_into_known_checks(tmp_path):
    data = yaml.safe_load(SCENARIOS_FILE.read_text())
    data["scenarios"][0]["route"].append("no-such-check")
    path = _write(tmp_path, data, "scenarios.yaml")
    with pytest.raises(PlaybookError, match=r"high-ttft\): route names unknown checks no-such"):
        load_scenarios(load_playbook(), path)


def test_the_cli_reports_a_malformed_playbook_in_one_line(tmp_path, sample_run):
    path = _write(tmp_path, _mutate(lambda d: _check(d, "host-bound").update(fact="nope")))
    result = CliRunner().invoke(app, ["analyze", str(sample_run[0]), "--playbook", str(path)])
    assert result.exit_code == 1
    assert isinstance(result.exception, PlaybookError)
    assert "unknown fact 'nope'" in str(result.exception)


def test_conditions_pick_the_most_severe_level_reached():
    c = Condition("at_least", (("warning", 0.2), ("critical", 0.5)))
    assert [c.severity(v) for v in (0.1, 0.2, 0.49, 0.5, 3)] == [
        None,
        "warning",
        "warning",
        "critical",
        "critical",
    ]
    assert c.severity(float("nan")) is None and c.severity(None) is None
    assert c.severity(True) is None  # a flag is not a number
    below = Condition("below", (("info", 50), ("warning", 20)))
    assert [below.severity(v) for v in (60, 30, 10)] == [None, "info", "warning"]
    assert Condition("in", (("warning", ["crashed"]),)).severity("crashed") == "warning"
    assert Condition("equals", (("warning", True),)).severity(False) is None


def test_templates_fill_plain_values_only():
    assert template.render("{a:.1f} ms, {b:.0%}, {c}", {"a": 1.26, "b": 0.5, "c": "x"}) == (
        "1.3 ms, 50%, x"
    )
    nan = float("nan")
    assert template.render("{a:d} {missing} {n:.1f}", {"a": 2.5, "n": nan}) == (
        "2.5 not measured not measured"
    )
    # a bracketed clause is left out when one of its values is missing
    text = "swap {s} tokens[, saving {ms:.0f} ms ({p:.0%} of step time)]"
    assert template.render(text, {"s": 3, "ms": nan, "p": 0.1}) == "swap 3 tokens"
    assert template.render(text, {"s": 3, "ms": 12.0, "p": 0.1}) == (
        "swap 3 tokens, saving 12 ms (10% of step time)"
    )
    assert template.render("{advice}", {"advice": None}) == ""  # advice without ground
    assert template.render("{flag}", {"flag": True}) == "yes"
    for bad in ("{a.b}", "{a[0]}", "{a!s}", "{a:{b}}", "{A}"):
        with pytest.raises(template.TemplateError):
            template.fields(bad)

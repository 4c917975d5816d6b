"""A training trace is not a serving run: the triage steps and pins that need requests or
engine steps are listed once as "not applicable to a training trace", never as missing
data ("the run does not record: engine configuration, workload seed", "cannot tell: High
TTFT, ITL spikes"). A serving run keeps all of them."""

import json

import pytest
from conftest import KINETO

from perfdiag.analyzers.serving import analyze_serving
from perfdiag.playbooks.applicability import SERVING_FACTS, trace_kind
from perfdiag.playbooks.evaluate import run_triage
from perfdiag.playbooks.facts import TriageContext, evaluate_fact
from perfdiag.playbooks.schema import load_playbook, load_scenarios
from perfdiag.traces.importers.kineto import import_kineto
from perfdiag.traces.reader import load_run

TRAINING = KINETO / "mi250_rocm.json.gz"  # a training step: MseLossBackward0, autograd
INFERENCE = KINETO / "a100_alexnet_cuda_sync.json.gz"  # forward passes only
PHRASE = "not applicable to a training trace"


@pytest.fixture(scope="module")
def training(tmp_path_factory):
    out = tmp_path_factory.mktemp("training") / "run"
    import_kineto([TRAINING], out)
    return out


def test_the_serving_facts_are_facts_the_playbook_uses():
    playbook = load_playbook()
    used = {c.fact for s in playbook.steps for c in s.checks}
    used |= {s.symptom_fact for s in load_scenarios(playbook)}
    assert used >= SERVING_FACTS, SERVING_FACTS - used


def test_a_training_trace_is_told_once_what_does_not_apply(training, cli):
    r = cli("analyze", str(training))
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())  # rich wraps lines
    assert text.count(PHRASE) == 1, text
    assert "workload seed" not in text and "engine configuration" not in text
    assert "cannot tell" not in text
    for serving in ("client-back-pressure", "slow-input", "itl-host-gaps", "cache-hits",
                    "requests-failed", "host-bound", "few-requests"):  # fmt: skip
        assert serving not in text, serving
    assert "High TTFT" in text.split(PHRASE)[1]  # the serving symptoms, in the one list
    assert "noisy-repeats" in text  # still not evaluated: repeats would apply to training


def test_the_triage_and_its_json_say_what_does_not_apply(training, cli):
    run = load_run(training)
    assert trace_kind(run) == "training"
    ctx = TriageContext(run, analyze_serving(run))
    pins = evaluate_fact("unpinned", ctx, {})
    missing = next(e.value for e in pins.evidence if e.name == "missing")
    assert "workload" not in missing and "engine configuration" not in missing
    triage = run_triage(ctx)
    assert triage.applicability == PHRASE
    assert {"client-back-pressure", "itl-host-gaps", "few-requests"} <= set(triage.not_applicable)
    steps = {s.step: s for s in triage.steps}
    assert 2 not in steps and 3 not in steps and 5 not in steps  # wholly serving steps
    assert all(c.check not in triage.not_applicable for s in triage.steps for c in s.checks)
    assert "high-ttft" in {s.scenario for s in triage.scenarios if s.symptom == "not-applicable"}
    assert cli("analyze", str(training)).returncode == 0
    data = json.loads((training / "results" / "findings.json").read_text())
    assert data["applicability"] == PHRASE
    assert "client-back-pressure" in data["not_applicable"]


def test_a_trace_of_unknown_purpose_says_so(tmp_path):
    import_kineto([INFERENCE], tmp_path / "run")
    run = load_run(tmp_path / "run")
    assert trace_kind(run) == "profiler"
    triage = run_triage(TriageContext(run, analyze_serving(run)))
    assert triage.applicability == "not applicable to a profiler trace without requests"

"""chunk-too-small on recorded runs: long prompts sliced by a tiny chunk or a tiny token
budget pay a step's fixed cost many times; the same prompts with a sensible chunk do
not. The advice names the knob that slices, its value and a larger one."""

import re

import pytest

from perfdiag import load_run
from perfdiag.playbooks.evaluate import run_triage
from perfdiag.playbooks.facts import TriageContext
from perfdiag.probes.run_options import EngineOptions, ProbeOptions, RunOptions
from perfdiag.probes.session import record_run
from perfdiag.probes.workload import ArrivalSpec, LengthSpec, WorkloadSpec


def triage(path, **engine):
    options = RunOptions(
        EngineOptions(preset="tiny", kv_cache_mb=16.0, **engine),
        WorkloadSpec(requests=40, warmup=2, seed=21, arrival=ArrivalSpec("closed", 2),
                     prompt_len=LengthSpec.parse("uniform:160:320"),
                     output_len=LengthSpec.parse("uniform:4:12")),
        ProbeOptions(device_sampling=False),
    )  # fmt: skip
    record_run(options, path, command=["pytest"])
    return run_triage(TriageContext(load_run(path)))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("chunks")
    return {
        "small-chunk": triage(root / "a", chunk_size=24),
        "small-budget": triage(root / "b", chunk_size=512, max_batched_tokens=26),
        "control": triage(root / "c", chunk_size=512),
    }


def test_a_tiny_chunk_is_named_with_a_larger_one(runs):
    f = runs["small-chunk"].by_check("chunk-too-small")
    assert f is not None and f.severity in ("warning", "critical"), runs["small-chunk"].findings
    advice = f.recommendations[0]
    size = int(re.search(r"--chunk-size (\d+) \(now 24\)", advice).group(1))
    assert size > 24


def test_a_tiny_budget_is_named_as_the_budget(runs):
    f = runs["small-budget"].by_check("chunk-too-small")
    assert f is not None and f.severity in ("warning", "critical")
    budget = re.search(r"--max-batched-tokens (\d+) \(now 26", f.recommendations[0])
    assert budget and int(budget.group(1)) > 26


def test_the_same_prompts_in_one_chunk_raise_nothing(runs):
    f = runs["control"].by_check("chunk-too-small")
    assert f is None or f.severity == "info"


def test_the_step_count_is_said_of_a_prompt_whose_count_changes():
    from perfdiag.playbooks.facts_scheduling import _steps_phrase

    assert _steps_phrase(300, 600, 256, 64) == (
        "a prompt of the mean length (300 tokens) then takes 2 steps instead of 5"
    )
    # The mean prompt fits one slice before and after: the longest one is what changes.
    assert _steps_phrase(30, 200, 256, 32) == (
        "the longest prompt (200 tokens) then takes 1 step instead of 7"
    )

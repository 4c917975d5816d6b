"""Step 4's pipeline checks: pp-bubbles (advice with the micro-batch count, priced),
pp-stage-imbalance (the layers to move), pp-scaling (PP against another layout of the
same cores), on synthetic stage timelines and on a real `perfdiag run --pp 2`."""

from __future__ import annotations

from types import SimpleNamespace

from test_pipeline_analysis import _gpipe, _run

from perfdiag.playbooks import facts_pipeline as F
from perfdiag.playbooks.facts import TriageContext, Unavailable


def _ctx(run, baseline=None):
    return TriageContext(run, serving=SimpleNamespace(), baseline=baseline)


def _value(fact, name):
    return next(e.value for e in fact.evidence if e.name == name)


def test_too_few_microbatches_fire_with_a_priced_count():
    fact = F.pp_bubbles(_ctx(_run(_gpipe(2, 1, [10, 10]), 2, 1, requests=8)))
    assert fact.value == 0.5  # (2 − 1)/(1 + 2 − 1)
    # 20 % needs m = 4: fill and drain 1/5, forward (1 − 1/5)/(1 − 1/2) = 0.625 of now
    assert _value(fact, "m_new") == 4
    assert "--pp-microbatches 4" in _value(fact, "advice") and "×0.62" in _value(fact, "advice")
    assert fact.action.flags == "--pp-microbatches 4" and fact.max_severity is None


def test_bubbles_without_requests_to_split_are_info_only():
    fact = F.pp_bubbles(_ctx(_run(_gpipe(2, 1, [10, 10]), 2, 2, requests=1)))
    assert fact.value == 0.5 and fact.max_severity == "info" and fact.action is None
    assert "--concurrency" in _value(fact, "advice")


def test_slow_stage_names_the_layers_to_move():
    run = _run(_gpipe(2, 4, [10, 20]), 2, 4, layers=[[0, 4], [4, 8]])
    fact = F.pp_stage_imbalance(_ctx(run))
    assert fact.value == 1 - 15 / 20
    assert _value(fact, "slowest") == 1
    assert "Move layer 4 from stage 1 to stage 0: --pp-layers 5,3 (now 4,4)" in _value(
        fact, "advice"
    )
    assert fact.action.flags == "--pp-layers 5,3"


def test_no_pipeline_is_not_evaluated():
    run = _run([], 2, 2)
    assert isinstance(F.pp_bubbles(_ctx(run)), Unavailable)
    assert isinstance(F.pp_stage_imbalance(_ctx(run)), Unavailable)


def test_pp_run_triage_puts_bubbles_first(cli, tmp_path):
    """A run with one micro-batch over two stages and six requests a step: pp-bubbles
    fires and asks for more micro-batches."""
    from perfdiag import load_run
    from perfdiag.playbooks.evaluate import run_triage

    out = tmp_path / "run"
    args = ("--preset", "tiny", "-n", "12", "--closed", "--concurrency", "6", "--prompt-len", "16",
            "--output-len", "8", "--no-device-sampling")  # fmt: skip
    result = cli("run", *args, "--pp", "2", "--pp-microbatches", "1", "--out", out)
    assert result.returncode == 0, result.stderr
    triage = run_triage(TriageContext(load_run(out)))
    pp = [f for f in triage.findings if f.check == "pp-bubbles"]
    assert pp and pp[0].severity == "critical" and pp[0].value == 0.5
    assert "--pp-microbatches" in pp[0].recommendations[0]
    assert pp[0].action is not None
    scaling = next(o for s in triage.steps for o in s.checks if o.check == "pp-scaling")
    assert scaling.status == "not-evaluated"


def test_tp_scaling_leaves_a_pipeline_run_to_pp_scaling():
    """A PP 2 run against a TP 2 baseline is not 'tensor parallelism 2 → 1'."""
    from perfdiag.playbooks.facts_parallel import tp_scaling

    pp_run = _run(_gpipe(2, 2, [10, 10]), 2, 2)
    tp_run = _run([], 2, 2)
    tp_run.manifest.config = {"parallel": {"tensor_parallel_size": 2}}
    got = tp_scaling(_ctx(pp_run, baseline=_ctx(tp_run)))
    assert isinstance(got, Unavailable) and "pp-scaling" in got.reason

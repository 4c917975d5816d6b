"""The speculative-decoding diagnosis scenarios (benchmarks/diagnosis/scenarios.py) on the
reference engine: a draft too slow for its acceptance names spec-no-speedup first, with
draft time as what eats the gain; K far from optimal names spec-k-mismatch first, and its
advised K, applied by a re-run (playbooks/verify.py), raises the output tokens/s."""

from __future__ import annotations

import pytest
from scenario_module import sc

from perfdiag import load_run
from perfdiag.analyzers.serving import analyze_serving
from perfdiag.playbooks.facts import TriageContext
from perfdiag.playbooks.verify import verify

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", ["spec-slow-draft", "spec-slow-draft-b", "spec-k-far-b"])
def test_the_top_finding_names_the_speculative_cause(tmp_path, name):
    s = sc.by_name(name)
    triage = s.diagnose(s.record(tmp_path / name, requests=32))
    summary = [(f.check, f.severity, f.consequence_of) for f in triage.findings]
    assert s.verdict(triage), f"{name}: findings {summary}"
    top = triage.top
    assert top.severity in ("warning", "critical") and top.recommendations
    if s.expected == "spec-no-speedup":
        assert "draft time eats it" in top.title


def test_the_advised_k_raises_tokens_per_second_when_verified(tmp_path):
    s = sc.by_name("spec-k-far")
    run = s.record(tmp_path / "k16", requests=32)
    ctx = TriageContext(load_run(run))
    triage = s.diagnose(run)
    top = triage.top
    assert top is not None and top.check == "spec-k-mismatch", [f.check for f in triage.findings]
    setting = top.action.settings[0]
    assert setting.option == "engine.speculative" and setting.now == "ngram:16"
    v = verify(ctx, top, tmp_path / "verified",
               analyze=lambda r: TriageContext(r, analyze_serving(r)))  # fmt: skip
    assert v.target.metric == "throughput.output"
    assert v.target.b > v.target.a, (v.verdict, v.reason)
    after = load_run(tmp_path / "verified").manifest.config["run_options"]["engine"]
    assert after["speculative"] == setting.to

"""The pipeline diagnosis scenarios (benchmarks/diagnosis/scenarios.py) on the reference
engine: two stages over one micro-batch per step name pp-bubbles first, with the
micro-batch count to set."""

from __future__ import annotations

import pytest
from scenario_module import sc

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", ["pp-few-microbatches", "pp-few-microbatches-b"])
def test_too_few_microbatches_name_pp_bubbles_first(tmp_path, name):
    s = sc.by_name(name)
    triage = s.diagnose(s.record(tmp_path / name, requests=24))
    summary = [(f.check, f.severity, f.consequence_of) for f in triage.findings]
    assert s.verdict(triage), f"{name}: findings {summary}"
    top = triage.top
    assert top.severity in ("warning", "critical")
    assert "--pp-microbatches" in top.recommendations[0]
    assert top.action.settings[0].option == "engine.pp_microbatches"

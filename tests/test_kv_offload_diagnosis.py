"""The host-tier diagnosis scenarios (benchmarks/diagnosis/scenarios.py) on the reference
engine: a host tier whose restores (slowed for real by the restore_delay_us fault) cost
more than recomputing the short prefixes names offload-restore-slower first, with the
turn-it-off action."""

from __future__ import annotations

import pytest
from scenario_module import sc

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", ["offload-slow-restore", "offload-slow-restore-b"])
def test_slow_restores_name_offload_restore_slower_first(tmp_path, name):
    s = sc.by_name(name)
    triage = s.diagnose(s.record(tmp_path / name, requests=48))
    summary = [(f.check, f.severity) for f in triage.findings]
    assert s.verdict(triage), f"{name}: findings {summary}"
    top = triage.top
    assert top.severity in ("warning", "critical") and top.recommendations
    assert top.action.settings[0].option == "engine.kv_offload_mb"
    assert top.action.settings[0].to == 0.0

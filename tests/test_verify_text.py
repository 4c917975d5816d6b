"""What `--verify-advice` says (issue 37 item 7): a verdict line gives every number its
unit, and an improvement the comparison cannot pin on the advice — host contention
changed beside it, which the comparison warns of — is inconclusive, never "improved"."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from verify_runs import record_tiny

from perfdiag import load_run
from perfdiag.analyzers.actions import Setting, run_action
from perfdiag.analyzers.compare import make_delta
from perfdiag.analyzers.findings import Finding
from perfdiag.playbooks.facts import TriageContext
from perfdiag.playbooks.verify import _reason, verify
from perfdiag.playbooks.verify_repeats import runs_delta


def _numbers_have_units(text: str, unit: str) -> None:
    """Every "a to b" and "a–b" range in `text` ends with the unit."""
    import re

    for m in re.finditer(r"[-+]?\d[\d.,]*\s*(?:to|–)\s*[-+]?\d[\d.,]*(\s*\S+)?", text):
        assert (m.group(1) or "").strip().startswith(unit), (m.group(0), text)


def test_a_one_run_verdict_gives_its_interval_a_unit():
    d = make_delta("ttft.p50", "TTFT p50", "ms", 100.0, 80.0, -25.0, -15.0, True)
    text = _reason(d, None)
    assert "100.0 → 80.0 ms" in text
    _numbers_have_units(text, "ms")


def test_a_verdict_over_runs_gives_every_interval_a_unit():
    rng = np.random.default_rng(0)
    a = [(rng.normal(0.100, 0.005, 200), np.arange(200)) for _ in range(3)]
    b = [(rng.normal(0.060, 0.005, 200), np.arange(200)) for _ in range(3)]
    spread = runs_delta("ttft.p50", a, b)
    text = _reason(spread.delta, spread)
    _numbers_have_units(text, "ms")
    assert "A " in text and "B " in text


@pytest.fixture(scope="module")
def sliced(tmp_path_factory):
    return record_tiny(tmp_path_factory.mktemp("verify-text") / "sliced", chunk_size=16)


def _contended(ctx: TriageContext, lost: float) -> TriageContext:
    """The run as if other processes had taken `lost` of its step time."""
    host = ctx.serving.host
    assert host is not None and not isinstance(host, type(None))
    host = dataclasses.replace(host, lost_share=lost, others_cores=1.5)
    ctx.serving = dataclasses.replace(ctx.serving, host=host)
    return ctx


def test_host_contention_beside_the_advice_makes_an_improvement_inconclusive(sliced, tmp_path):
    action = run_action("ttft.p50", Setting("engine.chunk_size", 16, 128))
    finding = Finding("chunk-too-small", 3, "", "warning", "t", "", (), (), (), (), 0.5, 0.5,
                      action=action)  # fmt: skip
    a = _contended(TriageContext(load_run(sliced)), 0.0)
    v = verify(a, finding, tmp_path / "b", analyze=lambda run: _contended(TriageContext(run), 0.4))
    assert v.target.verdict == "better"  # the chunk alone would have been "improved"
    names = [ch.name for ch in v.comparison.diff.variables]
    assert "host.cpu_contention" in names and len(names) >= 2  # the comparison's warning
    assert v.verdict == "inconclusive", v.reason
    assert "host.cpu_contention" in v.reason

"""Hand-made runs for the host-contention tests: steps with host evidence beside the CPU
sampler's counters, and the check's figure read both ways (fact and analysis agree)."""

from __future__ import annotations

import pytest

from perfdiag import load_run
from perfdiag.analyzers.serving import analyze_serving
from perfdiag.playbooks.facts import TriageContext, evaluate_fact
from perfdiag.traces.writer import RunWriter


def write_run(path, steps, counters, device: str, cores: int):
    config = {"run_options": {"engine": {"device": device}}}
    with RunWriter(path, command=["test"], config=config,
                   environment_info={"cpu_count": cores}) as w:  # fmt: skip
        for s in steps:
            w.append("steps", s)
        for c in counters:
            w.append("counters", c)
    return load_run(path)


def lost_share(run) -> float:
    """host-contention's value, checked equal to the analysis's lost share."""
    fact = evaluate_fact("host_contention", TriageContext(run), {})
    host = analyze_serving(run).host
    assert fact.value == pytest.approx(host.lost_share)
    return host.lost_share

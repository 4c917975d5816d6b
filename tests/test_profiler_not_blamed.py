"""The profiler's own time is the gate's, never the engine's: a run with a profiler
window is not made host-bound by the window's start/stop stalls (gaps between steps a
probe held) nor by the profiled steps' bookkeeping (issue: the triage blamed the engine
for the profiler's stalls)."""

from __future__ import annotations

from perfdiag import load_run
from perfdiag.playbooks.evaluate import run_triage
from perfdiag.playbooks.facts import TriageContext


def test_host_share_leaves_out_the_profiler(tmp_path, cli):
    run_dir = tmp_path / "run"
    r = cli("run", "--preset", "tiny", "-n", "40", "--warmup", "0", "--closed",
            "--concurrency", "4", "--prompt-len", "uniform:16:64", "--output-len", "16",
            "--profile-steps", "5:25", "--no-device-sampling", "-q", "-o", run_dir)  # fmt: skip
    assert r.returncode == 0, r.stderr
    run = load_run(run_dir)
    triage = run_triage(TriageContext(run))
    gate = triage.by_check("probe-stalls")
    assert gate is not None and gate.severity != "info"  # the stalls are named, in the gate
    (outcome,) = [o for s in triage.steps for o in s.checks if o.check == "host-bound"]
    evidence = {e.name: e.value for e in _fact(triage, run).evidence}
    steps = run.steps["step_id"].nunique()
    assert evidence["steps"] == steps - 21  # the window's 21 steps are left out
    # the start stall alone (seconds) would make a tiny run's host share ~1 if counted
    assert outcome.value < 0.4, f"host share {outcome.value:.2f} counts the profiler"
    f = triage.by_check("host-bound")
    assert f is None or f.consequence_of == "probe-stalls"


def _fact(triage, run):
    from perfdiag.playbooks.facts import evaluate_fact

    return evaluate_fact("host_share", TriageContext(run), {})

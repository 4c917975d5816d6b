"""Advice proven by re-running: apply a finding's action to the run's own options
(`perfdiag run --like` semantics: the same engine, workload, seed, probes and injected
faults, with only the advised options changed), record the run again, and compare.

The verdict is the compare's own (analyzers/compare.py): the targeted metric improved
when its bootstrap interval lies below zero (above, for a throughput), "worse" the other
way, "unchanged" when the interval spans zero. An action that is not a setting (a code
change, a quieter machine), or a run perfdiag cannot re-create (an imported trace, an
HTTP server whose engine it does not configure), is "not applicable", with why. A server
that `perfdiag run --launch` started is relaunched with the advised flag changed and
driven with the same workload and seed.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..analyzers.actions import FLAGS, Action
from ..analyzers.compare import Comparison, MetricDelta
from ..analyzers.findings import Finding, Triage
from ..errors import ConfigError
from ..probes.faults import FaultOptions
from ..probes.run_options import RunOptions
from ..probes.server_args import with_flag
from ..probes.server_launch import LaunchSpec
from ..traces.reader import Run
from .facts import TriageContext

VERDICTS = ("improved", "unchanged", "worse", "not applicable")


@dataclass(frozen=True)
class Verification:
    check: str  # the finding whose advice was applied
    action: Action
    verdict: str  # one of VERDICTS
    reason: str  # in words: what moved, or why it could not be applied
    run_b: str | None = None  # the re-run's directory
    target: MetricDelta | None = None
    comparison: Comparison | None = None
    still_fires: str | None = None  # the finding's severity after, None: it is gone


def chosen_finding(triage: Triage, check: str | None = None) -> Finding | None:
    """The top finding, or the named check's finding."""
    if check is None:
        return triage.top
    found = triage.by_check(check)
    if found is None:
        fired = ", ".join(f.check for f in triage.findings) or "none"
        raise ConfigError(f"no finding {check!r} in this run's triage (fired: {fired})")
    return found


def rerun_options(run: Run, action: Action) -> tuple[RunOptions, FaultOptions | None] | str:
    """The run's options with the action applied, and its faults; or why not."""
    config = run.manifest.config or {}
    recorded = config.get("run_options")
    if not isinstance(recorded, dict):
        return "the run was not recorded by perfdiag run: apply the change where it was made"
    options = RunOptions.from_dict(recorded)
    if action.relaunches:
        return _relaunch(config, options, action)
    if config.get("target") and any(s.option.startswith("engine.") for s in action.settings):
        return (
            "the run drove a server perfdiag does not configure: set "
            f"{action.flags} (or its equivalent) on the server and record again"
        )
    engine, workload = {}, {}
    for s in action.settings:
        section, name = s.option.split(".", 1)
        (engine if section == "engine" else workload)[name] = s.to
    arrival = options.workload.arrival
    if workload:
        arrival = dataclasses.replace(arrival, **workload)
    options = RunOptions(
        engine=dataclasses.replace(options.engine, **engine),
        workload=dataclasses.replace(options.workload, arrival=arrival),
        probes=options.probes,
    )
    faults = config.get("faults")
    return options, FaultOptions(**faults) if isinstance(faults, dict) else None


def _relaunch(config: dict, options: RunOptions, action: Action):
    """The launched server's command with the action's flags changed (the same workload);
    or why it cannot be relaunched."""
    launch = (config.get("server") or {}).get("launch")
    if not isinstance(launch, dict) or not launch.get("argv"):
        return ("the server was started elsewhere: relaunch it with "
                f"{action.flags} and record again")  # fmt: skip
    # A free port for the relaunch: the recorded one may have been picked for that run.
    argv = with_flag(list(launch["argv"]), "--port", None)
    for s in action.settings:
        argv = with_flag(argv, FLAGS[tuple(s.option.split(".", 1))], s.to)
    env = {k: str(v) for k, v in (launch.get("env") or {}).items()}
    return options, LaunchSpec(shlex.join(argv), env=env)


def verify(
    ctx: TriageContext,
    finding: Finding,
    out_dir: Path,
    record: Callable[..., object] | None = None,
    analyze: Callable[[Run], TriageContext] | None = None,
) -> Verification:
    """Re-run `ctx.run` with `finding`'s action into `out_dir` and compare.
    `record(options, out_dir, command=…, faults=…)` defaults to probes.session.record_run;
    `analyze(run)` builds the re-run's context (the same analysis settings as `ctx`)."""
    action = finding.action
    if action is None:
        return _not_applicable(finding, None, "its advice names no setting a re-run can change")
    if action.kind != "run":
        return _not_applicable(finding, action, f"a {action.kind} change: {action.how}")
    got = rerun_options(ctx.run, action)
    if isinstance(got, str):
        return _not_applicable(finding, action, got)
    options, how = got
    command = ["perfdiag", "analyze", str(ctx.run.path), "--verify-advice"]
    if isinstance(how, LaunchSpec):  # a relaunch of the server, the same load against it
        from ..probes.http_session import HttpOptions, record_http_run

        record_http_run(options, out_dir, command=command, http=HttpOptions(launch=how))
    else:
        if record is None:
            from ..probes.session import record_run as record
        record(options, out_dir, command=command, faults=how)
    from ..traces.reader import load_run
    from .comparison import compare

    after = analyze(load_run(out_dir)) if analyze else TriageContext(load_run(out_dir))
    c = compare(ctx, after)
    target = next((d for d in c.deltas if d.metric == action.target), None)
    moved = target.verdict if target is not None else ""
    verdict = {"better": "improved", "worse": "worse"}.get(moved, "unchanged")
    after_finding = _fired(c.triage, finding.check)
    reason = _reason(target, after_finding)
    return Verification(
        finding.check, action, verdict, reason, str(out_dir), target, c, after_finding
    )


def _fired(triage: Triage, check: str) -> str | None:
    f = triage.by_check(check)
    return f.severity if f is not None and f.severity != "info" else None


def _reason(target: MetricDelta | None, after: str | None) -> str:
    if target is None:
        return "the target metric could not be measured in both runs"
    moved = (
        f"{target.label} {target.a:.1f} → {target.b:.1f} {target.unit} "
        f"({target.relative:+.0%}; 95 % interval of the change {target.ci_low:+.1f} to "
        f"{target.ci_high:+.1f})"
    )
    return moved + ("; the finding is gone" if after is None else f"; it still fires ({after})")


def _not_applicable(finding: Finding, action: Action | None, why: str) -> Verification:
    return Verification(finding.check, action or Action("code", ""), "not applicable", why)

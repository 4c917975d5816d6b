"""Advice proven by re-running: apply a finding's action to the run's own options
(`perfdiag run --like` semantics: the same engine, workload, seed, probes and injected
faults, with only the advised options changed), record the run again, and compare.

The metric judged is the check's own, fixed in the playbook (`verify:`) before any run.
With one re-run (`repeats` 1) the verdict is the compare's (analyzers/compare.py): the
target improved when its request-level bootstrap interval lies below zero (above, for a
throughput), "worse" the other way, "inconclusive" when the interval spans zero. With
`repeats` N, side A is the run and N − 1 re-runs with the same options and the same
workload seed (the noise measured is run-to-run, not the workload's), side B N runs with
the advice; the target is judged over runs (verify_repeats.py: improved or worse only
when the change's interval excludes zero and the sides' intervals do not overlap).

Whatever the interval, when the comparison says more than one main variable changed
(another neighbour load, another machine), the difference cannot be pinned on the advice:
inconclusive, with the variables named. An action that is not a setting (a code change,
a quieter machine), or a run perfdiag cannot re-create (an imported trace, an HTTP
server whose engine it does not configure), is "not applicable", with why. A server that
`perfdiag run --launch` started is relaunched for every run (both sides), the advised
flag changed on side B, and driven with the same workload and seed.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..analyzers.actions import FLAGS, Action
from ..analyzers.compare import Comparison, MetricDelta
from ..analyzers.findings import SEVERITIES, Finding, Triage
from ..errors import ConfigError
from ..probes.faults import FaultOptions
from ..probes.run_options import RunOptions
from ..probes.server_args import with_flag
from ..probes.server_launch import LaunchSpec
from ..traces.reader import Run
from .facts import TriageContext
from .verify_repeats import RunsDelta, runs_delta, samples_of

VERDICTS = ("improved", "inconclusive", "worse", "not applicable")


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
    runs_a: tuple[str, ...] = ()  # side A: the run, then its re-runs with the same options
    runs_b: tuple[str, ...] = ()  # side B: the runs with the advice (run_b the first)
    spread: RunsDelta | None = None  # with repeats: each side's interval over its runs
    variables: tuple[str, ...] = ()  # main variables that differ from the run, all runs


def chosen_finding(triage: Triage, check: str | None = None) -> Finding | None:
    """The top finding, or the named check's finding."""
    if check is None:
        return triage.top
    found = triage.by_check(check)
    if found is None:
        fired = ", ".join(f.check for f in triage.findings) or "none"
        raise ConfigError(f"no finding {check!r} in this run's triage (fired: {fired})")
    return found


def rerun_options(
    run: Run, action: Action, apply: bool = True
) -> tuple[RunOptions, FaultOptions | LaunchSpec | None] | str:
    """The run's options with the action applied (`apply` False: as they were, for side
    A's repeats), and its faults or the server's launch; or why it cannot be re-run."""
    config = run.manifest.config or {}
    recorded = config.get("run_options")
    if not isinstance(recorded, dict):
        return "the run was not recorded by perfdiag run: apply the change where it was made"
    options = RunOptions.from_dict(recorded)
    if action.relaunches:
        return _relaunch(config, options, action, apply)
    if config.get("target") and any(s.option.startswith("engine.") for s in action.settings):
        return (
            "the run drove a server perfdiag does not configure: set "
            f"{action.flags} (or its equivalent) on the server and record again"
        )
    engine, workload = {}, {}
    for s in action.settings if apply else ():
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


def _relaunch(config: dict, options: RunOptions, action: Action, apply: bool):
    """The launched server's command with the action's flags changed (the same workload);
    or why it cannot be relaunched."""
    launch = (config.get("server") or {}).get("launch")
    if not isinstance(launch, dict) or not launch.get("argv"):
        return ("the server was started elsewhere: relaunch it with "
                f"{action.flags} and record again")  # fmt: skip
    # A free port for the relaunch: the recorded one may have been picked for that run.
    argv = with_flag(list(launch["argv"]), "--port", None)
    for s in action.settings if apply else ():
        argv = with_flag(argv, FLAGS[tuple(s.option.split(".", 1))], s.to)
    env = {k: str(v) for k, v in (launch.get("env") or {}).items()}
    return options, LaunchSpec(shlex.join(argv), env=env)


def verify(
    ctx: TriageContext,
    finding: Finding,
    out_dir: Path,
    record: Callable[..., object] | None = None,
    analyze: Callable[[Run], TriageContext] | None = None,
    repeats: int = 1,
    record_a: Callable[..., object] | None = None,
) -> Verification:
    """Re-run `ctx.run` with `finding`'s action into `out_dir` and compare; with
    `repeats` N, N runs a side (the run is A's first; B's others go to `out_dir`-b2 …,
    A's re-runs to `out_dir`-a2 …, recorded alternately so drift falls on both sides).
    `record(options, out_dir, command=…, faults=…)` defaults to probes.session.record_run
    (`record_a`, for side A's re-runs, to `record`); `analyze(run)` builds a re-run's
    context (the same analysis settings as `ctx`)."""
    if repeats < 1:
        raise ConfigError(f"--repeats must be at least 1, got {repeats}")
    action = finding.action
    if action is None:
        return _not_applicable(finding, None, "its advice names no setting a re-run can change")
    if action.kind != "run":
        return _not_applicable(finding, action, f"a {action.kind} change: {action.how}")
    advised = rerun_options(ctx.run, action)
    if isinstance(advised, str):
        return _not_applicable(finding, action, advised)
    same = rerun_options(ctx.run, action, apply=False)
    command = ["perfdiag", "analyze", str(ctx.run.path), "--verify-advice"]
    if record is None:
        from ..probes.session import record_run as record

    def one(where: Path, got, rec) -> TriageContext:
        from ..traces.reader import load_run

        options, how = got
        if isinstance(how, LaunchSpec):  # a relaunch of the server, the same load against it
            from ..probes.http_session import HttpOptions, record_http_run

            record_http_run(options, where, command=command, http=HttpOptions(launch=how))
        else:
            rec(options, where, command=command, faults=how)
        return analyze(load_run(where)) if analyze else TriageContext(load_run(where))

    side_a, side_b = [ctx], []
    for k in range(1, repeats + 1):
        side_b.append(one(out_dir if k == 1 else _sibling(out_dir, f"b{k}"), advised, record))
        if k < repeats:
            side_a.append(one(_sibling(out_dir, f"a{k + 1}"), same, record_a or record))
    from .comparison import compare

    c = compare(ctx, side_b[0])
    spread = None
    target = next((d for d in c.deltas if d.metric == action.target), None)
    if repeats > 1:
        a, b = samples_of(side_a, action.target), samples_of(side_b, action.target)
        spread = runs_delta(action.target, a, b) if a is not None and b is not None else None
        target = spread.delta if spread is not None else target
        moved = spread.verdict if spread is not None else ""
    else:
        moved = target.verdict if target is not None else ""
    verdict = {"better": "improved", "worse": "worse"}.get(moved, "inconclusive")
    variables = _variables(ctx, [*side_a[1:], *side_b])
    fired = [_fired(c.triage, finding.check)]
    fired += [_fired(_triage(t), finding.check) for t in side_b[1:]]
    after_finding = max((f for f in fired if f), key=SEVERITIES.index, default=None)
    reason = _reason(target, spread) + _still(fired, after_finding)
    if len(variables) > 1 and verdict in ("improved", "worse"):
        verdict = "inconclusive"
        reason += (
            f"; but {len(variables)} main variables changed ({', '.join(variables)}): "
            "the change cannot be pinned on the advice"
        )
    return Verification(
        finding.check,
        action,
        verdict,
        reason,
        str(out_dir),
        target,
        c,
        after_finding,
        tuple(str(t.run.path) for t in side_a),
        tuple(str(t.run.path) for t in side_b),
        spread,
        variables,
    )


def _sibling(out_dir: Path, tag: str) -> Path:
    return out_dir.with_name(f"{out_dir.name}-{tag}")


def _triage(ctx: TriageContext) -> Triage:
    from .evaluate import run_triage

    return run_triage(ctx)


def _variables(ctx: TriageContext, others: list[TriageContext]) -> tuple[str, ...]:
    """The main variables (configuration, environment, the host's load) in which any
    other run differs from the run itself."""
    from ..analyzers.compare import config_diff

    names: dict[str, None] = {}
    for o in others:
        diff = config_diff(ctx.run.manifest, o.run.manifest, ctx.get("host"), o.get("host"))
        names.update((ch.name, None) for ch in diff.variables)
    return tuple(names)


def _fired(triage: Triage, check: str) -> str | None:
    f = triage.by_check(check)
    return f.severity if f is not None and f.severity != "info" else None


def _reason(target: MetricDelta | None, spread: RunsDelta | None) -> str:
    if target is None:
        return "the target metric could not be measured in both runs"
    u = target.unit
    moved = f"{target.label} {target.a:.1f} → {target.b:.1f} {u} ({target.relative:+.0%}; "
    if spread is None:
        return moved + (
            f"95 % interval of the change {target.ci_low:+.1f} to {target.ci_high:+.1f} {u})"
        )
    (alo, ahi), (blo, bhi) = spread.a_interval, spread.b_interval
    na, nb = spread.runs
    return moved + (
        f"{na} runs against {nb}, 95 % interval of the change over runs {target.ci_low:+.1f} "
        f"to {target.ci_high:+.1f} {u}; A {alo:.1f}–{ahi:.1f} {u}, B {blo:.1f}–{bhi:.1f} {u}"
        f"{', which overlap' if spread.overlap else ''})"
    )


def _still(fired: list[str | None], worst: str | None) -> str:
    """Whether the finding still fired after the advice (`worst`: its worst severity)."""
    if worst is None:
        return "; the finding is gone"
    n = sum(f is not None for f in fired)
    where = "" if len(fired) == 1 else f" in {n} of {len(fired)} runs with the advice"
    return f"; it still fires ({worst}){where}"


def _not_applicable(finding: Finding, action: Action | None, why: str) -> Verification:
    return Verification(finding.check, action or Action("code", ""), "not applicable", why)

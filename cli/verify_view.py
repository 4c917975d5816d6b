"""`perfdiag analyze RUN --verify-advice`: apply the top finding's first advice to the
run's own options, record the run again beside it, and show with `compare` whether the
metric the advice targets improved beyond noise (playbooks/verify.py)."""

from __future__ import annotations

import json
from pathlib import Path

from rich.markup import escape

from .app import out

VERDICT_STYLE = {"improved": "bold green", "inconclusive": "yellow", "worse": "bold red",
                 "not applicable": "dim"}  # fmt: skip


def default_out(run: Path, check: str) -> Path:
    """`<run>-verify-<check>` beside the run, numbered when it exists."""
    base = run.resolve().with_name(f"{run.resolve().name}-verify-{check}")
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def verify_and_print(
    ctx, triage, check: str | None, out_dir: Path | None, analyze, repeats: int = 1
) -> str:
    """Run the verification and print it; returns the verdict."""
    from ..analyzers.serving import to_jsonable
    from ..playbooks.verify import chosen_finding, verify
    from .compare import _deltas, _finding_changes, _variables

    finding = chosen_finding(triage, check)
    if finding is None:
        out.print("[bold]verify advice[/]: no finding to act on — nothing to verify")
        return "not applicable"
    action = finding.action
    out.print(f"\n[bold]verify advice[/] of {finding.check}: ", end="", highlight=False)
    if action is not None and action.kind == "run":
        target = out_dir or default_out(Path(ctx.run.path), finding.check)
        runs = (
            f"{repeats} runs a side (the run and {repeats - 1} re-runs as it was; "
            f"{repeats} with the advice), starting with {target}"
            if repeats > 1
            else str(target)
        )
        out.print(
            f"{escape(action.flags)} (target {action.target}; expected: "
            f"{escape(action.expect or '—')})\n  re-running into {runs} …",
            highlight=False,
        )
    else:
        target = out_dir or Path(ctx.run.path)
    v = verify(ctx, finding, target, analyze=analyze, repeats=repeats)
    if v.comparison is not None:
        _variables(v.comparison.diff, v.comparison.deltas)
        _deltas(v.comparison.deltas)
        _finding_changes(v.comparison)
    style = VERDICT_STYLE[v.verdict]
    out.print(f"[{style}]advice {v.verdict}[/]: {escape(v.reason)}", highlight=False)
    if v.run_b:
        from ..traces.atomic_file import write_atomic

        data = {k: to_jsonable(x) for k, x in dataclass_dict(v).items()}
        results = Path(ctx.run.path) / "results"
        for where in (results, Path(v.run_b) / "results"):
            try:
                where.mkdir(parents=True, exist_ok=True)
                write_atomic(where / "verification.json", json.dumps(data, indent=2) + "\n")
            except OSError:
                pass
    return v.verdict


def dataclass_dict(v) -> dict:
    """The verification without the whole comparison (compare RUN_A RUN_B shows that)."""
    return {
        "check": v.check,
        "action": v.action,
        "verdict": v.verdict,
        "reason": v.reason,
        "run_b": v.run_b,
        "target": v.target,
        "still_fires": v.still_fires,
        "repeats": len(v.runs_b) or None,
        "runs_a": v.runs_a,
        "runs_b": v.runs_b,
        "interval_a": v.spread.a_interval if v.spread else None,
        "interval_b": v.spread.b_interval if v.spread else None,
        "variables": v.variables,
    }

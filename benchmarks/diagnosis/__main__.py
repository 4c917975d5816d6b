"""Run the diagnosis scenarios: is the right cause named first, does the advice work?

    .venv/bin/python -m benchmarks.diagnosis [--only NAME ...] [--seeds N] [--no-verify]
                                             [--fast] [--keep DIR] [--json FILE]

Each scenario records a short run of the reference engine under a broken condition
(scenarios.py), runs the triage on it, and compares the top finding with the expected
cause; the healthy baselines must raise nothing critical. With `--seeds 2` (the default)
every scenario is recorded again with another workload seed, and the two tops must
agree (stability). With verification on (the default), each fault's top finding has its
first advice applied and the run recorded again (playbooks/verify.py, `perfdiag analyze
--verify-advice`): the metric the advice targets must improve beyond noise. Advice that
is a code change cannot be applied by a re-run and is reported as such; "re-run on a
quiet machine" is applied by re-running without the neighbours.

Prints the table and the figures (top-1 accuracy, critical false alarms on healthy
runs, stability, advice verified); exits 1 if a scenario is wrong.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

from .scenarios import HEALTHY, PROBES_ACCOUNTED, SCENARIOS, Scenario, by_name

# CI's subset (about a minute and a half on 2 cores): a healthy run and four fault
# classes whose advice is a setting, each verified by re-running.
FAST = ("healthy", "chunk-too-small", "seq-cap", "cold-starvation", "bursty")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.diagnosis")
    parser.add_argument("--only", nargs="*", default=None, help="scenario names (or prefixes)")
    parser.add_argument("--seeds", type=int, default=2, help="workload seeds per scenario")
    parser.add_argument("--no-verify", action="store_true", help="do not re-run the advice")
    parser.add_argument("--keep", type=Path, default=None, help="keep the runs in this folder")
    parser.add_argument("--json", type=Path, default=None, help="write the results as JSON")
    parser.add_argument(
        "--fast", action="store_true", help=f"CI's subset, one seed: {', '.join(FAST)}"
    )
    args = parser.parse_args(argv)
    if args.fast:
        args.only, args.seeds = args.only or list(FAST), 1
    scenarios = select(args.only) if args.only else list(SCENARIOS)
    rows = []
    with tempfile.TemporaryDirectory(prefix="perfdiag-diagnosis-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        for s in scenarios:
            rows.append(run_scenario(s, root, args.seeds, verify=not args.no_verify))
            print(_line(rows[-1]), flush=True)
    _table(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0 if all(r["ok"] for r in rows) else 1


def run_scenario(s: Scenario, root: Path, seeds: int, verify: bool) -> dict:
    started = time.perf_counter()
    runs = []
    # The README scenarios come in two seeds of their own (and one feeds another's rate).
    for k in range(1 if s.readme else seeds):
        variant = s if k == 0 else reseeded(s, k)
        run_dir = variant.record(root / variant.name)
        runs.append((variant, run_dir, variant.diagnose(run_dir)))
    s0, dir0, triage = runs[0]
    top = triage.top
    row = {
        "scenario": s.name,
        "variant_of": s.variant_of,
        "cause": s.cause,
        "expected": s.expected,
        "top": top.check if top else "none",
        "severity": top.severity if top else "",
        "title": top.title if top else "",
        "critical": sum(f.severity == "critical" for f in triage.findings),
        "gate": ", ".join(f.check for f in triage.qualifiers if f.severity != "info"),
        "ok": s.verdict(triage),
        "seeds": [s.verdict(t) for _, _, t in runs],
        "tops": [t.top.check if t.top else "none" for _, _, t in runs],
        "advice": None,
    }
    row["stable"] = len(set(row["tops"])) == 1 if len(runs) > 1 else None
    if verify and s.expected not in (HEALTHY, PROBES_ACCOUNTED) and top is not None:
        row["advice"] = verify_top(s0, dir0, triage)
    row["seconds"] = round(time.perf_counter() - started, 1)
    return row


def reseeded(s: Scenario, k: int) -> Scenario:
    seed = (s.workload.get("seed") or 1) + 1000 * k
    return dataclasses.replace(s, name=f"{s.name}-seed{seed}", workload=s.workload | {"seed": seed})


def verify_top(s: Scenario, run_dir: Path, triage) -> dict:
    """Apply the top finding's advice and re-run (playbooks/verify.py)."""
    from perfdiag import load_run
    from perfdiag.playbooks.facts import TriageContext
    from perfdiag.playbooks.verify import verify

    top = triage.top
    action = top.action
    if action is not None and action.kind == "environment" and s.neighbours:
        # "Re-run on a quiet machine": the same options, without the burning processes
        # (verify records outside Scenario.record, so no neighbour is started).
        top = dataclasses.replace(top, action=dataclasses.replace(action, kind="run"))
    v = verify(TriageContext(load_run(run_dir)), top, run_dir.with_name(run_dir.name + "-advice"))
    return {
        "check": v.check,
        "flags": v.action.flags if v.action.kind == "run" else v.action.how,
        "kind": v.action.kind,
        "target": v.action.target,
        "verdict": v.verdict,
        "reason": v.reason,
        "a": v.target.a if v.target else None,
        "b": v.target.b if v.target else None,
    }


def select(names: list[str]) -> list:
    """Scenarios by name; a name that is no scenario selects those it prefixes
    (`readme`, `readme-neighbour`)."""
    out = []
    for n in names:
        matched = [s for s in SCENARIOS if s.name.startswith(n)]
        out += [by_name(n)] if any(s.name == n for s in SCENARIOS) or not matched else matched
    return out


def _line(r: dict) -> str:
    adv = r["advice"]
    advice = f"; advice {adv['verdict']}" if adv else ""
    seeds = f" (seeds: {', '.join(r['tops'])})" if len(r["tops"]) > 1 else ""
    return (
        f"  {r['scenario']}: top {r['top']} ({r['severity'] or '-'}){seeds}{advice} "
        f"in {r['seconds']} s"
    )


def _table(rows: list[dict]) -> None:
    head = ("scenario", "expected cause", "top finding", "ok", "seeds", "advice (target)")
    body = []
    for r in rows:
        expected = r["expected"] if r["expected"] != HEALTHY else "nothing critical"
        top = r["top"] if r["expected"] != HEALTHY else f"{r['top']} ({r['critical']} critical)"
        if r["expected"] == PROBES_ACCOUNTED:
            top = f"gate {r['gate'] or 'silent'}; top {r['top']}"
        seeds = "/".join("ok" if x else "NO" for x in r["seeds"])
        adv = r["advice"]
        advice = f"{adv['verdict']} ({adv['target']})" if adv else "–"
        body.append((r["scenario"], expected, top, "yes" if r["ok"] else "NO", seeds, advice))
    widths = [max(len(x[i]) for x in (head, *body)) for i in range(len(head))]
    print()
    print("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in body:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    print()
    for line in summary(rows):
        print(line)


def summary(rows: list[dict]) -> list[str]:
    """The benchmark's figures."""
    faults = [r for r in rows if r["expected"] not in (HEALTHY, PROBES_ACCOUNTED)]
    healthy = [r for r in rows if r["expected"] == HEALTHY]
    runs = [ok for r in rows for ok in r["seeds"]]
    stable = [r for r in rows if r["stable"] is not None]
    verified = [r["advice"] for r in faults if r["advice"]]
    applied = [a for a in verified if a["verdict"] != "not applicable"]
    improved = [a for a in applied if a["verdict"] == "improved"]
    false_alarms = sum(r["critical"] > 0 for r in healthy)
    seconds = sum(r["seconds"] for r in rows)
    classes = {r["expected"] for r in faults}
    return [
        f"{sum(r['ok'] for r in rows)} of {len(rows)} scenarios diagnosed correctly "
        f"({len(classes)} fault classes; {seconds:.0f} s)",
        f"top-1 accuracy on faults (first seed): {sum(r['ok'] for r in faults)}/{len(faults)}",
        f"all seeds: {sum(runs)}/{len(runs)} runs correct",
        f"critical false alarms on healthy runs: {false_alarms}/{len(healthy)}",
        f"stable across seeds (same top): {sum(r['stable'] for r in stable)}/{len(stable)}",
        f"advice verified by re-running: improved the target in {len(improved)}/{len(applied)}"
        f" applicable ({len(verified) - len(applied)} not applicable: code changes)",
    ]


if __name__ == "__main__":
    sys.exit(main())

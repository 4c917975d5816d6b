"""Run the diagnosis scenarios: is the right cause named first, does the advice work?

    .venv/bin/python -m benchmarks.diagnosis [--only NAME ...] [--seeds N] [--no-verify]
                                             [--verify-repeats N] [--fast] [--keep DIR]
                                             [--json FILE]

Each scenario records a short run of the reference engine under a broken condition
(scenarios.py), runs the triage on it, and compares the top finding with the expected
cause; the healthy baselines must raise nothing critical. With `--seeds 2` (the default)
every scenario is recorded again with another workload seed, and the two tops must
agree (stability). With verification on (the default), each fault's top finding has its
first advice applied and the run recorded again (playbooks/verify.py, `perfdiag analyze
--verify-advice --repeats N`, 3 by default, 1 with --fast): the metric the advice
targets must improve beyond run-to-run noise. Advice that
is a code change cannot be applied by a re-run and is reported as such; "re-run on a
quiet machine" is applied by re-running without the neighbours.

`--generate N` runs the fault generator instead (generate.py: N seeded draws of
configurations with zero, one or two faults around each check's threshold; report.py).

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
from collections import Counter
from pathlib import Path

from perfdiag.errors import PerfdiagError

from .scenarios import HEALTHY, PROBES_ACCOUNTED, SCENARIOS, Scenario, by_name

# CI's subset (about a minute and a half on 2 cores): a healthy run and four fault
# classes whose advice is a setting, each verified by re-running.
FAST = ("healthy", "chunk-too-small", "seq-cap", "cold-starvation", "bursty")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.diagnosis")
    parser.add_argument("--only", nargs="*", default=None, help="scenario names (or prefixes)")
    parser.add_argument("--seeds", type=int, default=2, help="workload seeds per scenario")
    parser.add_argument("--no-verify", action="store_true", help="do not re-run the advice")
    parser.add_argument(
        "--verify-repeats", type=int, default=None,
        help="runs a side when verifying advice (default 3; 1 with --fast)",
    )  # fmt: skip
    parser.add_argument("--keep", type=Path, default=None, help="keep the runs in this folder")
    parser.add_argument("--json", type=Path, default=None, help="write the results as JSON")
    parser.add_argument(
        "--fast", action="store_true", help=f"CI's subset, one seed: {', '.join(FAST)}"
    )
    parser.add_argument("--generate", type=int, default=None, metavar="N",
                        help="run N generated draws instead of the scenarios")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="the generator's seed")
    parser.add_argument("--requests", type=int, default=None,
                        help="requests per generated run (default: drawn, 24-48)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.generate is not None:
        return generated(args)
    if args.fast:
        args.only, args.seeds = args.only or list(FAST), 1
    repeats = args.verify_repeats or (1 if args.fast else 3)
    if repeats < 1:
        parser.error("--verify-repeats must be at least 1")
    scenarios = select(args.only) if args.only else list(SCENARIOS)
    rows = []
    with tempfile.TemporaryDirectory(prefix="perfdiag-diagnosis-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        for s in scenarios:
            verify = 0 if args.no_verify else repeats
            rows.append(run_scenario(s, root, args.seeds, verify=verify))
            print(_line(rows[-1]), flush=True)
    _table(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0 if all(r["ok"] for r in rows) else 1


def generated(args) -> int:
    """--generate: the draws, one line per run, then the report."""
    from . import generate, report

    if args.generate < 1 or args.seed < 0 or args.seeds < 1 or (args.requests or 8) < 8:
        print("error: --generate and --seeds need >= 1, --seed >= 0, --requests >= 8")
        return 1
    banner = generate.held_out(args.seed)
    if banner:
        print(generate.HELD_OUT_BANNER, flush=True)
    runs, failed = [], []
    with tempfile.TemporaryDirectory(prefix="perfdiag-generate-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        for i in range(args.generate):
            d = generate.draw(args.seed, i, args.requests)
            try:
                drawn = generate.run_draw(d, root, args.seeds)
            except PerfdiagError as e:  # a draw the engine refuses: said, not the whole run
                failed.append({"draw": d.name, "error": str(e)})
                print(f"  {d.name}: not recorded: {e}", flush=True)
                continue
            for r in drawn:
                runs.append(r)
                print(f"  {r['draw']}-s{r['workload_seed']}: {r['cause']} → top {r['top']} "
                      f"({r['top_severity'] or '-'}) in {r['record_s']} s", flush=True)  # fmt: skip
    summary_ = report.summarise(runs)
    print()
    for line in report.lines(summary_):
        print(line)
    for f in failed:
        print(f"not recorded: {f['draw']}: {f['error']}")
    if banner:
        print(generate.HELD_OUT_BANNER)
    if args.json:
        out = {"summary": summary_, "runs": runs, "not_recorded": failed}
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


def run_scenario(s: Scenario, root: Path, seeds: int, verify: int) -> dict:
    """`verify`: runs a side for the top advice's verification (0: none)."""
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
        row["advice"] = verify_top(s0, dir0, triage, verify)
    row["seconds"] = round(time.perf_counter() - started, 1)
    return row


def reseeded(s: Scenario, k: int) -> Scenario:
    seed = (s.workload.get("seed") or 1) + 1000 * k
    return dataclasses.replace(s, name=f"{s.name}-seed{seed}", workload=s.workload | {"seed": seed})


def verify_top(s: Scenario, run_dir: Path, triage, repeats: int = 1) -> dict:
    """Apply the top finding's advice and re-run, `repeats` runs a side
    (playbooks/verify.py)."""
    from perfdiag import load_run
    from perfdiag.playbooks.facts import TriageContext
    from perfdiag.playbooks.verify import verify
    from perfdiag.probes.faults import burning
    from perfdiag.probes.session import record_run
    from perfdiag.traces.environment import machine_cores

    top = triage.top
    action = top.action
    quiet = action is not None and action.kind == "environment" and s.neighbours
    if quiet:
        # "Re-run on a quiet machine": the same options, without the burning processes.
        top = dataclasses.replace(top, action=dataclasses.replace(action, kind="run"))

    def beside_neighbours(*args, **kwargs):
        # The run's own conditions: its neighbours burn while a repeat records.
        with burning(s.neighbours * machine_cores()):
            return record_run(*args, **kwargs)

    as_run = beside_neighbours if s.neighbours else record_run
    v = verify(TriageContext(load_run(run_dir)), top, run_dir.with_name(run_dir.name + "-advice"),
               record=record_run if quiet else as_run, repeats=repeats,
               record_a=as_run)  # fmt: skip
    return {
        "check": v.check,
        "flags": v.action.flags if v.action.kind == "run" else v.action.how,
        "kind": v.action.kind,
        "target": v.action.target,
        "verdict": v.verdict,
        "reason": v.reason,
        "repeats": repeats,
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
    # every seed of every healthy scenario (a healthy run is wrong exactly when critical)
    healthy_runs = [ok for r in healthy for ok in r["seeds"]]
    false_alarms = sum(not ok for ok in healthy_runs)
    skipped = [a for a in verified if a["verdict"] == "not applicable"]
    not_applicable = Counter(a.get("kind") or a.get("reason") or "?" for a in skipped)
    why = ", ".join(f"{n} {kind}" for kind, n in sorted(not_applicable.items())) or "none"
    seconds = sum(r["seconds"] for r in rows)
    classes = {r["expected"] for r in faults}
    return [
        f"{sum(r['ok'] for r in rows)} of {len(rows)} scenarios diagnosed correctly "
        f"({len(classes)} fault classes; {seconds:.0f} s)",
        f"top-1 accuracy on faults (first seed): {sum(r['ok'] for r in faults)}/{len(faults)}",
        f"all seeds: {sum(runs)}/{len(runs)} runs correct",
        f"critical false alarms on healthy runs (all seeds): {false_alarms}/{len(healthy_runs)}",
        f"stable across seeds (same top): {sum(r['stable'] for r in stable)}/{len(stable)}",
        f"advice verified by re-running: improved the target in {len(improved)}/{len(applied)}"
        f" applicable ({len(verified) - len(applied)} not applicable, by kind: {why})",
    ]


if __name__ == "__main__":
    sys.exit(main())

"""Re-triage the kept runs of a generator report after an analysis change, without
recording them again: what the current rules say of the same runs.

    python -m benchmarks.diagnosis.rescore REPORT.json RUNS_DIR [--json OUT.json]
        [--changed]

REPORT.json is `--generate … --json`'s output, RUNS_DIR its `--keep` folder. Prints the
report as `--generate` does, and with --changed each run whose top, critical or warning
findings moved. Runs scored this way have been looked at: a held-out seed rescored
during development becomes development data (report held-out figures from a fresh seed,
a held-out seed not used before, recorded after the rules are frozen).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from perfdiag import load_run
from perfdiag.playbooks.evaluate import run_triage
from perfdiag.playbooks.facts import TriageContext

from . import report
from .generate import findings_of

KEYS = ("top", "top_severity", "top3", "critical", "warning")


def rescore(run: dict, runs_dir: Path) -> dict:
    """The run's entry with its findings from today's rules."""
    path = runs_dir / f"{run['draw']}-s{run['workload_seed']}"
    return {**run, **findings_of(run_triage(TriageContext(load_run(path))))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.diagnosis.rescore")
    p.add_argument("report", type=Path)
    p.add_argument("runs", type=Path)
    p.add_argument("--json", type=Path)
    p.add_argument("--changed", action="store_true", help="list runs whose findings moved")
    a = p.parse_args(argv)
    try:
        old = json.loads(a.report.read_text())["runs"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"error: {a.report}: not a generator report ({e})", file=sys.stderr)
        return 1
    new = []
    for r in old:
        try:
            n = rescore(r, a.runs)
        except (OSError, ValueError) as e:
            print(f"error: {r['draw']}-s{r['workload_seed']}: {e}", file=sys.stderr)
            return 1
        new.append(n)
        if a.changed and any(n[k] != r[k] for k in KEYS):
            print(f"  {n['draw']}-s{n['workload_seed']} {n['cause']}: top {r['top']} "
                  f"({r['top_severity'] or '-'}) → {n['top']} ({n['top_severity'] or '-'}); "
                  f"warnings {r['warning']} → {n['warning']}", flush=True)  # fmt: skip
    summary = report.summarise(new)
    print()
    for line in report.lines(summary):
        print(line)
    if a.json:
        a.json.write_text(json.dumps({"summary": summary, "runs": new}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Run every diagnosis scenario and check that the top finding names the cause.

    .venv/bin/python -m benchmarks.diagnosis [--only NAME ...] [--keep DIR] [--json FILE]

Each scenario records a short run of the reference engine under a broken condition
(scenarios.py), runs the triage on it, and compares the top finding with the expected
cause; the healthy baselines must raise nothing critical. Prints a table and exits 1 if
any scenario is wrong. A few minutes on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from .scenarios import HEALTHY, PROBES_ACCOUNTED, SCENARIOS, by_name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.diagnosis")
    parser.add_argument("--only", nargs="*", default=None, help="scenario names to run")
    parser.add_argument("--keep", type=Path, default=None, help="keep the runs in this folder")
    parser.add_argument("--json", type=Path, default=None, help="write the results as JSON")
    args = parser.parse_args(argv)
    scenarios = select(args.only) if args.only else list(SCENARIOS)
    rows = []
    with tempfile.TemporaryDirectory(prefix="perfdiag-diagnosis-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        for s in scenarios:
            started = time.perf_counter()
            run_dir = s.record(root / s.name)
            triage = s.diagnose(run_dir)
            top = triage.top
            rows.append(
                {
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
                    "seconds": round(time.perf_counter() - started, 1),
                }
            )
            print(_line(rows[-1]), flush=True)
    _table(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0 if all(r["ok"] for r in rows) else 1


def select(names: list[str]) -> list:
    """Scenarios by name; a name that is no scenario selects those it prefixes
    (`readme`, `readme-neighbour`)."""
    out = []
    for n in names:
        matched = [s for s in SCENARIOS if s.name.startswith(n)]
        out += [by_name(n)] if any(s.name == n for s in SCENARIOS) or not matched else matched
    return out


def _line(r: dict) -> str:
    return f"  {r['scenario']}: top {r['top']} ({r['severity'] or '-'}) in {r['seconds']} s"


def _table(rows: list[dict]) -> None:
    head = ("scenario", "expected cause", "top finding", "ok")
    body = []
    for r in rows:
        expected = r["expected"] if r["expected"] != HEALTHY else "nothing critical"
        top = r["top"] if r["expected"] != HEALTHY else f"{r['top']} ({r['critical']} critical)"
        if r["expected"] == PROBES_ACCOUNTED:
            top = f"gate {r['gate'] or 'silent'}; top {r['top']}"
        body.append((r["scenario"], expected, top, "yes" if r["ok"] else "NO"))
    widths = [max(len(x[i]) for x in (head, *body)) for i in range(len(head))]
    print()
    print("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in body:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    ok = sum(r["ok"] for r in rows)
    print(
        f"\n{ok} of {len(rows)} scenarios diagnosed correctly "
        f"({sum(r['seconds'] for r in rows):.0f} s)"
    )


if __name__ == "__main__":
    sys.exit(main())

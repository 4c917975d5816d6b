"""The generator's report: arithmetic over run results (generate.run_draw's dicts), and the
raw text printed for BENCHMARKS.md.

A run with no fault is healthy; a single-fault run is right when its top finding is the
fault's check; in a two-fault run each fault counts as found when its check is among the
top three findings, and the run is right when both are. A fault is above threshold when
its relative magnitude (magnitude / the documented detection threshold) is ≥ 1 and so is
its floor (`relative_low`, where the label's model gives a range; reports written before
it have none): a label whose range straddles the threshold is scored neither above nor
below it, and the runs holding one are counted on their own line.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict

BINS = ((0.0, 0.5), (0.5, 1.0), (1.0, 1.5), (1.5, 2.0), (2.0, math.inf))


def bin_label(lo: float, hi: float) -> str:
    return f"<{hi:g}" if lo == 0 else (f"≥{lo:g}" if math.isinf(hi) else f"{lo:g}–{hi:g}")


def _bin(rel: float) -> int:
    return next(i for i, (lo, hi) in enumerate(BINS) if lo <= rel < hi) if rel >= 0 else 0


def above(fault: dict) -> bool:
    return fault.get("relative_low", fault["relative"]) >= 1  # the floor is ≤ the label


def straddles(fault: dict) -> bool:
    return fault["relative"] >= 1 and not above(fault)


def found(run: dict, fault: dict) -> bool:
    if len(run["faults"]) == 1:
        return run["top"] == fault["check"]
    return fault["check"] in run["top3"][:3]


def summarise(runs: list[dict]) -> dict:
    healthy = [r for r in runs if not r["faults"]]
    single = [r for r in runs if len(r["faults"]) == 1]
    double = [r for r in runs if len(r["faults"]) == 2]
    curve: dict[str, list[list[int]]] = defaultdict(lambda: [[0, 0] for _ in BINS])
    for r in single + double:
        for f in r["faults"]:
            cell = curve[f["class"]][_bin(f["relative"])]
            cell[0] += found(r, f)
            cell[1] += 1
    above1 = [r for r in single if above(r["faults"][0])]
    above2 = [r for r in double if all(above(f) for f in r["faults"])]
    uncertain = [r for r in single + double if any(straddles(f) for f in r["faults"])]
    confusion: dict[str, Counter] = defaultdict(Counter)
    for r in above1:
        confusion[r["faults"][0]["class"]][r["top"]] += 1
    for r in healthy:
        confusion["(healthy)"][r["top"]] += 1
    misses = [r for r in above1 if not found(r, r["faults"][0])]
    misses += [r for r in above2 if not all(found(r, f) for f in r["faults"])]
    return {
        "runs": len(runs),
        "draws": len({r["draw"] for r in runs}),
        "healthy_runs": len(healthy),
        "healthy_critical": sum(bool(r["critical"]) for r in healthy),
        "healthy_warning": sum(bool(r["warning"]) and not r["critical"] for r in healthy),
        "single_above": [sum(r["top"] == r["faults"][0]["check"] for r in above1), len(above1)],
        "double_above": [sum(all(found(r, f) for f in r["faults"]) for r in above2), len(above2)],
        "straddling": [_miss(r) for r in uncertain],
        "curve": {k: v for k, v in sorted(curve.items())},
        "confusion": {k: dict(v.most_common()) for k, v in sorted(confusion.items())},
        "misses": [_miss(r) for r in misses],
        "record_s_mean": (sum(r["record_s"] for r in runs) / len(runs)) if runs else 0.0,
    }


def _miss(r: dict) -> str:
    faults = ", ".join(f"{f['class']} ×{_label(f)}" for f in r["faults"])
    top3 = ", ".join(r["top3"]) or "none"
    return f"{r['draw']}-s{r['workload_seed']} ({r['preset']}, {r['loop']}): {faults} → {top3}"


def _label(f: dict) -> str:
    low = f.get("relative_low", f["relative"])
    return f"{f['relative']:.2f}" if low >= f["relative"] else f"{low:.2f}–{f['relative']:.2f}"


def _pct(a: int, n: int) -> str:
    return f"{a}/{n} ({100 * a / n:.0f} %)" if n else "0/0"


def lines(s: dict) -> list[str]:
    """The printed report (raw: paste it unedited)."""
    out = [f"{s['draws']} draws, {s['runs']} runs; mean record time per run "
           f"{s['record_s_mean']:.1f} s"]  # fmt: skip
    a, n = s["single_above"]
    out.append(f"top cause right, one fault above threshold: {_pct(a, n)}")
    a, n = s["double_above"]
    out.append(f"both named in the top three, two faults above threshold: {_pct(a, n)}")
    h = s["healthy_runs"]
    crit = _pct(s["healthy_critical"], h)
    out.append(f"healthy runs (all seeds) with a critical finding: {crit}")
    out.append(f"healthy runs (all seeds) with a warning, none critical: "
               f"{_pct(s['healthy_warning'], h)}")  # fmt: skip
    out.append("")
    out.append("detection curve (found/runs by magnitude ÷ threshold; two-fault runs: in top 3)")
    labels = [bin_label(lo, hi) for lo, hi in BINS]
    width = max([len(k) for k in s["curve"]] + [5])
    out.append("  ".join(["class".ljust(width)] + [x.rjust(7) for x in labels]))
    for cls, cells in s["curve"].items():
        row = [f"{a}/{n}" if n else "-" for a, n in cells]
        out.append("  ".join([cls.ljust(width)] + [x.rjust(7) for x in row]))
    out.append("")
    out.append("confusion (one fault above threshold, and healthy): expected class → top finding")
    for cls, tops in s["confusion"].items():
        out.append(f"  {cls}: " + ", ".join(f"{t} {c}" for t, c in tops.items()))
    straddling = s.get("straddling", [])
    if straddling:
        out.append("")
        out.append("not scored: a label whose range straddles its threshold (run: faults "
                   "×relative → top three)")  # fmt: skip
        out += [f"  {m}" for m in straddling]
    if s["misses"]:
        out.append("")
        out.append("misses above threshold (run: faults ×relative → top three)")
        out += [f"  {m}" for m in s["misses"]]
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m benchmarks.diagnosis.report A.json [B.json …]`: one report over the runs
    of several `--generate … --json` reports (e.g. two held-out seeds), from their saved
    results: nothing is recorded or triaged again."""
    import json
    import sys
    from pathlib import Path

    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print("usage: python -m benchmarks.diagnosis.report REPORT.json [REPORT.json ...]")
        return 1
    runs = []
    for p in paths:
        try:
            runs += json.loads(Path(p).read_text(encoding="utf-8"))["runs"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"error: {p}: not a generator report ({e})")
            return 1
    for line in lines(summarise(runs)):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

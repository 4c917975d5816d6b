"""Findings as annotations: instants at the time each finding refers to.

The hook is a list of `Annotation(ts_ns, title, severity, text)`; any producer can make
one. `annotations_from_findings` reads the triage's `results/findings.json` (a list of
findings, or an object holding one under "findings"). A finding's time: its own `ts_ns`
or `start_ns` when it has one; else each step or request it names as evidence
(`ids: [{kind: step|request, ids: [...]}]`, at most `MAX_MARKS` of them, in the order
given, worst first) — at the step's start or the request's first event; else the run's
start, marked as about the whole run. A findings file that cannot be read is reported,
not fatal: the trace is still worth having.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..layout import RESULTS_DIR

FINDINGS_FILE = "findings.json"
MAX_MARKS = 10


@dataclass(frozen=True)
class Annotation:
    ts_ns: int
    title: str
    severity: str  # info | warning | critical (whatever the producer says)
    text: str
    ref: str = ""  # what the instant marks: "step 12", "request r-3", "whole run"
    check: str = ""


def read_findings(run_path: Path) -> tuple[list[dict], str | None]:
    """(findings, a warning or None); no file → ([], None)."""
    path = Path(run_path) / RESULTS_DIR / FINDINGS_FILE
    if not path.exists():
        return [], None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return [], f"{RESULTS_DIR}/{FINDINGS_FILE} not rendered: {e}"
    items = data.get("findings") if isinstance(data, dict) else data
    if not isinstance(items, list):
        return [], f"{RESULTS_DIR}/{FINDINGS_FILE} not rendered: no list of findings"
    return [f for f in items if isinstance(f, dict)], None


def annotations_from_findings(
    findings: list[dict], step_start: dict[int, int], request_start: dict[str, int], run_start: int
) -> list[Annotation]:
    out = []
    for f in findings:
        title = str(f.get("title") or f.get("check") or "finding")
        severity = str(f.get("severity") or "info")
        text = str(f.get("explanation") or f.get("text") or f.get("detail") or "")
        check = str(f.get("check") or "")
        marks = _marks(f, step_start, request_start)
        if not marks:
            marks = [(run_start, "whole run")]
        out += [Annotation(ts, title, severity, text, ref, check) for ts, ref in marks]
    out.sort(key=lambda a: a.ts_ns)
    return out


def _marks(f: dict, step_start: dict[int, int], request_start: dict[str, int]) -> list:
    for key in ("ts_ns", "start_ns"):
        if isinstance(f.get(key), int) and not isinstance(f.get(key), bool):
            return [(f[key], "")]
    marks = []
    for group in f.get("ids") or ():
        if not isinstance(group, dict):
            continue
        kind = group.get("kind")
        for ident in group.get("ids") or ():
            if kind == "step":
                try:
                    ts = step_start.get(int(ident))
                except (TypeError, ValueError):
                    ts = None
            elif kind == "request":
                ts = request_start.get(str(ident))
            else:
                ts = None
            if ts is not None and len(marks) < MAX_MARKS:
                marks.append((ts, f"{kind} {ident}"))
    return marks

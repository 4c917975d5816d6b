"""Playbooks as data: the YAML files, their validation, and the objects they load into.

A playbook is an ordered list of triage steps (0 = the data-trust gate, then 1..7), each
with checks. A check names a registered fact (facts.py) with its parameters, one
condition (`at_least`, `above`, `at_most`, `below` with a number or a severity ladder;
`equals` or `in` with a `severity`), and the words: a title and an explanation (plain
text with `{name}` fields from the fact's evidence), what to try next, the figures to
show, the metric `--verify-advice` judges its advice by (`verify`, a compare metric
key), and `consequence_of`: checks that, when they fire, explain this one (a root marked
`slows_everything` explains a check marked `time_share` only as far as its own share
covers that check's excess over its threshold, and one marked `queue_share` only as far
as the queue at the engine's load without that loss would stay under the threshold). Scenario
playbooks name a symptom (a fact and a condition) and the route of checks that explain
it. Everything is checked when a file loads; any problem is a PlaybookError naming the
file, the place in it and what is wrong. See docs/triage.md.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..analyzers.findings import SEVERITIES
from ..errors import ConfigError
from ..yaml_file import read_yaml_mapping
from . import template
from .facts import REQUIRED, load_registry
from .figures import FIGURES

HERE = Path(__file__).parent
TRIAGE_FILE = HERE / "triage.yaml"
SCENARIOS_FILE = HERE / "scenarios.yaml"
NUMERIC_OPS = {"at_least": ">=", "above": ">", "at_most": "<=", "below": "<"}
OPS = (*NUMERIC_OPS, "equals", "in")
_ID = re.compile(r"^[a-z][a-z0-9-]*$")
_CHECK_KEYS = {
    "id",
    "fact",
    "params",
    "severity",
    "title",
    "explanation",
    "next",
    "figures",
    "consequence_of",
    "time_share",
    "queue_share",
    "slows_everything",
    "evidence",
    "verify",
    *OPS,
}


class PlaybookError(ConfigError):
    """A playbook file is malformed: the message names the file, where, and what."""


@dataclass(frozen=True)
class Condition:
    op: str  # at_least | above | at_most | below | equals | in
    levels: tuple[tuple[str, Any], ...]  # (severity, threshold), mildest first

    def severity(self, value) -> str | None:
        """The most severe level the value reaches, or None (the check passes)."""
        hit = None
        for severity, threshold in self.levels:
            if self._holds(value, threshold):
                hit = severity
        return hit

    def _holds(self, value, threshold) -> bool:
        if self.op == "equals":
            return value == threshold
        if self.op == "in":
            return value in threshold
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            return False
        return {
            "at_least": value >= threshold,
            "above": value > threshold,
            "at_most": value <= threshold,
            "below": value < threshold,
        }[self.op]

    def describe(self) -> str:
        if self.op in NUMERIC_OPS:
            return ", ".join(f"{s} {NUMERIC_OPS[self.op]} {t:g}" for s, t in self.levels)
        return ", ".join(f"{s} {self.op} {t}" for s, t in self.levels)


@dataclass(frozen=True)
class Check:
    id: str
    fact: str
    params: tuple[tuple[str, Any], ...]
    condition: Condition
    title: str
    explanation: str
    next: tuple[str, ...]
    figures: tuple[str, ...]
    consequence_of: tuple[str, ...]
    evidence: tuple[str, ...] | None  # evidence names to show (None: all)
    time_share: bool = False  # the value is a share of time (of TTFT, ITL, step time)
    slows_everything: bool = False  # the value is a share of time lost by all work alike
    queue_share: bool = False  # the value is a share of latency spent queueing
    # The metric --verify-advice judges this check's advice by (a compare metric key),
    # fixed here before any run; it overrides the target the fact's action names.
    verify: str | None = None

    @property
    def threshold(self) -> float | None:
        """The mildest warning-or-worse threshold of a numeric ladder (None otherwise)."""
        if self.condition.op not in NUMERIC_OPS:
            return None
        return next((t for s, t in self.condition.levels if s != "info"), None)


@dataclass(frozen=True)
class TriageStep:
    step: int
    title: str
    explanation: str
    checks: tuple[Check, ...]


@dataclass(frozen=True)
class Playbook:
    name: str
    title: str
    source: str
    steps: tuple[TriageStep, ...]

    def check(self, check_id: str) -> Check:
        return next(c for s in self.steps for c in s.checks if c.id == check_id)

    def step_of(self, check_id: str) -> TriageStep:
        return next(s for s in self.steps if any(c.id == check_id for c in s.checks))


@dataclass(frozen=True)
class Scenario:
    id: str
    title: str
    question: str
    symptom_fact: str
    symptom_params: tuple[tuple[str, Any], ...]
    symptom: Condition
    explanation: str
    route: tuple[str, ...]


def _read(path: Path) -> dict:
    return read_yaml_mapping(path, "it", "a mapping at the top level", error=PlaybookError)


class _Where:
    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, where: str, problem: str):
        raise PlaybookError(f"{self.path}: {where}: {problem}")

    def need(self, data: dict, key: str, kind, where: str):
        if key not in data:
            self.fail(where, f"missing `{key}`")
        value = data[key]
        if not isinstance(value, kind) or (kind is str and not value.strip()):
            names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
            self.fail(where, f"`{key}` must be a non-empty {names}")
        return value

    def texts(self, data: dict, key: str, where: str) -> tuple[str, ...]:
        value = data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            self.fail(where, f"`{key}` must be a list of texts")
        return tuple(value)


def _condition(w: _Where, data: dict, where: str, severity_needed: bool = True) -> Condition:
    ops = [op for op in OPS if op in data]
    if len(ops) != 1:
        w.fail(where, f"give exactly one condition of {', '.join(OPS)} (found {len(ops)})")
    op, spec = ops[0], data[ops[0]]
    severity = data.get("severity")
    if severity is not None and severity not in SEVERITIES:
        w.fail(where, f"severity {severity!r} is not one of {', '.join(SEVERITIES)}")
    if op in NUMERIC_OPS and isinstance(spec, dict):
        if severity is not None:
            w.fail(where, f"`{op}` gives a threshold per severity: drop `severity`")
        bad = [k for k in spec if k not in SEVERITIES]
        if bad or not spec:
            w.fail(where, f"`{op}` keys must be severities ({', '.join(SEVERITIES)}), got {bad}")
        levels = sorted(spec.items(), key=lambda kv: SEVERITIES.index(kv[0]))
        for s, t in levels:
            if isinstance(t, bool) or not isinstance(t, int | float):
                w.fail(where, f"`{op}.{s}` must be a number, got {t!r}")
        values = [t for _, t in levels]
        rising = op in ("at_least", "above")
        if values != sorted(values, reverse=not rising):
            w.fail(
                where, f"`{op}` thresholds must get {'higher' if rising else 'lower'} with severity"
            )
        return Condition(op, tuple(levels))
    if severity is None and severity_needed:
        w.fail(where, f"`{op}` with a single value needs a `severity`")
    if op in NUMERIC_OPS and (isinstance(spec, bool) or not isinstance(spec, int | float)):
        w.fail(where, f"`{op}` must be a number or a mapping of severities, got {spec!r}")
    if op == "in" and not isinstance(spec, list):
        w.fail(where, f"`in` must be a list, got {spec!r}")
    return Condition(op, ((severity or "info", spec),))


def _params(w: _Where, fact_name: str, data, where: str) -> tuple[tuple[str, Any], ...]:
    spec = load_registry().get(fact_name)
    if spec is None:
        w.fail(where, f"unknown fact {fact_name!r} (known: {', '.join(sorted(load_registry()))})")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        w.fail(where, "`params` must be a mapping")
    for name, value in data.items():
        p = spec.params.get(name)
        if p is None:
            w.fail(
                where,
                f"fact {fact_name!r} has no parameter {name!r} "
                f"(it takes: {', '.join(spec.params) or 'none'})",
            )
        ok = isinstance(value, p.type) or (p.type is float and isinstance(value, int))
        if not ok or isinstance(value, bool) != (p.type is bool):
            w.fail(where, f"parameter {name!r} must be a {p.type.__name__}, got {value!r}")
        if p.choices and value not in p.choices:
            w.fail(
                where, f"parameter {name!r} must be one of {', '.join(p.choices)}, got {value!r}"
            )
    for name, p in spec.params.items():
        if p.default is REQUIRED and name not in data:
            w.fail(where, f"fact {fact_name!r} needs parameter {name!r}")
    return tuple(sorted(data.items()))


def _check(w: _Where, data, where: str) -> Check:
    if not isinstance(data, dict):
        w.fail(where, "a check must be a mapping")
    check_id = w.need(data, "id", str, where)
    where = f"{where} ({check_id})"
    if not _ID.match(check_id):
        w.fail(where, "an id is lowercase letters, digits and dashes")
    unknown = sorted(set(data) - _CHECK_KEYS)
    if unknown:
        w.fail(where, f"unknown keys {', '.join(unknown)}")
    fact_name = w.need(data, "fact", str, where)
    params = _params(w, fact_name, data.get("params"), where)
    condition = _condition(w, data, where)
    provides = load_registry()[fact_name].provides
    texts = {k: w.need(data, k, str, where) for k in ("title", "explanation")}
    nxt = w.texts(data, "next", where)
    if not nxt and condition.levels[-1][0] != "info":
        w.fail(where, "a check that can warn needs `next`: what to try")
    for key, text in (*texts.items(), *(("next", t) for t in nxt)):
        try:
            names = template.fields(text)
        except template.TemplateError as e:
            w.fail(f"{where} {key}", str(e))
        unknown = [n for n in names if n not in provides]
        if unknown:
            w.fail(
                f"{where} {key}",
                f"fact {fact_name!r} provides no {', '.join(unknown)} "
                f"(it provides: {', '.join(provides)})",
            )
    figures = w.texts(data, "figures", where)
    for f in figures:
        if f not in FIGURES:
            w.fail(where, f"unknown figure {f!r} (known: {', '.join(FIGURES)})")
    evidence = data.get("evidence")
    if evidence is not None:
        evidence = w.texts(data, "evidence", where)
        bad = [e for e in evidence if e not in provides]
        if bad:
            w.fail(where, f"`evidence` names {', '.join(bad)} that fact {fact_name!r} lacks")
    return Check(
        check_id,
        fact_name,
        params,
        condition,
        texts["title"],
        texts["explanation"],
        nxt,
        figures,
        w.texts(data, "consequence_of", where),
        evidence,
        _flag(w, data, "time_share", where),
        _flag(w, data, "slows_everything", where),
        _flag(w, data, "queue_share", where),
        _verify(w, data, where),
    )


def _verify(w: _Where, data: dict, where: str) -> str | None:
    from ..analyzers.compare import METRIC_KEYS

    value = data.get("verify")
    if value is not None and value not in METRIC_KEYS:
        w.fail(where, f"`verify` must be one of {', '.join(METRIC_KEYS)}, got {value!r}")
    return value


def _flag(w: _Where, data: dict, key: str, where: str) -> bool:
    value = data.get(key, False)
    if not isinstance(value, bool):
        w.fail(where, f"`{key}` must be true or false")
    return value


def load_playbook(path: str | Path | None = None) -> Playbook:
    path = Path(path) if path is not None else TRIAGE_FILE
    w = _Where(path)
    data = _read(path)
    name = w.need(data, "playbook", str, "top level")
    title = w.need(data, "title", str, "top level")
    raw_steps = w.need(data, "steps", list, "top level")
    steps, seen = [], {}
    for i, s in enumerate(raw_steps):
        where = f"steps[{i}]"
        if not isinstance(s, dict):
            w.fail(where, "a step must be a mapping")
        number = w.need(s, "step", int, where)
        if not 0 <= number <= 7 or any(x.step >= number for x in steps):
            w.fail(where, f"step {number}: steps run 0 (the gate) to 7, in order, once each")
        checks = []
        for j, c in enumerate(w.need(s, "checks", list, where)):
            check = _check(w, c, f"{where}.checks[{j}]")
            if check.id in seen:
                w.fail(f"{where}.checks[{j}]", f"duplicate id {check.id!r} (also {seen[check.id]})")
            seen[check.id] = f"{where}.checks[{j}]"
            checks.append(check)
        steps.append(
            TriageStep(
                number,
                w.need(s, "title", str, where),
                w.need(s, "explanation", str, where),
                tuple(checks),
            )
        )
    for step in steps:
        for c in step.checks:
            for other in c.consequence_of:
                if other not in seen or other == c.id:
                    w.fail(seen[c.id], f"consequence_of names {other!r}, not another check here")
    _no_cycles(w, steps, seen)
    return Playbook(name, title, str(path), tuple(steps))


def _no_cycles(w: _Where, steps, seen) -> None:
    graph = {c.id: c.consequence_of for s in steps for c in s.checks}
    for start in graph:
        stack, visited = list(graph[start]), set()
        while stack:
            node = stack.pop()
            if node == start:
                w.fail(seen[start], f"consequence_of makes a cycle through {start!r}")
            if node not in visited:
                visited.add(node)
                stack.extend(graph[node])


def load_scenarios(playbook: Playbook, path: str | Path | None = None) -> tuple[Scenario, ...]:
    path = Path(path) if path is not None else SCENARIOS_FILE
    w = _Where(path)
    data = _read(path)
    known = {c.id for s in playbook.steps for c in s.checks}
    out, seen = [], set()
    for i, sc in enumerate(w.need(data, "scenarios", list, "top level")):
        where = f"scenarios[{i}]"
        if not isinstance(sc, dict):
            w.fail(where, "a scenario must be a mapping")
        sid = w.need(sc, "id", str, where)
        where = f"{where} ({sid})"
        if sid in seen or not _ID.match(sid):
            w.fail(where, "ids are unique, lowercase letters, digits and dashes")
        seen.add(sid)
        symptom = w.need(sc, "symptom", dict, where)
        fact_name = w.need(symptom, "fact", str, f"{where} symptom")
        params = _params(w, fact_name, symptom.get("params"), f"{where} symptom")
        condition = _condition(w, symptom, f"{where} symptom", severity_needed=False)
        route = w.texts(sc, "route", where)
        if not route:
            w.fail(where, "`route` must list the checks that explain the symptom")
        bad = [r for r in route if r not in known]
        if bad:
            w.fail(where, f"route names unknown checks {', '.join(bad)} (not in {playbook.source})")
        out.append(
            Scenario(
                sid,
                w.need(sc, "title", str, where),
                w.need(sc, "question", str, where),
                fact_name,
                params,
                condition,
                w.need(sc, "explanation", str, where),
                route,
            )
        )
    return tuple(out)

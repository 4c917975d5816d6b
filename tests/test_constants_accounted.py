"""Every threshold is accounted for (issue 35): each module-level numeric constant in
playbooks/*.py and analyzers/*.py, and each check's and symptom's thresholds in the
playbooks' YAML, has a row in docs/triage.md's constants table — its name, file, value
(as the code has it), whether it is derived, calibrated or a convention, and why. A new
constant without a row, a row whose value the code no longer has, or a row for a
constant that is gone fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parents[1]
DOC = ROOT / "docs" / "triage.md"
HEADING = "## Constants: where each threshold comes from"
KINDS = ("derived", "calibrated", "convention")
THRESHOLD_KEYS = ("at_least", "at_most", "above", "below")
# Not thresholds: unit conversions, names for a step number, sentinels.
ALLOWED = {
    "NS": "a unit conversion: nanoseconds per second",
    "GATE_STEP": "the number of the triage's gate step, a name, not a threshold",
    "QUALIFYING_STEP": "the number of the triage's step 1, a name, not a threshold",
    "GONE": "a sentinel edge weight that takes an edge out of a critical-path replay",
}
NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:e-?\d+)?")


def _numeric(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int | float) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return _numeric(node.operand)
    if isinstance(node, ast.BinOp):
        return _numeric(node.left) and _numeric(node.right)
    if isinstance(node, ast.Tuple):
        return bool(node.elts) and all(_numeric(e) for e in node.elts)
    return False


def _values(node: ast.expr) -> list[float]:
    # only numbers and arithmetic (checked by _numeric): safe to evaluate
    value = eval(compile(ast.Expression(node), "<constant>", "eval"), {"__builtins__": {}})
    return [float(v) for v in (value if isinstance(value, tuple) else (value,))]


def python_constants() -> dict[tuple[str, str], list[float]]:
    """(name, file relative to the package) → value(s), for every module-level numeric
    constant: `NAME = 0.5`, `NAME: float = 0.5`, `A, B = 8, 0.1`, `T = (50, 90)`."""
    found = {}
    for folder in ("playbooks", "analyzers", "hardware"):
        for path in sorted((ROOT / folder).glob("*.py")):
            for node in ast.parse(path.read_text()).body:
                pairs = []
                if isinstance(node, ast.Assign) and len(node.targets) == 1:
                    target, value = node.targets[0], node.value
                    if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
                        pairs = list(zip(target.elts, value.elts, strict=False))
                    else:
                        pairs = [(target, value)]
                elif isinstance(node, ast.AnnAssign) and node.value is not None:
                    pairs = [(node.target, node.value)]
                for target, value in pairs:
                    if isinstance(target, ast.Name) and _numeric(value):
                        found[(target.id, f"{folder}/{path.name}")] = _values(value)
    return found


def yaml_thresholds() -> dict[tuple[str, str], list[float]]:
    """(check or symptom id, file) → its thresholds in the order the YAML lists them."""
    found = {}
    triage = yaml.safe_load((ROOT / "playbooks" / "triage.yaml").read_text())
    for step in triage["steps"]:
        for check in step["checks"]:
            nums = _threshold_numbers(check)
            if nums:
                found[(check["id"], "playbooks/triage.yaml")] = nums
    scenarios = yaml.safe_load((ROOT / "playbooks" / "scenarios.yaml").read_text())
    for s in scenarios["scenarios"]:
        nums = _threshold_numbers(s["symptom"])
        if nums:
            found[(s["id"], "playbooks/scenarios.yaml")] = nums
    return found


def _threshold_numbers(entry: dict) -> list[float]:
    out = []
    for key in THRESHOLD_KEYS:
        t = entry.get(key)
        if isinstance(t, dict):
            out += [float(v) for v in t.values()]
        elif t is not None:
            out.append(float(t))
    return out


def table_rows(text: str) -> dict[tuple[str, str], dict[str, str]]:
    """The constants table's rows: (name, where) → {value, kind, why}."""
    if HEADING not in text:
        raise AssertionError(f"docs/triage.md has no section {HEADING!r}")
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 5 or set(cells[0]) <= set("-: "):
            continue
        name, where, value, kind, why = cells
        if name == "name":
            continue
        key = (name.strip("`"), where.strip("`"))
        assert key not in rows, f"{key} listed twice"
        rows[key] = {"value": value, "kind": kind, "why": why}
    return rows


def _numbers(cell: str) -> list[float]:
    return [float(n) for n in NUMBER.findall(cell.replace("−", "-"))]


@pytest.fixture(scope="module")
def rows():
    return table_rows(DOC.read_text())


@pytest.fixture(scope="module")
def constants():
    py = {k: v for k, v in python_constants().items() if k[0] not in ALLOWED}
    return py | yaml_thresholds()


def test_every_constant_has_a_row(rows, constants):
    missing = sorted(f"{name} ({where})" for name, where in set(constants) - set(rows))
    assert not missing, "not in docs/triage.md's constants table: " + ", ".join(missing)


def test_every_row_is_a_constant_the_code_has(rows, constants):
    stale = sorted(f"{name} ({where})" for name, where in set(rows) - set(constants))
    assert not stale, "rows for constants the code no longer has: " + ", ".join(stale)


def test_each_row_has_the_codes_value(rows, constants):
    wrong = [f"{k[0]} ({k[1]}): table {rows[k]['value']!r}, code {v}"
             for k, v in sorted(constants.items())
             if k in rows and _numbers(rows[k]["value"]) != pytest.approx(v)]  # fmt: skip
    assert not wrong, "; ".join(wrong)


def test_each_row_says_where_it_comes_from(rows):
    for (name, _), row in rows.items():
        first = re.match(r"[a-z]+", row["kind"])
        assert first and first.group() in KINDS, f"{name}: kind {row['kind']!r}"
        assert len(row["why"]) >= 10, f"{name}: no reason given"


def test_the_inventory_finds_what_it_must():
    # the scanner itself: module constants of every form, and YAML thresholds
    py = python_constants()
    assert py[("STARVED_MIN_SWITCHES", "analyzers/host.py")] == [3.0]
    assert py[("MIN_OVERLAP_SHARE", "playbooks/facts_server.py")] == [0.1]  # A, B = 8, 0.1
    assert py[("PERCENTILES", "analyzers/distribution.py")] == [50, 90, 95, 99]
    y = yaml_thresholds()
    assert y[("slow-input", "playbooks/triage.yaml")] == [0.25, 0.4]
    assert ("run-incomplete", "playbooks/triage.yaml") not in y  # `in:`, no number
    doc = "\n".join((
        "x", HEADING, "",
        "| name | where | value | kind | why |", "|---|---|---|---|---|",
        "| `A` | `b.py` | 1e-3 | convention: x | a reason here |", "",
        "## next", "| `B` | `c` | 1 | d | e |",
    ))  # fmt: skip
    rows = table_rows(doc)
    assert list(rows) == [("A", "b.py")] and _numbers(rows[("A", "b.py")]["value"]) == [0.001]

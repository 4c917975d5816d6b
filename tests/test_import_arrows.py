"""Data flows one way (DESIGN.md): an AST scan of every module in the package, each
import resolved to the top-level folder it reaches, against the arrows the design allows.
Lazy imports inside functions count too: they are arrows all the same."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent  # the repository root is the package
PACKAGES = ("hardware", "engine_ref", "traces", "analyzers", "probes", "playbooks", "sweeps",
            "tui", "cli")  # fmt: skip
# What each folder may import besides itself and the root's small modules (errors, …).
ALLOWED = {
    "hardware": {"traces"},  # device facts: datasheets and measured ceilings
    "engine_ref": {"hardware"},
    "traces": set(),
    "analyzers": {"traces", "hardware"},
    "probes": {"engine_ref", "traces", "hardware"},
    "playbooks": {"analyzers", "traces", "hardware"},
    "sweeps": {"probes", "analyzers", "playbooks", "traces", "hardware"},
    "tui": {"analyzers", "playbooks", "sweeps", "traces", "hardware"},
    "cli": set(PACKAGES),
}
HEAVY = {"torch", "triton", "textual"}
# Who may import the heavy libraries: analyzers work on a run, anywhere.
HEAVY_ALLOWED = {
    "torch": {"engine_ref", "probes", "traces"},  # traces: the environment's fingerprint
    "triton": {"engine_ref", "probes"},
    "textual": {"tui"},
}
# Arrows against the design that were there before this test, each a module and the
# folder it reaches. Remove an entry when its import goes; never add one.
KNOWN = {
    ("playbooks/verify.py", "probes"),  # --verify-advice re-records the run
}


def _modules():
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            yield pkg, path


def _reached(path: Path, node: ast.AST) -> list[str]:
    """The top-level names (a folder of the package, a root module or a third-party
    library) an import statement reaches."""
    if isinstance(node, ast.Import):
        names = [a.name.split(".") for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0:
        names = [node.module.split(".")]
    elif isinstance(node, ast.ImportFrom):
        here = path.relative_to(ROOT).parent.parts  # the module's package, as folders
        up = node.level - 1
        assert up <= len(here), f"{path}: a relative import above the package"
        base = [*here[: len(here) - up], *(node.module.split(".") if node.module else [])]
        names = [base] if base else [[a.name] for a in node.names]  # `from .. import x`
    else:
        return []
    return [p[1] if p[0] == "perfdiag" and len(p) > 1 else p[0] for p in names]


def _arrows() -> set[tuple[str, str, str]]:
    """(module path, its folder, the folder or heavy library it imports)."""
    found = set()
    for pkg, path in _modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _reached(path, node):
                if target != pkg and (target in PACKAGES or target in HEAVY):
                    found.add((str(path.relative_to(ROOT)), pkg, target))
    return found


def _violations() -> set[tuple[str, str]]:
    bad = set()
    for module, pkg, target in _arrows():
        ok = pkg in HEAVY_ALLOWED[target] if target in HEAVY else target in ALLOWED[pkg]
        if not ok:
            bad.add((module, target))
    return bad


def test_the_scan_sees_relative_and_absolute_imports():
    arrows = {(pkg, target) for _, pkg, target in _arrows()}
    assert ("cli", "sweeps") in arrows and ("analyzers", "traces") in arrows
    assert ("tui", "textual") in arrows and ("engine_ref", "torch") in arrows


@pytest.mark.parametrize(
    ("pkg", "forbidden"),
    [("sweeps", {"cli", "tui"}),
     ("engine_ref", {"analyzers", "probes", "playbooks", "cli", "tui", "sweeps", "traces"}),
     ("analyzers", {"torch", "triton", "textual", "cli", "tui", "probes", "engine_ref"})],
)  # fmt: skip
def test_the_issue_37_arrows_are_gone(pkg, forbidden):
    hits = sorted((m, t) for m, p, t in _arrows() if p == pkg and t in forbidden)
    assert hits == []


def test_every_other_arrow_follows_the_design():
    bad = _violations()
    assert bad - KNOWN == set(), "new arrows against DESIGN.md's data flow"
    assert KNOWN - bad == set(), "gone: take them off KNOWN"

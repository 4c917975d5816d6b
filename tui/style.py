"""Colours and glyphs shared by the screens: one severity or status looks the same
everywhere (and is readable without colour: every style comes with a word or glyph)."""

from __future__ import annotations

SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
SEVERITY_LABEL = {"critical": "CRIT", "warning": "WARN", "info": "info"}
# A step's status (playbooks/triage_view.py): a fired step is styled by its worst severity.
STATUS_STYLE = {"fired": "bold red", "partial": "yellow", "pass": "green", "not-evaluated": "dim"}
STATUS_GLYPH = {"fired": "✖", "partial": "◐", "pass": "✔", "not-evaluated": "·"}
OUTCOME_STYLE = {"fired": "yellow", "passed": "green", "not-evaluated": "dim"}
VERDICT_STYLE = {"better": "green", "worse": "red", "same": "dim", "unknown": "dim"}


def severity_label(severity: str) -> str:
    return SEVERITY_LABEL.get(severity, severity)


def step_status_text(step):
    """A step's status as a styled glyph and word: "✖ fired", "◐ partial", …"""
    from rich.text import Text

    style = STATUS_STYLE[step.status]
    if step.status == "fired" and step.worst == "warning":
        style = SEVERITY_STYLE["warning"]
    return Text(f"{STATUS_GLYPH[step.status]} {step.status_text}", style=style)

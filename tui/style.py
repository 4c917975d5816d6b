"""Colours and glyphs shared by the screens: one severity or status looks the same
everywhere (and is readable without colour: every style comes with a word or glyph)."""

from __future__ import annotations

SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
SEVERITY_LABEL = {"critical": "CRIT", "warning": "WARN", "info": "info"}
STATUS_STYLE = {"fail": "bold red", "warn": "yellow", "pass": "green", "not evaluated": "dim"}
STATUS_GLYPH = {"fail": "✖", "warn": "▲", "pass": "✔", "not evaluated": "·"}
OUTCOME_STYLE = {"fired": "yellow", "passed": "green", "not-evaluated": "dim"}
VERDICT_STYLE = {"better": "green", "worse": "red", "same": "dim", "unknown": "dim"}


def severity_label(severity: str) -> str:
    return SEVERITY_LABEL.get(severity, severity)

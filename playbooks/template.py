"""Playbook text with numbers in it: `"{blocked_pct:.0f}% of requests waited"`.

A deliberately small language: a field is a plain name (no attribute access, no
indexing, no conversions) with an optional numeric format; names are checked against
what the check's fact provides when the playbook loads, and text is rendered with
`str.format_map` over plain values only. A clause in square brackets,
`"swap {swap_tokens} tokens[, saving {saved_ms:.0f} ms]"`, is left out when a field in it
has no value (missing, None or NaN) and kept without its brackets otherwise; a text that
is a single field without a value is empty; any other missing value reads "not measured".
"""

from __future__ import annotations

import math
import re
import string

_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
_SPEC = re.compile(r"^,?(\.\d{1,2})?[fdg%]?$")
_CLAUSE = re.compile(r"\[([^\[\]]*)\]")
MISSING = "not measured"


class TemplateError(ValueError):
    """The text's fields are not plain names with a numeric format."""


def fields(text: str) -> list[str]:
    """The names a text refers to; TemplateError if any field is not allowed."""
    names = []
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as e:
        raise TemplateError(f"bad braces in {text!r} ({e})") from None
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if not _NAME.match(name):
            raise TemplateError(f"field {{{name}}} in {text!r}: use a plain lowercase name")
        if conversion:
            raise TemplateError(f"field {{{name}!{conversion}}} in {text!r}: no conversions")
        if spec and not _SPEC.match(spec):
            raise TemplateError(f"field {{{name}:{spec}}} in {text!r}: use a format like .1f")
        names.append(name)
    return names


class _Safe(dict):
    def __missing__(self, key):
        return _Blank()


class _Blank:
    def __format__(self, spec: str) -> str:
        return MISSING


def render(text: str, values: dict) -> str:
    """Fill `text` with `values` (numbers, text, booleans); nothing else is reachable."""
    clean = _Safe()
    for name, value in values.items():
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            clean[name] = _Blank()
        elif isinstance(value, bool):
            clean[name] = _Text("yes" if value else "no")
        elif isinstance(value, int | float):
            clean[name] = _Num(value)
        else:
            clean[name] = _Text(str(value))

    names = fields(text)
    if (
        len(names) == 1
        and text.strip() == "{" + names[0] + "}"
        and isinstance(clean[names[0]], _Blank)
    ):
        return ""  # a text that is one field (advice) and has no value is empty
    out = []
    for i, part in enumerate(_CLAUSE.split(text)):  # text, clause, text, …
        if i % 2 and any(isinstance(clean[name], _Blank) for name in fields(part)):
            continue  # a clause with a field that has no value is left out
        out.append(part.format_map(clean))
    return "".join(out)


class _Text(str):
    """Text ignores a numeric format (a playbook may format a field that is text here)."""

    def __format__(self, spec: str) -> str:
        return str(self)


class _Num:
    """A number; a format that does not fit it (`d` for a float) falls back to `g`."""

    def __init__(self, value: float) -> None:
        self.value = value

    def __format__(self, spec: str) -> str:
        try:
            return format(self.value, spec)
        except ValueError:
            return format(self.value, ",.4g" if "," in spec else ".4g")

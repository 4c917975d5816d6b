"""`--json` output: strict JSON (RFC 8259) for every command — NaN and ±Infinity become
null, numpy scalars and pandas' missing values plain numbers or null — so any parser
reads it (Python's `json` alone accepts NaN; jq, JavaScript and most others do not)."""

from __future__ import annotations

import json


def json_text(obj, indent: int | None = 2) -> str:
    from ..analyzers.serving import to_jsonable

    return json.dumps(to_jsonable(obj), indent=indent, default=str, allow_nan=False)


def print_json(obj) -> None:
    print(json_text(obj))

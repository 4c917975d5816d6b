"""A server's launch command read as data: which server it is (`server_kind`) and its flags
as the settings a run records (`parse_server_args`: `--max-num-seqs 2` → `max_num_seqs: 2`,
`--no-enable-prefix-caching` → `enable_prefix_caching: False`, the word after `serve` the
model). analyzers/server_settings.py reads them back by these names.
"""

from __future__ import annotations

import contextlib
import json
import os
import re

_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _program(argv: list[str]) -> tuple[str, str | None, list[str]]:
    """(program name, the module of `python -m MODULE` or None, the words after them)."""
    prog = os.path.basename(argv[0]) if argv else ""
    rest = list(argv[1:])
    if re.fullmatch(r"python[\d.]*", prog) and "-m" in rest:
        at = rest.index("-m")
        if at + 1 < len(rest):
            return prog, rest[at + 1], rest[at + 2 :]
    return prog, None, rest


def server_kind(argv: list[str]) -> str:
    """vllm, sglang, llamacpp, perfdiag or unknown, from the command line."""
    prog, module, rest = _program(argv)
    name = (module or prog).split(".")[0]
    if name == "vllm":
        return "vllm"
    if name == "sglang":
        return "sglang"
    if prog.startswith("llama-server"):
        return "llamacpp"
    if name == "perfdiag" and rest[:1] == ["serve"]:
        return "perfdiag"
    return "unknown"


def kind_from_models(models: list | None) -> str:
    """The server's kind as its /v1/models cards say (`owned_by`), else unknown."""
    owner = models[0].get("owned_by") if models and isinstance(models[0], dict) else None
    names = {"vllm": "vllm", "sglang": "sglang", "llamacpp": "llamacpp", "perfdiag": "perfdiag"}
    return names.get(str(owner).lower(), "unknown")


def parse_server_args(argv: list[str]) -> dict:
    """The command's flags by normalised name: `--max-num-seqs 2` → max_num_seqs: 2,
    `--enforce-eager` → True, `--no-enable-prefix-caching` → enable_prefix_caching: False,
    `--x=y` alike; numbers converted, JSON objects and lists parsed. The word after
    `serve` is `model`; other positional words are listed under `positional`."""
    _, _, words = _program(argv)
    out: dict = {}
    positional: list[str] = []
    if words[:1] == ["serve"]:
        words = words[1:]
        if words and not words[0].startswith("-"):
            out["model"] = words.pop(0)
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word == "--":
            positional.extend(words[i:])
            break
        if not word.startswith("-") or _NUMBER.fullmatch(word):
            positional.append(word)
            continue
        name, eq, value = word.lstrip("-").partition("=")
        key = name.replace("-", "_")
        if eq:
            _put(out, key, _value(value))
        elif i < len(words) and (not words[i].startswith("-") or _NUMBER.fullmatch(words[i])):
            _put(out, key, _value(words[i]))
            i += 1
        elif key.startswith("no_") and len(key) > 3:
            _put(out, key[3:], False)
        else:
            _put(out, key, True)
    if positional:
        out["positional"] = positional
    return out


def _put(out: dict, key: str, value) -> None:
    if key in out:  # a repeated flag: every value, in order
        before = out[key]
        out[key] = [*before, value] if isinstance(before, list) else [before, value]
    else:
        out[key] = value


def _value(text: str):
    if _NUMBER.fullmatch(text):
        with contextlib.suppress(ValueError):
            return int(text)
        return float(text)
    if text[:1] in "{[":
        with contextlib.suppress(ValueError):
            return json.loads(text)
    return text


# ---- the log -----------------------------------------------------------------------------


def with_flag(argv: list[str], flag: str, value) -> list[str]:
    """`argv` with `flag` set to `value`: earlier occurrences (`--flag V`, `--flag=V`, and
    for a switch its `--no-` form) removed, the new one appended (`--flag`/`--no-flag` for
    a bool; nothing for None: the flag removed)."""
    negated = flag.replace("--", "--no-", 1)
    out, i = [], 0
    while i < len(argv):
        word = argv[i]
        if word in (flag, negated):
            takes_value = word == flag and not isinstance(value, bool)  # None: as a value
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            i += 2 if takes_value and nxt is not None and not nxt.startswith("--") else 1
            continue
        if word.startswith((flag + "=", negated + "=")):
            i += 1
            continue
        out.append(word)
        i += 1
    if value is None:
        return out
    if isinstance(value, bool):
        return [*out, flag if value else negated]
    return [*out, flag, f"{value:g}" if isinstance(value, float) else str(value)]

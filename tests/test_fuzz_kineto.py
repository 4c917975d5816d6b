"""Kineto traces with mutated events and headers: every event is either imported with
values in range or skipped and counted by reason; the import never raises anything but
a one-line PerfdiagError; commands on what was imported stay clean and print strict JSON."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from fuzz_support import assert_clean, call_cli
from hypothesis import given
from hypothesis import strategies as st

from perfdiag import load_run
from perfdiag.errors import PerfdiagError
from perfdiag.traces.importers.kineto import import_kineto

EXCERPT = Path(__file__).parent / "data" / "kineto_excerpt.json"
BASE = json.loads(EXCERPT.read_text())
INT64 = 2**63 - 1

nasty = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**80), 2**80), st.sampled_from([INT64, -1, 0]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6),
    st.sampled_from(["NaN", "1e400", "-5", "abc", "12.5e3", "0x10"]),
    st.sampled_from([10**30, -(10**30), 2**63, -(2**63)]),  # ids beyond int64
    st.sampled_from(["\ud800", "a\udfffb", "\udc00\ud800"]),  # unpaired surrogates
    st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(),
                                                         max_size=2),
)  # fmt: skip
FIELDS = ["ts", "dur", "pid", "tid", "name", "cat", "ph", "args", "id"]
ARG_FIELDS = ["correlation", "device", "stream", "bytes", "flops", "In msg nelems", "dtype"]
ARG_FIELDS.append("k\udfff")  # a key with an unpaired surrogate


def mutate(event: dict, field: str, value, delete: bool) -> bool:
    """Set or delete `field` ("args.X" inside args) of `event`; False when its args are
    not an object (nothing to set)."""
    target, key = event, field
    if field.startswith("args."):
        target, key = event.setdefault("args", {}), field[5:]
        if not isinstance(target, dict):
            return False
    if delete:
        target.pop(key, None)
    else:
        target[key] = value
    return True


def _strict(text: str):
    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def _write(doc: dict, path: Path, deep: int = 0) -> Path:
    text = json.dumps(doc, allow_nan=True)
    if deep:  # args nested deeper than any recursive decoder goes
        nested = "[" * deep + "]" * deep
        text = text.replace('"traceEvents": [', '"traceEvents": [{"ph": "X", "cat": "cpu_op", '
                            f'"name": "deep", "ts": 1, "dur": 1, "pid": 1, "tid": 1, '
                            f'"args": {{"a": {nested}}}}}, ', 1)  # fmt: skip
    path.write_text(text)
    return path


def _import_and_check(trace: Path, out: Path, expected_x: int) -> None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a Python warning reaches the user's terminal
            summary = import_kineto([trace], out, command=["pytest"], jobs=1)
    except PerfdiagError as e:
        assert "\n" not in str(e)
        return
    run = load_run(out)
    spans = run.spans
    assert (spans["start_ns"].abs() <= INT64).all() and (spans["dur_ns"] >= 0).all()
    f = summary.files[0]
    skipped_x = sum(n for why, n in f.skipped.items() if why.startswith("X event"))
    skipped_x += f.skipped.get("CPU event with a pid/tid that is not an integer", 0)
    skipped_x += f.skipped.get("CPU event with a pid/tid beyond the int64 range", 0)
    skipped_x += f.skipped.get("event nested too deeply to decode", 0)
    trace_windows = len(run.manifest.extra["kineto"]["files"][0]["profiler_windows"])
    # What the summary counts is what the table holds: no row dropped by the writer.
    assert sum(f.spans.values()) == len(spans)
    # Every X event is a span, a profiler window, or skipped with its reason.
    assert len(spans) + trace_windows + skipped_x == expected_x, f.skipped
    for args in (("inspect", out), ("timeline", out, "--json"), ("analyze", out, "--no-report")):
        outcome = call_cli(*args)
        assert_clean(outcome)
        if "--json" in args and outcome.code == 0:
            _strict(outcome.stdout)


@given(
    index=st.integers(0, len(BASE["traceEvents"]) - 1),
    field=st.sampled_from(FIELDS + [f"args.{a}" for a in ARG_FIELDS]),
    value=nasty,
    delete=st.booleans(),
)
def test_a_mutated_event(tmp_path_factory, index, field, value, delete):
    tmp = tmp_path_factory.mktemp("kineto")
    doc = json.loads(json.dumps(BASE))
    if not mutate(doc["traceEvents"][index], field, value, delete):
        return
    x_events = sum(1 for e in doc["traceEvents"] if e.get("ph") == "X")
    _import_and_check(_write(doc, tmp / "t.json"), tmp / "run", x_events)


@given(key=st.sampled_from(["baseTimeNanoseconds", "distributedInfo", "deviceProperties",
                            "traceName", "schemaVersion"]), value=nasty)  # fmt: skip
def test_a_mutated_header(tmp_path_factory, key, value):
    tmp = tmp_path_factory.mktemp("kineto")
    doc = json.loads(json.dumps(BASE)) | {key: value}
    x_events = sum(1 for e in doc["traceEvents"] if e.get("ph") == "X")
    _import_and_check(_write(doc, tmp / "t.json"), tmp / "run", x_events)


def test_args_nested_200000_deep_are_skipped_and_counted(tmp_path):
    x_events = sum(1 for e in BASE["traceEvents"] if e.get("ph") == "X") + 1
    summary_path = _write(BASE, tmp_path / "t.json", deep=200_000)
    _import_and_check(summary_path, tmp_path / "run", x_events)
    meta = load_run(tmp_path / "run").manifest.extra["kineto"]["files"][0]
    assert meta["skipped"]["event nested too deeply to decode"] == 1

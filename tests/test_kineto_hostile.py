"""Kineto traces an attacker (or a broken exporter) could write: ids beyond int64, lone
surrogates in names, the same events twice. Each imports with the right counts, with one
warning line at most, and never as an internal error."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pandas as pd
import pytest

from perfdiag import load_run
from perfdiag.traces.importers.kineto import import_kineto

EXCERPT = Path(__file__).parent / "data" / "kineto_excerpt.json"
BASE = json.loads(EXCERPT.read_text())
HUGE = 10**30


def _doc():
    return json.loads(json.dumps(BASE))


def _first(doc, cat):
    return next(e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == cat)


def _import(doc, tmp_path):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a Python warning is a defect here
        summary = import_kineto([path], tmp_path / "run", jobs=1)
    return summary, load_run(tmp_path / "run")


def _x_events(doc) -> int:
    return sum(1 for e in doc["traceEvents"] if e.get("ph") == "X")


@pytest.mark.parametrize("field", ["pid", "tid"])
def test_a_cpu_id_beyond_int64_is_skipped_and_counted(tmp_path, field):
    doc = _doc()
    _first(doc, "cpu_op")[field] = HUGE
    summary, run = _import(doc, tmp_path)
    skipped = summary.files[0].skipped
    assert skipped == {"CPU event with a pid/tid beyond the int64 range": 1}
    assert sum(summary.spans.values()) == len(run.spans) == _x_events(doc) - 1 - 1  # 1 window


@pytest.mark.parametrize("arg", ["device", "stream", "correlation"])
def test_a_gpu_id_beyond_int64_is_left_empty(tmp_path, arg):
    doc = _doc()
    kernel = _first(doc, "kernel")
    kernel["args"][arg] = HUGE
    summary, run = _import(doc, tmp_path)
    assert sum(summary.spans.values()) == len(run.spans) == _x_events(doc) - 1
    value = run.spans[run.spans["name"] == kernel["name"]].iloc[0][arg]
    if arg == "correlation":  # none in args: a launch flow may still name it
        assert pd.isna(value) or value < 2**63
    else:
        assert pd.isna(value)


@pytest.mark.parametrize("fast", [True, False])
def test_lone_surrogates_in_names_are_kept_as_replacement_characters(tmp_path, fast):
    doc = _doc()
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") != "Trace"]
    for e in xs[:10]:
        e["name"] += "\ud800"
    xs[10]["cat"] = "custom\udfff"
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        summary = import_kineto([path], tmp_path / "run", jobs=1, fast=fast)
    run = load_run(tmp_path / "run")
    assert sum(summary.spans.values()) == len(run.spans) == len(xs)
    assert run.manifest.extra.get("rows_dropped") in (None, {}, 0)
    assert (run.spans["name"].str.endswith("\ufffd")).sum() == 10
    assert "custom\ufffd" in set(run.spans["category"])


def test_identical_events_twice_are_reported_with_their_count(tmp_path):
    doc = _doc()
    doc["traceEvents"] = doc["traceEvents"] + doc["traceEvents"]
    summary, run = _import(doc, tmp_path)
    spans_once = _x_events(_doc()) - 1  # the profiler's window is no span
    said = [w for w in summary.warnings if "identical" in w]
    assert len(said) == 1 and f"{spans_once:,} " in said[0], summary.warnings
    assert run.manifest.extra["kineto"]["warnings"] == summary.warnings
    # Kept, as HTA keeps them: the warning says their time counts twice.
    assert summary.files[0].skipped == {}
    assert len(run.spans) == 2 * spans_once
    assert run.manifest.extra["kineto"]["files"][0]["identical_spans"] == spans_once


def test_a_trace_without_duplicates_says_nothing(tmp_path):
    summary, _ = _import(_doc(), tmp_path)
    assert not [w for w in summary.warnings if "identical" in w]


def test_lone_surrogates_in_counters_and_metadata_keep_their_rows(tmp_path):
    doc = _doc()
    ts = _first(doc, "cpu_op")["ts"]
    doc["traceEvents"] += [
        {"ph": "C", "name": "q\ud800", "pid": "\ud802", "ts": ts, "args": {"v\udc00": 3, "w": 4}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": "\ud800", "args": {"name": "w\udfff"}},
    ]
    before = len(load_run(_import(_doc(), tmp_path / "a")[0].out).counters)
    _, run = _import(doc, tmp_path / "b")
    counters = run.counters
    assert len(counters) == before + 2
    assert {"q\ufffd.v\ufffd", "q\ufffd.w"} <= set(counters["name"])


@pytest.mark.parametrize("fast", [True, False])
def test_lone_surrogates_in_args_keys_and_values_keep_the_spans(tmp_path, fast):
    doc = _doc()
    for e in doc["traceEvents"]:
        if e.get("ph") == "X":
            e.setdefault("args", {})["s\udfff"] = "v\ud800"
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        summary = import_kineto([path], tmp_path / "run", jobs=1, fast=fast)
    run = load_run(tmp_path / "run")
    assert sum(summary.spans.values()) == len(run.spans) == _x_events(doc) - 1
    assert run.spans["correlation"].notna().any()  # the keys it reads are still read

"""Chrome JSON (Trace Event Format) export of the hand-built run: it loads with `json`,
holds the same slices per kind as the run, keeps every timestamp to the nanosecond, nests
on every thread, pairs its flows and names its processes and threads."""

import gzip
import json
from collections import Counter, defaultdict
from decimal import Decimal
from pathlib import Path

import export_runs as R
import pytest

import perfdiag
from perfdiag.traces.exporters import export_run
from perfdiag.traces.exporters.chrome import us_text


def load_chrome(path: Path) -> dict:
    """The document, numbers as Decimal (exactly as written) — a float would round."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f, parse_float=Decimal)


def ns(doc: dict, us: Decimal) -> int:
    value = Decimal(doc["baseTimeNanoseconds"]) + us * 1000
    assert value == value.to_integral_value()
    return int(value)


@pytest.fixture(scope="module")
def rich(tmp_path_factory):
    path = R.write_rich_run(tmp_path_factory.mktemp("chrome") / "run")
    result = export_run(path, "chrome")
    return perfdiag.load_run(path), result, load_chrome(result.path)


def test_us_text_is_exact():
    assert us_text(0) == "0.000" and us_text(1) == "0.001" and us_text(1_234_567) == "1234.567"
    assert us_text(10**19 + 7) == "10000000000000000.007"


def test_loads_and_counts_match_the_run(rich):
    run, result, doc = rich
    assert result.path.name == f"{run.manifest.run_id}.trace.json"
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    got = Counter(e["cat"] for e in xs)
    assert dict(got) == result.slices
    spans = run.spans["category"].astype(str).value_counts().to_dict()
    assert {k: got[k] for k in spans} == spans
    assert got["step"] == len(run.steps) and got["request"] == 3 and got["prefill"] == 5
    assert doc["displayTimeUnit"] == "ns" and doc["otherData"]["run_id"] == run.manifest.run_id


def test_timestamps_round_trip_to_the_nanosecond(rich):
    run, _, doc = rich
    spans = run.spans
    want = sorted(zip(spans["name"].astype(str), spans["start_ns"], spans["dur_ns"], strict=True))
    cats = set(spans["category"].astype(str))
    got = sorted(
        (e["name"], ns(doc, e["ts"]), int(e["dur"] * 1000))
        for e in doc["traceEvents"]
        if e["ph"] == "X" and e["cat"] in cats
    )
    assert got == want
    assert doc["baseTimeNanoseconds"] % 1_000_000_000 == 0
    assert all(e["ts"] >= 0 for e in doc["traceEvents"] if "ts" in e)


def test_slices_nest_on_every_thread(rich):
    _, _, doc = rich
    by_thread = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            by_thread[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for thread, slices in by_thread.items():
        stack = []
        for start, end in sorted(slices, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1], f"partial overlap on {thread} at {start}"
            stack.append(end)


def test_flows_pair_up_and_bind_to_slices(rich):
    _, result, doc = rich
    events = doc["traceEvents"]
    starts = {(e["pid"], e["tid"], e["ts"]) for e in events if e["ph"] == "X"}
    s = {e["id"]: e for e in events if e["ph"] == "s"}
    f = {e["id"]: e for e in events if e["ph"] == "f"}
    assert len(s) == len(f) == result.flows > 0
    assert s.keys() == f.keys()
    for fid, begin in s.items():
        end = f[fid]
        assert begin["ts"] <= end["ts"] and begin["name"] == end["name"] and end["bp"] == "e"
        assert (begin["pid"], begin["tid"], begin["ts"]) in starts
        assert (end["pid"], end["tid"], end["ts"]) in starts
    assert Counter(e["name"] for e in s.values()) == {
        "request-step": 9,
        "step-kernel": 4,
        "ac2g": 5,
    }


def test_every_process_and_thread_is_named(rich):
    _, _, doc = rich
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    processes = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    for e in doc["traceEvents"]:
        if e["ph"] in ("X", "i"):
            assert (e["pid"], e["tid"]) in threads
        if e["ph"] != "M":
            assert e["pid"] in processes
    assert processes[R.PID] == f"perfdiag {R.PID}" and threads[(R.PID, R.TID)] == f"thread {R.TID}"
    assert {"Requests", "Scheduler", "GPU 0", "Findings", "Host"} <= set(processes.values())


def test_args_keep_the_recorded_object_and_perfdiag_fields(rich):
    _, _, doc = rich
    gemm = next(e for e in doc["traceEvents"] if e.get("name") == "gemm")
    assert gemm["args"]["grid"] == [1, 2, 3] and gemm["args"]["correlation"] == 1
    assert gemm["args"]["flops"] == 2**40 + 1 and gemm["args"]["step_id"] == 0
    step = next(e for e in doc["traceEvents"] if e.get("name") == "step 1")
    assert step["args"]["num_prefill_tokens"] == 22


def test_counters_and_findings(rich):
    _, _, doc = rich
    util = [e for e in doc["traceEvents"] if e["ph"] == "C" and e["name"] == "gpu_util_pct"]
    assert [(ns(doc, e["ts"]), e["args"]["%"]) for e in util] == [(R.us(10), 50), (R.us(30), 80)]
    marks = sorted((ns(doc, e["ts"]), e["name"]) for e in doc["traceEvents"] if e["ph"] == "i")
    assert (R.us(40), "Steps 3 and 5 are slow") in marks and len(marks) == 4


def test_gzip_and_no_args(rich, tmp_path):
    run, result, _doc = rich
    out = export_run(run, "chrome", tmp_path / "t.json.gz", with_args=False)
    zipped = load_chrome(out.path)
    assert out.slices == result.slices
    gemm = next(e for e in zipped["traceEvents"] if e.get("name") == "gemm")
    assert "grid" not in gemm["args"] and gemm["args"]["correlation"] == 1


def test_args_that_are_not_an_object_stay_text():
    from perfdiag.traces.exporters.chrome import _args_text

    assert json.loads(_args_text([("step_id", 3)], "not json")) == {
        "step_id": 3,
        "args": "not json",
    }
    assert json.loads(_args_text([("x", 1.5), ("y", float("nan"))], " {} ")) == {
        "x": 1.5,
        "y": None,
    }
    assert json.loads(_args_text([("correlation", 9)], '{"correlation": 7}')) == {"correlation": 7}

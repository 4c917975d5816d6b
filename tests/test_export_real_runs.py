"""Exports of real data: a run recorded by `perfdiag run` (tiny preset, a profiler window)
and the shared Kineto traces imported with `perfdiag import`. Both formats keep every
slice per kind, the kernel count and the total kernel time to the nanosecond."""

import gzip
import json
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import perfetto_validator as V
import pytest

import perfdiag
from perfdiag.traces.exporters import export_run
from perfdiag.traces.importers.kineto import import_kineto

KINETO = Path(__file__).resolve().parent / "data" / "kineto"  # real traces, as in conftest.py


def chrome_doc(path: Path) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f, parse_float=Decimal)


def chrome_ns(doc, us: Decimal) -> int:
    return int(Decimal(doc["baseTimeNanoseconds"]) + us * 1000)


def span_counts(run) -> dict:
    return run.spans["category"].astype(str).value_counts().to_dict()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    out = tmp_path_factory.mktemp("real") / "run"
    cmd = [sys.executable, "-m", "perfdiag", "run", "--preset", "tiny", "-n", "8",
           "--prompt-len", "uniform:8:60", "--output-len", "uniform:4:12", "--rate", "30",
           "--profile-steps", "2:4", "--kv-blocks", "12", "--chunk-size", "32", "-q",
           "--out", str(out)]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    return perfdiag.load_run(out)


def test_recorded_run_to_perfetto(recorded, tmp_path):
    run = recorded
    result = export_run(run, "perfetto", tmp_path / "t.pftrace")
    d = V.validate(result.path)
    kinds = d.by_category()
    for cat, n in span_counts(run).items():
        assert kinds[cat] == n, cat
    events = run.request_events["kind"].astype(str).value_counts()
    assert kinds["step"] == len(run.steps)
    assert kinds["request"] == len(run.requests)
    assert kinds["prefill"] == events["prefill_chunk"]
    assert kinds["queue"] == events["queued"]
    assert kinds.get("preempted", 0) == events.get("preempted", 0)
    assert kinds["cpu_op"] > 100  # the profiler window's ops
    e = run.request_events
    ran = e[e["kind"].isin(["prefill_chunk", "first_token", "token"]) & e["step_id"].notna()]
    request_flows = [f for f in d.flows if {f[0].category, f[1].category} & {"prefill", "decode"}]
    assert len(request_flows) == len(ran[["request_id", "step_id"]].drop_duplicates())
    assert {d.path(t.uuid) for t in d.tracks.values()} >= {"Requests", "Scheduler/steps",
                                                           "Scheduler/KV blocks used"}  # fmt: skip


def test_recorded_run_to_chrome_exact(recorded, tmp_path):
    run = recorded
    result = export_run(run, "chrome", tmp_path / "t.json")
    doc = chrome_doc(result.path)
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    spans = run.spans
    cats = set(span_counts(run))
    got = sorted((e["name"], chrome_ns(doc, e["ts"]), int(e["dur"] * 1000)) for e in xs
                 if e["cat"] in cats)  # fmt: skip
    want = sorted(zip(spans["name"].astype(str), spans["start_ns"], spans["dur_ns"], strict=True))
    assert got == want
    steps = sorted(
        (chrome_ns(doc, e["ts"]), e["args"]["step_id"]) for e in xs if e["cat"] == "step"
    )
    assert steps == sorted(zip(run.steps["start_ns"], run.steps["step_id"], strict=True))


def test_recorded_run_to_tensorboard(recorded, tmp_path):
    result = export_run(recorded, "tensorboard", tmp_path / "logs")
    (trace,) = result.files
    raw = next((recorded.path / "raw").glob("*.json.gz"))
    assert trace.read_bytes() == raw.read_bytes()  # the profiler's own trace, its own clock
    tb = pytest.importorskip("torch_tb_profiler.profiler.data", reason="tensorboard extra")
    data = tb.RunProfileData.parse("w", None, str(trace), str(tmp_path / "cache"))
    assert len([e for e in data.events if e.type == "Operator"]) > 100


@pytest.fixture(scope="module")
def v100(tmp_path_factory):
    out = tmp_path_factory.mktemp("kineto") / "v100"
    import_kineto([KINETO / "v100_train_ns_resolution.json.gz"], out)
    return perfdiag.load_run(out)


def kernel_totals(run) -> tuple[int, int]:
    k = run.spans[run.spans["category"] == "kernel"]
    return len(k), int(k["dur_ns"].sum())


def test_kineto_import_to_perfetto_keeps_kernels(v100, tmp_path):
    result = export_run(v100, "perfetto", tmp_path / "t.pftrace")
    d = V.validate(result.path)
    kernels = [s for s in d.slices if s.category == "kernel"]
    assert (len(kernels), sum(s.dur for s in kernels)) == kernel_totals(v100)
    assert dict(d.by_category()) == span_counts(v100)
    launches = [f for f in d.flows if f[1].category == "kernel" and f[0].category == "cuda_runtime"]
    assert len(launches) == len(kernels)  # every kernel has its launch in this trace
    assert d.track_named("thread 1102 (pt_main_thread)")  # the importer's thread names


def test_kineto_import_to_chrome_keeps_kernels(v100, tmp_path):
    result = export_run(v100, "chrome", tmp_path / "t.json")
    doc = chrome_doc(result.path)
    kernels = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "kernel"]
    total = sum(Decimal(e["dur"]) * 1000 for e in kernels)
    assert (len(kernels), int(total)) == kernel_totals(v100)
    assert all(e["args"]["correlation"] for e in kernels)  # Kineto's own args, kept


@pytest.mark.parametrize(
    "files",
    [
        ["sampled_rank-0", "sampled_rank-1"],
        ["a100_nccl_comm"],
        ["mi250_rocm"],
        ["cpu_only"],
    ],
)
def test_more_kineto_traces_export(files, tmp_path):
    import_kineto([KINETO / f"{f}.json.gz" for f in files], tmp_path / "run")
    run = perfdiag.load_run(tmp_path / "run")
    d = V.validate(export_run(run, "perfetto", tmp_path / "t.pftrace").path)
    assert dict(d.by_category()) == span_counts(run)
    chrome = export_run(run, "chrome", tmp_path / "t.json.gz")
    with gzip.open(chrome.path, "rt") as f:
        doc = json.load(f)
    assert sum(e["ph"] == "X" for e in doc["traceEvents"]) == len(run.spans)
    paths = {d.path(t.uuid) for t in d.tracks.values()}
    if len(files) == 2:
        assert {"GPU 0 · rank 0/stream 7", "GPU 1 · rank 1/stream 7"} <= paths
    if files == ["a100_nccl_comm"]:
        comm = [s for s in d.slices if s.category == "comm"]
        assert any(d.tracks[s.track].name == "communication" for s in comm)

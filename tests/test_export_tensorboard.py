"""TensorBoard export: a log dir whose files torch-tb-profiler's own run loader parses, with
the run's kernels; the raw profiler trace copied when the run kept one; a clear error for
a run without a profiler window."""

import gzip
import json
from pathlib import Path

import export_runs as R
import pytest

import perfdiag
from perfdiag.errors import PerfdiagError
from perfdiag.traces.exporters import export_run
from perfdiag.traces.schema import Span
from perfdiag.traces.writer import RunWriter


def plugin_load(logdir: Path, run_name: str):
    """The plugin's own RunLoader (the code TensorBoard runs), on one run of the log dir."""
    tb_io = pytest.importorskip(
        "torch_tb_profiler.io", reason="torch-tb-profiler not installed (the tensorboard extra)"
    )
    from torch_tb_profiler.profiler.loader import RunLoader

    cache = tb_io.Cache()
    try:
        return RunLoader(run_name, str(logdir / run_name), cache).load()
    finally:
        cache.close() if hasattr(cache, "close") else None


@pytest.fixture(scope="module")
def rich(tmp_path_factory):
    return R.write_rich_run(tmp_path_factory.mktemp("tb") / "run", with_findings=False)


def test_generated_kineto_layout(rich, tmp_path):
    run = perfdiag.load_run(rich)
    result = export_run(run, "tensorboard", tmp_path / "logs")
    (trace,) = result.files
    assert trace.parent == tmp_path / "logs" / run.manifest.run_id
    assert trace.name.endswith(".pt.trace.json")
    doc = json.loads(trace.read_text())
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    # kernels and the GPU collective (Kineto files NCCL kernels as kernels)
    assert sorted(e["name"] for e in kernels) == sorted(
        ["gemm", "graph_k1", "graph_k2", "early", "ncclKernel_AllReduce"]
    )
    gemm = next(e for e in kernels if e["name"] == "gemm")
    assert (gemm["pid"], gemm["tid"], gemm["args"]["device"], gemm["args"]["stream"]) == (
        0,
        7,
        0,
        7,
    )
    names = {e["name"] for e in doc["traceEvents"] if e["ph"] == "X"}
    assert "gpu annotation" in names  # annotations in; phases and unplaced spans out
    assert "forward" not in names and "orphan" not in names
    assert result.slices["kernel"] == 4


def test_plugin_loader_parses_the_generated_trace(rich, tmp_path):
    run = perfdiag.load_run(rich)
    export_run(run, "tensorboard", tmp_path / "logs")
    loaded = plugin_load(tmp_path / "logs", run.manifest.run_id)
    from torch_tb_profiler.run import RunProfile

    (profile,) = [p for p in loaded.get_profiles() if isinstance(p, RunProfile)]
    views = {v.name for v in profile.views}
    assert {"overall", "operator", "kernel", "trace"} <= views
    rows = profile.kernel_table["data"]["rows"]
    calls = {row[0]: row[2] for row in rows}
    assert calls["gemm"] == 1 and calls["graph_k1"] == 1 and sum(calls.values()) == 5


def test_raw_profiler_trace_is_copied(tmp_path):
    raw_doc = {"schemaVersion": 1, "traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1.5, "dur": 2,
         "args": {"device": 0, "stream": 7, "correlation": 1}}]}  # fmt: skip
    path = tmp_path / "run"
    with RunWriter(path, command=["t"], environment_info={}) as w:
        w.table("spans").append(Span("k", "kernel", 1500, 2000, device=0, stream=7))
    (path / "raw").mkdir()
    with gzip.open(path / "raw" / "profile_steps_1_2.json.gz", "wt") as f:
        json.dump(raw_doc, f)
    result = export_run(path, "tensorboard", tmp_path / "logs")
    (copied,) = result.files
    assert copied.name == "profile_steps_1_2.pt.trace.json.gz"
    assert copied.read_bytes() == (path / "raw" / "profile_steps_1_2.json.gz").read_bytes()
    again = export_run(path, "tensorboard", tmp_path / "logs")  # replaces, never stacks up
    assert [f.name for f in again.files] == [copied.name]
    assert sorted(p.name for p in copied.parent.iterdir()) == [copied.name]


def test_a_run_without_a_profiler_window_is_an_error(tmp_path):
    path = tmp_path / "run"
    with RunWriter(path, command=["t"], environment_info={}) as w:
        w.table("spans").append(Span("forward", "phase", 10, 5, pid=1, tid=1))
    with pytest.raises(PerfdiagError, match="no profiler window"):
        export_run(path, "tensorboard", tmp_path / "logs")
    assert not (tmp_path / "logs").exists() or not any((tmp_path / "logs").iterdir())

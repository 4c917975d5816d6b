"""Traces that come back: older Kineto's `async_cpu_to_gpu` launch flows, perfdiag's own
Chrome export imported again (GPU work stays GPU work, ranks kept), and the TensorBoard
export's deviceProperties."""

import json
from pathlib import Path

import pandas as pd

import perfdiag
from perfdiag.traces.exporters import export_run
from perfdiag.traces.importers.kineto import import_kineto
from perfdiag.traces.schema import Span
from perfdiag.traces.writer import RunWriter

KINETO = Path(__file__).resolve().parent / "data" / "kineto"  # real traces, as in conftest.py
EXCERPT = Path(__file__).parent / "data" / "kineto_excerpt.json"
KEY = ["name", "category", "abs_ns", "dur_ns", "device", "stream", "rank", "correlation"]


def _old_kineto(path: Path) -> Path:
    """A trace as PyTorch 1.9-era Kineto wrote it: no args.correlation, launch and
    kernel joined by `async_cpu_to_gpu` flows (pid/tid: thread or device/stream)."""
    events = [
        {"ph": "X", "cat": "Operator", "name": "aten::add", "pid": 7, "tid": 9, "ts": 100,
         "dur": 20, "args": {"External id": 1}},
        {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": 9,
         "ts": 105, "dur": 5, "args": {"External id": 1}},
        {"ph": "s", "id": 41, "pid": 7, "tid": 9, "ts": 105, "cat": "async_cpu_to_gpu",
         "name": "async_gpu"},
        {"ph": "X", "cat": "Kernel", "name": "add_kernel", "pid": 0, "tid": 7, "ts": 130,
         "dur": 10, "args": {"External id": 1, "device": 0, "stream": 7}},
        {"ph": "f", "id": 41, "pid": 0, "tid": 7, "ts": 130, "cat": "async_cpu_to_gpu",
         "name": "async_gpu", "bp": "e"},
        {"ph": "X", "cat": "Memcpy", "name": "Memcpy HtoD", "pid": 7, "tid": 9, "ts": 150,
         "dur": 3, "args": {}},
        {"ph": "s", "id": 42, "pid": 7, "tid": 9, "ts": 150, "cat": "async_cpu_to_gpu",
         "name": "async_gpu"},
        {"ph": "X", "cat": "Memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "pid": 0,
         "tid": 7, "ts": 160, "dur": 4, "args": {"device": 0, "stream": 7, "bytes": 64}},
        {"ph": "f", "id": 42, "pid": 0, "tid": 7, "ts": 160, "cat": "async_cpu_to_gpu",
         "name": "async_gpu", "bp": "e"},
    ]  # fmt: skip
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


def test_async_cpu_to_gpu_flows_link_launches(tmp_path):
    # (an old trace's capitalised categories: Runtime/Kernel/Memcpy/Operator)
    trace = _old_kineto(tmp_path / "old.json")
    text = trace.read_text().replace('"Runtime"', '"cuda_runtime"').replace('"Kernel"', '"kernel"')
    trace.write_text(text.replace('"Memcpy"', '"gpu_memcpy"').replace('"Operator"', '"cpu_op"'))
    summary = import_kineto([trace], tmp_path / "run")
    assert summary.files[0].flows_linked == 4 and "async_cpu_to_gpu flow" not in str(summary)
    run = perfdiag.load_run(tmp_path / "run")
    corr = run.spans.set_index("name")["correlation"]
    assert corr["cudaLaunchKernel"] == corr["add_kernel"] == 41
    assert corr["Memcpy HtoD"] == corr["Memcpy HtoD (Pinned -> Device)"] == 42
    from perfdiag.analyzers.report import timeline_report

    assert timeline_report(run).kernels_linked == 1.0


def _absolute(run_dir: Path) -> pd.DataFrame:
    run = perfdiag.load_run(run_dir)
    s = run.spans.astype({"name": str, "category": str})
    clock = run.manifest.clock  # the run's clock onto Unix ns
    s["abs_ns"] = s["start_ns"] - clock.get("monotonic_ns", 0) + (clock.get("wall_ns") or 0)
    return s[KEY].sort_values(KEY).reset_index(drop=True)


def _ranked_excerpt(tmp_path: Path) -> Path:
    files = []
    for rank in (0, 1):
        p = tmp_path / f"r{rank}.json"
        p.write_text(EXCERPT.read_text().replace('"rank": 0', f'"rank": {rank}'))
        files.append(p)
    import_kineto(files, tmp_path / "ranks")
    return tmp_path / "ranks"


def test_a_chrome_export_of_an_imported_trace_imports_back(tmp_path):
    first = _ranked_excerpt(tmp_path)
    export_run(first, "chrome", tmp_path / "x.json.gz")
    summary = import_kineto([tmp_path / "x.json.gz"], tmp_path / "back")
    assert summary.files[0].rank is None  # one file of two ranks: each span says its own
    a, b = _absolute(first), _absolute(tmp_path / "back")
    assert b["category"].value_counts().to_dict() == a["category"].value_counts().to_dict()
    assert b.equals(a), pd.concat([a, b], axis=1).head(30)
    back = perfdiag.load_run(tmp_path / "back").spans
    nccl = back[back["category"] == "comm"]
    assert nccl["device"].notna().all() and nccl["pid"].isna().all()  # still on the GPU


def _recorded(path: Path) -> Path:
    """A recorded-style run: GPU work in perfdiag's own categories, two ranks."""
    t0 = 1_700_000_000_000_000_000
    with RunWriter(path, command=["test"], environment_info={"python": "3"}) as w:
        spans = w.table("spans")
        for rank in (0, 1):
            base = t0 + rank * 10_000
            spans.append(Span("decode", "phase", base, 5_000, pid=10 + rank, tid=1, rank=rank))
            spans.append(Span("cudaLaunchKernel", "cuda_runtime", base + 100, 50, pid=10 + rank,
                              tid=1, rank=rank, correlation=5))  # fmt: skip
            spans.append(Span("triton_rmsnorm", "triton", base + 300, 400, device=rank,
                              stream=7, rank=rank, flops=4096, bytes=1024))  # fmt: skip
            spans.append(Span("gemm", "kernel", base + 800, 900, device=rank, stream=7,
                              rank=rank, correlation=5, flops=10**9, bytes=10**6))  # fmt: skip
            spans.append(Span("ncclAllReduce", "comm", base + 2000, 700, device=rank, stream=9,
                              rank=rank, bytes=4096))  # fmt: skip
            spans.append(Span("graph", "annotation", base + 3000, 100, device=rank, stream=7,
                              rank=rank))  # fmt: skip
    return path


def test_a_chrome_export_of_a_recorded_run_imports_back(tmp_path):
    first = _recorded(tmp_path / "rec")
    export_run(first, "chrome", tmp_path / "rec.json")
    import_kineto([tmp_path / "rec.json"], tmp_path / "back")
    a, b = _absolute(first), _absolute(tmp_path / "back")
    assert b.equals(a), pd.concat([a, b], axis=1)
    back = perfdiag.load_run(tmp_path / "back").spans.astype({"name": str})
    assert back.groupby("name")["flops"].first().to_dict()["triton_rmsnorm"] == 4096
    assert back.set_index("name").loc["ncclAllReduce", "bytes"].tolist() == [4096, 4096]
    # the rank the user gives wins over the spans' own
    import_kineto([tmp_path / "rec.json"], tmp_path / "forced", ranks=[3])
    assert set(perfdiag.load_run(tmp_path / "forced").spans["rank"]) == {3}


def test_tensorboard_export_keeps_device_properties(tmp_path):
    first = _ranked_excerpt(tmp_path)
    result = export_run(first, "tensorboard", tmp_path / "tb")
    doc = json.loads(sorted(result.files)[0].read_text())
    (props,) = doc["deviceProperties"]
    assert props["name"] == "NVIDIA H100 80GB HBM3" and props["numSms"] == 132
    assert props["totalGlobalMem"] == 85045379072 and props["computeMajor"] == 9
    import_kineto(sorted(result.files), tmp_path / "again")
    gpus = perfdiag.load_run(tmp_path / "again").manifest.environment["gpus"]
    original = perfdiag.load_run(first).manifest.environment["gpus"]
    assert gpus == original


def test_tensorboard_device_properties_of_a_recorded_run():
    from perfdiag.traces.exporters.tensorboard import device_properties

    gpus = [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_bytes": 85045379072,
             "sm_count": 132, "capability": "9.0"}]  # fmt: skip
    assert device_properties(gpus) == [
        {"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85045379072,
         "numSms": 132, "computeMajor": 9, "computeMinor": 0}
    ]  # fmt: skip
    assert device_properties(None) == [] and device_properties([3]) == []


def test_shared_two_rank_job_round_trips_through_chrome(tmp_path):
    files = [KINETO / "sampled_rank-0.json.gz", KINETO / "sampled_rank-1.json.gz"]
    import_kineto(files, tmp_path / "run")
    export_run(tmp_path / "run", "chrome", tmp_path / "x.json.gz")
    import_kineto([tmp_path / "x.json.gz"], tmp_path / "back")
    a, b = _absolute(tmp_path / "run"), _absolute(tmp_path / "back")
    assert sorted(b["rank"].unique()) == [0, 1]
    assert b.equals(a)


def test_an_older_export_with_its_header_last_imports_back(tmp_path, monkeypatch):
    """Exports written before the header moved first keep `otherData` after the events:
    a gzip's tail is found by the import, which then reads the file again as an export."""
    import gzip

    from perfdiag.traces.importers import kineto_identity

    monkeypatch.setattr(kineto_identity, "FIRST_EVENTS", 5)  # the tail is not seen early
    first = _ranked_excerpt(tmp_path)
    export_run(first, "chrome", tmp_path / "x.json")
    doc = json.loads((tmp_path / "x.json").read_text())
    events = doc.pop("traceEvents")
    old = tmp_path / "old.json.gz"
    old.write_bytes(gzip.compress(json.dumps({"traceEvents": events, **doc}).encode()))
    assert not kineto_identity.read_identity(old).tail_read
    import_kineto([old], tmp_path / "back")
    assert _absolute(tmp_path / "back").equals(_absolute(first))

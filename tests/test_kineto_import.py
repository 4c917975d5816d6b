"""Importing PyTorch-profiler (Kineto) traces: every shared trace, exact ns timestamps,
ranks, correlation (args and ac2g flows), errors on bad files and no half-imported run."""

import gzip
import json
import shutil
from decimal import Decimal
from pathlib import Path

import pytest

import perfdiag
from perfdiag.traces.importers.chrome_stream import ChromeTraceStream, TraceFormatError
from perfdiag.traces.importers.kineto import import_kineto
from perfdiag.traces.importers.kineto_events import to_ns

KINETO = Path(__file__).resolve().parent / "data" / "kineto"  # real traces, as in conftest.py
EXCERPT = Path(__file__).parent / "data" / "kineto_excerpt.json"
T0_NS = 1712195495500000 * 1000


def test_to_ns_is_exact_where_floats_are_not():
    text = "1712195495519689.047"
    assert to_ns(text) == 1712195495519689047
    assert int(float(text) * 1000) != 1712195495519689047  # what a float parse would give
    assert to_ns(5) == 5000
    assert to_ns("1.5") == 1500
    assert to_ns("0.0015") == 2  # sub-ns digits round half-even
    assert to_ns("1e3") == 1_000_000
    assert to_ns(Decimal("2.25")) == 2250
    with pytest.raises(TypeError):
        to_ns(None)


def test_excerpt_imports_with_exact_times_and_links(tmp_path):
    summary = import_kineto([EXCERPT], tmp_path / "run")
    run = perfdiag.load_run(tmp_path / "run")
    assert run.status == "complete" and run.manifest.source == "kineto"
    assert summary.events == 28
    spans = run.spans.set_index("name")
    # 1021.503 µs past the base, to the nanosecond
    k2 = spans.loc["void at::native::vectorized_elementwise_kernel<4>"]
    assert k2["start_ns"] == T0_NS + 1_021_503 and k2["dur_ns"] == 3_497
    assert (k2["device"], k2["stream"], k2["pid"]) == (0, 7, pd_na())
    # a kernel without args.correlation is linked through its ac2g flow
    assert spans.loc["triton_poi_fused_add_0", "correlation"] == 6
    assert pd_isna(spans.loc["mystery_kernel", "correlation"])
    nccl = spans[spans["category"] == "comm"].iloc[0]
    assert nccl["bytes"] == 1024 * 4 and nccl["stream"] == 20
    assert spans.loc["Memcpy HtoD (Pinned -> Device)", "bytes"] == 4096
    assert json.loads(spans.loc["aten::mm", "args"])["Input Dims"] == [[64, 128], [128, 256]]
    assert set(run.spans["rank"]) == {0}
    assert "PyTorch Profiler (0)" not in set(run.spans["name"])  # the profiler window
    assert run.counters["name"].tolist() == ["memory_allocated_bytes", "memory_reserved_bytes"]
    env = run.manifest.environment
    assert env["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3" and env["gpus"][0]["sm_count"] == 132
    meta = run.manifest.extra["kineto"]["files"][0]
    assert meta["rank"] == 0 and meta["world_size"] == 2 and meta["processes"]["100"]["name"]


def pd_na():
    import pandas as pd

    return pd.NA


def pd_isna(v):
    import pandas as pd

    return v is pd.NA or pd.isna(v)


def _rank_copy(src: Path, dst: Path, rank: int, base_ns: int | None, gz: bool) -> Path:
    text = src.read_text().replace('"rank": 0', f'"rank": {rank}')
    if base_ns is not None:
        text = text.replace('"displayTimeUnit": "ms"', f'"baseTimeNanoseconds": {base_ns}')
    if gz:
        dst.write_bytes(gzip.compress(text.encode()))
    else:
        dst.write_text(text)
    return dst


def test_ranks_import_together_on_one_time_base(tmp_path):
    # Two files relative to bases 1 s apart: rank 1 lands 1 s after rank 0.
    a = _rank_copy(EXCERPT, tmp_path / "r0.json.gz", 0, 10**18, gz=True)
    b = _rank_copy(EXCERPT, tmp_path / "r1.json", 1, 10**18 + 10**9, gz=False)
    import_kineto([a, b], tmp_path / "run")
    run = perfdiag.load_run(tmp_path / "run")
    assert run.manifest.clock["wall_ns"] == 10**18
    s = run.spans
    first = s[s["name"] == "ProfilerStep#1"].set_index("rank")["start_ns"]
    assert first[1] - first[0] == 10**9
    assert [f["rank"] for f in run.manifest.extra["kineto"]["files"]] == [0, 1]


def test_the_real_traces_and_their_licence_are_in_the_repository():
    """A clone runs every real-trace test: the traces are committed, not looked up outside."""
    traces = {"v100_train_ns_resolution", "sampled_rank-0", "sampled_rank-1", "cpu_only",
              "a100_alexnet_cuda_sync", "a100_nccl_comm", "a100_triton_kernel",
              "mi250_rocm"}  # fmt: skip
    assert {f"{t}.json.gz" for t in traces} | {"LICENSE", "README.md"} <= {
        p.name for p in KINETO.iterdir()
    }
    assert "Copyright (c) Meta Platforms, Inc. and affiliates." in (KINETO / "LICENSE").read_text()


def test_every_shared_trace_imports(tmp_path):
    traces = sorted(KINETO.glob("*.json.gz"))
    assert len(traces) >= 8
    for trace in traces:
        out = tmp_path / trace.name.split(".")[0]
        summary = import_kineto([trace], out)
        run = perfdiag.load_run(out)
        assert run.status == "complete", trace.name
        assert run.row_counts()["spans"] > 0, trace.name
        assert summary.events > 0
    rocm = perfdiag.load_run(tmp_path / "mi250_rocm").spans
    assert "hipLaunchKernel" in set(rocm["name"]) or "hipExtModuleLaunchKernel" in set(rocm["name"])
    cpu_only = perfdiag.load_run(tmp_path / "cpu_only").spans
    assert cpu_only["device"].isna().all() and "comm" in set(cpu_only["category"])
    triton = perfdiag.load_run(tmp_path / "a100_triton_kernel").spans
    kernel = triton[triton["category"] == "kernel"].iloc[0]
    launch = triton[triton["name"] == "cuLaunchKernel"].iloc[0]
    assert kernel["correlation"] == launch["correlation"]


def test_v100_ns_timestamps_match_the_decimal_text(tmp_path):
    trace = KINETO / "v100_train_ns_resolution.json.gz"
    import_kineto([trace], tmp_path / "run")
    spans = perfdiag.load_run(tmp_path / "run").spans
    # The first event's ts/dur, read from the text independently of the importer.
    stream = ChromeTraceStream(trace)
    ev = next(stream.events())
    text = stream.buf[stream.value_start : stream.value_end]
    ts = Decimal(text.split('"ts":')[1].split(",")[0].strip())
    assert int(ts * 1000) in set(spans["start_ns"])
    assert (spans["start_ns"] % 1000 != 0).mean() > 0.5  # ns digits kept
    assert ev["name"] in set(spans["name"])


def test_two_ranks_of_the_shared_job(tmp_path):
    files = [KINETO / "sampled_rank-0.json.gz", KINETO / "sampled_rank-1.json.gz"]
    summary = import_kineto(files, tmp_path / "run")
    run = perfdiag.load_run(tmp_path / "run")
    assert sorted(run.spans["rank"].dropna().unique()) == [0, 1]
    assert [f.rank for f in summary.files] == [0, 1]


# -- bad input ------------------------------------------------------------------------------
def _bad(tmp_path, text: str, name="bad.json", gz=False) -> Path:
    p = tmp_path / name
    if gz:
        p.write_bytes(gzip.compress(text.encode()))
    else:
        p.write_text(text)
    return p


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty file"),
        ('{"traceEvents": [{"ph": "X"', "truncated"),
        ('{"traceEvents": [{"ph": "X"}, {"ph": "X" "ts": 1}]}', "malformed JSON"),
        ('{"traceEvents": [1, 2]}', "is not a JSON object"),
        ('{"schemaVersion": 1}', "no traceEvents"),
        ('{"traceEvents": []} extra', "extra data"),
    ],
)
def test_bad_traces_fail_clearly_and_leave_nothing(tmp_path, text, message):
    path = _bad(tmp_path, text)
    with pytest.raises(TraceFormatError, match=message) as info:
        import_kineto([path], tmp_path / "run")
    assert "\n" not in str(info.value) and str(path) in str(info.value)
    assert not (tmp_path / "run").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["bad.json"]  # no temporary directory


def test_truncated_gzip_and_truncated_text(tmp_path):
    full = EXCERPT.read_bytes()
    cut = _bad(tmp_path, "", name="cut.json.gz")
    cut.write_bytes(gzip.compress(full)[:-40])  # the gzip stream itself ends early
    with pytest.raises(TraceFormatError, match=r"corrupt or truncated|truncated"):
        import_kineto([cut], tmp_path / "run")
    half = _bad(tmp_path, full.decode()[: len(full) // 2], name="half.json")
    with pytest.raises(TraceFormatError, match=r"truncated.*after \d+ events"):
        import_kineto([half], tmp_path / "run2")
    assert not (tmp_path / "run").exists() and not (tmp_path / "run2").exists()


def test_corrupt_gzip_data_is_one_line(tmp_path):
    """Damaged deflate data (not a short file) is an error of the file, whichever inflater
    reads it (ISA-L's errors are not zlib's)."""
    data = bytearray(gzip.compress(EXCERPT.read_bytes()))
    data[20:40] = bytes(range(20))  # inside the deflate stream, past the header
    bad = _bad(tmp_path, "", name="bad.json.gz")
    bad.write_bytes(bytes(data))
    with pytest.raises(TraceFormatError, match=r"corrupt or truncated") as info:
        import_kineto([bad], tmp_path / "run")
    assert "\n" not in str(info.value) and not (tmp_path / "run").exists()


def test_stream_reads_events_across_chunk_boundaries(tmp_path, monkeypatch):
    from perfdiag.traces.importers import chrome_stream

    monkeypatch.setattr(chrome_stream, "CHUNK_CHARS", 7)  # every value spans chunks
    events = list(ChromeTraceStream(EXCERPT).events())
    assert events == json.loads(EXCERPT.read_text(), parse_float=str)["traceEvents"]


def test_cli_import_prints_a_summary_and_errors_in_one_line(tmp_path, cli):
    ok = cli("import", EXCERPT, "--out", tmp_path / "run")
    assert ok.returncode == 0, ok.stderr
    assert "kernel" in ok.stdout and "28" in ok.stdout
    bad = _bad(tmp_path, '{"traceEvents": [{"ph": "X",')
    r = cli("import", bad, "--out", tmp_path / "run2")
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "truncated" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "run2").exists()
    exists = cli("import", EXCERPT, "--out", tmp_path / "run")
    assert exists.returncode == 1 and "already exists" in exists.stderr
    shutil.rmtree(tmp_path / "run")


def test_odd_events_are_counted_not_fatal(tmp_path):
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "no_ts", "pid": 1, "tid": 1, "dur": 1},
        {"ph": "X", "cat": "cpu_op", "name": "open", "pid": 1, "tid": 1, "ts": 5, "dur": -1},
        {"ph": "X", "cat": "overhead", "name": "CUPTI Overhead", "pid": 1, "tid": 1, "ts": 7,
         "dur": 2.5},
        {"ph": "C", "name": "queue", "pid": 1, "ts": 8, "args": {"depth": 3, "label": "x"}},
        {"ph": "B", "name": "begin", "pid": 1, "tid": 1, "ts": 9},
        {"ph": "X", "cat": "cpu_op", "name": "args later", "pid": 1, "tid": 1, "ts": 10,
         "args": {"a": 1.5}, "dur": 1},
    ]  # fmt: skip
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"traceEvents": events}))
    summary = import_kineto([path], tmp_path / "run")
    skipped = summary.files[0].skipped
    assert skipped["X event without a numeric ts/dur"] == 1
    assert skipped["negative duration (set to 0)"] == 1 and skipped["ph=B event"] == 1
    run = perfdiag.load_run(tmp_path / "run")
    spans = run.spans.set_index("name")
    assert spans.loc["open", "dur_ns"] == 0
    assert spans.loc["CUPTI Overhead", "category"] == "overhead"
    assert spans.loc["CUPTI Overhead", "dur_ns"] == 2500
    assert json.loads(spans.loc["args later", "args"]) == {"a": 1.5}  # re-encoded, a float
    assert run.counters[["name", "value"]].values.tolist() == [["queue.depth", 3.0]]
    assert spans["rank"].isna().all()  # one file, no distributedInfo: no rank


def _sorted_spans(run_dir):
    spans = perfdiag.load_run(run_dir).spans.drop(columns=["args"])
    spans = spans.astype({"name": str, "category": str})
    return spans.sort_values(["start_ns", "name", "dur_ns"]).reset_index(drop=True)


def test_parallel_read_equals_one_process(tmp_path, monkeypatch):
    from perfdiag.traces.importers import kineto_parallel

    monkeypatch.setattr(kineto_parallel, "MIN_CHARS_PER_WORKER", 1 << 20)
    trace = KINETO / "v100_train_ns_resolution.json.gz"
    one = import_kineto([trace], tmp_path / "one", jobs=1)  # the fast front end
    three = import_kineto([trace], tmp_path / "three", jobs=3, fast=False)
    meta = perfdiag.load_run(tmp_path / "three").manifest.extra["kineto"]["files"][0]
    assert meta["workers"] == 3 and three.events == one.events == 68692
    assert three.spans == one.spans
    a, b = _sorted_spans(tmp_path / "one"), _sorted_spans(tmp_path / "three")
    assert a.equals(b)


def test_parallel_read_falls_back_when_fooled(tmp_path, monkeypatch):
    from perfdiag.traces.importers import kineto_parallel

    monkeypatch.setattr(kineto_parallel, "MIN_CHARS_PER_WORKER", 4096)
    # Every name holds "}, {", the boundary pattern the workers search for.
    events = [
        {"ph": "X", "cat": "cpu_op", "name": f"op}}, {{{i}", "pid": 1, "tid": 1,
         "ts": f"{1000 + i}.125", "dur": 1, "args": {"k": "}, {"}}
        for i in range(2000)
    ]  # fmt: skip
    path = tmp_path / "fooled.json"
    path.write_text(
        json.dumps({"traceEvents": events}).replace('.125"', ".125").replace('"ts": "', '"ts": ')
    )
    summary = import_kineto([path], tmp_path / "run", jobs=2, fast=False)
    run = perfdiag.load_run(tmp_path / "run")
    assert summary.events == 2000 and len(run.spans) == 2000
    assert run.manifest.extra["kineto"]["files"][0]["workers"] == 1  # fell back, exact
    assert run.spans["start_ns"].min() == 1_000_125

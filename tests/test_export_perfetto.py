"""Perfetto export of a hand-built run: the file decodes with the `perfetto` package's
protobuf classes, passes the structural validator, and holds exactly what the run holds
(slices per kind, every span's name and ns times, flows, counters, findings)."""

from collections import Counter

import export_runs as R
import perfetto_validator as V
import pytest

import perfdiag
from perfdiag.traces.exporters import Annotation, export_run


@pytest.fixture(scope="module")
def rich(tmp_path_factory):
    path = R.write_rich_run(tmp_path_factory.mktemp("export") / "run")
    result = export_run(path, "perfetto")
    return perfdiag.load_run(path), result, V.validate(result.path)


def test_default_path_and_summary(rich):
    run, result, _ = rich
    assert result.path == run.path / "exports" / f"{run.manifest.run_id}.pftrace"
    assert result.flows > 0 and result.instants == 4 and result.counter_samples > 0


def test_slices_per_kind_equal_the_run(rich):
    run, result, decoded = rich
    kinds = decoded.by_category()
    spans = run.spans["category"].astype(str).value_counts().to_dict()
    events = run.request_events["kind"].astype(str).value_counts()
    expected = {
        **spans,
        "step": len(run.steps),
        "request": run.request_events["request_id"].nunique(),
        "prefill": events["prefill_chunk"],
        "preempted": events["preempted"],
        "queue": events["queued"],
        "tokenize": events["tokenize_end"],
        "decode": 4,  # r0; r1 before and after its preemption; r2 until its abort
    }
    assert dict(kinds) == expected
    assert result.slices == expected


def test_every_span_keeps_its_name_and_exact_ns(rich):
    run, _, decoded = rich
    spans = run.spans
    want = sorted(
        zip(
            spans["category"].astype(str),
            spans["name"].astype(str),
            spans["start_ns"].tolist(),
            spans["dur_ns"].tolist(),
            strict=True,
        )
    )
    got = sorted(
        (s.category, s.name, s.start, s.dur)
        for s in decoded.slices
        if s.category in set(spans["category"].astype(str))
    )
    assert got == want
    assert min(s.start for s in decoded.slices) > 2**53  # beyond float64: nothing rounded


def test_track_tree(rich):
    _, _, d = rich
    paths = {d.path(t.uuid) for t in d.tracks.values()}
    for p in [
        "Findings/findings",
        "Requests/lane 1",
        "Requests/lane 2",
        "Scheduler/steps",
        "Scheduler/waiting requests",
        "Scheduler/running sequences",
        "Scheduler/KV blocks used",
        "Scheduler/prefix-cache hit rate",
        "Scheduler/tokens/s (processed)",
        "GPU 0/stream 7",
        "GPU 0/stream 7 · copies",
        "GPU 0/stream 7 · other",
        "GPU 0/communication",
        "GPU 0/gpu_util_pct",
        "GPU 0/power_w",
        "GPU 0/sm_clock_mhz",
        "Host/cpu0 · cpu_util_pct",
        f"perfdiag {R.PID}/thread {R.TID}",
        f"perfdiag {R.PID}/thread {R.TID} (2)",
        f"perfdiag {R.PID}/communication",
        "unattributed/annotation",
    ]:
        assert p in paths, p
    thread = d.track_named(f"thread {R.TID}")[0]
    assert (thread.pid, thread.tid) == (R.PID, R.TID)  # a real thread keeps its ids
    names = [t.name for t in d.tracks.values()]
    assert names.index("Findings") < names.index("Requests") < names.index("Scheduler")


def test_overlapping_cpu_op_moves_to_a_second_lane_and_nesting_is_kept(rich):
    _, _, d = rich
    by_name = {s.name: s for s in d.slices}
    forward, add = by_name["forward"], by_name["aten::add"]
    assert forward.track != add.track
    assert d.tracks[add.track].name == f"thread {R.TID} (2)"
    assert by_name["aten::mm"].track == forward.track and by_name["aten::mm"].depth == 1
    empties = [s for s in d.slices if s.name == "aten::empty"]
    assert [s.dur for s in empties] == [0, 0]


def test_requests_nest_their_phases_and_never_overlap_on_a_lane(rich):
    _, _, d = rich
    top = {s.name: s for s in d.slices if s.category == "request"}
    assert (top["r0"].start, top["r0"].end) == (R.us(0), R.us(51))  # client events included
    assert (top["r1"].start, top["r1"].end) == (R.us(4), R.us(80))
    assert top["r0"].args["prompt_tokens"] == 30 and top["r2"].args["is_warmup"] is True
    by_track = {}
    for s in sorted(top.values(), key=lambda s: s.start):
        assert s.start >= by_track.get(s.track, 0)
        by_track[s.track] = s.end
    r1 = sorted(
        (
            s
            for s in d.slices
            if s.track == top["r1"].track
            and s.depth == 1
            and top["r1"].start <= s.start < top["r1"].end
        ),
        key=lambda s: s.start,
    )
    assert [(s.name, s.start, s.end) for s in r1] == [
        ("queue", R.us(5), R.us(21)),
        ("prefill chunk 1", R.us(21), R.us(29)),  # its step began at 20, but r1 queued till 21
        ("decode", R.us(29), R.us(41)),
        ("preempted (recompute)", R.us(41), R.us(61)),
        ("prefill chunk 2", R.us(61), R.us(69)),
        ("decode", R.us(69), R.us(80)),
    ]
    assert r1[1].args == {"chunk": 1, "num_tokens": 8, "step_id": 1}


def test_steps_carry_their_batch_composition(rich):
    _, _, d = rich
    step1 = next(s for s in d.slices if s.name == "step 1")
    assert step1.args["num_prefill_seqs"] == 2 and step1.args["num_prefill_tokens"] == 22
    assert step1.args["kv_blocks_used"] == 4 and step1.args["num_running"] == 2


def test_flows_link_requests_steps_launches_and_kernels(rich):
    run, _, d = rich
    pairs = Counter()
    for a, b in d.flows:
        assert a.start <= b.start
        pairs[(a.category, b.category)] += 1
        if "kernel" in (a.category, b.category) and "cuda_runtime" in (a.category, b.category):
            launch, k = (a, b) if a.category == "cuda_runtime" else (b, a)
            assert launch.args["correlation"] == k.args["correlation"]
    # launch -> GPU op: 5 GPU ops with a correlation id, the graph launch feeding two
    assert pairs[("cuda_runtime", "kernel")] + pairs[("kernel", "cuda_runtime")] == 4
    assert pairs[("cuda_runtime", "gpu_memcpy")] == 1
    # the kernel that starts before its step is the flow's origin
    assert pairs[("step", "kernel")] == 3 and pairs[("kernel", "step")] == 1
    e = run.request_events  # the steps a request ran in: its chunks' and tokens' steps
    ran = e[e["kind"].isin(["prefill_chunk", "first_token", "token"]) & e["step_id"].notna()]
    n = len(ran[["request_id", "step_id"]].drop_duplicates())
    assert n == 9  # not step 3 for r1: it was preempted while step 3 was scheduled
    assert sum(v for (x, y), v in pairs.items() if "step" in (x, y) and "kernel" not in (x, y)) == n


def test_counters_in_time_order_nan_skipped_and_derived_from_steps(rich):
    _, _, d = rich
    util = d.track_named("gpu_util_pct")[0]
    assert d.counters[util.uuid] == [(R.us(10), 50.0), (R.us(30), 80.0)]
    cpu0 = d.track_named("cpu0 · cpu_util_pct")[0]
    assert d.counters[cpu0.uuid] == [(R.us(20), 12.5)]
    waiting = d.track_named("waiting requests")[0]
    assert [v for _, v in d.counters[waiting.uuid]] == [1, 0, 0, 1, 0, 0]
    rate = d.counters[d.track_named("tokens/s (processed)")[0].uuid]
    assert rate[0] == (R.us(10), pytest.approx(16 / 10e-6)) and (R.us(50), 0.0) in rate
    hit = d.counters[d.track_named("prefix-cache hit rate")[0].uuid]
    assert hit[-1] == (R.us(61), 100.0 * 8 / (30 + 8 + 4))


def test_findings_are_instants_at_the_steps_and_requests_they_name(rich):
    run, _, d = rich
    marks = sorted((i.start, i.name, i.args["severity"]) for i in d.instants)
    t0 = run.time_span_ns()[0]
    assert marks == [
        (t0, "Run looks fine", "info"),
        (R.us(4), "r1 was preempted", "critical"),
        (R.us(40), "Steps 3 and 5 are slow", "warning"),
        (R.us(60), "Steps 3 and 5 are slow", "warning"),
    ]


def test_clock_snapshot_maps_the_run_clock_to_wall_time(rich):
    run, _, d = rich
    (snap,) = d.clock_snapshots
    first = run.time_span_ns()[0]
    assert snap[6] == first and snap[1] == run.manifest.wall_ns(first)


def test_small_chunks_write_the_same_trace(rich, tmp_path):
    from perfdiag.traces.exporters.layout import write_run
    from perfdiag.traces.exporters.perfetto import PerfettoSink

    run, _, decoded = rich
    with open(tmp_path / "t.pftrace", "wb") as f:
        sink = PerfettoSink(f, chunk_packets=7)
        write_run(run, sink)
    assert sink.packets == decoded.packets and sink.bytes_written > 0
    again = V.validate(tmp_path / "t.pftrace")
    key = lambda s: (s.start, s.end, s.name)  # noqa: E731
    assert sorted(map(key, again.slices)) == sorted(map(key, decoded.slices))


def test_names_are_interned_once(rich):
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    _, result, _ = rich
    trace = pb.Trace.FromString(result.path.read_bytes())
    names = [e.name for p in trace.packet for e in p.interned_data.event_names]
    assert len(names) == len(set(names))
    assert not any(p.track_event.name for p in trace.packet)  # always by iid
    assert names.count("aten::empty") == 1


def test_annotations_hook_replaces_findings(rich, tmp_path):
    run, _, _ = rich
    marks = [Annotation(R.us(33), "custom", "warning", "text")]
    result = export_run(run, "perfetto", tmp_path / "a.pftrace", annotations=marks)
    d = V.validate(result.path)
    assert [(i.start, i.name, i.args["text"]) for i in d.instants] == [(R.us(33), "custom", "text")]


def test_an_empty_run_exports_to_both_formats(tmp_path):
    import json

    from perfdiag.traces.writer import RunWriter

    with RunWriter(tmp_path / "run", command=["t"], environment_info={}):
        pass
    d = V.validate(export_run(tmp_path / "run", "perfetto").path)
    assert d.slices == [] and d.tracks == {}
    chrome = export_run(tmp_path / "run", "chrome", tmp_path / "t.json")
    assert json.loads(chrome.path.read_text())["traceEvents"] == []

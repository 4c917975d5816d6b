"""Timeline analyzers: the breakdown, resources, overlap and idle-gap classes, checked by
hand on a small excerpt (tests/data/kineto_excerpt.json, times in µs past its base):

    CPU  aten::mm 1001-1011, aten::busy 1025-1040, aten::late 1086-1093.5
    RT   launch c1 1002-1007, c2 1009-1012, c3 1040-1042, c7 1042.5-1043,
         cudaStreamSynchronize 1045-1053, c4 1053.5-1054.5, memcpy c5 1080-1082,
         cuLaunchKernel c6 1093-1094 (its kernel is linked only by an ac2g flow)
    GPU  s7: k1 1008-1020, k2 1021.503-1025, k3 1043-1050, k4 1055-1060,
             memcpy 1083-1085, k8 1090-1092 (no launch), k6 1095-1097
         s20: NCCL all-reduce (c7) 1044-1052
"""

from pathlib import Path

import numpy as np
import pytest

import perfdiag
from perfdiag.analyzers import intervals
from perfdiag.analyzers.gaps import GAP_CLASSES
from perfdiag.analyzers.report import timeline_report
from perfdiag.analyzers.spans import CLASSES
from perfdiag.traces.importers.kineto import import_kineto

KINETO = Path(__file__).resolve().parent / "data" / "kineto"  # real traces, as in conftest.py

EXCERPT = Path(__file__).parent / "data" / "kineto_excerpt.json"
V100 = KINETO / "v100_train_ns_resolution.json.gz"
T0 = 1712195495500000 * 1000
PARTS = [f"{c}_ns" for c in CLASSES] + ["idle_ns"]


def us(x: float) -> int:
    return T0 + round(x * 1000)


@pytest.fixture(scope="module")
def excerpt(tmp_path_factory):
    out = tmp_path_factory.mktemp("excerpt") / "run"
    import_kineto([EXCERPT], out)
    return timeline_report(perfdiag.load_run(out))


@pytest.fixture(scope="module")
def v100(tmp_path_factory):
    out = tmp_path_factory.mktemp("v100") / "run"
    import_kineto([V100], out)
    run = perfdiag.load_run(out)
    return run, timeline_report(run)


def test_union_and_coverage():
    u = intervals.union([5, 0, 2, 10, 12], [7, 3, 4, 12, 13])  # 10-12 and 12-13 touch
    assert u.start.tolist() == [0, 5, 10] and u.end.tolist() == [4, 7, 13]
    cov = u.coverage()
    assert cov.between(np.array([0, 3, 6]), np.array([100, 6, 11])).tolist() == [9, 2, 2]
    g = intervals.union([0, 1, 0, 5], [2, 3, 1, 6], groups=[1, 1, 0, 0])
    assert list(zip(g.group, g.start, g.end, strict=True)) == [(0, 0, 1), (0, 5, 6), (1, 0, 3)]
    gs, ge, nxt = intervals.gaps(g)
    assert gs.tolist() == [1] and ge.tolist() == [5] and nxt.tolist() == [1]


def test_breakdown_by_hand(excerpt):
    b = excerpt.breakdown
    assert len(b) == 1 and b.loc[0, "name"] == "ProfilerStep#1"
    row = b.iloc[0]
    assert (row["start_ns"], row["end_ns"]) == (us(1000), us(1100))
    # kernels: 12 + 3.497 + 7 + 5 + 2 + 2; comm only where no kernel runs (1050-1052);
    # runtime outside GPU work: 5 + 2 + 0.5 + 1 (sync after 1052) + 1 + 2 + 1;
    # CPU outside both: 1001-1002, 1007-1008, 1025-1040, 1086-1090, 1092-1093.
    expected = dict(
        kernel_ns=31_497, memcpy_ns=2_000, memset_ns=0, comm_ns=2_000, runtime_ns=12_500,
        cpu_ns=22_000, idle_ns=30_003,
    )  # fmt: skip
    assert {k: int(row[k]) for k in expected} == expected
    assert sum(int(row[p]) for p in PARTS) == row["wall_ns"] == 100_000


def test_idle_gaps_by_hand(excerpt):
    g = excerpt.gaps
    got = list(zip(g["start_ns"], g["end_ns"], g["cause"], strict=True))
    assert got == [
        (us(1020), us(1021.503), "launch_delay"),  # c2 was launched at 1009
        (us(1025), us(1043), "host_bound"),  # launched at 1040 after aten::busy
        (us(1052), us(1055), "sync"),  # the host sat in cudaStreamSynchronize
        (us(1060), us(1083), "no_work"),  # the thread did nothing until 1080
        (us(1085), us(1090), "unlinked"),  # k8 has no launch
        (us(1092), us(1095), "host_bound"),  # cuLaunchKernel at 1093, aten::late busy
    ]
    s = excerpt.gap_summary.set_index("cause")
    assert s.loc["host_bound", "total_ns"] == 21_000 and s.loc["host_bound", "gaps"] == 2


def test_resources_overlap_and_launches(excerpt):
    r = excerpt.resources.set_index("resource")
    assert r.loc["gpu 0 stream 7", "busy_ns"] == 33_497
    assert r.loc["gpu 0 stream 20", "busy_ns"] == 8_000
    assert r.loc["pid 100 tid 100", "busy_ns"] == 47_500  # ops and calls on the thread
    assert (r["busy_ns"] + r["idle_ns"] == r["window_ns"]).all()
    o = excerpt.overlap.iloc[0]
    assert o["compute_comm_overlap_ns"] == 6_000 and o["exposed_comm_ns"] == 2_000
    assert o["exposed_copy_ns"] == 2_000 and o["compute_copy_overlap_ns"] == 0
    assert excerpt.kernels_linked == pytest.approx(5 / 6)
    ls = excerpt.launch_stats.set_index("launch_name")
    assert ls.loc["cudaLaunchKernel", "ops"] == 4 + 1  # four kernels + the NCCL kernel
    assert ls.loc["cuLaunchKernel", "queue_max_ns"] == 2_000
    classes = excerpt.kernel_classes.set_index("kernel_class")["count"].to_dict()
    assert classes == {
        "gemm": 2, "communication": 1, "elementwise": 2, "normalisation": 1, "copy": 1,
        "other": 1,
    }  # fmt: skip


def test_v100_timelines(v100):
    run, rep = v100
    spans = run.spans
    kernels = spans[spans["category"] == "kernel"]
    assert len(kernels) == 4350
    # the kernel table's total is the sum of the kernels' durations, to the ns
    table = rep.kernels[rep.kernels["name"].isin(set(kernels["name"]))]
    assert table["total_ns"].sum() == kernels["dur_ns"].sum()
    assert table["count"].sum() == len(kernels)
    gpu_categories = ["kernel", "gpu_memcpy", "gpu_memset", "comm"]
    gpu_ops = spans[spans["device"].notna() & spans["category"].isin(gpu_categories)]
    assert rep.kernel_classes["total_ns"].sum() == gpu_ops["dur_ns"].sum()
    b = rep.breakdown
    assert (b[PARTS].sum(axis=1) == b["wall_ns"]).all()
    assert list(b["name"]) == [f"ProfilerStep#{i}" for i in range(101, 106)]
    assert rep.kernels_linked >= 0.99
    assert set(rep.gaps["cause"]) <= set(GAP_CLASSES)
    # GPU busy = compute ∪ copy; GPU idle = the idle gaps + the windows' edges
    gpu = rep.resources[rep.resources["kind"] == "gpu"].iloc[0]
    o = rep.overlap.sum(numeric_only=True)
    assert gpu["busy_ns"] == o["compute_ns"] + o["copy_ns"] - o["compute_copy_overlap_ns"]
    first, last = gpu_ops["start_ns"].min(), (gpu_ops["start_ns"] + gpu_ops["dur_ns"]).max()
    lo, hi = rep.windows["start_ns"].min(), rep.windows["end_ns"].max()
    assert lo <= first and last <= hi
    assert gpu["idle_ns"] == rep.gaps["dur_ns"].sum() + (first - lo) + (hi - last)


def test_every_shared_trace_gets_timelines(tmp_path):
    for trace in sorted(KINETO.glob("*.json.gz")):
        if trace.name.startswith("v100"):
            continue  # covered above
        out = tmp_path / trace.name.split(".")[0]
        import_kineto([trace], out)
        rep = timeline_report(perfdiag.load_run(out))
        b = rep.breakdown
        assert len(b) and (b[PARTS].sum(axis=1) == b["wall_ns"]).all(), trace.name
        assert len(rep.resources), trace.name
        if "cpu_only" in trace.name:
            assert rep.gpu_ops == 0 and b["kernel_ns"].sum() == 0 and b["comm_ns"].sum() > 0
        else:
            assert rep.gpu_ops > 0 and rep.kernels_linked >= 0.9, trace.name


def test_cli_timeline_json(tmp_path, cli):
    import json

    import_kineto([EXCERPT], tmp_path / "run")
    r = cli("timeline", tmp_path / "run", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["breakdown"][0]["idle_ns"] == 30_003
    text = cli("timeline", tmp_path / "run")
    assert text.returncode == 0 and "GPU idle gaps" in text.stdout
    missing = cli("timeline", tmp_path / "nope")
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1


def test_group_codes_number_groups_as_a_sorted_groupby():
    """Resource groups from hash passes on numpy ids equal pandas' sorted groupby, with an
    absent id a group of its own that sorts first."""
    import pandas as pd

    from perfdiag.analyzers.spans import group_codes, id_array

    rng = np.random.default_rng(3)
    n = 5000
    frame = pd.DataFrame(
        {
            "rank": rng.integers(-1, 3, n),
            "pid": pd.array(rng.integers(0, 4, n), dtype="Int64"),
            "tid": pd.array(rng.integers(-(2**40), 2**40, n) // 2**37, dtype="Int64"),
        }
    )
    frame.loc[rng.random(n) < 0.1, "pid"] = pd.NA
    frame.loc[rng.random(n) < 0.1, "tid"] = pd.NA
    codes, first = group_codes([frame["rank"].to_numpy(), id_array(frame["pid"]),
                                id_array(frame["tid"])])  # fmt: skip
    keys = frame.astype("float64").fillna(-np.inf)
    expected = keys.groupby(["rank", "pid", "tid"], sort=True).ngroup().to_numpy()
    assert (codes == expected).all()
    assert (first == [np.flatnonzero(codes == g)[0] for g in range(codes.max() + 1)]).all()


def test_vllm_step_annotations_are_the_steps(tmp_path):
    """vLLM's worker trace: its `execute_context_*` annotations become the windows, each
    its own extent; the idle inside steps and the time between them are told apart."""
    from kineto_traces import vllm_steps_trace

    run = perfdiag.load_run(import_kineto([vllm_steps_trace(tmp_path / "w.json")],
                                          tmp_path / "run").out)  # fmt: skip
    rep = timeline_report(run)
    w = rep.windows
    assert list(w["source"]) == ["vllm"] * 3 and list(w["step"]) == [0, 1, 2]
    assert list(w["end_ns"] - w["start_ns"]) == [600_000] * 3  # not tiled to the next step
    b = rep.breakdown
    assert (b[PARTS].sum(axis=1) == b["wall_ns"]).all()
    assert list(b["idle_ns"]) == [50_000] * 3  # inside a step: between its ops
    o = rep.outside.iloc[0]
    assert o["extent_ns"] == 2_900_000  # the first step's start to the last host work's end
    assert o["inside_ns"] == 1_800_000 and o["outside_ns"] == 1_100_000
    assert o["host_outside_ns"] == 600_000  # the engine loop's 200 µs after each step


def test_a_real_vllm_worker_trace_has_its_steps(tmp_path):
    """A worker trace vLLM 0.32.0 (CPU) wrote for `--server-profile`, trimmed to 3 steps
    (tests/data/vllm/profile/README.md)."""
    trace = next((Path(__file__).parent / "data" / "vllm" / "profile").glob("rank0.*.json.gz"))
    run = perfdiag.load_run(import_kineto([trace], tmp_path / "run").out)
    rep = timeline_report(run)
    w = rep.windows
    assert (w["source"] == "vllm").all() and len(w) == 3
    assert all(n.startswith("execute_context_") for n in w["name"])
    b = rep.breakdown
    assert (b[PARTS].sum(axis=1) == b["wall_ns"]).all()
    o = rep.outside.iloc[0]
    assert o["inside_ns"] + o["outside_ns"] == o["extent_ns"] and o["outside_ns"] > 0
    assert 0 <= o["host_outside_ns"] <= o["outside_ns"]

"""The critical path (analyzers/critical_path.py) on small traces whose path is worked out
by hand in each test's docstring, and on the real shared traces: the path tiles the
analysed time, the graph's replay reproduces every observed time, and the what-if
savings follow the model."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from kineto_traces import synced_steps_trace

from perfdiag.analyzers import critical_path_graph as cg
from perfdiag.analyzers.critical_path import critical_path
from perfdiag.analyzers.spans import prepare
from perfdiag.analyzers.timeline import windows

KINETO = Path(__file__).resolve().parent / "data" / "kineto"  # real traces, as in conftest.py
US = 1000  # ns


def _cpu(name, start, end, tid=1, category="cpu_op", correlation=None):
    return {"name": name, "category": category, "start_ns": start * US,
            "dur_ns": (end - start) * US, "pid": 1, "tid": tid, "device": None,
            "stream": None, "correlation": correlation}  # fmt: skip


def _gpu(name, start, end, correlation=None, stream=7, category="kernel"):
    return {"name": name, "category": category, "start_ns": start * US,
            "dur_ns": (end - start) * US, "pid": None, "tid": None, "device": 0,
            "stream": stream, "correlation": correlation}  # fmt: skip


def _frame(rows) -> pd.DataFrame:
    f = pd.DataFrame(rows)
    for col in ("pid", "tid", "device", "stream", "correlation"):
        f[col] = pd.array(f[col].tolist(), dtype="Int64")
    f["rank"] = pd.array([None] * len(f), dtype="Int64")
    f["step_id"] = pd.array([None] * len(f), dtype="Int64")
    return prepare(f)


def _path(rows):
    df = _frame(rows)
    return critical_path(df, windows(df))


def _parts(cp) -> list[tuple[str, str, int]]:
    s = cp.segments
    return [(k, n, int(d) // US) for k, n, d in zip(s["kind"], s["name"], s["dur_ns"], strict=True)]


def _saved_us(cp, kind, name) -> float:
    it = cp.items[(cp.items["kind"] == kind) & (cp.items["name"] == name)]
    return int(it["saved_ns"].iloc[0]) / US


def test_launch_kernel_sync_by_hand():
    """op A 0–10, launch 10–12, op B 12–20, cudaDeviceSynchronize 20–50; the kernel runs
    15–45. The sync returns 5 after the kernel (sync 5), the kernel (30) started 5 after
    its launch call began (launch 5), which followed A (10): 10 + 5 + 30 + 5 = 50, and B
    is off the path. Halving the kernel saves 15; halving A saves 5 (the kernel moves
    with it); removing the sync saves 5 only: the host is done at 25, the GPU at 45."""
    cp = _path([
        _cpu("A", 0, 10),
        _cpu("cudaLaunchKernel", 10, 12, category="cuda_runtime", correlation=1),
        _cpu("B", 12, 20),
        _cpu("cudaDeviceSynchronize", 20, 50, category="cuda_runtime"),
        _gpu("K", 15, 45, correlation=1),
    ])  # fmt: skip
    assert _parts(cp) == [
        ("cpu", "A", 10),
        ("launch", "cudaLaunchKernel", 5),
        ("kernel", "K", 30),
        ("sync", "cudaDeviceSynchronize", 5),
    ]
    assert _saved_us(cp, "kernel", "K") == 15
    assert _saved_us(cp, "cpu", "A") == 5
    assert _saved_us(cp, "sync", "cudaDeviceSynchronize") == 5
    bound = cp.bound()
    assert bound["gpu compute"] == 30 * US and bound["host"] == 10 * US


def test_gpu_backlog_by_hand():
    """Three launches at 0, 2, 4 (1 µs each); kernels of 10 run back to back from 5: each
    waits for the one before (its launch was long issued), so the path is the first
    launch (5) and the three kernels (30). Halving the middle kernel saves 5."""
    rows = []
    for i in range(3):
        rows.append(_cpu("cudaLaunchKernel", 2 * i, 2 * i + 1, category="cuda_runtime",
                         correlation=i + 1))  # fmt: skip
        rows.append(_gpu(f"K{i}", 5 + 10 * i, 15 + 10 * i, correlation=i + 1))
    cp = _path(rows)
    assert _parts(cp) == [
        ("launch", "cudaLaunchKernel", 5),
        ("kernel", "K0", 10),
        ("kernel", "K1", 10),
        ("kernel", "K2", 10),
    ]
    assert _saved_us(cp, "kernel", "K1") == 5
    assert cp.bound().index[0] == "gpu compute"


def test_kernel_to_kernel_gaps_on_the_path():
    """Kernels launched together at the start but starting 40 after the one before ended:
    the gaps are the GPU's (kernel-to-kernel), not the host's."""
    rows = []
    for i in range(4):
        rows.append(_cpu("cudaLaunchKernel", i, i + 1, category="cuda_runtime",
                         correlation=i + 1))  # fmt: skip
        rows.append(_gpu(f"K{i}", 10 + 50 * i, 20 + 50 * i, correlation=i + 1))
    cp = _path(rows)
    by_kind = cp.by_kind.set_index("kind")["path_ns"] // US
    assert by_kind["gpu_gap"] == 3 * 40 and by_kind["kernel"] == 40
    assert by_kind["launch"] == 10  # the first kernel's launch (from its call at 0)


def test_a_thread_waiting_for_another_by_hand():
    """The main thread runs F 0–10, then nothing until O 40–45; the backward thread runs
    B 12–38. The main thread was waiting for B (the backward thread was busy through its
    gap), and B's thread for F: F 10, wait 2, B 26, wait 2, O 5 = 45."""
    cp = _path([_cpu("F", 0, 10), _cpu("O", 40, 45), _cpu("B", 12, 38, tid=2)])
    parts = _parts(cp)
    assert [(k, d) for k, _, d in parts] == [
        ("cpu", 10), ("thread_wait", 2), ("cpu", 26), ("thread_wait", 2), ("cpu", 5),
    ]  # fmt: skip
    assert [n for k, n, _ in parts if k == "cpu"] == ["F", "B", "O"]
    assert _saved_us(cp, "cpu", "B") == 13


def test_nested_ops_count_their_self_time():
    """An op 0–20 with a child 5–15: 10 of its own and 10 of the child's."""
    cp = _path([_cpu("outer", 0, 20), _cpu("inner", 5, 15)])
    assert _parts(cp) == [("cpu", "outer", 5), ("cpu", "inner", 10), ("cpu", "outer", 5)]


def test_path_is_cut_at_step_boundaries():
    """Two ProfilerSteps: the path's parts per window add up to each window's wall time."""
    rows = [
        _cpu("ProfilerStep#1", 0, 30, category="annotation"),
        _cpu("ProfilerStep#2", 30, 60, category="annotation"),
        _cpu("A", 0, 25),
        _cpu("cudaLaunchKernel", 25, 26, category="cuda_runtime", correlation=1),
        _gpu("K", 28, 58, correlation=1),
    ]
    cp = _path(rows)
    w = cp.windows.set_index("name")
    parts = [c for c in w.columns if c.endswith("_ns") and c != "wall_ns"]
    assert (w[parts].sum(axis=1) == w["wall_ns"]).all()
    assert w.loc["ProfilerStep#2", "kernel_ns"] == 28 * US
    assert w.loc["ProfilerStep#1", "cpu_ns"] == 25 * US


@pytest.mark.parametrize(
    "name", ["v100_train_ns_resolution", "a100_alexnet_cuda_sync", "a100_nccl_comm"]
)
def test_real_traces_replay_and_tile(name, tmp_path, cli):
    path = KINETO / f"{name}.json.gz"
    cli("import", str(path), "-o", str(tmp_path / "run"))
    from perfdiag.analyzers.spans import timeline_spans
    from perfdiag.traces.reader import load_run

    df = timeline_spans(load_run(tmp_path / "run"))
    g = cg.build(df)
    assert np.array_equal(cg.replay(g), g.time)  # the model reproduces the trace
    wins = windows(df)
    cp = critical_path(df, wins)
    r = cp.ranks.iloc[0]
    lo, hi = int(wins["start_ns"].min()), int(wins["end_ns"].max())
    # the path tiles the analysed time: its parts add up to the wall time, per step too
    assert r["path_ns"] == hi - lo
    w = cp.windows
    parts = [c for c in w.columns if c.endswith("_ns") and c != "wall_ns"]
    assert (w[parts].sum(axis=1) == w["wall_ns"]).all()
    s = cp.segments
    assert (s["start_ns"].to_numpy()[1:] == s["end_ns"].to_numpy()[:-1]).all()
    # halving what lies on the path saves at most half its time there (max-plus model)
    halved = cp.items[cp.items["what_if"] == "halved"]
    assert len(halved) and (halved["saved_ns"] <= halved["path_ns"] // 2 + halved["pieces"]).all()


def test_timeline_and_findings_show_the_critical_path(tmp_path, cli):
    """Halving the gemm shortens every step by 150 µs (the sync returns 2 µs after it);
    that is the biggest lever, named in the finding and in `timeline`."""
    import json

    trace = synced_steps_trace(tmp_path / "t.json")
    assert cli("import", trace, "-o", tmp_path / "run").returncode == 0
    text = cli("timeline", tmp_path / "run").stdout
    assert "critical path (3 steps" in text and "heaviest ops on the critical path" in text
    data = json.loads(cli("timeline", tmp_path / "run", "--json").stdout)
    items = {(i["kind"], i["name"]): i for i in data["critical_path"]["items"]}
    assert items[("kernel", "gemm")]["saved_per_window_ns"] == 150_000
    assert items[("kernel", "gemm")]["path_ns"] == 900_000
    assert cli("analyze", tmp_path / "run").returncode == 0
    findings = json.loads((tmp_path / "run/results/findings.json").read_text())["findings"]
    cp = next(f for f in findings if f["check"] == "critical-path")
    assert cp["severity"] == "info"
    assert "halving gemm would save 0.150 ms per step" in cp["title"]


# HTA 0.5.0's critical_path_analysis(rank=0, annotation="") on the shared alexnet trace
# (its own test data), run in HTA's environment (pandas < 2.2): % of the path.
HTA_ALEXNET = {
    "cpu_bound": 99.833203,
    "gpu_compute_bound": 0.139710,
    "gpu_kernel_launch_overhead": 0.004694,
    "gpu_kernel_kernel_overhead": 0.022394,
}


def test_agrees_with_hta_on_the_alexnet_trace(tmp_path, cli):
    """Over the whole trace, as HTA measures it: host 99.86 % (HTA's cpu_bound 99.83 %),
    GPU work 0.136 % (0.140 %), launch overhead 0.0046 % (0.0047 %)."""
    path = KINETO / "a100_alexnet_cuda_sync.json.gz"
    cli("import", str(path), "-o", str(tmp_path / "run"))
    from perfdiag.analyzers.spans import timeline_spans
    from perfdiag.traces.reader import load_run

    df = timeline_spans(load_run(tmp_path / "run"))
    cp = critical_path(df, windows(df))  # no ProfilerStep: the whole trace is the window
    b = cp.bound()
    pct = 100 * b / b.sum()
    assert abs(pct["host"] - HTA_ALEXNET["cpu_bound"]) < 0.05
    gpu = pct.get("gpu compute", 0) + pct.get("gpu copy", 0)
    assert abs(gpu - HTA_ALEXNET["gpu_compute_bound"]) < 0.01
    assert abs(pct["launch overhead"] - HTA_ALEXNET["gpu_kernel_launch_overhead"]) < 0.001
    assert pct.get("kernel-to-kernel", 0) < HTA_ALEXNET["gpu_kernel_kernel_overhead"] + 0.01

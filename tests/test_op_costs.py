"""Op-level figures from a profiler window: self time of nested CPU ops, the GEMMs' and
attention's FLOPs and bytes from their recorded shapes, and `perfdiag timeline` on a
run with `--profile-steps` (the profiled steps first, ops by self time, the op roofline
filled)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from perfdiag.analyzers.kernels import op_breakdown, self_time_ns
from perfdiag.traces.importers.op_cost import op_cost


def test_self_time_takes_out_direct_children_only():
    # thread 0: A[0,100) ⊃ B[10,60) ⊃ C[20,30); D[60,90) touches B; thread 1: E[0,50)
    start = np.array([0, 10, 20, 60, 0])
    end = np.array([100, 60, 30, 90, 50])
    thread = np.array([0, 0, 0, 0, 1])
    assert self_time_ns(start, end, thread).tolist() == [20, 40, 10, 30, 50]
    # spans starting together: the longer is the parent
    assert self_time_ns(np.array([0, 0]), np.array([10, 40]), np.array([0, 0])).tolist() == [10, 30]


def test_op_table_ranks_by_self_time_and_self_shares_add_up():
    df = pd.DataFrame(
        {
            "name": ["aten::linear", "aten::matmul", "aten::mm", "aten::add"],
            "category": pd.Categorical(["cpu_op"] * 4),
            "start_ns": [0, 1, 2, 50],
            "dur_ns": [40, 38, 35, 10],
            "rank_key": -1, "pid": 1, "tid": 1,
        }
    )  # fmt: skip
    ops = op_breakdown(df)
    assert ops["name"].tolist()[0] == "aten::mm"
    assert dict(zip(ops["name"], ops["self_ns"], strict=True)) == {
        "aten::linear": 2, "aten::matmul": 3, "aten::mm": 35, "aten::add": 10,
    }  # fmt: skip
    assert ops["self_share_pct"].sum() == pytest.approx(100.0)
    assert ops.set_index("name").loc["aten::linear", "total_ns"] == 40  # inclusive kept


@pytest.mark.parametrize(
    "name, dims, types, flops, nbytes",
    [
        ("aten::mm", [[31, 64], [64, 128]], ["float", "float"], 2 * 31 * 64 * 128,
         4 * (31 * 64 + 64 * 128 + 31 * 128)),
        ("aten::addmm", [[128], [8, 64], [64, 128]], ["float", "c10::BFloat16", "c10::BFloat16"],
         2 * 8 * 64 * 128, 2 * (128 + 8 * 64 + 64 * 128 + 8 * 128)),
        ("aten::bmm", [[2, 3, 4], [2, 4, 5]], ["c10::Half", "c10::Half"], 2 * 2 * 3 * 4 * 5,
         2 * 2 * (12 + 20 + 15)),
        ("aten::_scaled_dot_product_flash_attention_for_cpu",
         [[1, 4, 10, 16], [1, 4, 12, 16], [1, 4, 12, 16], [], []], ["float"] * 5,
         2 * 4 * 10 * 12 * 32, 4 * (640 + 768 + 768 + 640)),
        ("aten::linear", [[8, 64], [128, 64]], ["float", "float"], None, None),  # not a leaf
        ("aten::mm", [[8, 64], [32, 128]], ["float", "float"], None, None),  # inner dims differ
        ("aten::mm", [[8], [64, 128]], ["float", "float"], None, None),  # not a matrix
    ],
)  # fmt: skip
def test_gemm_and_attention_costs_from_shapes(name, dims, types, flops, nbytes):
    assert op_cost(name, {"Input Dims": dims, "Input type": types}) == (flops, nbytes)


def test_timeline_of_a_profiled_run(tmp_path, cli):
    run = tmp_path / "run"
    r = cli("run", "--preset", "tiny", "-n", "8", "--warmup", "0", "--prompt-len", "24",
            "--output-len", "8", "--profile-steps", "3:6", "--no-device-sampling", "-q",
            "-o", run)  # fmt: skip
    assert r.returncode == 0, r.stderr
    shown = cli("timeline", run)
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    assert "the profiled window, steps 3–6" in text
    assert "CPU ops by self time" in text
    data = json.loads(cli("timeline", run, "--json").stdout)
    ops = {o["name"]: o for o in data["ops"]}
    assert sum(o["self_share_pct"] for o in ops.values()) == pytest.approx(100.0)
    assert ops["aten::linear"]["self_ns"] < ops["aten::linear"]["total_ns"]
    spans = {s["name"]: s for s in data["roofline"]["spans"]}
    assert spans["aten::mm"]["flops"] > 0 and spans["aten::mm"]["bytes"] > 0

"""The Triton probe on single launches: nothing runs for it unless attached; attached,
every launch becomes one span with its grid, meta-parameters, tensor shapes, step and the
FLOPs and bytes of the kernel's closed form."""

from __future__ import annotations

import json

import pytest
import torch

from perfdiag.engine_ref.kernels import decode_attention as dec
from perfdiag.engine_ref.kernels import launch, rms_norm, silu_mul
from perfdiag.engine_ref.kernels._common import interpreting
from perfdiag.engine_ref.kernels.testing import paged_cache, scattered_tables
from perfdiag.probes.triton_probe import TritonProbe
from perfdiag.traces.schema import Span

pytestmark = pytest.mark.skipif(not interpreting(), reason="needs TRITON_INTERPRET=1")


@pytest.fixture
def probe():
    rows: list[Span] = []
    p = TritonProbe(rows.append, "cpu").attach()
    p.rows = rows
    yield p
    p.detach()
    assert launch.observer() is None


def test_without_a_probe_the_cost_model_is_never_evaluated():
    assert launch.observer() is None

    def cost():
        raise AssertionError("evaluated without a probe")

    x = torch.randn(3, 10)
    out = torch.empty(3, 5)
    launch.launch(silu_mul._silu_mul_kernel, (1, 1), (x, out, 3, 5, 10, 5),
                  {"ROWS": 4, "BLOCK": 8}, cost)  # fmt: skip
    torch.testing.assert_close(out, silu_mul.ref_silu_mul(x))


def test_a_launch_is_one_span_with_its_closed_form(probe):
    t, h = 5, 48
    x, w, r = torch.randn(t, h), torch.randn(h), torch.randn(t, h)
    probe.begin(7)
    rms_norm.rms_norm(x, w, 1e-6, residual=r)
    assert probe.end() is None  # no CUDA step timer under it on the CPU
    rms_norm.rms_norm(x, w, 1e-6)  # outside a step
    first, second = probe.rows
    assert first.name == "_rms_norm_kernel" and first.category == "triton_interpret"
    assert (first.step_id, second.step_id) == (7, None)
    assert first.dur_ns > 0 and first.pid is not None and first.device is None
    assert first.flops == 5 * t * h and second.flops == 4 * t * h  # 4/elem (+1: the add)
    assert first.bytes == 4 * 4 * t * h + 4 * h and second.bytes == 2 * 4 * t * h + 4 * h
    args = json.loads(first.args)
    assert args["timing"] == "host_interpreter" and args["grid"] == [1]
    assert args["meta"]["HAS_RES"] is True and args["meta"]["BLOCK"] == 64
    assert args["tensors"]["x_ptr"] == {"shape": [t, h], "dtype": "float32", "stride": [h, 1]}
    assert args["scalars"]["n_cols"] == h
    assert probe.summary()["launches"] == 2


def test_split_decode_records_both_launches(probe):
    lens = [9, 30, 1]
    kc, vc = paged_cache(20, 4, 2, 24, torch.float16, "cpu")
    tables = scattered_tables(lens, 4, 20)
    q = torch.randn(3, 6, 24).half()
    dec.decode_attention(q, kc, vc, tables, torch.tensor(lens, dtype=torch.int32), 0.2,
                         num_splits=2)  # fmt: skip
    main, combine = probe.rows
    b, h, hkv, d, s, e, w = 3, 6, 2, 24, 2, 2, tables.shape[1]
    assert (main.name, combine.name) == ("_decode_kernel", "_combine_kernel")
    assert json.loads(main.args)["grid"] == [b, hkv, s]
    assert main.flops == 4 * h * d * sum(lens)  # QKᵀ and PV, one query per sequence
    kv = 2 * sum(lens) * hkv * d * e
    partials = 4 * b * h * s * (d + 1)
    assert main.bytes == b * h * d * e + kv + 4 * b * (w + 1) + partials
    assert combine.bytes == partials + b * h * d * e
    assert combine.flops == 2 * b * h * s * d


def test_graph_replays_are_annotations(probe):
    probe.begin(3)
    probe.on_graph_replay(3, 4, 100, 250)
    probe.end()
    (row,) = probe.rows
    assert (row.name, row.category, row.dur_ns, row.step_id) == ("cuda_graph_replay",
                                                                 "annotation", 150, 3)  # fmt: skip
    assert json.loads(row.args) == {"batch_size": 3, "graph_size": 4}

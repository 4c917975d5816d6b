"""The micro-benchmark's cases run (tiny shapes, interpreted) and report figures that are
the cost models' FLOPs and bytes over the measured time, so the GPU check's table means
what it says."""

from __future__ import annotations

import pytest

from perfdiag.engine_ref.kernels import bench
from perfdiag.engine_ref.kernels._common import interpreting
from perfdiag.hardware.ceilings import resolve


@pytest.mark.skipif(not interpreting(), reason="needs TRITON_INTERPRET=1")
def test_every_case_runs_and_reports_consistent_figures():
    ceilings = resolve("cpu")
    rows = bench.bench_kernels("cpu", "float32", ceilings, bench.TINY)
    kinds = {r["kernel"].split()[0] for r in rows}
    assert kinds == {"rms_norm+residual", "rope", "silu_mul", "kv_store", "decode_attention",
                     "prefill_attention", "dense_matmul", "dequant_matmul"}  # fmt: skip
    for r in rows:
        assert r["ms"] > 0 and r["bytes"] > 0
        assert r["gb_per_s"] == pytest.approx(r["bytes"] / (r["ms"] / 1e3) / 1e9)
        assert r["tflop_per_s"] == pytest.approx(r["flops"] / (r["ms"] / 1e3) / 1e12)
        assert r["pct_of_bandwidth"] == pytest.approx(
            100 * r["gb_per_s"] * 1e9 / ceilings.bytes_per_s
        )
    decode = next(r for r in rows if r["kernel"].startswith("decode"))
    (batch, ctx), t = bench.TINY.decodes[0], bench.TINY
    assert decode["flops"] == 4 * t.heads * t.head_dim * batch * ctx

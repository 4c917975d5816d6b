"""A run recorded with the Triton kernels (interpreted on the CPU) holds every launch, in
its step, with the FLOPs and bytes of the closed forms recomputed here from the steps
table, the request events and the model's shape; the roofline places each kernel."""

from __future__ import annotations

import json

import numpy as np
import pytest

from perfdiag import load_run
from perfdiag.analyzers.roofline import roofline_report
from perfdiag.engine_ref.config import ModelConfig
from perfdiag.engine_ref.kernels._common import interpreting
from perfdiag.probes.run_options import EngineOptions, ProbeOptions, RunOptions
from perfdiag.probes.session import record_run
from perfdiag.probes.workload import ArrivalSpec, LengthSpec, WorkloadSpec

pytestmark = pytest.mark.skipif(not interpreting(), reason="needs TRITON_INTERPRET=1")

M = ModelConfig.preset("tiny")
L, HID, HQ, HKV, D, INTER, E = 2, 64, 4, 2, 16, 128, 4  # fp32
assert (M.num_layers, M.hidden_size, M.num_heads, M.num_kv_heads, M.head_dim,
        M.intermediate_size) == (L, HID, HQ, HKV, D, INTER)  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    engine = EngineOptions(preset="tiny", kernel_backend="triton", prefix_cache=False,
                           chunk_size=8, block_size=4, kv_cache_mb=1)  # fmt: skip
    workload = WorkloadSpec(requests=5, seed=2, arrival=ArrivalSpec("closed", concurrency=3),
                            prompt_len=LengthSpec.parse("uniform:5:19"),
                            output_len=LengthSpec.parse("4"))  # fmt: skip
    options = RunOptions(engine, workload, ProbeOptions(device_sampling=False))
    path = tmp_path_factory.mktemp("runs") / "triton"
    assert record_run(options, path, command=["pytest"]).status == "complete"
    return load_run(path)


def _per_step_chunks(run):
    """step → [(new tokens, cached context)] of the prefill chunks computed in it."""
    ev = run.request_events
    ev = ev[(ev["kind"].astype(str) == "prefill_chunk") & (ev["side"].astype(str) == "engine")]
    out: dict[int, list] = {}
    done: dict[str, int] = {}
    for row in ev.sort_values(["step_id", "ts_ns"]).itertuples():
        c = done.get(row.request_id, 0)
        out.setdefault(int(row.step_id), []).append((int(row.num_tokens), c))
        done[row.request_id] = c + int(row.num_tokens)
    return out


def test_every_launch_matches_its_closed_form(run):
    spans = run.spans
    tri = spans[spans["category"].astype(str) == "triton_interpret"]
    assert len(tri) == run.manifest.extra["triton_probe"]["launches"] > 0
    assert tri["step_id"].notna().all() and (tri["dur_ns"] > 0).all()
    chunks = _per_step_chunks(run)
    mixed = 0
    for step in run.steps.itertuples():
        s = tri[tri["step_id"] == step.step_id]
        by = {n: g for n, g in s.groupby(s["name"].astype(str))}
        t = step.num_prefill_tokens + step.num_decode_seqs  # tokens computed in the step
        rms = by["_rms_norm_kernel"]
        assert len(rms) == 2 * L + 1  # two per layer, the final norm
        assert rms["flops"].sum() == (4 + 5 * 2 * L) * t * HID  # the first has no residual
        assert rms["bytes"].sum() == (2 + 4 * 2 * L) * t * HID * E + (2 * L + 1) * HID * E
        for name, flops, nbytes in (
            ("_rope_kernel", 3 * t * (HQ + HKV) * D, 2 * t * (HQ + HKV) * D * E + t * (8 + D * E)),
            ("_silu_mul_kernel", 5 * t * INTER, 3 * t * INTER * E),
            ("_store_kv_kernel", 0, 4 * t * HKV * D * E + 8 * t),
        ):
            assert len(by[name]) == L
            assert (by[name]["flops"] == flops).all() and (by[name]["bytes"] == nbytes).all()
        # attention: a sequence of n new tokens after c cached keeps n·c + n(n+1)/2 pairs
        ch = chunks.get(step.step_id, [])
        decode_ctx = step.num_context_tokens - sum(n + c for n, c in ch)
        pairs = decode_ctx + sum(n * c + n * (n + 1) // 2 for n, c in ch)
        dec, pre = by.get("_decode_kernel"), by.get("_prefill_kernel")
        flops = sum(0 if g is None else g["flops"].sum() for g in (dec, pre))
        assert flops == L * 4 * HQ * D * pairs
        # bytes: q read and output written once, each sequence's K/V once per KV head,
        # int32 tables and lengths (decode) or tables, lengths and offsets (prefill)
        dec_ctx = 0 if dec is None else int(dec["flops"].iloc[0]) // (4 * HQ * D)
        for g, ctx, extra in ((dec, dec_ctx, 1), (pre, step.num_context_tokens - dec_ctx, 2)):
            for row in [] if g is None else g.itertuples():
                a = json.loads(row.args)["tensors"]
                (tq, hq, d), (seqs, width) = a["q_ptr"]["shape"], a["bt_ptr"]["shape"]
                assert (hq, d, a["q_ptr"]["dtype"]) == (HQ, D, "float32")
                want = 2 * tq * HQ * D * E + 2 * ctx * HKV * D * E + 4 * seqs * (width + extra)
                assert row.bytes == want + (4 if extra == 2 else 0)
        mixed += bool(ch) and step.num_decode_seqs > 0
    assert mixed > 0  # steps with prefill chunks and decodes together were checked


def test_the_roofline_places_every_kernel(run):
    roof = roofline_report(run)
    spans = roof.spans.set_index("name")
    names = {"_rms_norm_kernel", "_rope_kernel", "_silu_mul_kernel", "_store_kv_kernel",
             "_decode_kernel", "_prefill_kernel"}  # fmt: skip
    assert names <= set(spans.index)
    assert (spans.loc[list(names), "category"] == "triton_interpret").all()
    tri = run.spans[run.spans["category"].astype(str) == "triton_interpret"]
    assert spans.loc[list(names), "count"].sum() == len(tri)
    assert np.isfinite(spans.loc[list(names), "pct_of_roof"]).all()  # copies included


def test_perfdiag_run_kernel_backend_triton_on_the_cpu(tmp_path):
    """The CLI chooses the interpreter itself on the CPU (the variable is not inherited)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "perfdiag", "run", "--preset", "tiny", "--kernel-backend",
           "triton", "-n", "2", "--prompt-len", "6", "--output-len", "3",
           "--no-device-sampling", "-q", "-o", str(out)]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    r = load_run(out)
    assert r.manifest.config["run_options"]["engine"]["kernel_backend"] == "triton"
    cats = set(r.spans["category"].astype(str))
    assert "triton_interpret" in cats and "triton" not in cats
    bad = subprocess.run([*cmd[:7], "fast", "-o", str(tmp_path / "bad")], env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 1 and "kernel_backend 'fast'" in bad.stderr
    assert "Traceback" not in bad.stderr and not (tmp_path / "bad").exists()

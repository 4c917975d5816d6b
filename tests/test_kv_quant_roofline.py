"""The roofline counts K/V bytes as a quantised cache stores them: one byte and a 4-byte
scale per (token, KV head), read from the manifest's config.engine_config.cache.kv_dtype;
a run recorded before the field existed means the model's dtype."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from perfdiag import load_run
from perfdiag.analyzers.model_flops import ModelShape, for_engine_config, for_kv_dtype
from perfdiag.analyzers.roofline import roofline_report, step_shapes
from perfdiag.analyzers.step_cost_roofline import hardware_of
from perfdiag.cli import app

SHAPE = ModelShape(576, 30, 9, 3, 64, 1536, 49152, 4.0, 4.0, 4.0)


def test_kv_bytes_per_element_as_stored():
    assert for_kv_dtype(SHAPE, "int8").kv_bytes == 1 + 4 / 64
    assert for_kv_dtype(SHAPE, "fp8").kv_bytes == 1 + 4 / 64
    assert for_kv_dtype(SHAPE, "auto") is SHAPE and for_kv_dtype(SHAPE, None) is SHAPE
    both = for_engine_config(SHAPE, {"weight_format": "q8_0", "cache": {"kv_dtype": "int8"}})
    assert (both.weight_bytes, both.kv_bytes) == (34 / 32, 1 + 4 / 64)
    assert for_engine_config(SHAPE, {"weight_format": "float"}) is SHAPE  # an older run


@pytest.fixture(scope="module")
def int8_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("kvq") / "run"
    args = ["run", "--preset", "tiny", "--kv-dtype", "int8", "-n", "6", "--warmup", "0"]
    res = CliRunner().invoke(app, [*args, "--no-device-sampling", "-q", "-o", str(out)])
    assert res.exit_code == 0, res.output
    return out


def test_roofline_reads_the_recorded_kv_dtype(int8_run, tmp_path):
    old = tmp_path / "old"  # the same run as if recorded before kv_dtype existed
    shutil.copytree(int8_run, old)
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["config"]["engine_config"]["cache"]["kv_dtype"]
    (old / "manifest.json").write_text(json.dumps(manifest))

    run = load_run(int8_run)
    new_b = roofline_report(run).steps["bytes"].to_numpy()
    old_b = roofline_report(load_run(old)).steps["bytes"].to_numpy()
    # tiny: 2 layers, 2 KV heads of 16; fp32 model (4 bytes) vs int8 + scale (1.25 bytes)
    s = step_shapes(run.steps, run.request_events)
    kv_tokens = s.prefill_kv_tokens + s.decode_kv_tokens + s.prefill_tokens + s.decode_seqs
    saved = 2 * 2 * (2 * 16) * (4 - 1.25) * kv_tokens  # K and V, layers, heads x dim
    assert (old_b - new_b) == pytest.approx(saved)
    assert hardware_of(run).model.kv_bytes == 1.25
    assert hardware_of(load_run(old)).model.kv_bytes == 4.0

"""The analytic cost model against torch's FlopCounterMode, its closed forms, and the
roofline's positions and bound classes."""

import numpy as np
import pandas as pd
import pytest

from perfdiag.analyzers.model_flops import (
    MATMUL_OPS,
    ModelShape,
    StepShape,
    step_costs,
    step_totals,
)
from perfdiag.analyzers.roofline import position, step_shapes
from perfdiag.hardware.ceilings import DATASHEET, Ceilings, datasheet_for, resolve

TINY = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, vocab_size=259,
)  # fmt: skip


def _matmul_flops(model, shape) -> float:
    costs = step_costs(model, shape, causal="full").set_index("op")
    return float(costs.loc[list(MATMUL_OPS), "flops"].sum())


def test_analytic_flops_match_flop_counter_mode():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from torch.utils.flop_counter import FlopCounterMode

    cfg = transformers.LlamaConfig(**TINY, max_position_embeddings=128, attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    shape = ModelShape.from_dict(cfg.to_dict(), dtype="float32")
    ids = torch.randint(0, cfg.vocab_size, (3, 11))
    with torch.no_grad():
        with FlopCounterMode(display=False) as prefill:
            out = model(input_ids=ids, logits_to_keep=1, use_cache=True)
        with FlopCounterMode(display=False) as decode:
            model(input_ids=ids[:, :1], cache=out.past_key_values, logits_to_keep=1)
    # Same conventions: a masked dense matmul computes every (query, key) pair, and the
    # LM head runs on the last position only.
    analytic_prefill = _matmul_flops(shape, StepShape.from_sequences(prefill=[(11, 0)] * 3))
    analytic_decode = _matmul_flops(shape, StepShape.from_sequences(decode=[11] * 3))
    assert analytic_prefill == pytest.approx(prefill.get_total_flops(), rel=0.01)
    assert analytic_decode == pytest.approx(decode.get_total_flops(), rel=0.01)


def test_decode_gemm_intensity_is_about_the_batch_size():
    m = ModelShape(4096, 32, 32, 8, 128, 14336, 128256)  # 2-byte weights
    for batch in (1, 4, 16):
        costs = step_costs(m, StepShape.from_sequences(decode=[1000] * batch)).set_index("op")
        for op in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
            assert costs.loc[op, "intensity"] == pytest.approx(batch, rel=0.02), (op, batch)


def test_decode_attention_intensity_is_about_the_gqa_ratio():
    for heads, kv_heads in ((32, 8), (32, 32), (64, 8)):
        m = ModelShape(4096, 2, heads, kv_heads, 128, 14336, 32000)
        costs = step_costs(m, StepShape.from_sequences(decode=[4096] * 8)).set_index("op")
        assert costs.loc["attention", "intensity"] == pytest.approx(heads / kv_heads, rel=0.02)
    # with 1-byte KV the same attention does twice the work per byte
    m8 = ModelShape(4096, 2, 32, 8, 128, 14336, 32000, kv_bytes=1)
    costs = step_costs(m8, StepShape.from_sequences(decode=[4096] * 8)).set_index("op")
    assert costs.loc["attention", "intensity"] == pytest.approx(8, rel=0.02)


def test_causal_conventions_and_chunks():
    m = ModelShape.from_dict({**TINY, "num_layers": 1}, dtype="bfloat16")
    one = StepShape.from_sequences(prefill=[(100, 0)])
    assert one.prefill_pairs_exact == 100 * 101 // 2 and one.prefill_pairs_full == 100 * 100
    chunked = (
        StepShape.from_sequences(prefill=[(50, 0, False)]),
        StepShape.from_sequences(prefill=[(50, 50)]),
    )
    # two chunks compute exactly the pairs of the whole prompt, causally
    assert sum(s.prefill_pairs_exact for s in chunked) == one.prefill_pairs_exact
    assert chunked[0].sampled == 0 and chunked[1].sampled == 1
    a = step_costs(m, one).set_index("op").loc["attention", "flops"]
    assert a == 4 * 4 * 16 * (100 * 101 / 2)
    flops, nbytes = step_totals(m, StepShape(np.array([10, 0]), 55, 100, 10, 0, 0, 1))
    assert flops.shape == (2,) and nbytes[0] > nbytes[1] > 0


def test_model_shape_reads_engine_and_hf_configs():
    engine = dict(
        vocab_size=259, hidden_size=512, intermediate_size=1536, num_layers=8, num_heads=8,
        num_kv_heads=2, head_dim=64,
    )  # fmt: skip
    s = ModelShape.from_dict(engine, dtype="float32")
    assert (s.num_layers, s.num_kv_heads, s.weight_bytes, s.kv_bytes) == (8, 2, 4.0, 4.0)
    hf = ModelShape.from_dict({**TINY, "torch_dtype": "bfloat16"})
    assert hf.num_layers == 2 and hf.weight_bytes == 2.0
    with pytest.raises(ValueError, match="lacks"):
        ModelShape.from_dict({"hidden_size": 8})


def test_position_and_bound_classes():
    c = Ceilings("test", {"bfloat16": 100e12}, 1e12, DATASHEET, "unit test")  # ridge 100
    p = position([1e12, 1e9, 1e9], [1e9, 1e9, 1e9], [0.02, 0.0011, 1.0], c, "bfloat16")
    assert p["intensity"].tolist() == [1000, 1, 1]
    assert p["bound"].tolist() == ["compute", "bandwidth", "latency"]
    assert p.loc[0, "pct_of_roof"] == pytest.approx(50)
    assert p.loc[1, "attained_bytes_per_s"] == pytest.approx(1e9 / 0.0011)


def test_datasheets_cover_the_table_and_resolve_falls_back(tmp_path):
    for name in ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA L4",
                 "NVIDIA L40S", "Tesla V100-SXM2-32GB"):  # fmt: skip
        sheet = datasheet_for(name)
        assert sheet is not None and sheet.source.count("http") >= 1, name
    assert datasheet_for("NVIDIA L4").device == "L4"
    assert datasheet_for("NVIDIA L40S").device == "L40S"
    assert resolve("Unknown Accelerator", tmp_path).device == "generic GPU"  # never the CPU


def test_step_shapes_from_steps_and_prefill_chunks():
    steps = pd.DataFrame(
        {
            "step_id": [0, 1, 2],
            "num_prefill_seqs": [1, 1, 0],
            "num_prefill_tokens": [8, 4, 0],
            "num_decode_seqs": [0, 1, 2],
            # Σ over the batch of each sequence's context after the step
            "num_context_tokens": [8, 12 + 9, 13 + 10],
        }
    )
    plain = step_shapes(steps)
    assert plain.prefill_pairs_exact[0] == 8 * 9 / 2
    events = pd.DataFrame(
        {
            "request_id": ["a", "a", "b"],
            "kind": ["prefill_chunk"] * 3,
            "ts_ns": [1, 2, 0],
            "step_id": [0, 1, -5],
            "num_tokens": [8, 4, 8],
        }
    )
    refined = step_shapes(steps, events)
    # step 1's chunk of 4 comes after 8 cached tokens: 4·8 + 4·5/2 pairs, 12 K/V read
    assert refined.prefill_pairs_exact[1] == 4 * 8 + 10
    assert refined.prefill_kv_tokens[1] == 12 and refined.decode_kv_tokens[1] == 9
    assert refined.decode_kv_tokens[2] == 23

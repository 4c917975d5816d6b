"""The roofline's cost model for quantised weights: decode's bytes fall with the packed
size, prefill pays the dequantisation FLOPs (analyzers/model_flops.py)."""

from __future__ import annotations

from perfdiag.analyzers.model_flops import ModelShape, StepShape, for_weight_format, step_totals

SMOLLM2 = dict(hidden_size=576, num_layers=30, num_heads=9, num_key_value_heads=3,
               intermediate_size=1536, vocab_size=49152)  # fmt: skip


def test_decode_bytes_fall_and_prefill_pays_for_dequantisation():
    f32 = ModelShape.from_dict(SMOLLM2, dtype="float32")
    q4 = for_weight_format(f32, "q4_1")
    assert (q4.weight_bytes, q4.dequant_flops, q4.act_bytes) == (0.625, 2.0, 4.0)
    assert for_weight_format(f32, "float") is f32
    decode = StepShape.from_sequences(decode=[100])
    (ff, fb), (qf, qb) = step_totals(f32, decode), step_totals(q4, decode)
    assert 4.5 < fb / qb < 6.4  # weights dominate decode: ~4/0.625, less activations and KV
    assert qf > 1.9 * ff  # one token's 2 FLOPs a weight, plus 2 to dequantise each weight
    prefill = StepShape.from_sequences(prefill=[(512, 0)])
    (pf, _), (pq, _) = step_totals(f32, prefill), step_totals(q4, prefill)
    assert 1.0 < pq / pf < 1.01  # dequantising once per step is small next to 512 tokens

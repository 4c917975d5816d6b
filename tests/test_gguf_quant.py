"""The real model with its weights kept packed (`--weights q4_1|q8_0`) against the same
file dequantised to float.

Documented tolerances: q4_1 keeps the file's own blocks bit for bit, so it differs from
float only in arithmetic order: logits within 1e-3, greedy tokens identical. q8_0
re-quantises the file's Q4_1 blocks (8-bit codes for 4-bit values: an error of at most
half a Q8_0 step): logits within 2 % relative (norm), at least 80 % of next-token choices
the same (a near-tie can flip, and greedy continuations then part: they are not compared)."""

from __future__ import annotations

import pytest
from smollm2_model import PROMPTS, smollm2_path

PATH = smollm2_path()
torch = pytest.importorskip("torch")

from perfdiag.engine_ref import (  # noqa: E402
    EngineConfig,
    LLMEngine,
    SamplingParams,
    quant,
)
from perfdiag.engine_ref.gguf_loader import read_gguf_config  # noqa: E402
from perfdiag.engine_ref.testing import paged_logits  # noqa: E402

TOKENS = 12


def _engine(fmt):
    cfg = read_gguf_config(PATH)
    return LLMEngine(EngineConfig(model=cfg, model_path=str(PATH), max_model_len=512,
                                  weight_format=fmt))  # fmt: skip


@pytest.fixture(scope="module")
def engines():
    return {fmt: _engine(fmt) for fmt in ("float", "q4_1", "q8_0")}


def test_packed_weights_are_the_files_blocks(engines):
    f, q = engines["float"].model, engines["q4_1"].model
    proj = q.layers[3].self_attn.qkv_proj  # Q and K rows un-permuted while still packed
    assert isinstance(proj, quant.QuantLinear) and proj.fmt == "q4_1"
    assert torch.equal(quant.dequantize(proj.packed), f.layers[3].self_attn.qkv_proj.weight)
    head = q.lm_head  # tied: the embedding's Q8_0 blocks, as in the file
    assert head is q.embed_tokens.table and head.fmt == "q8_0"
    assert torch.equal(quant.dequantize(head.packed), f.embed_tokens.weight)
    packed = sum(m.weight_bytes for m in q.modules() if isinstance(m, quant.QuantLinear)
                 if m is not head) + head.weight_bytes  # fmt: skip
    assert packed < 0.2 * sum(p.numel() * 4 for p in f.parameters())  # ~92 MB vs 540 MB


@pytest.mark.parametrize(("fmt", "rel_tol"), [("q4_1", 1e-5), ("q8_0", 0.02)])
def test_quantised_logits_vs_float(engines, fmt, rel_tol):
    ref, eng = engines["float"], engines[fmt]
    for prompt in PROMPTS:
        ids = ref.tokenizer.encode(prompt)
        a, b = paged_logits(ref, ids, 16), paged_logits(eng, ids, 16)
        rel = ((a - b).norm() / a.norm()).item()
        assert rel < rel_tol, (prompt, rel)
        agree = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
        if fmt == "q4_1":
            assert (a - b).abs().max().item() < 1e-3 and agree == 1.0
        else:  # near-ties may flip: most next-token choices agree
            assert agree >= 0.8, (prompt, agree)


def test_q4_1_greedy_tokens_equal_float(engines):
    ref, eng = engines["float"], engines["q4_1"]
    params = SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True)
    prompts = [ref.tokenizer.encode(p) for p in PROMPTS]
    want = [o.token_ids for o in ref.generate(prompts, params)]
    assert [o.token_ids for o in eng.generate(prompts, params)] == want

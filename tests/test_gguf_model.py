"""engine_ref on a real GGUF model against an implementation no one here wrote:
transformers' own GGUF loader (`from_pretrained(..., gguf_file=...)`) on the same file.

Stated tolerances (fp32 on the CPU): logits within 1e-3 absolute at every position (the
logits span about ±35; observed max |Δ| is ~4e-5); greedy continuations identical for 32
tokens on each prompt."""

from __future__ import annotations

import pytest
from smollm2_model import PROMPTS, smollm2_path

PATH = smollm2_path()
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", reason="transformers (dev extra): the reference")
pytest.importorskip("accelerate", reason="transformers needs accelerate to load GGUF files")

from perfdiag.engine_ref import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
from perfdiag.engine_ref.gguf_loader import read_gguf_config  # noqa: E402
from perfdiag.engine_ref.testing import paged_logits  # noqa: E402

LOGITS_ATOL = 1e-3
GREEDY_TOKENS = 32


@pytest.fixture(scope="module")
def engine():
    cfg = EngineConfig(model=read_gguf_config(PATH), model_path=str(PATH), max_model_len=1024)
    return LLMEngine(cfg)


@pytest.fixture(scope="module")
def hf_model():
    m = transformers.AutoModelForCausalLM.from_pretrained(
        PATH.parent, gguf_file=PATH.name, dtype=torch.float32
    )
    return m.eval()


def test_config_from_metadata():
    cfg = read_gguf_config(PATH)
    assert (cfg.num_layers, cfg.hidden_size, cfg.intermediate_size) == (30, 576, 1536)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (9, 3, 64)
    assert cfg.vocab_size == 49152 and cfg.rope.theta == 100000.0
    assert cfg.max_position_embeddings == 8192 and cfg.tie_word_embeddings
    assert cfg.eos_token_ids == (2,) and cfg.weights.startswith("gguf:")
    assert 134e6 < cfg.num_params < 136e6


@pytest.mark.parametrize("prompt", PROMPTS)
def test_logits_match_transformers(engine, hf_model, prompt):
    ids = engine.tokenizer.encode(prompt)
    ours = paged_logits(engine, ids, 5)  # chunked prefill through the paged cache
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0].float()
    assert ours.shape == ref.shape
    diff = (ours - ref).abs().max().item()
    assert diff < LOGITS_ATOL, f"max |Δ logits| {diff:.2e}"
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def test_greedy_continuations_match_transformers(engine, hf_model):
    prompts = [engine.tokenizer.encode(p) for p in PROMPTS]
    params = SamplingParams(temperature=0, max_tokens=GREEDY_TOKENS, ignore_eos=True)
    ours = engine.generate(prompts, params)  # one batch: decodes of all three together
    for ids, out in zip(prompts, ours, strict=True):
        with torch.no_grad():
            ref = hf_model.generate(
                torch.tensor([ids]), max_new_tokens=GREEDY_TOKENS,
                min_new_tokens=GREEDY_TOKENS, do_sample=False,
            )[0, len(ids):].tolist()  # fmt: skip
        assert out.token_ids == ref, engine.tokenizer.decode(out.token_ids)


@pytest.fixture(scope="module")
def numba_engine():
    pytest.importorskip("numba", reason="kernel_backend 'numba' needs the cpu extra")
    cfg = EngineConfig(model=read_gguf_config(PATH), model_path=str(PATH), max_model_len=1024,
                       kernel_backend="numba")  # fmt: skip
    return LLMEngine(cfg)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_fused_cpu_decode_steps_match_transformers(numba_engine, hf_model, prompt):
    """One token a step: every position goes through the fused batch-1 decode step."""
    ids = numba_engine.tokenizer.encode(prompt)
    ours = paged_logits(numba_engine, ids, 1)
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0].float()
    diff = (ours - ref).abs().max().item()
    assert diff < LOGITS_ATOL, f"max |Δ logits| {diff:.2e}"
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def test_fused_cpu_greedy_continuation_matches_transformers(numba_engine, hf_model):
    ids = numba_engine.tokenizer.encode(PROMPTS[0])
    params = SamplingParams(temperature=0, max_tokens=GREEDY_TOKENS, ignore_eos=True)
    ours = numba_engine.generate([ids], params)[0].token_ids
    with torch.no_grad():
        ref = hf_model.generate(
            torch.tensor([ids]), max_new_tokens=GREEDY_TOKENS,
            min_new_tokens=GREEDY_TOKENS, do_sample=False,
        )[0, len(ids):].tolist()  # fmt: skip
    assert ours == ref


def test_chat_request_ends_on_eos_with_real_text(engine):
    tok = engine.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    assert text.endswith("<|im_start|>assistant\n") and "<|im_start|>system" in text
    out = engine.generate([text], SamplingParams(temperature=0, max_tokens=64))[0]
    assert out.finish_reason == "stop" and out.token_ids[-1] == 2  # <|im_end|>, before 64
    assert "Paris" in out.text

"""Against models no one here wrote: engine_ref's logits equal transformers' on the same
random weights, loaded by engine_ref's loader from a checkpoint directory the test writes."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip(
    "transformers", reason="transformers (dev extra) is needed to compare against HF models"
)
pytest.importorskip("safetensors", reason="safetensors (dev extra) writes the checkpoints")
torch = pytest.importorskip("torch")

from perfdiag.engine_ref import LLMEngine, SamplingParams  # noqa: E402
from perfdiag.engine_ref.loader import read_model_config  # noqa: E402
from perfdiag.engine_ref.testing import paged_logits  # noqa: E402

COMMON = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=112,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
)

CASES = {
    "llama_untied": ("LlamaConfig", "LlamaForCausalLM", dict(tie_word_embeddings=False)),
    "llama_tied_mha": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(tie_word_embeddings=True, num_key_value_heads=4),
    ),
    "llama3_rope_scaling": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=500000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=64,
            )
        ),
    ),
    "llama_attention_bias": ("LlamaConfig", "LlamaForCausalLM", dict(attention_bias=True)),
    "qwen2_tied": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "qwen2_untied": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=False)),
}


def write_checkpoint(tmp_path, case: str):
    cfg_cls, model_cls, extra = CASES[case]
    config = getattr(transformers, cfg_cls)(**{**COMMON, **extra})
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():  # HF zero-inits biases; random ones make the check mean something
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
        # Spread the logits so greedy choices are well separated (no fp32 near-ties).
        model.get_output_embeddings().weight.mul_(8.0)
    model.save_pretrained(tmp_path)
    assert list(tmp_path.glob("*.safetensors"))
    return model


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_transformers(tmp_path, case):
    hf = write_checkpoint(tmp_path, case)
    engine = LLMEngine.from_pretrained(str(tmp_path))
    cfg = engine.config.model
    assert cfg.architecture == ("qwen2" if case.startswith("qwen2") else "llama")
    assert cfg.qkv_bias == (case.startswith("qwen2") or case == "llama_attention_bias")

    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, COMMON["vocab_size"], (90,), generator=gen).tolist()
    with torch.no_grad():
        expected = hf(torch.tensor([tokens])).logits[0].float()
    # Through the paged cache, in chunks (prefill) and token by token (decode).
    for chunk in (len(tokens), 7, 1):
        got = paged_logits(engine, tokens, chunk)
        assert got.shape == expected.shape
        torch.testing.assert_close(got, expected, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("case", ["llama_untied", "qwen2_tied"])
def test_greedy_generation_matches_transformers(tmp_path, case):
    hf = write_checkpoint(tmp_path, case)
    engine = LLMEngine.from_pretrained(str(tmp_path))
    prompts = [[1, 5, 9, 13], [2, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49], [3]]
    outs = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    for prompt, out in zip(prompts, outs, strict=True):
        with torch.no_grad():
            ids = hf.generate(
                torch.tensor([prompt]),
                max_new_tokens=12,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )[0]
            logits = hf(ids[None]).logits[0, len(prompt) - 1 : -1]
        top2 = logits.topk(2).values
        assert (top2[:, 0] - top2[:, 1]).min() > 1e-3  # a fair demand, not luck
        assert out.token_ids == ids[len(prompt) :].tolist()


def test_config_fields_read(tmp_path):
    write_checkpoint(tmp_path, "llama3_rope_scaling")
    cfg = read_model_config(tmp_path)
    assert cfg.rope.type == "llama3" and cfg.rope.factor == 8.0
    assert cfg.rope.theta == 500000.0 and cfg.rope.original_max_position_embeddings == 64
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (4, 2, 16)
    assert cfg.weights.startswith("ckpt:")

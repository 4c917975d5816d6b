"""The Qwen2-MoE model (engine_ref/moe.py) against transformers' Qwen2MoeForCausalLM on
checkpoints the test writes: the per-expert names `save_pretrained` writes and the fused
3-D expert tensors transformers 5 holds in memory; logits to fp32 tolerance through the
paged cache, greedy tokens token for token; what the loader refuses."""

from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip(
    "transformers", reason="transformers (dev extra) is needed to compare against HF models"
)
safetensors_torch = pytest.importorskip("safetensors.torch")
torch = pytest.importorskip("torch")

from perfdiag.engine_ref import EngineConfig, LLMEngine, ModelConfig, SamplingParams  # noqa: E402
from perfdiag.engine_ref.loader import CheckpointError, read_model_config  # noqa: E402
from perfdiag.engine_ref.testing import paged_logits  # noqa: E402
from perfdiag.errors import ConfigError  # noqa: E402

COMMON = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=112,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=48,
)
CASES = {
    "shared": {},
    "renormalised_top3": dict(norm_topk_prob=True, num_experts_per_tok=3),
    "tied_no_qkv_bias": dict(tie_word_embeddings=True, qkv_bias=False),
}
# fp32: the engine groups each expert's tokens into one GEMM and sums experts in the same
# (ascending) order as transformers; what differs is GEMM blocking, ~1e-6 relative.
ATOL, RTOL = 2e-4, 1e-4


def write_checkpoint(tmp_path, case="shared", fused=False, head_scale=8.0, **extra):
    config = transformers.Qwen2MoeConfig(**{**COMMON, **CASES[case], **extra})
    torch.manual_seed(0)
    model = transformers.Qwen2MoeForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
            if name.endswith("mlp.gate.weight"):  # spread the router: distinct top-k choices
                p.copy_(torch.randn_like(p))
        model.get_output_embeddings().weight.mul_(head_scale)  # spread the logits
    model.save_pretrained(tmp_path)
    if fused:  # the in-memory names: experts.gate_up_proj [E, 2I, h], experts.down_proj
        for f in tmp_path.glob("*.safetensors"):
            f.unlink()
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        if config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        safetensors_torch.save_file(state, str(tmp_path / "model.safetensors"))
    return model


def _tensor_names(tmp_path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(next(tmp_path.glob("*.safetensors"))), "pt") as f:
        return set(f.keys())


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_transformers(tmp_path, case):
    hf = write_checkpoint(tmp_path, case)
    # What transformers 5.24 writes: one tensor per expert and projection.
    assert "model.layers.0.mlp.experts.7.gate_proj.weight" in _tensor_names(tmp_path)
    engine = LLMEngine.from_pretrained(str(tmp_path))
    cfg = engine.config.model
    assert cfg.architecture == "qwen2_moe" and cfg.is_moe
    assert (cfg.num_experts, cfg.num_experts_per_tok) == (8, CASES[case].get(
        "num_experts_per_tok", 2))  # fmt: skip
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, COMMON["vocab_size"], (90,), generator=gen).tolist()
    with torch.no_grad():
        expected = hf(torch.tensor([tokens])).logits[0].float()
    for chunk in (len(tokens), 7, 1):  # one prefill, chunks, token by token (decode)
        got = paged_logits(engine, tokens, chunk)
        torch.testing.assert_close(got, expected, atol=ATOL, rtol=RTOL)


def test_fused_expert_tensors_load_the_same(tmp_path):
    hf = write_checkpoint(tmp_path, fused=True)
    names = _tensor_names(tmp_path)
    assert "model.layers.0.mlp.experts.gate_up_proj" in names
    assert "model.layers.0.mlp.experts.0.gate_proj.weight" not in names
    engine = LLMEngine.from_pretrained(str(tmp_path))
    tokens = list(range(3, 60))
    with torch.no_grad():
        expected = hf(torch.tensor([tokens])).logits[0].float()
    torch.testing.assert_close(paged_logits(engine, tokens, 5), expected, atol=ATOL, rtol=RTOL)


def test_without_a_shared_expert(tmp_path):
    hf = write_checkpoint(tmp_path, shared_expert_intermediate_size=0)
    engine = LLMEngine.from_pretrained(str(tmp_path))
    assert engine.config.model.shared_expert_intermediate_size == 0
    assert engine.model.layers[0].mlp.shared_expert is None
    tokens = list(range(10, 50))
    with torch.no_grad():
        expected = hf(torch.tensor([tokens])).logits[0].float()
    torch.testing.assert_close(paged_logits(engine, tokens, 9), expected, atol=ATOL, rtol=RTOL)


def test_greedy_generation_matches_transformers(tmp_path):
    hf = write_checkpoint(tmp_path, head_scale=32.0)  # greedy needs no near-ties
    engine = LLMEngine.from_pretrained(str(tmp_path))
    prompts = [[1, 5, 9, 13], [2, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49], [3]]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outs = engine.generate(prompts, params)
    for prompt, out in zip(prompts, outs, strict=True):
        with torch.no_grad():
            ids = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                              eos_token_id=None, pad_token_id=0)[0]  # fmt: skip
            logits = hf(ids[None]).logits[0, len(prompt) - 1 : -1]
        top2 = logits.topk(2).values
        assert (top2[:, 0] - top2[:, 1]).min() > 1e-3  # a fair demand, not luck
        assert out.token_ids == ids[len(prompt) :].tolist()


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(decoder_sparse_step=2), "decoder_sparse_step 2 unsupported"),
        (dict(mlp_only_layers=[1]), "mlp_only_layers"),
        (dict(use_sliding_window=True), "sliding-window"),
    ],
)
def test_unsupported_features_are_refused_in_one_line(tmp_path, change, message):
    write_checkpoint(tmp_path)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | change))
    with pytest.raises(CheckpointError, match=message) as info:
        read_model_config(tmp_path)
    assert "\n" not in str(info.value)


def test_a_missing_expert_tensor_is_named(tmp_path):
    write_checkpoint(tmp_path)
    f = next(tmp_path.glob("*.safetensors"))
    state = safetensors_torch.load_file(str(f))
    del state["model.layers.1.mlp.experts.3.up_proj.weight"]
    safetensors_torch.save_file(state, str(f))
    with pytest.raises(CheckpointError, match=r"layers\.1\.mlp\.experts\.3\.up_proj"):
        LLMEngine.from_pretrained(str(tmp_path))


def test_active_and_resident_parameters():
    cfg = ModelConfig.preset("tiny-moe")
    h, layers = cfg.hidden_size, cfg.num_layers
    expert = 3 * h * cfg.moe_intermediate_size
    # The resident count holds all 8 experts; a token computes with 2 of them.
    assert cfg.num_params - cfg.num_active_params == layers * 6 * expert
    engine = LLMEngine(EngineConfig(model=cfg))
    held = sum(p.numel() for p in engine.model.parameters())
    assert held == cfg.num_params
    dense = ModelConfig.preset("tiny")
    assert dense.num_params == dense.num_active_params


def test_moe_config_is_validated():
    with pytest.raises(ConfigError, match="num_experts_per_tok"):
        ModelConfig.preset("tiny-moe", num_experts_per_tok=9)
    with pytest.raises(ConfigError, match="router bias names expert 8"):
        ModelConfig.preset("tiny-moe", router_bias=((8, 1.0),))
    with pytest.raises(ConfigError, match="torch kernels"):
        EngineConfig(model=ModelConfig.preset("tiny-moe"), kernel_backend="triton")


# -- the paged engine against the dense reference (engine_ref/reference.py) ---------------
def _moe_config(**kw):
    from perfdiag.engine_ref.config import CacheConfig, SchedulerConfig

    return EngineConfig(
        model=ModelConfig.preset("tiny-moe"),
        cache=kw.pop("cache", CacheConfig(block_size=4, num_gpu_blocks=256, check_ownership=True)),
        scheduler=kw.pop("scheduler", SchedulerConfig(max_num_batched_tokens=64, chunk_size=16)),
        max_model_len=128,
        **kw,
    )


def test_paged_moe_logits_match_the_dense_reference():
    from perfdiag.engine_ref import DenseReference

    engine = LLMEngine(_moe_config())
    tokens = [256, *range(40, 100)]
    dense = DenseReference(engine.model).logits(tokens)
    for chunk in (1, 5, len(tokens)):
        torch.testing.assert_close(paged_logits(engine, tokens, chunk), dense, atol=2e-5, rtol=0)


def test_batched_chunked_preempted_moe_equals_the_dense_reference():
    """Routing is per token, so batching, chunking and recomputation after preemption
    must not change a token's experts: the same greedy tokens as one request alone."""
    from perfdiag.engine_ref import DenseReference
    from perfdiag.engine_ref.config import CacheConfig, SchedulerConfig
    from perfdiag.engine_ref.hooks import RecordingObserver
    from perfdiag.engine_ref.testing import run, workload

    items = workload(n=12, seed=4)
    cache = CacheConfig(block_size=4, num_gpu_blocks=40, watermark=0.0, check_ownership=True)
    sched = SchedulerConfig(chunk_size=5, max_num_batched_tokens=24, decode_reserve_tokens=0)
    rec = RecordingObserver()
    engine = LLMEngine(_moe_config(cache=cache, scheduler=sched), observer=rec)
    ref = DenseReference(engine.model)
    got = run(engine, items, per_step=3)
    assert sum(s.num_preemptions for s in rec.steps) > 0
    for i, it in enumerate(items):
        want = ref.greedy(it.prompt, it.params.max_tokens, (257,), max_model_len=128)
        assert want.min_margin > 1e-4  # a fair demand, not luck
        assert got.tokens[f"r{i}"] == want.token_ids, i

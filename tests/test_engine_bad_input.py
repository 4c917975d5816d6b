"""Bad input gets a clear error for that request (or at load), and the engine keeps serving."""

from __future__ import annotations

import pytest

from perfdiag.engine_ref import (
    CheckpointError,
    DenseReference,
    InvalidRequestError,
    LLMEngine,
    ModelConfig,
    RecordingObserver,
    SamplingParams,
)
from perfdiag.engine_ref import RequestEventKind as K
from perfdiag.engine_ref.config import CacheConfig, EngineConfig, SchedulerConfig
from perfdiag.engine_ref.testing import LLAMA_CONFIG as LLAMA
from perfdiag.engine_ref.testing import llama_tensors, tiny_config, write_checkpoint
from perfdiag.errors import ConfigError, PerfdiagError

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(temperature=-0.5), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(max_tokens=-3), "max_tokens"),
        (dict(seed=1.5), "seed"),
        (dict(stop_token_ids=(-1,)), "stop_token_ids"),
    ],
)
def test_invalid_sampling_params(kwargs, match):
    with pytest.raises(InvalidRequestError, match=match) as info:
        SamplingParams(**kwargs)
    assert isinstance(info.value, PerfdiagError) and isinstance(info.value, ValueError)
    assert "\n" not in str(info.value)


def test_bad_requests_are_refused_and_the_others_served():
    obs = RecordingObserver()
    engine = LLMEngine(tiny_config(max_model_len=64), observer=obs)
    good = [[256, 1, 2, 3], [256, 70, 71]]
    ids = [engine.add_request(good[0], GREEDY, request_id="good0")]
    bad = [
        ([256, 1], GREEDY, "already in use"),  # the id "good0" is taken
        ([], GREEDY, "empty prompt"),
        ("", GREEDY, "empty prompt"),
        (list(range(64)), GREEDY, "no room"),
        ([256, 999], GREEDY, "outside the vocabulary"),
        ([256, 1], SamplingParams(stop_token_ids=(5000,)), "outside the vocabulary"),
        ([256, 1.5], GREEDY, "token ids"),
        (None, GREEDY, "prompt must be"),
        ([256, 1], {"temperature": 0}, "SamplingParams"),
    ]
    done: dict[str, list[int]] = {}

    def step():
        for out in engine.step():
            done.setdefault(out.request_id, []).extend(out.new_token_ids)

    for prompt, params, match in bad:
        rid = "good0" if match == "already in use" else None
        with pytest.raises(InvalidRequestError, match=match):
            engine.add_request(prompt, params, request_id=rid)
        step()  # the engine keeps serving the good request meanwhile
    ids.append(engine.add_request(good[1], GREEDY, request_id="good1"))
    while engine.has_unfinished_requests():
        step()
    ref = DenseReference(engine.model)
    for rid, prompt in zip(ids, good, strict=True):
        assert done[rid] == ref.greedy(prompt, 8, (257,), max_model_len=64).token_ids
    assert engine.is_drained()
    rejected = [e for e in obs.requests if e.kind == K.FINISHED and e.detail.startswith("rejected")]
    assert len(rejected) == len(bad)


def test_request_larger_than_the_pool_is_refused():
    cfg = tiny_config(cache=CacheConfig(block_size=4, num_gpu_blocks=8), max_model_len=128)
    engine = LLMEngine(cfg)
    with pytest.raises(InvalidRequestError, match="KV blocks"):
        engine.add_request([256] * 20, SamplingParams(max_tokens=40))
    # ... while one that fits alone (32 tokens = 8 blocks) is served
    out = engine.generate([[256] * 20], SamplingParams(temperature=0, max_tokens=12))
    assert len(out[0].token_ids) <= 12 and engine.is_drained()


def test_generate_with_a_bad_prompt_raises_and_leaves_nothing_behind():
    engine = LLMEngine(tiny_config())
    with pytest.raises(InvalidRequestError):
        engine.generate([[256, 1], []], GREEDY)
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.is_drained()


@pytest.mark.parametrize(
    "make",
    [
        lambda: EngineConfig(
            model=ModelConfig.preset("tiny"),
            scheduler=SchedulerConfig(enable_chunked_prefill=False, max_num_batched_tokens=16),
        ),
        lambda: EngineConfig(model=ModelConfig.preset("tiny"), dtype="float64"),
        lambda: EngineConfig(model=ModelConfig.preset("tiny"), device="tpu"),
        lambda: EngineConfig(model=ModelConfig.preset("tiny"), attention_backend="flash"),
        lambda: EngineConfig(model=ModelConfig.preset("tiny"), max_model_len=100_000),
        lambda: CacheConfig(block_size=0),
        lambda: CacheConfig(watermark=1.0),
        lambda: SchedulerConfig(preemption_mode="delete"),
        lambda: SchedulerConfig(policy="lifo"),
        lambda: SchedulerConfig(max_wait_ms=float("inf")),
        lambda: ModelConfig.preset("tiny", num_kv_heads=3),
        lambda: ModelConfig.preset("nope"),
    ],
)
def test_invalid_engine_configs(make):
    with pytest.raises(ConfigError) as info:
        make()
    assert "\n" not in str(info.value)


# ---- checkpoints ---------------------------------------------------------------------------
def _write(path, config=None, tensors=None, raw_config=None):
    pytest.importorskip("safetensors", reason="writes checkpoints")
    # the weights always follow the base config, so a changed config.json mismatches them
    tensors = llama_tensors(LLAMA) if tensors is None else tensors
    return write_checkpoint(path, config, tensors, raw_config)


def _tensors(drop: str = "") -> dict:
    return llama_tensors(LLAMA, drop)


def test_valid_handwritten_checkpoint_loads(tmp_path):
    engine = LLMEngine.from_pretrained(str(_write(tmp_path)))
    out = engine.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=3))
    assert len(out[0].token_ids) == 3


@pytest.mark.parametrize(
    "setup, match",
    [
        ("missing_dir", "not a directory"),
        ("no_config", "no config.json"),
        ("bad_json", "not valid JSON"),
        ("json_list", "JSON object"),
        ("unsupported_arch", "unsupported"),
        ("missing_field", "missing field 'hidden_size'"),
        ("bad_heads", "multiple of num_kv_heads"),
        ("sliding_window", "sliding-window"),
        ("no_weights", "no \\*.safetensors"),
        ("corrupt_weights", "unreadable safetensors"),
        ("missing_tensor", "missing tensor"),
        ("missing_k_proj", "missing tensor layers.0.self_attn.k_proj"),
        ("extra_tensor", "unexpected tensor"),
        ("shape_mismatch", "implies"),
    ],
)
def test_bad_checkpoints_fail_at_load_with_one_line(tmp_path, setup, match):
    torch = pytest.importorskip("torch")
    d = tmp_path / "ckpt"
    d.mkdir()
    if setup == "missing_dir":
        d = tmp_path / "nowhere"
    elif setup == "no_config":
        (d / "model.safetensors").write_bytes(b"")
    elif setup == "bad_json":
        _write(d, raw_config="{not json")
    elif setup == "json_list":
        _write(d, raw_config="[1, 2]")
    elif setup == "unsupported_arch":
        _write(d, config={**LLAMA, "model_type": "mamba"})
    elif setup == "missing_field":
        _write(d, config={k: v for k, v in LLAMA.items() if k != "hidden_size"})
    elif setup == "bad_heads":
        _write(d, config={**LLAMA, "num_key_value_heads": 3})
    elif setup == "sliding_window":
        _write(d, config={**LLAMA, "model_type": "qwen2", "use_sliding_window": True})
    elif setup == "no_weights":
        _write(d, tensors={})
    elif setup == "corrupt_weights":
        _write(d, tensors={})
        (d / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{garbage")
    elif setup == "missing_tensor":
        _write(d, tensors=_tensors("model.norm.weight"))
    elif setup == "missing_k_proj":
        _write(d, tensors=_tensors("model.layers.0.self_attn.k_proj.weight"))
    elif setup == "extra_tensor":
        _write(d, tensors={**_tensors(), "model.layers.1.mlp.x": torch.ones(2)})
    elif setup == "shape_mismatch":
        _write(d, config={**LLAMA, "intermediate_size": 64})
    with pytest.raises(CheckpointError, match=match) as info:
        LLMEngine.from_pretrained(str(d))
    assert isinstance(info.value, PerfdiagError)
    assert "\n" not in str(info.value)


def test_a_failed_load_leaves_a_running_engine_serving(tmp_path):
    engine = LLMEngine(tiny_config())
    rid = engine.add_request([256, 5, 6], GREEDY)
    with pytest.raises(CheckpointError):
        LLMEngine.from_pretrained(str(tmp_path / "missing"))
    done = False
    while engine.has_unfinished_requests():
        done = any(o.finished and o.request_id == rid for o in engine.step()) or done
    assert done


def test_engine_config_is_frozen():
    cfg = EngineConfig(model=ModelConfig.preset("tiny"))
    with pytest.raises(AttributeError):
        cfg.device = "cuda"  # type: ignore[misc]
    assert cfg.max_model_len == 512
    assert EngineConfig(model=ModelConfig.preset("tiny"), max_model_len=100).max_model_len == 100
    assert CacheConfig().block_size == 16

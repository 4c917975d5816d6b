"""Load a local Hugging Face checkpoint directory (config.json + *.safetensors).

Llama, Qwen2 and Qwen2-MoE architectures. Nothing is ever downloaded. Every problem with the
directory (missing, unreadable, unsupported, or weights that do not match the config) raises
`CheckpointError` with one line naming the file and what is wrong.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import torch

from ..errors import ConfigError
from .config import ModelConfig, RopeConfig
from .model import LlamaModel

_ARCHS = {"llama": "llama", "qwen2": "qwen2", "qwen2_moe": "qwen2_moe"}
_LAYER = re.compile(
    r"^layers\.(\d+)\.(self_attn|mlp|mlp\.shared_expert)\.(q|k|v|gate|up)_proj\.(weight|bias)$"
)
# Qwen2-MoE experts, one tensor per expert and projection (what transformers writes).
_EXPERT = re.compile(r"^layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")


class CheckpointError(ConfigError):
    """A checkpoint directory that cannot be used (one clear line)."""


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


def _ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list) else (value,)


def weight_files(model_dir: str | Path) -> list[Path]:
    d = Path(model_dir)
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{d}: no *.safetensors weight files")
    return files


def checkpoint_digest(model_dir: str | Path) -> str:
    """Identity of a checkpoint for the prefix-cache fingerprint, cheap for large files:
    config.json, and per weight file its size, safetensors header and first MiB of data."""
    d = Path(model_dir)
    h = hashlib.blake2b(digest_size=16)
    h.update((d / "config.json").read_bytes())
    for f in weight_files(d):
        h.update(f.name.encode() + f.stat().st_size.to_bytes(8, "little"))
        with f.open("rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            h.update(fh.read(min(n, 1 << 26) + (1 << 20)))
    return h.hexdigest()


def read_model_config(model_dir: str | Path) -> ModelConfig:
    d = Path(model_dir)
    if not d.is_dir():
        raise CheckpointError(f"{d}: not a directory")
    path = d / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{d}: no config.json")
    raw = _read_json(path)
    model_type = raw.get("model_type")
    if model_type not in _ARCHS:
        raise CheckpointError(
            f"{path}: model_type {model_type!r} unsupported (llama, qwen2, qwen2_moe)"
        )
    if raw.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{path}: hidden_act {raw['hidden_act']!r} unsupported (silu)")
    if raw.get("mlp_bias"):
        raise CheckpointError(f"{path}: mlp_bias is unsupported")
    if model_type in ("qwen2", "qwen2_moe") and raw.get("use_sliding_window"):
        raise CheckpointError(f"{path}: sliding-window attention is unsupported")
    moe = _moe_fields(raw, path) if model_type == "qwen2_moe" else {}
    rp = raw.get("rope_parameters") or {
        "rope_theta": raw.get("rope_theta", 10000.0),
        **(raw.get("rope_scaling") or {}),
    }
    eos = _ids(raw.get("eos_token_id"))
    gen = d / "generation_config.json"
    if gen.is_file():
        eos = tuple(dict.fromkeys(eos + _ids(_read_json(gen).get("eos_token_id"))))
    weights = "ckpt:" + checkpoint_digest(d)
    try:
        rope = RopeConfig(
            theta=float(rp.get("rope_theta", 10000.0)),
            type=rp.get("rope_type", rp.get("type", "default")),
            factor=float(rp.get("factor", 1.0)),
            low_freq_factor=float(rp.get("low_freq_factor", 1.0)),
            high_freq_factor=float(rp.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(rp.get("original_max_position_embeddings", 8192)),
        )
        bias = bool(raw.get("attention_bias", False))
        qkv_bias = model_type == "qwen2" or bias
        if model_type == "qwen2_moe":
            qkv_bias = bool(raw.get("qkv_bias", True))  # older configs: always biased
        return ModelConfig(
            name=d.name,
            architecture="qwen2_moe" if moe else "qwen2" if model_type != "llama" else "llama",
            vocab_size=int(raw["vocab_size"]),
            hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=int(raw["num_attention_heads"]),
            num_kv_heads=int(raw.get("num_key_value_heads") or raw["num_attention_heads"]),
            head_dim=int(raw.get("head_dim") or 0),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope=rope,
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=qkv_bias,
            o_bias=bias,
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=eos,
            weights=weights,
            **moe,
        )
    except KeyError as e:
        raise CheckpointError(f"{path}: missing field {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: {e}") from None
    except ConfigError as e:
        raise CheckpointError(f"{path}: {e}") from None


def _moe_fields(raw: dict, path: Path) -> dict:
    """ModelConfig's MoE fields of a qwen2_moe config.json ({} when it has no experts: a
    dense Qwen2 layout); what engine_ref does not implement is refused."""
    experts = int(raw.get("num_experts") or 0)
    if experts == 0:
        return {}
    if int(raw.get("decoder_sparse_step", 1)) != 1:
        raise CheckpointError(
            f"{path}: decoder_sparse_step {raw['decoder_sparse_step']} unsupported (every "
            f"layer sparse: 1)"
        )
    if raw.get("mlp_only_layers"):
        raise CheckpointError(f"{path}: mlp_only_layers (dense layers among MoE) unsupported")
    return dict(
        num_experts=experts,
        num_experts_per_tok=int(raw.get("num_experts_per_tok", 4)),
        moe_intermediate_size=int(raw.get("moe_intermediate_size", 1408)),
        shared_expert_intermediate_size=int(raw.get("shared_expert_intermediate_size", 5632)),
        norm_topk_prob=bool(raw.get("norm_topk_prob", False)),
    )


def _read_tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    try:
        from safetensors import safe_open
    except ImportError as e:  # pragma: no cover - safetensors comes with the dev extra
        raise CheckpointError(f"loading {model_dir} needs the 'safetensors' package: {e}") from None
    tensors: dict[str, torch.Tensor] = {}
    for f in weight_files(model_dir):
        try:
            with safe_open(str(f), framework="pt") as fh:
                for name in fh.keys():  # noqa: SIM118 - safe_open is not a mapping
                    tensors[name] = fh.get_tensor(name)
        except Exception as e:
            raise CheckpointError(
                f"{f}: unreadable safetensors ({str(e).splitlines()[0]})"
            ) from None
    return tensors


def _to_engine_names(
    tensors: dict[str, torch.Tensor], tied: bool, shared_expert: bool = True
) -> dict[str, torch.Tensor]:
    """Hugging Face names -> this model's, fusing q/k/v and gate/up (and stacking
    per-expert tensors into the 3-D expert weights)."""
    out: dict[str, torch.Tensor] = {}
    parts: dict[tuple, dict[str, torch.Tensor]] = {}
    experts: dict[str, dict[tuple[int, str], torch.Tensor]] = {}
    for name, t in tensors.items():
        name = name.removeprefix("model.")
        if name.endswith("rotary_emb.inv_freq") or (tied and name == "lm_head.weight"):
            continue  # derived buffers; a tied head is the embedding
        if not shared_expert and ".mlp.shared_expert" in name:
            continue  # a zero-width shared expert computes nothing
        e = _EXPERT.match(name)
        if e is not None:
            layer, expert, part = e.groups()
            experts.setdefault(layer, {})[(int(expert), part)] = t
            continue
        m = _LAYER.match(name)
        if m is None:
            out[name] = t
            continue
        layer, block, part, kind = m.groups()
        fused = "qkv_proj" if block == "self_attn" else "gate_up_proj"
        parts.setdefault((layer, block, fused, kind), {})[part] = t
    for (layer, block, fused, kind), got in parts.items():
        order = ("q", "k", "v") if fused == "qkv_proj" else ("gate", "up")
        missing = [p for p in order if p not in got]
        if missing:
            raise CheckpointError(
                f"missing tensor layers.{layer}.{block}.{missing[0]}_proj.{kind} in checkpoint"
            )
        out[f"layers.{layer}.{block}.{fused}.{kind}"] = torch.cat([got[p] for p in order])
    for layer, got in experts.items():
        out.update(_stack_experts(layer, got))
    return out


def _stack_experts(layer: str, got: dict[tuple[int, str], torch.Tensor]) -> dict:
    """Per-expert gate/up/down tensors of one layer -> the fused [E, 2I, h] and [E, h, I]."""
    num = max(e for e, _ in got) + 1
    for e in range(num):
        for part in ("gate", "up", "down"):
            if (e, part) not in got:
                raise CheckpointError(
                    f"missing tensor layers.{layer}.mlp.experts.{e}.{part}_proj.weight in "
                    f"checkpoint"
                )
    shapes = {tuple(got[(e, p)].shape) for e in range(num) for p in ("gate", "up")}
    if len(shapes) != 1 or len({tuple(got[(e, "down")].shape) for e in range(num)}) != 1:
        raise CheckpointError(f"layers.{layer}.mlp.experts: experts of different shapes")
    prefix = f"layers.{layer}.mlp.experts"
    return {
        f"{prefix}.gate_up_proj": torch.stack(
            [torch.cat([got[(e, "gate")], got[(e, "up")]]) for e in range(num)]
        ),
        f"{prefix}.down_proj": torch.stack([got[(e, "down")] for e in range(num)]),
    }


def load_weights(model: LlamaModel, model_dir: str | Path) -> None:
    """Copy a checkpoint's weights into `model` (any dtype/device), checking every name and
    shape against the config."""
    d = Path(model_dir)
    cfg = model.config
    tensors = _to_engine_names(_read_tensors(d), cfg.tie_word_embeddings,
                               bool(cfg.shared_expert_intermediate_size))  # fmt: skip
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(tensors))
    unexpected = sorted(set(tensors) - set(params))
    if missing:
        raise CheckpointError(f"{d}: missing tensor {missing[0]} ({len(missing)} missing)")
    if unexpected:
        raise CheckpointError(
            f"{d}: unexpected tensor {unexpected[0]} ({len(unexpected)} not in this config)"
        )
    for name, p in params.items():
        t = tensors[name]
        if tuple(t.shape) != tuple(p.shape):
            raise CheckpointError(
                f"{d}: tensor {name} has shape {tuple(t.shape)}, config.json implies "
                f"{tuple(p.shape)}"
            )
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(tensors[name])

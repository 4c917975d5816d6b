"""Load a GGUF file (llama.cpp's format): model config, weights and, in gguf_tokenizer.py,
the tokenizer and chat template from its metadata.

gguf_reader.py reads the file; the `gguf` package (the `models` extra) dequantises. Two
things differ from a Hugging Face checkpoint:
- llama.cpp's converter permutes the rows of W_Q and W_K per head (it stores RoPE's
  halves interleaved, [x0, x_{d/2}, x1, x_{d/2+1}, …]); this engine's rotate-half RoPE
  wants Hugging Face's order, so `unpermute_rows` undoes it;
- GGUF shapes are innermost-first ([K, N] for an N×K weight); the data is row-major N×K.
Quantised tensors can stay packed (`--weights q4_1|q8_0`, see quant.py): the loader then
hands the raw blocks over instead of floats. Every problem raises `CheckpointError` with
one line naming the file.
"""

from __future__ import annotations

import hashlib
import importlib.util
import struct
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from .config import ModelConfig, RopeConfig
from .loader import CheckpointError
from .preset_names import FILE_PRESETS

# GGUF tensor names (per layer after "blk.N.") -> this model's, and the fused slot.
_LAYER_TENSORS = {
    "attn_norm.weight": ("input_layernorm.weight", None),
    "ffn_norm.weight": ("post_attention_layernorm.weight", None),
    "attn_q.weight": ("self_attn.qkv_proj.weight", 0),
    "attn_k.weight": ("self_attn.qkv_proj.weight", 1),
    "attn_v.weight": ("self_attn.qkv_proj.weight", 2),
    "attn_q.bias": ("self_attn.qkv_proj.bias", 0),
    "attn_k.bias": ("self_attn.qkv_proj.bias", 1),
    "attn_v.bias": ("self_attn.qkv_proj.bias", 2),
    "attn_output.weight": ("self_attn.o_proj.weight", None),
    "ffn_gate.weight": ("mlp.gate_up_proj.weight", 0),
    "ffn_up.weight": ("mlp.gate_up_proj.weight", 1),
    "ffn_down.weight": ("mlp.down_proj.weight", None),
}
_TOP_TENSORS = {
    "token_embd.weight": "embed_tokens.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "lm_head.weight",
}


def is_gguf(path: str | Path | None) -> bool:
    return path is not None and str(path).endswith(".gguf")


def preset_file(name: str) -> Path:
    """The GGUF file of a file preset, found in its installed package (never imported: the
    package's own module pulls in its plugin host)."""
    package, filename = FILE_PRESETS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            f"preset {name!r} needs the {package.replace('_', '-')} package: "
            "pip install 'perfdiag[models]'"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise ConfigError(f"preset {name!r}: {path} is missing from the installed package")
    return path


def _gguf():
    try:
        import gguf
    except ImportError:
        raise ConfigError(
            "reading GGUF files needs the 'gguf' package: pip install 'perfdiag[models]'"
        ) from None
    return gguf


@lru_cache(maxsize=4)
def _reader(path: str, mtime_ns: int):
    _gguf()  # the quantisation tables and dequantisers
    from .gguf_reader import GGUFFile

    try:
        return GGUFFile(path)
    except (ValueError, struct.error, UnicodeDecodeError, OSError) as e:
        raise CheckpointError(f"{path}: not a readable GGUF file ({_first_line(e)})") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def open_gguf(path: str | Path):
    """The file's `gguf_reader.GGUFFile` (memory-mapped; cached per path and mtime)."""
    p = Path(path)
    if not p.is_file():
        raise CheckpointError(f"{p}: no such file")
    return _reader(str(p), p.stat().st_mtime_ns)


def field(reader, key: str, default=None):
    return reader.fields.get(key, default)


def gguf_digest(path: str | Path) -> str:
    """Identity for the prefix-cache fingerprint: size, the first and last MiB."""
    p = Path(path)
    size = p.stat().st_size
    h = hashlib.blake2b(digest_size=16)
    h.update(size.to_bytes(8, "little"))
    with p.open("rb") as fh:
        h.update(fh.read(1 << 20))
        fh.seek(max(0, size - (1 << 20)))
        h.update(fh.read(1 << 20))
    return h.hexdigest()


def read_gguf_config(path: str | Path) -> ModelConfig:
    r = open_gguf(path)
    arch = field(r, "general.architecture")
    if arch != "llama":
        raise CheckpointError(f"{path}: GGUF architecture {arch!r} unsupported (llama)")

    def need(key: str):
        value = field(r, f"llama.{key}")
        if value is None:
            raise CheckpointError(f"{path}: GGUF field llama.{key} is missing")
        return value

    names = {t.name for t in r.tensors}
    vocab = field(r, "llama.vocab_size") or len(field(r, "tokenizer.ggml.tokens", []))
    heads = int(need("attention.head_count"))
    hidden = int(need("embedding_length"))
    head_dim = int(field(r, "llama.attention.key_length") or hidden // heads)
    rope_dim = field(r, "llama.rope.dimension_count")
    if rope_dim is not None and int(rope_dim) != head_dim:
        raise CheckpointError(f"{path}: partial rotary embeddings ({rope_dim} of {head_dim})")
    scaling = field(r, "llama.rope.scaling.type", "none")
    if scaling not in (None, "none", "linear"):
        raise CheckpointError(f"{path}: rope scaling {scaling!r} unsupported (none, linear)")
    eos = field(r, "tokenizer.ggml.eos_token_id")
    bos = field(r, "tokenizer.ggml.bos_token_id")
    try:
        return ModelConfig(
            name=Path(path).stem,
            architecture="llama",
            vocab_size=int(vocab),
            hidden_size=hidden,
            intermediate_size=int(need("feed_forward_length")),
            num_layers=int(need("block_count")),
            num_heads=heads,
            num_kv_heads=int(field(r, "llama.attention.head_count_kv") or heads),
            head_dim=head_dim,
            rms_norm_eps=float(need("attention.layer_norm_rms_epsilon")),
            rope=RopeConfig(
                theta=float(field(r, "llama.rope.freq_base", 10000.0)),
                type="linear" if scaling == "linear" else "default",
                factor=float(field(r, "llama.rope.scaling.factor", 1.0) or 1.0),
            ),
            max_position_embeddings=int(need("context_length")),
            tie_word_embeddings="output.weight" not in names,
            qkv_bias="blk.0.attn_q.bias" in names,
            o_bias="blk.0.attn_output.bias" in names,
            bos_token_id=None if bos is None else int(bos),
            eos_token_ids=() if eos is None else (int(eos),),
            weights="gguf:" + gguf_digest(path),
        )
    except ConfigError as e:
        raise CheckpointError(f"{path}: {e}") from None


def unpermute_rows(rows: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's per-head interleaving of W_Q / W_K rows (any trailing shape: float
    rows or packed blocks), giving Hugging Face's rotate-half order."""
    n = rows.shape[0]
    d = n // n_heads
    return rows.reshape(n_heads, d // 2, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


class GGUFTensor:
    """One tensor of the file, rows in this engine's order: float rows via `dequantize`,
    or the raw quantised blocks (`qtype`, `blocks` [N, bytes per row]) to keep packed."""

    def __init__(self, name: str, qtype: str, shape: tuple[int, ...], blocks, perm_heads=0):
        self.name, self.qtype, self.shape = name, qtype, shape
        self._blocks, self._perm_heads = blocks, perm_heads

    @property
    def blocks(self) -> np.ndarray:
        b = self._blocks
        return unpermute_rows(b, self._perm_heads) if self._perm_heads else b

    def dequantize(self) -> np.ndarray:
        gguf = _gguf()
        qt = gguf.GGMLQuantizationType[self.qtype]
        w = np.asarray(gguf.quants.dequantize(self._blocks, qt), dtype=np.float32)
        w = w.reshape(self.shape)
        return unpermute_rows(w, self._perm_heads) if self._perm_heads else w


def read_gguf_tensors(path: str | Path, cfg: ModelConfig) -> dict[str, list[GGUFTensor | None]]:
    """This model's parameter names -> the GGUF tensors that make it (a fused projection has
    several parts, in order), checked against the config."""
    r = open_gguf(path)
    out: dict[str, list[GGUFTensor | None]] = {}
    for t in r.tensors:
        name = t.name
        if name.startswith("blk."):
            layer, _, rest = name[4:].partition(".")
            if rest not in _LAYER_TENSORS:
                raise CheckpointError(f"{path}: unexpected tensor {name}")
            target, slot = _LAYER_TENSORS[rest]
            target = f"layers.{layer}.{target}"
        elif name in _TOP_TENSORS:
            target, slot = _TOP_TENSORS[name], None
        elif name == "rope_freqs.weight":
            raise CheckpointError(f"{path}: per-frequency rope factors are unsupported")
        else:
            raise CheckpointError(f"{path}: unexpected tensor {name}")
        shape = tuple(int(s) for s in reversed(t.dims))  # GGUF is innermost-first
        if len(shape) == 2 and shape[0] == 1:
            shape = shape[1:]
        perm = 0
        if rest_is(name, "attn_q."):
            perm = cfg.num_heads
        elif rest_is(name, "attn_k."):
            perm = cfg.num_kv_heads
        qtype = t.qtype
        out.setdefault(target, [None, None, None])[slot or 0] = GGUFTensor(
            name, qtype, shape, t.data, perm
        )
    return {k: [p for p in v if p is not None] for k, v in out.items()}


def rest_is(name: str, prefix: str) -> bool:
    return name.startswith("blk.") and name.split(".", 2)[2].startswith(prefix)


def load_gguf_weights(model, path: str | Path, keep_packed: bool = False) -> dict:
    """Copy the file's weights into `model` (dequantised to fp32, then the model's dtype).
    With `keep_packed`, linear weights stay unset and their parts come back (name -> list
    of GGUFTensor) for quant.py to pack; norms and biases are always loaded."""
    import torch

    cfg = model.config
    parts = read_gguf_tensors(path, cfg)
    params = dict(model.named_parameters())
    if cfg.tie_word_embeddings:
        params.pop("lm_head.weight", None)
    missing = sorted(set(params) - set(parts))
    unexpected = sorted(set(parts) - set(params))
    if missing:
        raise CheckpointError(f"{path}: missing tensor {missing[0]} ({len(missing)} missing)")
    if unexpected:
        raise CheckpointError(f"{path}: unexpected tensor {unexpected[0]} for this config")
    packed = {}
    with torch.no_grad():
        for name, p in params.items():
            got = parts[name]
            rows = sum(t.shape[0] for t in got)
            shape = (rows, *got[0].shape[1:]) if len(got[0].shape) > 1 else (rows,)
            if shape != tuple(p.shape):
                raise CheckpointError(
                    f"{path}: tensor {name} has shape {shape}, the metadata implies "
                    f"{tuple(p.shape)}"
                )
            if keep_packed and p.dim() == 2:
                packed[name] = got
                continue
            w = np.concatenate([t.dequantize() for t in got]) if len(got) > 1 else None
            w = got[0].dequantize() if w is None else w
            p.copy_(torch.from_numpy(np.array(w, dtype=np.float32, order="C")))
    return packed

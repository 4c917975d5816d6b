"""The tokenizer and chat template a GGUF file carries in its metadata, built with the
`tokenizers` library.

Supported: `tokenizer.ggml.model = "gpt2"` (byte-level BPE: the vocabulary, the merges,
and control tokens as special tokens). The pre-tokenizer follows `tokenizer.ggml.pre`:
"smollm" splits digits one by one before the GPT-2 regex, as llama.cpp does. BOS is
prepended only when `tokenizer.ggml.add_bos_token` says so. The chat template (Jinja) is
rendered in a sandbox, as Hugging Face renders it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .gguf_loader import field, open_gguf
from .loader import CheckpointError

_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types
_DIGITS_FIRST = ("smollm", "llama3", "llama-bpe", "qwen2", "deepseek-llm")


class GGUFTokenizer:
    def __init__(self, path: str | Path) -> None:
        try:
            from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
        except ImportError as e:  # pragma: no cover - tokenizers comes with the extras
            raise ConfigError(f"{path} needs the 'tokenizers' package: {e}") from None
        r = open_gguf(path)
        kind = field(r, "tokenizer.ggml.model")
        if kind != "gpt2":
            raise CheckpointError(f"{path}: tokenizer model {kind!r} unsupported (gpt2)")
        tokens = field(r, "tokenizer.ggml.tokens") or []
        merges = field(r, "tokenizer.ggml.merges") or []
        types = field(r, "tokenizer.ggml.token_type") or [1] * len(tokens)
        vocab = {t: i for i, t in enumerate(tokens)}
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        tok = Tokenizer(models.BPE(vocab, pairs, fuse_unk=False, byte_fallback=False))
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        pre = field(r, "tokenizer.ggml.pre", "default")
        if pre in _DIGITS_FIRST:
            tok.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Digits(individual_digits=True), byte_level]
            )
        else:
            tok.pre_tokenizer = byte_level
        tok.decoder = decoders.ByteLevel()
        special = [
            AddedToken(t, special=True, normalized=False)
            for t, kind in zip(tokens, types, strict=False)
            if kind in (_CONTROL, _USER_DEFINED)
        ]
        tok.add_special_tokens(special)
        self._tok = tok
        self.vocab_size = len(tokens)
        bos, eos = field(r, "tokenizer.ggml.bos_token_id"), field(r, "tokenizer.ggml.eos_token_id")
        self.bos_token_id = None if bos is None else int(bos)
        self.eos_token_id = None if eos is None else int(eos)
        self.add_bos = bool(field(r, "tokenizer.ggml.add_bos_token", False))
        self.chat_template: str | None = field(r, "tokenizer.chat_template")
        self._template = None

    def encode(self, text: str) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if self.add_bos and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, token_ids: list[int]) -> str:
        return self._tok.decode(list(token_ids), skip_special_tokens=True)

    def token_text(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True
    ) -> str:
        """The chat prompt as the model was trained on it."""
        if self._template is None:
            if not self.chat_template:
                raise ConfigError("this GGUF file has no chat template")
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            self._template = env.from_string(self.chat_template)
        bos, eos = (
            "" if i is None else self._tok.id_to_token(i) or ""
            for i in (self.bos_token_id, self.eos_token_id)
        )
        return self._template.render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=bos, eos_token=eos,
        )  # fmt: skip

    def save_hf(self, directory: str | Path) -> Path:
        """Write this tokenizer as a Hugging Face tokenizer directory (tokenizer.json and
        tokenizer_config.json), so tools that load tokenizers by path — aiperf, guidellm,
        transformers — count tokens offline exactly as the model does."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        self._tok.save(str(out / "tokenizer.json"))
        name = self._tok.id_to_token
        config: dict[str, Any] = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": None if self.bos_token_id is None else name(self.bos_token_id),
            "eos_token": None if self.eos_token_id is None else name(self.eos_token_id),
            "add_bos_token": self.add_bos,
            "clean_up_tokenization_spaces": False,
            "model_max_length": 1 << 30,
        }
        if self.chat_template:
            config["chat_template"] = self.chat_template
        (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
        return out

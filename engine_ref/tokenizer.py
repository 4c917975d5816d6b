"""Tokenizers: a built-in byte-level one, or a model directory's `tokenizer.json`.

The byte tokenizer maps each UTF-8 byte to its value (0-255) and adds BOS 256, EOS 257 and
PAD 258: any text round-trips, and it needs no files. A `tokenizer.json` beside a checkpoint
is used through the `tokenizers` library (imported only then).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from ..errors import ConfigError


class Tokenizer(Protocol):
    vocab_size: int
    bos_token_id: int | None
    eos_token_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...


class ByteTokenizer:
    vocab_size = 259
    bos_token_id = 256
    eos_token_id = 257
    pad_token_id = 258

    def __init__(self, add_bos: bool = True) -> None:
        self.add_bos = add_bos

    def encode(self, text: str) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_token_id, *ids] if self.add_bos else ids

    def decode(self, token_ids: list[int]) -> str:
        return bytes(t for t in token_ids if 0 <= t < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A `tokenizers.Tokenizer` from tokenizer.json; special tokens as its post-processor
    adds them (e.g. Llama's BOS)."""

    def __init__(self, path: Path, bos_token_id: int | None, eos_token_id: int | None) -> None:
        try:
            from tokenizers import Tokenizer as _Tok
        except ImportError as e:  # pragma: no cover - tokenizers is a dependency of the extra
            raise ConfigError(f"{path} needs the 'tokenizers' package: {e}") from None
        try:
            self._tok = _Tok.from_file(str(path))
        except Exception as e:
            raise ConfigError(f"cannot read tokenizer {path}: {str(e).splitlines()[0]}") from None
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def decode(self, token_ids: list[int]) -> str:
        return self._tok.decode(token_ids, skip_special_tokens=True)


def load_tokenizer(
    model_dir: str | Path | None, bos_token_id: int | None = None, eos_token_id: int | None = None
) -> Tokenizer:
    """A GGUF file's own tokenizer, a directory's tokenizer.json when present, else the byte
    tokenizer."""
    if model_dir is not None and str(model_dir).endswith(".gguf"):
        from .gguf_tokenizer import GGUFTokenizer

        return GGUFTokenizer(model_dir)
    if model_dir is not None:
        path = Path(model_dir) / "tokenizer.json"
        if path.is_file():
            return HFTokenizer(path, bos_token_id, eos_token_id)
    return ByteTokenizer()

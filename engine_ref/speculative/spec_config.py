"""The speculative-decoding setting (`EngineConfig.speculative`) and its CLI spelling.

No torch here: the CLI parses `--speculative` before anything heavy is imported.
"""

from __future__ import annotations

from dataclasses import dataclass

METHODS = ("ngram", "draft")
MAX_NUM_TOKENS = 16


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str  # "ngram" (prompt lookup, no model) or "draft" (a smaller model)
    num_tokens: int  # K: draft tokens proposed per request per step
    draft: str | None = None  # for "draft": a preset name or a model path / GGUF file

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative method {self.method!r} is not one of {METHODS}")
        k = self.num_tokens
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_NUM_TOKENS:
            raise ValueError(f"speculative num_tokens must be an int in [1, {MAX_NUM_TOKENS}]")
        if (self.method == "draft") != bool(self.draft):
            raise ValueError("a draft model is named for method 'draft', and only for it")


def parse_speculative(text: str) -> SpeculativeConfig:
    """`ngram:K` or `draft:PRESET_OR_FILE:K` -> the config; ValueError with the spelling."""
    usage = (f"bad --speculative {text!r}: use ngram:K or draft:PRESET_OR_FILE:K "
             f"with K in 1..{MAX_NUM_TOKENS}")  # fmt: skip
    method, _, rest = text.partition(":")
    # The draft's path may hold colons: K is what follows the last one.
    draft, _, k_text = rest.rpartition(":")
    if method not in METHODS or not k_text.strip().isdigit():
        raise ValueError(usage)
    try:
        return SpeculativeConfig(method, int(k_text), draft or None)
    except ValueError:
        raise ValueError(usage) from None

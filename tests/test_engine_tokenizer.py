"""Tokenizers: the built-in byte-level one, and a checkpoint's tokenizer.json."""

from __future__ import annotations

import pytest

from perfdiag.engine_ref import LLMEngine, SamplingParams
from perfdiag.engine_ref.testing import tiny_config, write_checkpoint
from perfdiag.engine_ref.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer
from perfdiag.errors import ConfigError


@pytest.mark.parametrize("text", ["hello", "", "naïve — 東京 🚀", "a\x00b\nc"])
def test_byte_tokenizer_round_trips(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert ids[0] == tok.bos_token_id and all(0 <= t < 256 for t in ids[1:])
    assert tok.decode(ids) == text
    assert tok.decode([*ids, tok.eos_token_id, tok.pad_token_id]) == text


def test_text_prompts_through_the_engine():
    engine = LLMEngine(tiny_config())
    assert isinstance(engine.tokenizer, ByteTokenizer)
    out = engine.generate(["Hello, world"], SamplingParams(temperature=0, max_tokens=5))[0]
    assert out.prompt_token_ids == ByteTokenizer().encode("Hello, world")
    assert out.text == ByteTokenizer().decode(out.token_ids)


def test_tokenizer_json_is_used_when_present(tmp_path):
    tokenizers = pytest.importorskip("tokenizers", reason="tokenizer.json support")
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "the": 3, "cat": 4, "sat": 5, "on": 6, "mat": 7}
    tok = tokenizers.Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))

    loaded = load_tokenizer(tmp_path, bos_token_id=1, eos_token_id=2)
    assert isinstance(loaded, HFTokenizer)
    assert loaded.encode("the cat sat on the mat") == [3, 4, 5, 6, 3, 7]
    assert loaded.decode([3, 4, 5]) == "the cat sat"
    assert isinstance(load_tokenizer(tmp_path / "elsewhere"), ByteTokenizer)
    assert isinstance(load_tokenizer(None), ByteTokenizer)

    # An engine whose checkpoint directory holds it encodes text prompts with it.
    pytest.importorskip("safetensors", reason="writes the checkpoint")
    ckpt = write_checkpoint(tmp_path / "ckpt")
    tok.save(str(ckpt / "tokenizer.json"))
    engine = LLMEngine.from_pretrained(str(ckpt))
    assert isinstance(engine.tokenizer, HFTokenizer)
    out = engine.generate(["the cat sat"], SamplingParams(temperature=0, max_tokens=3))[0]
    assert out.prompt_token_ids == [3, 4, 5]


def test_unreadable_tokenizer_json(tmp_path):
    pytest.importorskip("tokenizers")
    (tmp_path / "tokenizer.json").write_text("{broken")
    with pytest.raises(ConfigError, match="cannot read tokenizer"):
        load_tokenizer(tmp_path)

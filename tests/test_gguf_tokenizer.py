"""The tokenizer built from a GGUF file's metadata equals transformers' tokenizer for the
same file on a corpus of test strings (and llama.cpp's, when llama-cpp-python is
installed); its chat template renders as transformers renders it."""

from __future__ import annotations

import importlib.util

import pytest
from smollm2_model import smollm2_path

PATH = smollm2_path()
transformers = pytest.importorskip("transformers", reason="transformers (dev extra): the reference")

from perfdiag.engine_ref.gguf_tokenizer import GGUFTokenizer  # noqa: E402
from perfdiag.engine_ref.tokenizer import load_tokenizer  # noqa: E402

CORPUS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces and trailing   ",
    "Numbers: 0 7 42 2024 3.14159 -17 1,000,000 and 12345678901234567890",
    "don't, I'll, we're, they've, she'd, it's, I'm",
    "def f(x):\n\treturn x ** 2  # square\n\n\nprint(f(3))",
    "naïve café — déjà vu, Straße, Ærøskøbing",
    "東京は日本の首都です。北京欢迎你。",
    "emoji 🚀🔥👍🏽 and symbols ∑ ∫ √ → ≤ ©",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "mixed\r\nline\rendings\n\n\n   and\ttabs",
    "URL https://example.com/path?q=1&r=two#frag and e-mail a.b@c.org",
    "",
    " ",
    "a" * 300,
]


@pytest.fixture(scope="module")
def ours():
    return load_tokenizer(PATH)


@pytest.fixture(scope="module")
def hf():
    return transformers.AutoTokenizer.from_pretrained(PATH.parent, gguf_file=PATH.name)


def test_loaded_from_the_file(ours):
    assert isinstance(ours, GGUFTokenizer)
    assert ours.vocab_size == 49152 and ours.eos_token_id == 2 and ours.bos_token_id == 1
    assert ours.encode("<|im_start|>") == [1]  # a control token is one id, never split


@pytest.mark.parametrize("text", CORPUS, ids=range(len(CORPUS)))
def test_encode_equals_transformers(ours, hf, text):
    ids = ours.encode(text)
    assert ids == hf(text, add_special_tokens=True).input_ids
    plain = text.replace("<|im_start|>", "").replace("<|im_end|>", "")
    assert ours.decode(ours.encode(plain)) == plain  # byte-level BPE round-trips any text


def test_chat_template_equals_transformers(ours, hf):
    for messages in (
        [{"role": "user", "content": "What is 2 + 2?"}],
        [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}],
    ):  # fmt: skip
        want = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert ours.apply_chat_template(messages) == want


@pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed"
)
def test_encode_equals_llama_cpp(ours):
    from llama_cpp import Llama

    llm = Llama(model_path=str(PATH), vocab_only=True, verbose=False)
    for text in CORPUS:
        if text:
            want = llm.tokenize(text.encode(), add_bos=False, special=True)
            assert ours.encode(text) == want, text


def test_saved_as_a_hugging_face_tokenizer_it_counts_the_same(ours, tmp_path):
    # What aiperf and guidellm load by path to count tokens offline (benchmarks/aiperf_anchor.py).
    saved = transformers.AutoTokenizer.from_pretrained(ours.save_hf(tmp_path / "tok"))
    for text in CORPUS:
        assert saved.encode(text, add_special_tokens=False) == ours.encode(text), text
    chat = [{"role": "user", "content": "What is 2 + 2?"}]
    rendered = saved.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert rendered == ours.apply_chat_template(chat)

"""A real model behind the HTTP API: `perfdiag serve --preset smollm2-135m` in its own
process, a chat completion through the official openai SDK answers in real text, ends on
EOS, and counts prompt tokens as the engine's tokenizer does."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest
from smollm2_model import smollm2_path

PATH = smollm2_path()
openai = pytest.importorskip("openai", reason="the official client (dev extra)")

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    out = tmp_path_factory.mktemp("srv")
    proc = subprocess.Popen(
        [sys.executable, "-m", "perfdiag", "serve", "--preset", "smollm2-135m", "--port", "0",
         "--kv-cache-mb", "64", "--max-seqs", "4", "-o", str(out / "run")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    deadline, line = time.monotonic() + 180, ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        m = re.search(r"at (http://127\.0\.0\.1:\d+)", line)
        if m:
            break
        if proc.poll() is not None:
            raise AssertionError(f"the server exited: {line}{proc.stdout.read()}")
    else:
        proc.kill()
        raise AssertionError(f"the server did not start: {line}")
    yield m.group(1)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)


def test_chat_completion_in_real_text(server):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["smollm2-135m"]
    r = client.chat.completions.create(
        model="smollm2-135m", messages=QUESTION, max_tokens=64, temperature=0
    )
    choice = r.choices[0]
    assert choice.finish_reason == "stop"  # EOS (<|im_end|>) before the 64-token budget
    assert "Paris" in choice.message.content
    assert r.usage.completion_tokens < 64

    from perfdiag.engine_ref.gguf_tokenizer import GGUFTokenizer

    tok = GGUFTokenizer(PATH)  # the HTTP tokenizer is the engine's: same prompt count
    assert r.usage.prompt_tokens == len(tok.encode(tok.apply_chat_template(QUESTION)))


def test_streamed_chat_equals_the_full_answer(server):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0)
    args = dict(model="smollm2-135m", messages=QUESTION, max_tokens=64, temperature=0)
    full = client.chat.completions.create(**args).choices[0].message.content
    chunks = list(client.chat.completions.create(**args, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"

"""The OpenAI wire format: request validation, response and stream-chunk bodies, errors.

Requests are checked field by field so a bad one gets a 4xx naming the field (OpenAI's
error body: `{"error": {"message", "type", "param", "code"}}`), never a 500. vLLM's
extensions that a load tester needs are accepted: `ignore_eos`, `top_k`,
`stop_token_ids`, `return_token_ids` (each chunk carries its token ids) and
`stream_options.continuous_usage_stats` (usage in every chunk).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any


class ApiError(Exception):
    """A request the server refuses: the HTTP status and an OpenAI-style body."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code, self.headers = param, code, headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}  # fmt: skip


def bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


@dataclass(frozen=True)
class GenerationRequest:
    """A validated /v1/completions or /v1/chat/completions request."""

    chat: bool
    model: str | None
    prompt_text: str | None  # exactly one of text and ids
    prompt_ids: tuple[int, ...] | None
    max_tokens: int | None  # None: whatever the context leaves (chat's default)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    return_token_ids: bool = False
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()


def parse_json(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad(f"the request body is not valid JSON: {e}") from None
    except RecursionError:  # deeper than the parser recurses: no request nests like that
        raise bad("the request body nests too deeply") from None
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    return body


def _field(body: dict, name: str, kinds: tuple[type, ...], what: str, default=None):
    value = body.get(name, default)
    if value is None:
        return default
    # bool is an int in Python, never in JSON's sense of a number
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        raise bad(f"'{name}' must be {what}, got {json.dumps(value)[:60]}", name)
    return value


def _number(body, name, default, low, high, low_open=False):
    v = _field(body, name, (int, float), "a number", default)
    if not math.isfinite(v) or v < low or v > high or (low_open and v == low):
        bracket = "(" if low_open else "["
        raise bad(f"'{name}' must be in {bracket}{low}, {high}], got {v}", name)
    return float(v)


def _int(body, name, default=None, low=None):
    v = _field(body, name, (int,), "an integer", default)
    if v is not None and low is not None and v < low:
        raise bad(f"'{name}' must be >= {low}, got {v}", name)
    return v


def _bool(body, name, default=False):
    return _field(body, name, (bool,), "true or false", default)


def _token_list(value, name: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value
    ):
        raise bad(f"'{name}' must be a list of token ids (integers >= 0)", name)
    return tuple(value)


def _text(value: str, what: str, param: str) -> str:
    """`value` if it is text: JSON can escape a lone surrogate ("\\ud800"), which no
    encoding can carry to the tokenizer."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise bad(f"{what} holds an unpaired surrogate (\\ud800-\\udfff): not text",
                  param) from None  # fmt: skip
    return value


def _prompt(body: dict) -> tuple[str | None, tuple[int, ...] | None]:
    """A completions prompt: a string, a list of token ids, or a one-element batch of
    either (the engine serves one prompt per request)."""
    p = body.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]
    if isinstance(p, str):
        if not p:
            raise bad("'prompt' must not be empty", "prompt")
        return _text(p, "'prompt'", "prompt"), None
    if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        return None, _token_list(p, "prompt")
    if isinstance(p, list) and len(p) > 1:
        raise bad("one prompt per request: batched prompts are not supported", "prompt")
    raise bad("'prompt' must be a non-empty string or list of token ids", "prompt")


def chat_prompt(messages: Any, template=None) -> str:
    """Render messages with the model's chat template (`template(messages)`: a GGUF
    tokenizer's), else with a plain one (the byte tokenizer has none)."""
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' must be a non-empty list", "messages")
    parts = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad(f"messages[{i}] must be an object with a string 'role'", "messages")
        content = m.get("content")
        if isinstance(content, list):  # content parts: only text is served
            texts = [c.get("text") for c in content if isinstance(c, dict)]
            if any(not isinstance(c, dict) or c.get("type") != "text" for c in content) or not all(
                isinstance(t, str) for t in texts
            ):
                raise bad(f"messages[{i}]: only text content parts are supported", "messages")
            content = "".join(texts)
        if not isinstance(content, str):
            raise bad(f"messages[{i}].content must be a string", "messages")
        _text(m["role"], f"messages[{i}].role", "messages")
        parts.append((m["role"], _text(content, f"messages[{i}].content", "messages")))
    if template is not None:
        return template([{"role": role, "content": content} for role, content in parts])
    return "".join(f"<|{role}|>\n{content}\n" for role, content in parts) + "<|assistant|>\n"


def parse_generation(body: dict[str, Any], chat: bool, template=None) -> GenerationRequest:
    model = _field(body, "model", (str,), "a string")
    if chat:
        text, ids = chat_prompt(body.get("messages"), template), None
        max_tokens = _int(body, "max_completion_tokens", low=1)
        if max_tokens is None:
            max_tokens = _int(body, "max_tokens", low=1)
    else:
        text, ids = _prompt(body)
        max_tokens = _int(body, "max_tokens", 16, low=1)  # OpenAI's completions default
    n = _int(body, "n", 1)
    if n != 1:
        raise bad("only n = 1 is supported", "n")
    if body.get("stop") not in (None, [], ""):
        raise bad("stop strings are not supported: use stop_token_ids", "stop")
    if body.get("logprobs") not in (None, False, 0) or body.get("echo"):
        raise bad("logprobs and echo are not supported", "logprobs")
    stream = _bool(body, "stream")
    options = _field(body, "stream_options", (dict,), "an object", {})
    if options and not stream:
        raise bad("'stream_options' is only allowed when 'stream' is true", "stream_options")
    stop_ids = body.get("stop_token_ids")
    return GenerationRequest(
        chat=chat,
        model=model,
        prompt_text=text,
        prompt_ids=ids,
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
        top_k=_int(body, "top_k", 0, low=-1) if body.get("top_k") != -1 else 0,
        seed=_int(body, "seed"),
        stream=stream,
        include_usage=_bool(options, "include_usage"),
        continuous_usage=_bool(options, "continuous_usage_stats"),
        return_token_ids=_bool(body, "return_token_ids"),
        ignore_eos=_bool(body, "ignore_eos"),
        stop_token_ids=() if stop_ids is None else _token_list(stop_ids, "stop_token_ids"),
    )


# ---- responses --------------------------------------------------------------------------------
def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}  # fmt: skip


class ResponseBuilder:
    """Bodies of one request's response, in OpenAI's shapes for either endpoint."""

    def __init__(self, request_id: str, model: str, chat: bool, return_token_ids: bool):
        self.id = ("chatcmpl-" if chat else "cmpl-") + request_id
        self.model, self.chat, self.return_ids = model, chat, return_token_ids
        self.created = int(time.time())
        self._role_sent = False

    def chunk(self, text: str, token_ids: list[int], finish_reason: str | None,
              usage_now: dict | None, with_usage_field: bool) -> bytes:  # fmt: skip
        if self.chat:
            delta: dict[str, Any] = {}
            if not self._role_sent:
                delta["role"] = "assistant"
                self._role_sent = True
            if text:
                delta["content"] = text
            choice: dict[str, Any] = {"index": 0, "delta": delta}
        else:
            choice = {"index": 0, "text": text}
        choice["logprobs"] = None
        choice["finish_reason"] = finish_reason
        if self.return_ids:
            choice["token_ids"] = token_ids
        body = self._envelope("chat.completion.chunk" if self.chat else "text_completion")
        body["choices"] = [choice]
        if with_usage_field:  # OpenAI: `usage: null` on every chunk when usage is asked for
            body["usage"] = usage_now
        return sse(body)

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        body = self._envelope("chat.completion.chunk" if self.chat else "text_completion")
        body["choices"] = []
        body["usage"] = usage(prompt_tokens, completion_tokens)
        return sse(body)

    def full(self, text: str, token_ids: list[int], finish_reason: str | None,
             prompt_tokens: int) -> dict:  # fmt: skip
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant",
                                                              "content": text}}  # fmt: skip
        else:
            choice = {"index": 0, "text": text}
        choice.update(logprobs=None, finish_reason=finish_reason)
        if self.return_ids:
            choice["token_ids"] = token_ids
        body = self._envelope("chat.completion" if self.chat else "text_completion")
        body["choices"] = [choice]
        body["usage"] = usage(prompt_tokens, len(token_ids))
        return body

    def _envelope(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}


def sse(body: dict | str) -> bytes:
    data = body if isinstance(body, str) else json.dumps(body, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


SSE_DONE = sse("[DONE]")


class Detokenizer:
    """Incremental text of a growing output. A trailing replacement character may be an
    unfinished multi-byte sequence, so it is held back until more tokens (or the end)
    settle it: emitted text is never taken back."""

    def __init__(self, decode) -> None:
        self._decode = decode
        self.ids: list[int] = []
        self._emitted = ""

    def add(self, new_ids: list[int], final: bool) -> str:
        self.ids.extend(new_ids)
        text = self._decode(self.ids)
        if not final:
            text = text.rstrip("\ufffd")
        if not text.startswith(self._emitted) or len(text) <= len(self._emitted):
            return ""
        delta = text[len(self._emitted) :]
        self._emitted = text
        return delta

"""Hostile bodies over HTTP to `perfdiag serve`'s API: JSON nested far deeper than any
parser recurses, unpaired surrogates where text belongs. Each gets a 400 with a short
message naming the field, never a 500 carrying Python's exception text; the server
keeps serving."""

from __future__ import annotations

import json

import pytest
from fuzz_support import settings  # noqa: F401  (the suites' example budgets)
from hypothesis import given
from hypothesis import strategies as st
from test_serve_api import post, server  # noqa: F401  (the module's server fixture)

DEEP = 100_000
HOSTILE = [
    # (path, raw body, param)
    ("/v1/completions", b'{"prompt": ' + b"[" * DEEP + b"]" * DEEP + b"}", None),
    (
        "/v1/completions",
        b'{"prompt": "x", "extra": ' + b'{"a":' * DEEP + b"1" + b"}" * DEEP + b"}",
        None,
    ),
    ("/v1/completions", b'{"prompt": "\\ud800"}', "prompt"),
    ("/v1/completions", b'{"prompt": ["a\\udfffb"]}', "prompt"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "\\udc00", "content": "hi"}]}', "messages"),
    (
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud800"}]}]}',
        "messages",
    ),
]
PYTHON_WORDS = ("Error", "Traceback", "recursion", "surrogates not allowed", "codec")


NAMES = ["deep-array-prompt", "deep-object-field", "surrogate-prompt", "surrogate-in-batch",
         "surrogate-content", "surrogate-role", "surrogate-content-part"]  # fmt: skip


@pytest.mark.parametrize(("path", "raw", "param"), HOSTILE, ids=NAMES)
def test_hostile_bodies_get_a_short_400(server, path, raw, param):  # noqa: F811
    code, _, text = post(f"{server.url}{path}", None, raw=raw)
    assert code == 400, text[:300]
    err = json.loads(text)["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert len(err["message"]) < 160 and "\n" not in err["message"], err["message"]
    assert not any(w in err["message"] for w in PYTHON_WORDS), err["message"]
    ok, _, _ = post(f"{server.url}/v1/completions", {"prompt": "still here", "max_tokens": 2})
    assert ok == 200


def test_a_paired_surrogate_is_text(server):  # noqa: F811
    """JSON's escaped pair is one character (an emoji): served, not refused."""
    code, _, text = post(f"{server.url}/v1/completions", None,
                         raw=b'{"prompt": "\\ud83d\\ude00", "max_tokens": 2}')  # fmt: skip
    assert code == 200, text


# Any field of a request body given a nested value (up to 200,000 deep) or a text with an
# unpaired surrogate: a 4xx naming no Python exception, never a 500.
_FIELDS = ["prompt", "messages", "max_tokens", "temperature", "stop", "stream_options",
           "model", "seed", "stop_token_ids"]  # fmt: skip
_SURROGATES = [
    '"\\ud800"',
    '"a\\udfffb"',
    '["\\udc00"]',
    '[{"role": "user", "content": "\\ud8ff"}]',
]


@given(
    field=st.sampled_from(_FIELDS),
    depth=st.one_of(st.integers(1, 50), st.sampled_from([999, 5_000, 200_000])),
    opener=st.sampled_from(["[", '{"a":']),
    surrogate=st.one_of(st.none(), st.sampled_from(_SURROGATES)),
    chat=st.booleans(),
)
def test_nested_or_surrogate_fields_never_get_a_500(server, field, depth, opener, surrogate, chat):  # noqa: F811
    closer = "]" if opener == "[" else "}"
    value = surrogate or opener * depth + ("" if opener == "[" else "1") + closer * depth
    base = '"messages": [{"role": "user", "content": "hi"}]' if chat else '"prompt": "hi"'
    raw = f'{{{base}, "max_tokens": 2, "{field}": {value}}}'.encode()
    path = "/v1/chat/completions" if chat else "/v1/completions"
    code, _, text = post(f"{server.url}{path}", None, raw=raw)
    assert code in (200, 400, 404), text[:300]
    if code != 200:
        message = json.loads(text)["error"]["message"]
        assert len(message) < 200 and not any(w in message for w in PYTHON_WORDS), message

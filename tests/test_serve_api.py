"""`perfdiag serve`'s HTTP API on 127.0.0.1 at an ephemeral port: streaming, usage, request
ids, the official openai client, bad requests, the API key, /metrics, timeouts."""

from __future__ import annotations

import json
import time

import aiohttp
import pytest

from perfdiag.engine_ref import LLMEngine
from perfdiag.engine_ref.server import ServerConfig, ServerObserver, ServerThread
from perfdiag.engine_ref.testing import tiny_config

KEY = "sk-test-key"


class Records(ServerObserver):
    def __init__(self):
        self.events, self.ends = [], []

    def http_event(self, request_id, kind, ts_ns, num_tokens=None, detail=None):
        self.events.append((request_id, kind, num_tokens, detail))

    def request_end(self, record):
        self.ends.append(record)


@pytest.fixture(scope="module")
def server():
    engine = LLMEngine(tiny_config())
    records = Records()
    with ServerThread(engine, ServerConfig(port=0, model_name="tiny"), records) as srv:
        srv.records = records
        yield srv


def post(url, body, headers=None, raw=None):
    """A blocking POST (the server runs in its own thread): status, headers, body text."""
    import asyncio

    async def go():
        async with aiohttp.ClientSession() as s:
            kw = {"data": raw} if raw is not None else {"json": body}
            async with s.post(url, headers=headers or {}, **kw) as r:
                return r.status, dict(r.headers), await r.text()

    return asyncio.run(go())


def sse_objects(text: str) -> list:
    datas = [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]
    assert datas[-1] == "[DONE]"
    return [json.loads(d) for d in datas[:-1]]


def test_completion_stream_usage_ids_and_request_id(server):
    prompt = [256, *range(40, 60)]
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 9, "stream": True,
            "ignore_eos": True, "return_token_ids": True, "temperature": 0,
            "stream_options": {"include_usage": True}}  # fmt: skip
    status, headers, text = post(f"{server.url}/v1/completions", body, {"x-request-id": "abc-1"})
    assert status == 200 and headers["X-Request-ID"] == "abc-1"
    assert headers["Content-Type"].startswith("text/event-stream")
    objs = sse_objects(text)
    *chunks, last = objs
    assert last["choices"] == [] and last["usage"] == {
        "prompt_tokens": 21, "completion_tokens": 9, "total_tokens": 30}  # fmt: skip
    assert all(c["usage"] is None and c["id"] == "cmpl-abc-1" for c in chunks)
    ids = [t for c in chunks for t in c["choices"][0]["token_ids"]]
    assert len(ids) == 9
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    # the text streamed is the decoding of the ids (nothing lost to held-back bytes)
    engine_text = bytes(t for t in ids if t < 256).decode("utf-8", errors="replace")
    assert "".join(c["choices"][0]["text"] for c in chunks) == engine_text
    # greedy: the same request again gives the same tokens
    _, _, again = post(f"{server.url}/v1/completions", body)
    assert [t for c in sse_objects(again)[:-1] for t in c["choices"][0]["token_ids"]] == ids
    kinds = [k for rid, k, _, _ in server.records.events if rid == "abc-1"]
    assert kinds[:2] == ["http_received", "response_start"] and kinds[-1] == "response_end"
    assert kinds.count("sse_chunk") == len(chunks)


def test_request_id_generated_when_absent_or_unsafe(server):
    body = {"prompt": "hi", "max_tokens": 2}
    _, h1, text = post(f"{server.url}/v1/completions", body)
    _, h2, _ = post(f"{server.url}/v1/completions", body, {"x-request-id": "bad id\twith space"})
    assert len(h1["X-Request-ID"]) == 32 and h1["X-Request-ID"] != h2["X-Request-ID"]
    full = json.loads(text)
    assert full["object"] == "text_completion" and full["usage"]["completion_tokens"] <= 2


def test_chat_stream_and_non_stream(server):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    body = {"model": "tiny", "messages": msgs, "max_tokens": 5, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    status, _, text = post(f"{server.url}/v1/chat/completions", body)
    objs = sse_objects(text)
    assert status == 200 and objs[0]["object"] == "chat.completion.chunk"
    assert objs[0]["choices"][0]["delta"]["role"] == "assistant"
    assert objs[-1]["usage"]["completion_tokens"] == 5
    body["stream"] = False
    del body["stream_options"]
    status, _, text = post(f"{server.url}/v1/chat/completions", body)
    full = json.loads(text)
    assert status == 200 and full["object"] == "chat.completion"
    assert full["choices"][0]["message"]["role"] == "assistant"
    assert (
        full["usage"]["completion_tokens"] == 5 and full["choices"][0]["finish_reason"] == "length"
    )


def test_official_openai_client_streams():
    openai = pytest.importorskip("openai")
    engine = LLMEngine(tiny_config())
    with ServerThread(engine, ServerConfig(port=0, model_name="tiny", api_key=KEY)) as srv:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key=KEY, max_retries=0)
        assert [m.id for m in client.models.list().data] == ["tiny"]
        stream = client.completions.create(
            model="tiny", prompt="Once upon", max_tokens=7, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )  # fmt: skip
        chunks = list(stream)
        assert chunks[-1].usage.completion_tokens == 7 and chunks[-1].usage.prompt_tokens == 10
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        chat = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
            stream=True, extra_body={"ignore_eos": True},
        )  # fmt: skip
        deltas = [c.choices[0].delta for c in chat if c.choices]
        assert deltas[0].role == "assistant"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{srv.url}/v1", api_key="wrong", max_retries=0
                          ).models.list()  # fmt: skip
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="nope", prompt="x", max_tokens=1)
    assert engine.is_drained()


BAD = [
    (b"{not json", 400, None),
    (b"[1, 2]", 400, None),
    (json.dumps({"prompt": 5, "max_tokens": 3}).encode(), 400, "prompt"),
    (json.dumps({"prompt": "x", "max_tokens": "3"}).encode(), 400, "max_tokens"),
    (json.dumps({"prompt": "x", "max_tokens": True}).encode(), 400, "max_tokens"),
    (json.dumps({"prompt": "x", "temperature": "hot"}).encode(), 400, "temperature"),
    (json.dumps({"prompt": "x", "stream": "yes"}).encode(), 400, "stream"),
    (json.dumps({"prompt": [1, "a"]}).encode(), 400, "prompt"),
    (json.dumps({"prompt": [1, 99999]}).encode(), 400, "prompt"),  # outside the vocabulary
    (json.dumps({"prompt": "x", "model": "gpt-9"}).encode(), 404, "model"),
    (json.dumps({"prompt": "x", "max_tokens": 500}).encode(), 400, "max_tokens"),  # > context
    (json.dumps({"prompt": "x", "max_tokens": 0}).encode(), 400, "max_tokens"),
    (json.dumps({"prompt": "x", "n": 2}).encode(), 400, "n"),
    (json.dumps({"prompt": ["a", "b"]}).encode(), 400, "prompt"),
]


@pytest.mark.parametrize(("raw", "status", "param"), BAD)
def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(server, raw, status, param):
    before = len(server.records.ends)
    code, headers, text = post(f"{server.url}/v1/completions", None, {"x-request-id": "bad-1"},
                               raw=raw)  # fmt: skip
    assert code == status, text
    err = json.loads(text)["error"]
    assert err["message"] and err["type"] and err["param"] == param
    assert headers["X-Request-ID"] == "bad-1"
    end = server.records.ends[before]
    assert (end.request_id, end.finish_reason, end.status) == ("bad-1", "rejected", status)
    ok, _, _ = post(f"{server.url}/v1/completions", {"prompt": "still here", "max_tokens": 2})
    assert ok == 200
    assert server.running.engine.is_drained()


def test_chat_bad_messages(server):
    for messages in ([], [{"content": "no role"}], [{"role": "user", "content": 3}], "hi"):
        code, _, text = post(f"{server.url}/v1/chat/completions", {"messages": messages})
        assert code == 400 and json.loads(text)["error"]["param"] == "messages"


def test_api_key_required_when_set():
    engine = LLMEngine(tiny_config())
    with ServerThread(engine, ServerConfig(port=0, api_key=KEY)) as srv:
        body = {"prompt": "x", "max_tokens": 1}
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": KEY}):
            code, _, text = post(f"{srv.url}/v1/completions", body, headers)
            assert code == 401 and json.loads(text)["error"]["code"] == "invalid_api_key"
        code, _, _ = post(f"{srv.url}/v1/completions", body, {"Authorization": f"Bearer {KEY}"})
        assert code == 200

        import urllib.request

        assert urllib.request.urlopen(f"{srv.url}/health").status == 200  # health stays open


def test_models_health_and_metrics_under_vllm_names(server):
    import urllib.request

    models = json.loads(urllib.request.urlopen(f"{server.url}/v1/models").read())
    assert models["data"][0]["id"] == "tiny" and models["data"][0]["max_model_len"] == 128
    post(f"{server.url}/v1/completions", {"prompt": [256, 1, 2, 3], "max_tokens": 4,
                                          "ignore_eos": True})  # fmt: skip
    text = urllib.request.urlopen(f"{server.url}/metrics").read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    tiny = '{model_name="tiny"}'
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total",
                 "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
                 "vllm:request_queue_time_seconds_count", "vllm:time_to_first_token_seconds_count",
                 "vllm:inter_token_latency_seconds_count",
                 "vllm:e2e_request_latency_seconds_count"):  # fmt: skip
        assert name + tiny in values, name
    assert values["vllm:num_requests_running" + tiny] == 0  # idle: live, not the last step
    assert values["vllm:kv_cache_usage_perc" + tiny] == 0
    assert values["vllm:time_to_first_token_seconds_count" + tiny] >= 1
    assert values["vllm:prefix_cache_queries_total" + tiny] >= 4
    assert values["vllm:generation_tokens_total" + tiny] >= 4


def test_request_timeout_ends_the_stream_and_frees_kv():
    engine = LLMEngine(tiny_config())
    records = Records()
    config = ServerConfig(port=0, request_timeout_s=0.05)
    with ServerThread(engine, config, records) as srv:
        body = {"prompt": [256, *range(100)], "max_tokens": 27, "ignore_eos": True,
                "stream": True}  # fmt: skip
        import threading

        stall = threading.Event()
        original = engine.step

        def slow_step():  # a slow engine: each step 10 ms
            stall.wait(0.01)
            return original()

        engine.step = slow_step
        code, _, text = post(f"{srv.url}/v1/completions", body, {"x-request-id": "slow"})
        assert code == 200
        objs = sse_objects(text)
        assert objs[-1]["error"]["code"] == "timeout"
        deadline = time.monotonic() + 5
        while not engine.is_drained() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.is_drained()
        end = next(e for e in records.ends if e.request_id == "slow")
        assert end.finish_reason == "timeout" and end.output_tokens < 27

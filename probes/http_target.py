"""A `Target` over HTTP: any OpenAI-compatible server (vLLM, SGLang, `perfdiag serve`).

One aiohttp session (one connection pool) serves every request; each request streams
`/v1/completions` and yields a `Chunk` per Server-Sent Event that carries output.

How many tokens a chunk holds, best source first (recorded per request as
`token_counts`): the chunk's own `token_ids` (vLLM's `return_token_ids`, perfdiag's
server) → the running `usage` in each chunk (`stream_options.continuous_usage_stats`) →
one token per non-empty text chunk, checked against the final `usage` (a shortfall is
counted as `unattributed_tokens`: the server merged tokens into chunks, but which ones
cannot be told). A chunk carrying several tokens is counted as a multi-token chunk.

Prompts go as token ids where the server accepts them (OpenAI's completions take a list of
ints), else as text: `open()` probes the server once and picks. Each request carries an
`x-request-id` (the workload's id, which `perfdiag serve` adopts for the join); a server
that accepts only UUIDs there (llama-cpp-python's, via starlette-context, answers 400) gets
a fresh UUID per request instead, recorded in the request's `args.http.request_id_sent`.
Connection-level timings come from aiohttp's tracing (client events http_connect_start/end,
http_request_sent,
http_response_start) for the client/server join.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import SimpleNamespace

import aiohttp

from ..errors import ConfigError
from .client import Chunk, RequestRejected
from .workload import PlannedRequest

EventFn = Callable[[str, str, int, "int | None"], None]
PROMPT_FORMATS = ("auto", "ids", "text")
# Extensions that make a load test honest (exact lengths, per-chunk token counts); a
# server that refuses them is driven without.
EXTRAS = {"ignore_eos": True, "return_token_ids": True}
# Short common words: about one token each in any BPE vocabulary (text prompts).
_WORD_LIST = (
    "the of and to in is it you that he was for on are as with his they at be this have "
    "from or one had by word but not what all were we when your can said there use an each "
    "which she do how their if will up other about out many then them these so some her "
    "would make like him into time has look two more go see"
)
_WORDS = tuple(_WORD_LIST.split())


class HttpError(Exception):
    """The server failed the request (5xx, a broken stream): an error, not a rejection."""


@dataclass
class HttpRecord:
    """What the client saw of one request over HTTP."""

    status: int | None = None
    server_request_id: str | None = None
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    token_counts: str | None = None  # ids | usage | chunks
    chunks: int = 0
    multi_token_chunks: int = 0
    unattributed_tokens: int = 0
    retry_after: str | None = None
    request_id_sent: str | None = None  # only when it differs from the workload's id


@dataclass(frozen=True)
class TargetInfo:
    url: str
    model: str
    prompt_format: str  # ids | text
    extras: bool  # the server took perfdiag's extensions (EXTRAS, continuous usage)
    server: str | None  # its Server header
    perfdiag_run: str | None  # the run a `perfdiag serve` target records into
    max_model_len: int | None
    request_ids: str = "plain"  # plain: the workload's ids | uuid: the server wants UUIDs


def _request_id(request_id: str, style: str) -> str:
    return str(uuid.uuid4()) if style == "uuid" else request_id


def ids_to_text(ids) -> str:
    return " ".join(_WORDS[i % len(_WORDS)] for i in ids)


class HttpTarget:
    def __init__(self, url: str, *, api_key: str | None = None, model: str | None = None,
                 prompt_format: str = "auto", on_event: EventFn | None = None,
                 max_connections: int = 0, temperature: float = 0.0):  # fmt: skip
        if prompt_format not in PROMPT_FORMATS:
            raise ConfigError(f"prompt format {prompt_format!r} is not one of {PROMPT_FORMATS}")
        self.url = url.rstrip("/")
        self.api_key, self.model, self.prompt_format = api_key, model, prompt_format
        self.on_event = on_event or (lambda *a: None)
        self.max_connections = max_connections  # 0: no limit (the workload's cap governs)
        self.temperature = temperature
        self.records: dict[str, HttpRecord] = {}
        self.info: TargetInfo | None = None
        self.session: aiohttp.ClientSession | None = None

    # ---- set-up ------------------------------------------------------------------------
    async def open(self) -> TargetInfo:
        trace = aiohttp.TraceConfig()
        trace.on_connection_create_start.append(self._traced("http_connect_start"))
        trace.on_connection_create_end.append(self._traced("http_connect_end"))
        trace.on_request_chunk_sent.append(self._traced("http_request_sent"))
        trace.on_request_end.append(self._traced("http_response_start"))
        connector = aiohttp.TCPConnector(limit=self.max_connections, force_close=False)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
        self.session = aiohttp.ClientSession(connector=connector, trace_configs=[trace],
                                             timeout=timeout)  # fmt: skip
        try:
            self.info = await self._discover()
        except BaseException:
            await self.close()
            raise
        return self.info

    def _traced(self, kind: str):
        async def record(session, ctx: SimpleNamespace, params) -> None:
            rid = getattr(ctx.trace_request_ctx, "rid", None)
            if rid is not None:
                self.on_event(rid, kind, time.monotonic_ns(), None)

        return record

    def _headers(self, request_id: str | None = None) -> dict[str, str]:
        h = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        if request_id is not None:
            h["x-request-id"] = request_id
        return h

    async def _discover(self) -> TargetInfo:
        where = f"{self.url}/v1/models"
        try:
            async with self.session.get(where, headers=self._headers()) as resp:
                if resp.status == 401:
                    raise ConfigError(f"{where}: 401 unauthorised (give --api-key)")
                if resp.status != 200:
                    raise ConfigError(f"{where}: HTTP {resp.status}: {_message(await resp.text())}")
                models = await resp.json(content_type=None)
                server, run = resp.headers.get("Server"), resp.headers.get("x-perfdiag-run")
        except aiohttp.ClientError as e:
            raise ConfigError(f"cannot reach {self.url}: {e}") from None
        cards = models.get("data") if isinstance(models, dict) else None
        if not cards:
            raise ConfigError(f"{where}: the server lists no model")
        card = cards[0]
        if self.model:
            card = next((c for c in cards if c.get("id") == self.model), None)
        if card is None:
            names = ", ".join(str(c.get("id")) for c in cards)
            raise ConfigError(f"{where}: no model {self.model!r} (the server has {names})")
        model = card["id"]
        formats = ("ids", "text") if self.prompt_format == "auto" else (self.prompt_format,)
        max_len = card.get("max_model_len")
        for ids in ("plain", "uuid"):
            for fmt in formats:
                for extras in (True, False):
                    if await self._probe(model, fmt, extras, ids):
                        return TargetInfo(self.url, model, fmt, extras, server, run,
                                          max_len if isinstance(max_len, int) else None,
                                          ids)  # fmt: skip
        raise ConfigError(f"{self.url}: the server refuses a one-token completion request "
                          f"(tried prompts as {' and '.join(formats)})")  # fmt: skip

    async def _probe(self, model: str, fmt: str, extras: bool, ids: str) -> bool:
        prompt = [100, 101, 102] if fmt == "ids" else ids_to_text([0, 1, 2])
        body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0}
        if extras:
            body.update(EXTRAS)
        async with self.session.post(f"{self.url}/v1/completions", json=body,
                                     headers=self._headers(_request_id("perfdiag-probe", ids))
                                     ) as resp:  # fmt: skip
            await resp.read()
            if resp.status == 401:
                raise ConfigError(f"{self.url}: 401 unauthorised (give --api-key)")
            return resp.status == 200

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None

    async def __aenter__(self) -> HttpTarget:
        await self.open()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # ---- one request -------------------------------------------------------------------
    def body(self, request: PlannedRequest) -> dict:
        info = self.info
        ids = request.prompt_ids
        if info.prompt_format == "ids" and ids is not None:
            prompt: list[int] | str = list(ids)
        else:
            prompt = request.prompt_text if ids is None else ids_to_text(ids)
        options = {"include_usage": True}
        body = {"model": info.model, "prompt": prompt, "max_tokens": request.max_tokens,
                "stream": True, "temperature": self.temperature, "seed": request.index,
                "stream_options": options}  # fmt: skip
        if info.extras:
            body.update(EXTRAS)
            options["continuous_usage_stats"] = True
        return body

    async def stream(self, request: PlannedRequest) -> AsyncIterator[Chunk]:
        rid = request.request_id
        rec = self.records[rid] = HttpRecord()
        ctx = SimpleNamespace(rid=rid)
        sent_id = _request_id(rid, self.info.request_ids)
        rec.request_id_sent = None if sent_id == rid else sent_id
        resp = await self.session.post(f"{self.url}/v1/completions", json=self.body(request),
                                       headers=self._headers(sent_id),
                                       trace_request_ctx=ctx)  # fmt: skip
        complete = False
        try:
            rec.status = resp.status
            rec.server_request_id = resp.headers.get("x-request-id")
            if resp.status != 200:
                await self._refused(resp, rec)
            finish = None
            counted = 0
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                obj = json.loads(data)
                if "error" in obj:
                    raise HttpError(f"in-stream error: {_message(obj)}")
                usage = obj.get("usage")
                if usage:
                    rec.usage_prompt_tokens = usage.get("prompt_tokens")
                    rec.usage_completion_tokens = usage.get("completion_tokens")
                for choice in obj.get("choices") or ():
                    ids, n = self._count(choice, usage, counted, rec)
                    if n > 0:
                        counted += n
                        rec.chunks += 1
                        rec.multi_token_chunks += n > 1
                        yield Chunk(ids)
                    finish = choice.get("finish_reason") or finish
            if finish is None:
                raise HttpError("the stream ended without a finish_reason")
            if rec.usage_completion_tokens is not None:
                rec.unattributed_tokens = max(0, rec.usage_completion_tokens - counted)
            complete = True
            yield Chunk([], True, finish)
        finally:
            if complete:
                resp.release()
            else:  # cut the connection: the server must see the client leave and abort
                resp.close()

    @staticmethod
    def _count(choice: dict, usage: dict | None, counted: int, rec: HttpRecord):
        ids = choice.get("token_ids")
        if isinstance(ids, list):
            rec.token_counts = "ids"
            return ids, len(ids)
        if usage and isinstance(usage.get("completion_tokens"), int):
            rec.token_counts = "usage"
            n = usage["completion_tokens"] - counted
            return [-1] * n, n
        rec.token_counts = rec.token_counts or "chunks"
        text = choice.get("text")
        if text is None:
            text = (choice.get("delta") or {}).get("content")
        return ([-1], 1) if text else ([], 0)

    async def _refused(self, resp: aiohttp.ClientResponse, rec: HttpRecord) -> None:
        text = await resp.text()
        rec.retry_after = resp.headers.get("Retry-After")
        msg = f"HTTP {resp.status}: {_message(text)}"
        if 400 <= resp.status < 500:
            raise RequestRejected(msg)
        raise HttpError(msg)


def _message(body) -> str:
    """An OpenAI-style error body's message, else the text itself (shortened)."""
    try:
        obj = json.loads(body) if isinstance(body, (str, bytes)) else body
        err = obj.get("error", obj)
        return str(err.get("message", err) if isinstance(err, dict) else err)[:300]
    except (ValueError, AttributeError):
        return str(body)[:300]

"""The HTTP front: OpenAI-compatible routes over the engine loop (aiohttp).

Every generation request ends in exactly one `ServerRequestRecord` — served, refused
(4xx/429), timed out, cut off by the client or failed — so the server's record accounts
for every request it saw. A client that disconnects cancels its handler (aiohttp's
handler cancellation), and the handler's `finally` aborts the request in the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import re
import sys
import time
import uuid
from dataclasses import dataclass, field

from aiohttp import web

from ..._version import __version__
from ..request import InvalidRequestError, SamplingParams
from . import protocol as p
from .config import ServerConfig
from .engine_loop import EngineLoop, EngineStopped
from .events import ServerObserver, ServerRequestRecord
from .metrics import CONTENT_TYPE, ServerMetrics

GENERATION_PATHS = {"/v1/completions": False, "/v1/chat/completions": True}  # → chat?
_REQUEST_ID = re.compile(r"^[\x21-\x7e]{1,128}$")  # printable, no spaces: safe to echo
STATE = web.AppKey("perfdiag_server", object)
# Typed request-storage keys where aiohttp has them (3.12+), plain strings before.
_KEY = getattr(web, "RequestKey", lambda name, _t: name)
RID, REQ = _KEY("perfdiag_rid", str), _KEY("perfdiag_req", object)


@dataclass
class _Req:
    """One generation request's server-side bookkeeping."""

    rid: str
    endpoint: str
    received_ns: int
    status: int = 0
    finish: str = "error"
    prompt_tokens: int | None = None
    output_ids: list[int] = field(default_factory=list)
    stream: bool = False
    error: str | None = None
    first_write_ns: int | None = None


class Server:
    """The routes' shared state: config, engine loop, metrics, the optional observer."""

    def __init__(self, engine, config: ServerConfig, observer: ServerObserver | None = None):
        self.engine, self.config = engine, config
        self.observer = observer or ServerObserver()
        self.metrics = ServerMetrics(config.model_name, self._live_state)
        self.loop = EngineLoop(engine, self.metrics)
        self.max_model_len = engine.config.max_model_len
        self.run_id: str | None = None  # the run the observer records into, if any

    def _live_state(self):
        return self.loop.num_running, self.loop.num_waiting, self.loop.kv_usage()

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware],
                              client_max_size=self.config.max_body_bytes)  # fmt: skip
        app[STATE] = self
        app.router.add_post("/v1/completions", self.generate)
        app.router.add_post("/v1/chat/completions", self.generate)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics_route)
        app.on_response_prepare.append(self._on_prepare)
        return app

    # ---- cross-cutting: request id, auth, errors ----------------------------------------
    @web.middleware
    async def _middleware(self, request: web.Request, handler):
        now = time.monotonic_ns()
        given = request.headers.get("x-request-id", "")
        rid = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
        if request.path in GENERATION_PATHS and self.loop.is_active(rid):
            rid = f"{rid}-{uuid.uuid4().hex[:6]}"  # ids must be unique among live requests
        request[RID] = rid
        req = None
        if request.path in GENERATION_PATHS and request.method == "POST":
            req = request[REQ] = _Req(rid, request.path, now)
            self.observer.http_event(rid, "http_received", now, None, request.path)
        try:
            if self.config.api_key is not None and request.path.startswith("/v1/"):
                self._check_key(request)
            return await handler(request)
        except p.ApiError as e:
            if req is not None:
                req.finish, req.error, req.status = "rejected", f"{e.status}: {e.message}", e.status
                self.metrics.rejected(e.code or e.type)
            return web.json_response(e.body(), status=e.status, headers=e.headers)
        except web.HTTPException as e:  # aiohttp's own: 404/405 routes, body too large
            if req is not None:
                req.finish, req.error, req.status = "rejected", f"{e.status}: {e.reason}", e.status
            err = p.ApiError(e.status, e.text or e.reason, "invalid_request_error")
            return web.json_response(err.body(), status=e.status)
        except asyncio.CancelledError:  # the client went away (handler cancellation)
            if req is not None and req.finish not in ("stop", "length", "timeout"):
                req.finish, req.error = "cancelled", "client disconnected"
                req.status = req.status or 499
            raise
        except Exception as e:  # a bug or a broken engine: a 500 with a body, and go on
            # The exception's text stays on this side (the recorded request, stderr): it
            # can hold what a client should not see (paths, the request's own bytes).
            if req is not None:
                req.finish, req.error, req.status = "error", f"{type(e).__name__}: {e}", 500
            print(f"perfdiag serve: internal error on request {rid}: {type(e).__name__}: "
                  f"{str(e)[:200]}", file=sys.stderr, flush=True)  # fmt: skip
            err = p.ApiError(500, f"internal error (request {rid})", "server_error")
            return web.json_response(err.body(), status=500)
        finally:
            if req is not None:
                self._end(req)

    def _check_key(self, request: web.Request) -> None:
        auth = request.headers.get("Authorization", "")
        scheme, _, token = auth.partition(" ")
        expected = self.config.api_key.encode()
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected):
            msg = "missing API key" if not auth else "incorrect API key"
            raise p.ApiError(401, msg, "invalid_request_error", code="invalid_api_key")

    async def _on_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers["x-request-id"] = request.get(RID, "")
        response.headers["Server"] = f"perfdiag/{__version__}"
        if self.run_id:
            response.headers["x-perfdiag-run"] = self.run_id
        req = request.get(REQ)
        if req is not None:
            req.status = response.status
            self.observer.http_event(req.rid, "response_start", time.monotonic_ns(), None,
                                     str(response.status))  # fmt: skip

    def _end(self, req: _Req) -> None:
        now = time.monotonic_ns()
        self.observer.http_event(req.rid, "response_end", now, len(req.output_ids), req.finish)
        if req.finish in ("stop", "length"):
            self.metrics.e2e.observe((now - req.received_ns) / 1e9)
        digest = None
        if req.output_ids:
            h = hashlib.blake2b(digest_size=16)  # the load client's digest, so runs compare
            for t in req.output_ids:
                h.update(int(t).to_bytes(8, "little", signed=True))
            digest = h.hexdigest()
        self.observer.request_end(ServerRequestRecord(
            req.rid, req.endpoint, req.status or 499, req.finish, req.prompt_tokens,
            len(req.output_ids), req.stream, req.error, digest))  # fmt: skip

    # ---- routes --------------------------------------------------------------------------
    async def models(self, request: web.Request) -> web.Response:
        card = {"id": self.config.model_name, "object": "model", "created": 0,
                "owned_by": "perfdiag", "max_model_len": self.max_model_len}  # fmt: skip
        return web.json_response({"object": "list", "data": [card]})

    async def health(self, request: web.Request) -> web.Response:
        if self.loop.error is not None:
            return web.json_response({"status": "error", "error": str(self.loop.error)}, status=500)
        return web.json_response({"status": "ok"})

    async def metrics_route(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def generate(self, request: web.Request) -> web.StreamResponse:
        req: _Req = request[REQ]
        template = getattr(self.engine.tokenizer, "apply_chat_template", None)
        gen = p.parse_generation(
            p.parse_json(await request.read()), GENERATION_PATHS[request.path], template
        )
        req.stream = gen.stream
        if gen.model is not None and gen.model != self.config.model_name:
            raise p.ApiError(404, f"the model `{gen.model}` does not exist",
                             param="model", code="model_not_found")  # fmt: skip
        ids = list(gen.prompt_ids) if gen.prompt_ids is not None else self._encode(gen.prompt_text)
        req.prompt_tokens = len(ids)
        room = self.max_model_len - len(ids)
        max_tokens = gen.max_tokens if gen.max_tokens is not None else room
        if max_tokens > room or room < 1:
            raise p.bad(f"this model's maximum context length is {self.max_model_len} tokens; "
                        f"the request asks for {len(ids) + max_tokens} ({len(ids)} in the "
                        f"prompt, {max_tokens} to generate)", "max_tokens")  # fmt: skip
        if self.loop.num_waiting >= self.config.max_waiting:
            raise p.ApiError(429, f"the server is overloaded ({self.loop.num_waiting} requests "
                             "waiting): retry later", "rate_limit_error",
                             code="overloaded",
                             headers={"Retry-After": str(self.loop.retry_after_s())})  # fmt: skip
        params = self._sampling(gen, max_tokens)
        try:
            queue = self.loop.add(req.rid, ids, params)
        except InvalidRequestError as e:
            raise p.bad(str(e), "prompt") from None
        except EngineStopped as e:
            raise p.ApiError(503, str(e), "server_error") from None
        out = p.ResponseBuilder(req.rid, self.config.model_name, gen.chat, gen.return_token_ids)
        try:
            if gen.stream:
                return await self._stream(request, req, gen, queue, out)
            return await self._full(req, queue, out)
        finally:
            if self.loop.release(req.rid):
                self.metrics.aborted("timeout" if req.finish == "timeout" else "disconnect")

    def _encode(self, text: str) -> list[int]:
        ids = self.engine.tokenizer.encode(text)
        if not ids:
            raise p.bad("the prompt encodes to no tokens", "prompt")
        return ids

    def _sampling(self, gen: p.GenerationRequest, max_tokens: int) -> SamplingParams:
        try:
            return SamplingParams(temperature=gen.temperature, top_k=gen.top_k, top_p=gen.top_p,
                                  seed=gen.seed, max_tokens=max_tokens,
                                  stop_token_ids=gen.stop_token_ids,
                                  ignore_eos=gen.ignore_eos)  # fmt: skip
        except InvalidRequestError as e:
            raise p.bad(str(e)) from None

    async def _next(self, req: _Req, queue: asyncio.Queue):
        """The next outputs, merged: a handler that fell behind the engine sends what has
        accumulated as one chunk (so chunks can carry several tokens, as in vLLM)."""
        timeout = self.config.request_timeout_s
        remaining = None if timeout is None else req.received_ns / 1e9 + timeout - time.monotonic()
        try:
            first = await asyncio.wait_for(queue.get(), remaining)
        except asyncio.TimeoutError:
            req.finish, req.error = "timeout", f"no result within {timeout} s"
            return None
        outs = [first]
        while not queue.empty() and not isinstance(outs[-1], BaseException):
            outs.append(queue.get_nowait())
        for o in outs:
            if isinstance(o, BaseException):
                raise o
        ids = [t for o in outs for t in o.new_token_ids]
        last = outs[-1]
        return ids, last.finish_reason if last.finished else None

    async def _full(self, req: _Req, queue, out: p.ResponseBuilder) -> web.Response:
        finish = None
        while finish is None:
            step = await self._next(req, queue)
            if step is None:
                raise p.ApiError(504, req.error or "timeout", "timeout_error", code="timeout")
            ids, finish = step
            self._note_tokens(req, ids)
        req.finish = finish
        text = self.engine.tokenizer.decode(req.output_ids)
        body = out.full(text, req.output_ids, finish, req.prompt_tokens)
        return web.json_response(body)

    def _note_tokens(self, req: _Req, ids: list[int]) -> None:
        if ids and req.first_write_ns is None:
            req.first_write_ns = time.monotonic_ns()
            self.metrics.ttft.observe((req.first_write_ns - req.received_ns) / 1e9)
        req.output_ids.extend(ids)

    async def _stream(self, request, req: _Req, gen: p.GenerationRequest, queue,
                      out: p.ResponseBuilder) -> web.StreamResponse:  # fmt: skip
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})  # fmt: skip
        await resp.prepare(request)
        detok = p.Detokenizer(self.engine.tokenizer.decode)
        usage_field = gen.include_usage
        finish = None
        try:
            while finish is None:
                step = await self._next(req, queue)
                if step is None:  # timed out: say so in the stream, which has begun
                    err = p.ApiError(504, req.error or "timeout", "timeout_error", code="timeout")
                    await resp.write(p.sse(err.body()))
                    break
                ids, finish = step
                text = detok.add(ids, finish is not None)
                self._note_tokens(req, ids)
                if not (text or ids or finish):
                    continue
                now_usage = None
                if gen.continuous_usage:
                    now_usage = p.usage(req.prompt_tokens, len(req.output_ids))
                await resp.write(out.chunk(text, ids, finish, now_usage, usage_field))
                self.observer.http_event(req.rid, "sse_chunk", time.monotonic_ns(), len(ids))
            if finish is not None:
                req.finish = finish
                if gen.include_usage:
                    await resp.write(out.usage_chunk(req.prompt_tokens, len(req.output_ids)))
            await resp.write(p.SSE_DONE)
            await resp.write_eof()
        except ConnectionResetError:  # the client left while we wrote
            if req.finish not in ("stop", "length"):
                req.finish, req.error = "cancelled", "client disconnected"
        except EngineStopped as e:
            req.finish, req.error = "error", str(e)
            err = p.ApiError(503, str(e), "server_error")
            with contextlib.suppress(ConnectionError):
                await resp.write(p.sse(err.body()))
                await resp.write(p.SSE_DONE)
        return resp

"""rollout_svc's OpenAI-compatible HTTP port (`--http-port`): POST /v1/chat/completions,
POST /v1/completions and GET /v1/models, served by the same Replica (the same engines, the same
pool queues, so HTTP and Generate requests batch together and see the same weight versions) on the
gRPC server's event loop. Thin: rollout_svc.openai_request checks a body, openai_response builds
the answer; this wires them to the replica, the token, TLS and the metrics.

The gRPC port's TLS (and mutual TLS) apply here unchanged. Its token, where one is configured, is
required on every /v1 route: an OpenAI client always sends its api_key as `Authorization: Bearer`,
and this port is the one meant for callers outside the cluster's own services.

A stream is written once the generation is done: the engines answer whole completions, so its
first chunk comes when a non-streamed answer would (the chunks are what the `openai` client reads).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from aiohttp import web

from atgrpo import errors
from atgrpo.rpc.options import MAX_MESSAGE_BYTES
from atgrpo.rpc.security import ServerSecurity, bearer_ok
from rollout_svc import metrics
from rollout_svc import openai_response as out
from rollout_svc.openai_request import (
    ApiError,
    ApiRequest,
    parse_chat,
    parse_completion,
    resolve_model,
)
from rollout_svc.openai_tools import renders_tools
from rollout_svc.replica import Replica

log = logging.getLogger(__name__)

MAX_CONCURRENT = 256  # as the gRPC port's max_concurrent_rpcs: more are answered 429
# atgrpo errors as HTTP statuses (OpenAI's: 429 to retry later, 503 when the engine failed)
_STATUS = {
    errors.InvalidArgument: 400,
    errors.NotFound: 404,
    errors.FailedPrecondition: 409,
    errors.ResourceExhausted: 429,
    errors.Unavailable: 503,
    errors.DeadlineExceeded: 504,
}


def _api_error(err: errors.AtgrpoError) -> ApiError:
    status = next((s for cls, s in _STATUS.items() if isinstance(err, cls)), 500)
    kind = "invalid_request_error" if status < 500 and status != 429 else "server_error"
    return ApiError(status, err.message, kind=kind)


def _json(status: int, body: dict) -> web.Response:
    return web.json_response(body, status=status, dumps=json.dumps)


class OpenAIHttp:
    """The HTTP port, a SidePort of the rollout servicer (atgrpo.rpc.server)."""

    name = "http_port"

    def __init__(self, replica: Replica, port: int):
        self.replica, self.port = replica, port
        self.token: str | None = None
        self.in_flight = 0
        self._runner: web.AppRunner | None = None
        self._created = int(time.time())

    # --- lifecycle -------------------------------------------------------------------------

    async def open(self, host: str, security: ServerSecurity) -> int:
        self.token = security.token
        app = web.Application(middlewares=[self._guard], client_max_size=MAX_MESSAGE_BYTES)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completion)
        # A caller that hangs up stops its request: the pool drops it before the next step.
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, self.port, ssl_context=security.ssl_context())
        try:
            await site.start()
        except OSError as err:
            await self._runner.cleanup()
            raise OSError(
                f"--http-port {self.port}: could not bind {host}:{self.port} "
                f"({err.strerror or err}); is the port in use? Pass --http-port 0 for a free one"
            ) from None
        port = site._server.sockets[0].getsockname()[1]  # the bound one, for port 0
        log.info("OpenAI-compatible API on %s:%d (%s)", host, port, security.describe())
        return port

    async def close(self, grace_s: float) -> None:
        if self._runner is not None:
            # aiohttp 3 takes the grace only at the runner's construction, before it is known
            self._runner._shutdown_timeout = grace_s
            await self._runner.cleanup()

    # --- the guard: token, concurrency, errors, metrics -------------------------------------

    @web.middleware
    async def _guard(self, request: web.Request, handler: Callable[..., Awaitable]):
        route = request.path
        start = time.perf_counter()
        try:
            if self.token and not bearer_ok(
                [("authorization", request.headers.get("Authorization", ""))], self.token
            ):
                log.warning("refused %s from %s: no valid auth token", route, request.remote)
                raise ApiError(
                    401,
                    "missing or wrong API key: send the cluster's auth token as "
                    "'Authorization: Bearer <token>' (the openai client's api_key)",
                    code="invalid_api_key",
                )
            if self.in_flight >= MAX_CONCURRENT:
                raise ApiError(
                    429, f"{MAX_CONCURRENT} requests in flight; retry shortly", kind="rate_limit"
                )
            self.in_flight += 1
            try:
                response = await handler(request)
            finally:
                self.in_flight -= 1
        except ApiError as err:
            response = _json(err.status, err.body())
        except errors.AtgrpoError as err:
            api = _api_error(err)
            response = _json(api.status, api.body())
        except web.HTTPException as err:  # aiohttp's own: 404 route, 405, 413 body too large
            api = ApiError(err.status, f"{request.method} {route}: {err.reason}")
            response = _json(err.status, api.body())
        except Exception as err:  # noqa: BLE001 - a bug here: answered 500, the port keeps serving
            log.exception("%s failed", route)
            api = ApiError(500, f"internal error: {err!r}", kind="server_error")
            response = _json(500, api.body())
        metrics.observe_http(route, response.status, time.perf_counter() - start)
        return response

    # --- routes ----------------------------------------------------------------------------

    def _served(self) -> dict[str, tuple[str, ...]]:
        return {
            name: tuple(sorted(a for a in pool.versions if a))
            for name, pool in self.replica.pools.items()
        }

    async def _models(self, request: web.Request) -> web.Response:
        return _json(200, out.models_list(self.replica.policies(), self._created))

    async def _body(self, request: web.Request) -> Any:
        try:
            return await request.json()
        except ValueError as err:
            raise ApiError(
                400, f"the request body is not JSON ({err}); send a JSON object"
            ) from None

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        req = parse_chat(await self._body(request))
        pool, adapter = resolve_model(req.model, self._served())
        if req.tool_use:
            self._check_tools(pool, req)
        ids, _ = await self.replica.render(pool, list(req.messages), 0, list(req.tools))
        return await self._answer(request, req, pool, adapter, ids, "chat")

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        req = parse_completion(await self._body(request))
        pool, adapter = resolve_model(req.model, self._served())
        if isinstance(req.prompt, str):
            ids = await self.replica.tokenize(pool, req.prompt)
        else:
            ids = list(req.prompt)
        return await self._answer(request, req, pool, adapter, ids, "completion")

    def _check_tools(self, pool: str, req: ApiRequest) -> None:
        """Tools only for a model whose chat template renders them in Qwen3's form; not in a
        stream (calls are parsed from the whole answer)."""
        tokenizer = getattr(self.replica.pool(pool).engine, "tokenizer", None)
        if not renders_tools(getattr(tokenizer, "chat_template", None)):
            raise ApiError(
                400,
                f"tools: model {req.model!r} cannot take tools (its chat template defines no tool "
                "use in Qwen3's <tool_call> form); leave out `tools`, tool calls and tool "
                "messages, and describe the tools in a system message instead",
                "tools",
            )
        if req.stream and req.tool_choice == "auto":
            raise ApiError(
                400,
                "stream: with tools, ask without streaming: tool calls are parsed from the whole "
                "answer (or send tool_choice 'none')",
                "stream",
            )

    async def _answer(
        self,
        request: web.Request,
        req: ApiRequest,
        pool: str,
        adapter: str,
        ids: list[int],
        kind: str,
    ) -> web.StreamResponse:
        gen = await self.replica.generate_prompt(pool, adapter, ids, req.sampling, req.n)
        metrics.count_http_tokens(pool, **out.usage(gen))
        tokenizer = self.replica.pool(pool).engine.tokenizer

        def decode(token_ids) -> str:
            return tokenizer.decode(token_ids, skip_special_tokens=True)

        rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        args = (rid, int(time.time()), req.model, gen, req.logprobs)
        if not req.stream:
            if kind == "chat":
                tools = req.tool_choice == "auto"
                return _json(200, out.chat_response(*args, decode, tools=tools))
            return _json(200, out.completion_response(*args, decode))
        chunks = out.chat_chunks if kind == "chat" else out.completion_chunks
        return await _stream(request, chunks(*args, req.include_usage, decode))


async def _stream(request: web.Request, chunks: Iterator[dict]) -> web.StreamResponse:
    """Server-sent events as the openai client reads them: `data: <json>` each, then [DONE]."""
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    for chunk in chunks:
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response

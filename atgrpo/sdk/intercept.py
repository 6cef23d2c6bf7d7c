"""The interception server: one loopback HTTP server per process that answers agent programs'
OpenAI chat calls with the policy's answers (atgrpo.sdk.program).

It speaks what an `openai` client and most agent frameworks call, `POST /v1/chat/completions`
and `GET /v1/models`, under a prefix per program run: a run's base URL is
http://127.0.0.1:PORT/run/TOKEN/v1. So one server routes every episode's calls to that
episode's run, and no call reaches another one (the token is a 128-bit secret, and the server
listens on loopback only).

It runs on its own thread and event loop: it outlives the event loops of its callers (each
asyncio.run of a test or of `atgrpo env check` makes a new one), and a program's call is served
whichever thread the program blocks. A call is handed to its run on the run's own loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import threading
from collections.abc import Mapping
from typing import Any, Protocol

from aiohttp import web

from atgrpo.contract.env import Message, content_text
from atgrpo.sdk.host import MAX_ACTION_CHARS

ROLES = frozenset({"system", "user", "assistant"})
# A request carries a whole conversation: allow a few answers' worth of text per call.
MAX_REQUEST_BYTES = 16 * MAX_ACTION_CHARS


class CallRefused(Exception):
    """A call the interception cannot answer (a stream, tools, n > 1, a role that does not act,
    malformed messages): the program gets HTTP 400 and its episode ends with this message."""


class Receiver(Protocol):
    """A program run, as the server sees it (atgrpo.sdk.program_run.ProgramRun)."""

    loop: asyncio.AbstractEventLoop
    roles: tuple[str, ...]

    async def submit(self, model: str, messages: list[Message]) -> tuple[str, int]: ...

    def refuse(self, why: str) -> None: ...


def _content(value: Any, i: int) -> str:
    """A message's content as text: a string, or OpenAI's list of text parts."""
    text = content_text(value)
    if text is not None:
        return text
    raise CallRefused(
        f"message {i} has content {str(value)[:80]!r}: the policy reads text only (a string, or "
        'a list of {"type": "text", "text": ...} parts)'
    )


def parse_request(body: Any) -> tuple[str, list[Message]]:
    """(model, messages) of a chat-completions request body, or CallRefused saying why not."""
    if not isinstance(body, Mapping):
        raise CallRefused("the request body is not a JSON object")
    model, messages = body.get("model"), body.get("messages")
    if not isinstance(model, str):
        raise CallRefused(f"model is {model!r}: name the role (agent) that answers")
    if body.get("stream"):
        raise CallRefused("stream=True: the interception answers whole messages; call without it")
    if body.get("n") not in (None, 1):
        raise CallRefused(f"n={body.get('n')!r}: one answer per call (tree sampling branches it)")
    if body.get("tools") or body.get("functions") or body.get("tool_choice") not in (None, "none"):
        raise CallRefused(
            "tools: the policy answers with text, not function calls; describe the tools in "
            "the messages and parse the answer in the program"
        )
    if not isinstance(messages, list) or not messages:
        raise CallRefused("messages must be a non-empty list")
    out: list[Message] = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or m.get("role") not in ROLES:
            role = m.get("role") if isinstance(m, Mapping) else m
            raise CallRefused(f"message {i} has role {role!r}: use system, user or assistant")
        out.append({"role": m["role"], "content": _content(m.get("content"), i)})
    return model, out


def completion(model: str, text: str, index: int) -> dict[str, Any]:
    """A chat.completion answering with `text`; ids and times depend only on the call's index,
    so a program that reads them replays the same."""
    return {
        "id": f"chatcmpl-atgrpo-{index}",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


def _error(status: int, message: str) -> web.Response:
    body = {"error": {"message": message, "type": "atgrpo_interception", "code": status}}
    return web.json_response(body, status=status)


class _Server:
    def __init__(self) -> None:
        self.routes: dict[str, Receiver] = {}
        self.loop = asyncio.new_event_loop()
        self.port = 0
        ready = threading.Event()
        threading.Thread(
            target=self._serve, args=(ready,), name="atgrpo-intercept", daemon=True
        ).start()
        if not ready.wait(30) or not self.port:
            raise RuntimeError("the interception server did not start on 127.0.0.1")

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        app.router.add_post("/run/{token}/v1/chat/completions", self._chat)
        app.router.add_get("/run/{token}/v1/models", self._models)
        runner = web.AppRunner(app, access_log=None)
        self.loop.run_until_complete(runner.setup())
        self.loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
        self.port = runner.addresses[0][1]
        ready.set()
        self.loop.run_forever()

    def _receiver(self, request: web.Request) -> Receiver | None:
        return self.routes.get(request.match_info["token"])

    async def _chat(self, request: web.Request) -> web.Response:
        run = self._receiver(request)
        if run is None:
            return _error(404, "no live program run at this address: its episode was closed")
        try:
            model, messages = parse_request(await request.json())
        except (CallRefused, ValueError) as err:
            why = str(err) if isinstance(err, CallRefused) else "the request body is not JSON"
            with contextlib.suppress(RuntimeError):  # the run's loop is gone: nobody to tell
                run.loop.call_soon_threadsafe(run.refuse, why)
            return _error(400, why)
        try:
            handed = asyncio.run_coroutine_threadsafe(run.submit(model, messages), run.loop)
            text, index = await asyncio.wrap_future(handed)
        except CallRefused as err:
            return _error(400, str(err))
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():  # the program hung up: not our answer
                raise
            return _error(503, "the episode was closed before this call was answered")
        except Exception:  # noqa: BLE001 - the run or its loop is gone
            return _error(503, "the episode was closed before this call was answered")
        return web.json_response(completion(model, text, index))

    async def _models(self, request: web.Request) -> web.Response:
        run = self._receiver(request)
        if run is None:
            return _error(404, "no live program run at this address: its episode was closed")
        models = [
            {"id": r, "object": "model", "created": 0, "owned_by": "atgrpo"} for r in run.roles
        ]
        return web.json_response({"object": "list", "data": models})


_server: _Server | None = None
_lock = threading.Lock()


def _the_server() -> _Server:
    global _server
    with _lock:
        if _server is None:
            _server = _Server()
        return _server


def started() -> bool:
    return _server is not None


def start() -> int:
    """Start the server (once per process; a blocking wait, so call it off the event loop) and
    return its port."""
    return _the_server().port


def register(run: Receiver) -> tuple[str, str]:
    """(base_url, token): where `run`'s program calls the model, until unregister(token)."""
    server = _the_server()
    token = secrets.token_hex(16)
    server.routes[token] = run
    return f"http://127.0.0.1:{server.port}/run/{token}/v1", token


def unregister(token: str) -> None:
    if _server is not None:
        _server.routes.pop(token, None)

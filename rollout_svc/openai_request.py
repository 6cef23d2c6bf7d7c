"""The OpenAI-compatible API's requests (rollout_svc.openai_http serves them): a JSON body checked
and turned into the settings Generate takes. Pure functions, no I/O, so each rule is unit-tested.

A wrong field is answered 400 in OpenAI's error shape, naming the field (`param`) and what to send
instead. A field the engine cannot honour is refused, never ignored: a caller that asked for a
penalty or for top log-probs and silently got none would train or judge on something else.
Fields OpenAI clients send that change nothing here (user, metadata, store, ...) are accepted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from atgrpo.contract.env import content_text
from atgrpo.contract.rollout_wire import MAX_STOPS, MAX_TOKENS
from atgrpo.contract.sampling import Sampling
from rollout_svc.openai_errors import ApiError, bad
from rollout_svc.openai_tools import check_tool_choice, check_tools, tool_message

__all__ = ["ApiError", "ApiRequest", "parse_chat", "parse_completion", "resolve_model"]

MAX_N = 1024  # what Generate takes (rollout_svc.replica)
MAX_SEED = (1 << 64) - 1  # GenerateRequest's seed is a uint64
ROLES = ("system", "user", "assistant")
# Refused when set to anything but their no-op value: the engine samples only with temperature,
# top-p, top-k and stop strings (and log-probs are those of exactly that transform).
UNSUPPORTED = {
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "repetition_penalty": 1,
    "logit_bias": None,
    "echo": False,
    "suffix": None,
    "best_of": None,
    "min_tokens": 0,
    "response_format": None,
    "functions": None,
    "function_call": None,
}


@dataclass(frozen=True)
class ApiRequest:
    """One /v1/chat/completions or /v1/completions request, checked."""

    model: str
    sampling: Sampling
    n: int = 1
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage
    logprobs: bool = False  # the standard `logprobs` object (the sampled tokens' only)
    messages: tuple[dict[str, str], ...] = ()  # chat
    prompt: str | tuple[int, ...] = ""  # completions: text, or token ids taken as they are
    tools: tuple[dict, ...] = ()  # chat: what the model may call (rollout_svc.openai_tools)
    tool_choice: str = "none"  # "auto": answers' tool calls are parsed; "none": never
    tool_use: bool = False  # tools given, or tool calls and results in the messages


def _int(body: dict, name: str, low: int, high: int, default: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise bad(name, f"{value!r} must be an integer between {low} and {high}")
    return value


def _number(body: dict, name: str, low: float, high: float, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad(name, f"{value!r} must be a number between {low} and {high}")
    if not low <= value <= high:
        raise bad(name, f"{value} must be between {low} and {high}")
    return float(value)


def _bool(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad(name, f"{value!r} must be true or false")
    return value


def _stops(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if (
        not isinstance(stops, list)
        or len(stops) > MAX_STOPS
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise bad(
            "stop",
            f"give a non-empty string or a list of at most {MAX_STOPS} non-empty strings "
            "(an empty one would end every answer at once)",
        )
    return tuple(stops)


def _refuse_unsupported(body: dict) -> None:
    for name, neutral in UNSUPPORTED.items():
        value = body.get(name)
        if value is not None and value != neutral and value != {} and value != {"type": "text"}:
            raise bad(
                name,
                f"not supported by this server (the engine samples with temperature, top_p, "
                f"top_k and stop only, and returns the log-probs of exactly that); remove "
                f"{name} or set it to {neutral!r}",
            )


def _sampling(body: dict) -> Sampling:
    max_tokens = _int(body, "max_tokens", 1, MAX_TOKENS)
    newer = _int(body, "max_completion_tokens", 1, MAX_TOKENS)
    if max_tokens is not None and newer is not None and max_tokens != newer:
        raise bad(
            "max_completion_tokens",
            f"{newer} differs from max_tokens {max_tokens}; send one of the two",
        )
    top_k = _int(body, "top_k", -1, 1 << 31, -1)
    if top_k == 0:
        top_k = -1
    return Sampling(
        temperature=_number(body, "temperature", 0.0, 1e6, 1.0),
        top_p=_number(body, "top_p", 1e-9, 1.0, 1.0),
        top_k=top_k,
        max_tokens=newer or max_tokens or Sampling.max_tokens,
        # The whole prompt, never cut: one over the context is refused (400) as OpenAI does, not
        # shortened behind the caller's back (Generate's max_prompt_tokens cut).
        max_prompt_tokens=0,
        stop=_stops(body),
        seed=_int(body, "seed", 0, MAX_SEED),
    )


def _common(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model", "give the name of a served model (GET /v1/models lists them)")
    _refuse_unsupported(body)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad("stream_options", 'give an object, e.g. {"include_usage": true}')
    return dict(
        model=model,
        sampling=_sampling(body),
        n=_int(body, "n", 1, MAX_N, 1),
        stream=_bool(body, "stream"),
        include_usage=_bool(options or {}, "include_usage"),
    )


def _content(value: Any, where: str) -> str:
    """A message's text: a string, or a list of text parts joined."""
    text = content_text(value)
    if text is not None:
        return text
    raise bad(where, "give a string, or a list of text parts ({'type': 'text', 'text': ...})")


def parse_chat(body: Any) -> ApiRequest:
    """A /v1/chat/completions body, checked."""
    common = _common(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "give a non-empty list of {'role', 'content'} messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(where, "each message is an object with a role and a content")
        if m.get("role") == "tool" or m.get("tool_calls"):
            out.append(tool_message(m, where))
            continue
        if m.get("role") not in ROLES:
            raise bad(
                f"{where}.role", f"{m.get('role')!r}: use one of {', '.join(ROLES)} (or tool)"
            )
        out.append({"role": m["role"], "content": _content(m.get("content"), f"{where}.content")})
    logprobs = _bool(body, "logprobs")
    top = _int(body, "top_logprobs", 0, 20, 0)
    if top:
        raise bad(
            "top_logprobs",
            f"{top}: this engine returns only the sampled token's log-prob; send top_logprobs 0 "
            "or leave it out (logprobs: true gives the sampled tokens' log-probs)",
        )
    tools = check_tools(body.get("tools"))
    return ApiRequest(
        **common,
        logprobs=logprobs,
        messages=tuple(out),
        tools=tools,
        tool_choice=check_tool_choice(body.get("tool_choice"), tools),
        tool_use=bool(tools) or any(m["role"] == "tool" or "tool_calls" in m for m in out),
    )


def parse_completion(body: Any) -> ApiRequest:
    """A /v1/completions body, checked. The prompt is a string, or token ids (a list of ints)
    taken as they are; one prompt a request."""
    common = _common(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        prompt = tuple(prompt)
    elif not isinstance(prompt, str) or not prompt:
        raise bad(
            "prompt",
            "give one non-empty string, or one list of token ids (send several prompts as "
            "several requests)",
        )
    logprobs = _int(body, "logprobs", 0, 5)
    if logprobs:
        raise bad(
            "logprobs",
            f"{logprobs}: this engine returns only the sampled token's log-prob; send logprobs 0 "
            "(the sampled tokens' log-probs) or leave it out",
        )
    return ApiRequest(**common, logprobs=logprobs is not None, prompt=prompt)


def resolve_model(model: str, served: dict[str, tuple[str, ...]]) -> tuple[str, str]:
    """(pool, adapter) of a model name: a pool, `pool/adapter`, or an adapter (an agent's name,
    the adapters being named by agent) that one pool alone serves. `served`: pool -> adapters.
    404 naming the models there are otherwise."""
    if model in served:
        return model, ""
    pool, sep, adapter = model.partition("/")
    if sep and pool in served and adapter in served[pool]:
        return pool, adapter
    holders = [p for p, adapters in served.items() if model in adapters]
    if not sep and len(holders) == 1:
        return holders[0], model
    names = model_names(served)
    raise ApiError(
        404,
        f"model {model!r} is not served here; the models are: {', '.join(names) or 'none'}"
        + (f" ({model!r} is an adapter of {holders}: name it pool/adapter)" if holders else ""),
        "model",
        code="model_not_found",
    )


def model_names(served: dict[str, tuple[str, ...]]) -> list[str]:
    return [n for p in sorted(served) for n in [p, *(f"{p}/{a}" for a in sorted(served[p]))]]

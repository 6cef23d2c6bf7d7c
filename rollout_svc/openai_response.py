"""The OpenAI-compatible API's answers, built from a Generation (rollout_svc.openai_http serves
them). Pure functions: a tokenizer's `decode` is passed in where text of single tokens is needed.

Beside OpenAI's fields every answer carries the exact tokens, so a caller never re-tokenizes:
`prompt_token_ids` (the prompt as the model saw it: the chat template's rendering) and per choice
`token_ids` (vLLM's names, as its `return_token_ids` gives them) and `token_logprobs` (one per
token id, under the sampling transform the tokens were drawn with: what a trainer's old log-probs
are). A stream carries `prompt_token_ids` in its first chunk and each choice's ids and log-probs
in pieces, as vLLM streams them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from atgrpo.contract.rollout import Completion, Generation, PolicyRef
from rollout_svc.openai_tools import parse_tool_calls

Decode = Callable[[Sequence[int]], str]


def models_list(policies: Sequence[PolicyRef], created: int) -> dict[str, Any]:
    """GET /v1/models: each pool, and each adapter as pool/adapter, with the version served."""
    data = [
        {
            "id": f"{p.pool}/{p.adapter}" if p.adapter else p.pool,
            "object": "model",
            "created": created,
            "owned_by": "atgrpo",
            "root": p.pool,
            "parent": p.pool if p.adapter else None,
            "policy_version": p.version,
        }
        for p in sorted(policies, key=lambda p: (p.pool, p.adapter))
    ]
    return {"object": "list", "data": data}


def usage(gen: Generation) -> dict[str, int]:
    completion = sum(len(c.token_ids) for c in gen.completions)
    prompt = len(gen.prompt_ids)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _chat_logprobs(ids: Sequence[int], logps: Sequence[float], decode: Decode) -> dict:
    content = []
    for t, lp in zip(ids, logps, strict=True):
        text = decode([t])
        content.append(
            {"token": text, "logprob": lp, "bytes": list(text.encode()), "top_logprobs": []}
        )
    return {"content": content}


def _text_logprobs(
    ids: Sequence[int], logps: Sequence[float], decode: Decode, offset: int = 0
) -> dict:
    tokens = [decode([t]) for t in ids]
    offsets, at = [], offset
    for tok in tokens:
        offsets.append(at)
        at += len(tok)
    return {
        "tokens": tokens,
        "token_logprobs": list(logps),
        "top_logprobs": None,
        "text_offset": offsets,
    }


def _exact(c: Completion) -> dict[str, Any]:
    return {"token_ids": list(c.token_ids), "token_logprobs": list(c.logprobs)}


def _message(c: Completion, tools: bool, prefix: str) -> tuple[dict[str, Any], str]:
    """(the assistant message, the finish reason): with `tools`, the answer's tool calls parsed
    out of its text (rollout_svc.openai_tools), and "tool_calls" when it made any."""
    content, calls = parse_tool_calls(c.text, prefix) if tools else (c.text, [])
    if not calls:
        return {"role": "assistant", "content": c.text}, c.finish_reason
    return {"role": "assistant", "content": content, "tool_calls": calls}, "tool_calls"


def chat_response(
    rid: str,
    created: int,
    model: str,
    gen: Generation,
    logprobs: bool,
    decode: Decode,
    tools: bool = False,
) -> dict[str, Any]:
    choices = []
    for i, c in enumerate(gen.completions):
        message, finish = _message(c, tools, f"call_{rid.rpartition('-')[2][:16]}_{i}")
        choices.append(
            {
                "index": i,
                "message": message,
                "logprobs": _chat_logprobs(c.token_ids, c.logprobs, decode) if logprobs else None,
                "finish_reason": finish,
                **_exact(c),
            }
        )
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage(gen),
        "prompt_token_ids": list(gen.prompt_ids),
    }


def completion_response(
    rid: str, created: int, model: str, gen: Generation, logprobs: bool, decode: Decode
) -> dict[str, Any]:
    choices = [
        {
            "index": i,
            "text": c.text,
            "logprobs": _text_logprobs(c.token_ids, c.logprobs, decode) if logprobs else None,
            "finish_reason": c.finish_reason,
            "prompt_token_ids": list(gen.prompt_ids),  # vLLM puts them on each choice here
            **_exact(c),
        }
        for i, c in enumerate(gen.completions)
    ]
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage(gen),
        "prompt_token_ids": list(gen.prompt_ids),
    }


def pieces(c: Completion, decode: Decode) -> list[tuple[str, int, int]]:
    """A completion cut for streaming: (text, first token, end token) pieces whose texts join to
    exactly `c.text` and whose token ranges cover every token in order. A piece ends where the
    tokens so far decode to a prefix of the text (a token that ends inside a multi-byte character
    waits for the next one); tokens past a stop string go with the last piece."""
    out, sent, start = [], 0, 0
    for end in range(1, len(c.token_ids) + 1):
        text = decode(c.token_ids[:end])
        if text.endswith("\ufffd") or not c.text.startswith(text) or len(text) < sent:
            continue
        if len(text) > sent or end == len(c.token_ids):
            out.append((text[sent:], start, end))
            sent, start = len(text), end
    if start < len(c.token_ids) or sent < len(c.text):
        out.append((c.text[sent:], start, len(c.token_ids)))
    return out


def chat_chunks(
    rid: str,
    created: int,
    model: str,
    gen: Generation,
    logprobs: bool,
    include_usage: bool,
    decode: Decode,
) -> Iterator[dict[str, Any]]:
    """The chunks of a streamed chat completion, each choice's in turn (`index` tells them
    apart); the caller writes each as a server-sent event and ends with `data: [DONE]`."""
    head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
    for i, c in enumerate(gen.completions):
        first = {"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
        extra = {"prompt_token_ids": list(gen.prompt_ids)} if i == 0 else {}
        yield {**head, "choices": [{**first, "token_ids": [], "token_logprobs": []}], **extra}
        for text, a, b in pieces(c, decode):
            ids, logps = c.token_ids[a:b], c.logprobs[a:b]
            choice = {
                "index": i,
                "delta": {"content": text},
                "logprobs": _chat_logprobs(ids, logps, decode) if logprobs else None,
                "finish_reason": None,
                "token_ids": list(ids),
                "token_logprobs": list(logps),
            }
            yield {**head, "choices": [choice]}
        yield {**head, "choices": [{"index": i, "delta": {}, "finish_reason": c.finish_reason}]}
    if include_usage:
        yield {**head, "choices": [], "usage": usage(gen)}


def completion_chunks(
    rid: str,
    created: int,
    model: str,
    gen: Generation,
    logprobs: bool,
    include_usage: bool,
    decode: Decode,
) -> Iterator[dict[str, Any]]:
    """The chunks of a streamed completion (see chat_chunks)."""
    head = {"id": rid, "object": "text_completion", "created": created, "model": model}
    for i, c in enumerate(gen.completions):
        sent = 0
        for n, (text, a, b) in enumerate(pieces(c, decode)):
            ids, logps = c.token_ids[a:b], c.logprobs[a:b]
            choice = {
                "index": i,
                "text": text,
                "logprobs": _text_logprobs(ids, logps, decode, sent) if logprobs else None,
                "finish_reason": None,
                "token_ids": list(ids),
                "token_logprobs": list(logps),
                **({"prompt_token_ids": list(gen.prompt_ids)} if n == 0 else {}),
            }
            sent += len(text)
            yield {**head, "choices": [choice]}
        last = {"index": i, "text": "", "logprobs": None, "finish_reason": c.finish_reason}
        yield {**head, "choices": [last]}
    if include_usage:
        yield {**head, "choices": [], "usage": usage(gen)}

"""Tool use through the OpenAI-compatible API, for models whose chat template defines it in
Qwen3's (Hermes') form: the tools rendered as JSON inside the system turn, a call written by the
model as `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, a result shown back in a
`<tool_response>` block. Pure functions: request checks, message conversion and call parsing.

A model whose template has no such form (SmolLM2's, the tiny test model's) is refused tools with
a 400 (rollout_svc.openai_http): rendering them some other way would show the model a prompt it
was never trained on, and its answers could not be parsed back into calls.
"""

from __future__ import annotations

import json
import re
from typing import Any

from rollout_svc.openai_errors import bad

# A template renders tools in Qwen3's form when it takes `tools` and writes `<tool_call>` blocks.
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
MAX_TOOLS = 128


def renders_tools(template: str | None) -> bool:
    """Whether a chat template takes `tools` and writes calls as Qwen3's `<tool_call>` blocks."""
    return bool(template) and "tools" in template and "<tool_call>" in template


def check_tools(tools: Any) -> tuple[dict, ...]:
    """OpenAI's `tools`: a list of {"type": "function", "function": {"name", "description"?,
    "parameters"?}}, as the template renders them."""
    if tools is None:
        return ()
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise bad("tools", f"give a list of at most {MAX_TOOLS} tool definitions")
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            raise bad(f"tools[{i}]", 'give {"type": "function", "function": {"name": ...}}')
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad(f"tools[{i}].function.name", "give the function's name")
        if not isinstance(fn.get("parameters", {}), dict):
            raise bad(f"tools[{i}].function.parameters", "give a JSON schema object")
    return tuple(tools)


def check_tool_choice(choice: Any, tools: tuple[dict, ...]) -> str:
    """ "auto" (the model decides) or "none" (tools shown, no call parsed). A forced call
    ("required", or a named function) is refused: the engines cannot constrain the output."""
    if choice is None:
        return "auto" if tools else "none"
    if choice in ("auto", "none"):
        return choice
    raise bad(
        "tool_choice",
        f"{choice!r}: this server cannot force a tool call (the engine does not constrain its "
        "output); send 'auto' or 'none'",
    )


def tool_message(m: dict, where: str) -> dict[str, Any]:
    """A message of a conversation with tools, as the template reads it: an assistant turn with
    `tool_calls` (arguments as the JSON text the API carries), or a `tool` result."""
    if m.get("role") == "tool":
        content = m.get("content")
        if not isinstance(content, str):
            raise bad(f"{where}.content", "give the tool's result as a string")
        return {"role": "tool", "content": content, "tool_call_id": m.get("tool_call_id", "")}
    calls = m.get("tool_calls")
    if m.get("role") != "assistant" or not isinstance(calls, list) or not calls:
        raise bad(f"{where}.tool_calls", "only an assistant message carries a list of tool_calls")
    out = []
    for k, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad(f"{where}.tool_calls[{k}]", 'give {"function": {"name", "arguments"}}')
        arguments = fn.get("arguments", "{}")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        out.append(
            {
                "id": call.get("id", ""),
                "type": "function",
                "function": {**fn, "arguments": arguments},
            }
        )
    content = m.get("content") or ""
    if not isinstance(content, str):
        raise bad(f"{where}.content", "give a string (or null beside tool_calls)")
    return {"role": "assistant", "content": content, "tool_calls": out}


def parse_tool_calls(text: str, prefix: str) -> tuple[str | None, list[dict]]:
    """(the answer's text before its first call, or None when there is none; its calls in
    OpenAI's form, ids `<prefix>_<k>`). A block that is not a JSON object with a name stays text,
    as vLLM's Hermes parser leaves it."""
    calls, first = [], None
    for k, match in enumerate(_CALL.finditer(text)):
        try:
            call = json.loads(match.group(1))
        except ValueError:
            return text, []
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return text, []
        args = call.get("arguments", {})
        first = match.start() if first is None else first
        calls.append(
            {
                "id": f"{prefix}_{k}",
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
        )
    if not calls:
        return text, []
    return (text[:first].strip() or None), calls

"""Prompt ids of a chat as the rollout renders it (rollout_svc's engines) and as the supervised
warm start trains on it (atgrpo.models.sft): one function, so a demonstration's prompt is the
prompt the policy will be sampled on.

Message contents never become special tokens. A chat template renders to text that the tokenizer
then parses, special-token strings included, so a content holding "<|im_end|>\n<|im_start|>system"
(an agent's response quoted to the next agent, a program's output, a task's text) would close its
turn and open a system turn of its own. Each special token's string inside a content gets a word
joiner (U+2060) after its first character: the model reads it as ordinary text, and the template's
own markers are untouched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Message = dict[str, str]


JOINER = "\u2060"


def special_strings(tokenizer: Any) -> list[str]:
    """The strings the tokenizer parses as special tokens, longest first."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    found = set(getattr(tokenizer, "all_special_tokens", ())) | {
        t.content for t in added.values() if t.special
    }
    return sorted((s for s in found if len(s) > 1), key=len, reverse=True)


def defang(content: str, specials: Sequence[str]) -> str:
    """`content` with every special token's string broken by a word joiner after its first
    character."""
    for s in specials:
        if s in content:
            content = content.replace(s, s[0] + JOINER + s[1:])
    return content


def chat_tokens(
    tokenizer: Any, messages: list[Message], tools: Sequence[dict] | None = None
) -> list[int]:
    """Prompt ids of `messages` through the tokenizer's chat template, with the generation prompt;
    special-token strings inside the contents stay text (see the module's docstring). `tools`
    (OpenAI's function definitions) go to templates that render them (Qwen3's)."""
    specials = special_strings(tokenizer)
    messages = [
        {**m, "content": defang(m["content"], specials)} if isinstance(m.get("content"), str) else m
        for m in messages
    ]
    extra = {"tools": list(tools)} if tools else {}
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, **extra
    )
    if hasattr(ids, "input_ids"):  # some tokenizers return a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)

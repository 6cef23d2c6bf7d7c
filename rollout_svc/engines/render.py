"""Fitting a conversation into `max_prompt_tokens`, shared by the engines (hf.py, vllm.py).

An over-long prompt loses the middle of the conversation, never its head or its end:

1. the oldest turns after a leading system message are dropped, whole turns where the roles allow
   (the first kept message has the role of the first message after the system prompt, so a
   user/assistant alternation that some chat templates enforce still holds), re-rendering through
   the chat template until it fits. The fewest drops that fit are found by a binary search over
   how many oldest messages to drop: O(log n) renders, not one per dropped message;
2. if the system prompt and the last message alone are still over, the last message's content is
   cut from its middle: its first and its last tokens are kept, half of the room each, and the
   chat template's tokens around it (the message's header, its end-of-turn, the generation
   prompt) stay;
3. only if the system prompt and the template's own tokens alone exceed the budget is the render
   of (system prompt, last message) cut from the left, keeping its end (the generation prompt and
   the end of the last message), as every prompt was cut before.

A single message is its own last message (step 2 applies to it, a lone system message included).

Message contents never become special tokens (atgrpo.models.chat.chat_tokens, shared with the
supervised warm start).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from atgrpo.models.chat import chat_tokens

__all__ = ["chat_tokens", "fit_prompt"]

Message = dict[str, str]
Tokenize = Callable[[list[Message]], list[int]]


def fit_prompt(
    messages: Sequence[Message], max_prompt_tokens: int, tokenize: Tokenize
) -> tuple[list[int], bool]:
    """(prompt ids of `messages` within `max_prompt_tokens`, whether anything was cut); <= 0: no
    limit."""
    messages = list(messages)
    ids = tokenize(messages)
    if max_prompt_tokens <= 0 or len(ids) <= max_prompt_tokens:
        return ids, False
    head = 1 if len(messages) > 1 and messages[0].get("role") == "system" else 0
    last = len(messages) - 1

    def keep(drop: int) -> list[Message]:
        return messages[:head] + messages[head + drop :]

    renders = {0: ids}

    def render(drop: int) -> list[int]:
        if drop not in renders:
            renders[drop] = tokenize(keep(drop))
        return renders[drop]

    # How many oldest messages after the head may go: whole turns, or all but the last message.
    drops = [
        d
        for d in range(1, last - head)
        if messages[head + d].get("role") == messages[head].get("role")
    ]
    if last > head:
        drops.append(last - head)
    lo, hi = 0, len(drops)  # the first index whose render fits (a render shrinks as more go)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(render(drops[mid])) <= max_prompt_tokens:
            hi = mid
        else:
            lo = mid + 1
    if lo < len(drops):
        return render(drops[lo]), True
    most = drops[-1] if drops else 0
    return _cut_last(keep(most), render(most), max_prompt_tokens, tokenize), True


def _cut_last(
    messages: list[Message], ids: list[int], budget: int, tokenize: Tokenize
) -> list[int]:
    """`ids` (the render of `messages`) cut to `budget` inside the last message's content."""
    empty = tokenize(messages[:-1] + [{**messages[-1], "content": ""}])
    # The content's tokens are what the render with an empty content lacks: the common prefix
    # (the system prompt, the message's header) and suffix (end-of-turn, generation prompt).
    bound = min(len(ids), len(empty))
    prefix = 0
    while prefix < bound and ids[prefix] == empty[prefix]:
        prefix += 1
    suffix = 0
    while suffix < bound - prefix and ids[-1 - suffix] == empty[-1 - suffix]:
        suffix += 1
    room = budget - prefix - suffix
    if room < 0:  # the template and the system prompt alone are over: keep the end
        return ids[-budget:]
    body = ids[prefix : len(ids) - suffix]
    first = room // 2
    return (
        ids[:prefix] + body[:first] + body[len(body) - (room - first) :] + ids[len(ids) - suffix :]
    )

"""How an agent samples: the settings every engine and the trainer read alike (DESIGN.md §1).

The transform itself (temperature, top-k, top-p) is math and lives in atgrpo.algo.sampling; this is
only the plain type, so services that route settings need no torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sampling:
    """How one agent samples; train and eval settings differ per agent."""

    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # <= 0: off
    max_tokens: int = 256
    max_prompt_tokens: int = 2048  # longer prompts lose their oldest turns after the system prompt
    stop: tuple[str, ...] = ()
    seed: int | None = None

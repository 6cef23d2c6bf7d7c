"""How an agent samples: the settings every engine and the trainer read alike (DESIGN.md §1).

The transform itself (temperature, top-k, top-p) is math and lives in atgrpo.algo.sampling; this is
only the plain type, so services that route settings need no torch."""

from __future__ import annotations

from dataclasses import dataclass, field

from atgrpo.contract.fields import NOT_CONFIG


@dataclass(frozen=True)
class Sampling:
    """How one agent samples; train and eval settings differ per agent. This is their one form:
    the run config's agents.<a>.train_sampling and eval_sampling are this type, the router sends
    it, the engines and the trainer read it."""

    temperature: float = 1.0
    """softmax temperature; 0 = greedy"""
    top_p: float = 1.0
    """nucleus mass in (0, 1]; 1 = off"""
    top_k: int = -1
    """keep the k most likely tokens; -1 (any <= 0) = off"""
    max_tokens: int = 256
    """max response tokens per agent turn"""
    max_prompt_tokens: int = 2048
    """longer prompts lose their oldest turns after the system prompt, then the last message's
    middle"""
    stop: tuple[str, ...] = ()
    """extra stop strings (EOS always stops)"""
    # One request's seed (a Generate call's); not a run config key: a fixed seed for every
    # request would draw the same branches at every step.
    seed: int | None = field(default=None, metadata=NOT_CONFIG)

"""A guessing game written as a `verifiers` environment (its classic API, the form of the
Environments Hub's environments: a module whose `load_environment()` returns a `vf.MultiTurnEnv`
with a dataset, a parser and a rubric), and the atgrpo class that trains it.

Each row's secret is a digit, and its question says a range that holds it. The player answers
`<guess>D</guess>`; the environment replies "higher" or "lower" until the guess is right or the
turns run out. The rubric pays 1 for a right last guess and 0.2 times the share of answers in that
format. Train it with `examples/verifiers_guess_L0_tiny.yaml`.
"""

from __future__ import annotations

import random
import re

import verifiers as vf
from datasets import Dataset

from atgrpo.sdk.verifiers import VerifiersEnvironment

FORMAT = re.compile(r"<guess>[0-9]</guess>")
DIGIT = re.compile(r"\s*([0-9])\s*")  # ASCII: str.isdigit() accepts "²", which int() refuses
SYSTEM = "Guess the secret digit (0-9). Answer with <guess>D</guess> and nothing else."


class GuessEnv(vf.MultiTurnEnv):
    """Guess a secret digit, told higher or lower after each wrong guess."""

    async def env_response(self, messages: vf.Messages, state: vf.State, **kwargs) -> vf.Messages:
        guess = self.parser.parse_answer(messages)
        digit = DIGIT.fullmatch(guess) if guess is not None else None
        if digit is None:
            hint = "Answer with <guess>D</guess>, D a digit."
        else:
            hint = "higher" if int(digit.group(1)) < int(state["answer"]) else "lower"
        return [vf.UserMessage(content=hint)]

    @vf.stop
    async def guessed(self, state: vf.State) -> bool:
        if not state["trajectory"]:
            return False
        guess = self.parser.parse_answer(state["trajectory"][-1]["completion"])
        return guess is not None and guess.strip() == str(state["answer"])


def _rows(n: int, seed: int) -> Dataset:
    rng = random.Random(seed)
    questions, answers = [], []
    for _ in range(n):
        secret = rng.randint(0, 9)
        low, high = rng.randint(0, secret), rng.randint(secret, 9)
        questions.append(f"I picked a digit from {low} to {high}. Your guess?")
        answers.append(str(secret))
    return Dataset.from_dict({"question": questions, "answer": answers})


def load_environment(rows: int = 64, max_turns: int = 3, seed: int = 0) -> vf.Environment:
    parser = vf.XMLParser(["guess"], answer_field="guess")

    def correct(completion, answer, **kwargs) -> float:
        guess = parser.parse_answer(completion)
        return 1.0 if guess is not None and guess.strip() == answer else 0.0

    def formatted(completion, **kwargs) -> float:
        """The share of the player's answers that are exactly <guess>D</guess>."""
        answers = parser.get_assistant_messages(completion)
        good = sum(bool(FORMAT.fullmatch(m.content.strip())) for m in answers)
        return good / max(len(answers), 1)

    rubric = vf.Rubric(funcs=[correct, formatted], weights=[1.0, 0.2], parser=parser)
    return GuessEnv(
        dataset=_rows(rows, seed),
        eval_dataset=_rows(rows, seed + 1),
        system_prompt=SYSTEM,
        parser=parser,
        rubric=rubric,
        max_turns=max_turns,
    )


class Guess(VerifiersEnvironment):
    name = "verifiers_guess"
    load = staticmethod(load_environment)
    agents = ("player",)

"""The tokenizer's training text: shipped files plus text generated from a fixed seed.

The generated part covers what the built-in environments show a model (arithmetic, grids and
moves, JSON lists, role names), so the tiny tokenizer has merges for them.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

_CORPUS_DIR = Path(__file__).resolve().parent / "corpus"
# Fixed seed of the generated part of the corpus: the tokenizer is the same for every model seed.
_CORPUS_SEED = 20251015


class _Rng:
    """Only ``random.Random.random()`` is guaranteed stable across Python versions; build on it."""

    def __init__(self, seed: int) -> None:
        self._r = random.Random(seed)

    def below(self, n: int) -> int:
        return min(int(self._r.random() * n), n - 1)

    def pick(self, seq: list[Any] | tuple[Any, ...]) -> Any:
        return seq[self.below(len(seq))]


_NAMES = (
    "Alice",
    "Bob",
    "Carol",
    "Dave",
    "Eve",
    "Frank",
    "Grace",
    "Heidi",
    "Ivan",
    "Judy",
    "Mallory",
    "Oscar",
    "Peggy",
    "Trent",
    "Victor",
    "Wendy",
)
_ITEMS = (
    "apples",
    "books",
    "coins",
    "pencils",
    "marbles",
    "cookies",
    "stamps",
    "cards",
    "boxes",
    "tickets",
    "stones",
    "shells",
)
_MOVES = ("up", "down", "left", "right")
_ROLES = ("planner", "executor", "coder", "tester", "solver", "critic")
_ENVS = ("sokoban", "plan_path", "frozen_lake", "sudoku", "math", "code")
_SUBJ = (
    "The agent",
    "The player",
    "The robot",
    "The planner",
    "The executor",
    "The team",
    "The model",
    "A student",
    "The teacher",
    "My friend",
    "Our neighbor",
    "The cat",
)
_VERB = (
    "moves",
    "looks",
    "walks",
    "steps",
    "turns",
    "points",
    "jumps",
    "waits",
    "reads",
    "writes",
    "checks",
    "counts",
)
_TAIL = (
    "to the left of the wall.",
    "toward the goal.",
    "next to the box.",
    "along the path.",
    "before the last turn.",
    "after the first move.",
    "in the top row.",
    "in the bottom right corner.",
    "one cell at a time.",
    "without hitting a wall.",
    "and then stops.",
    "until the puzzle is solved.",
)


def _gen_arithmetic(rng: _Rng, n: int) -> list[str]:
    lines = []
    for _ in range(n):
        a, b = rng.below(100), rng.below(100)
        kind = rng.below(6)
        if kind == 0:
            lines.append(f"{a} + {b} = {a + b}")
        elif kind == 1:
            lines.append(f"{a} - {b} = {a - b}")
        elif kind == 2:
            lines.append(f"What is {a} * {b}? The answer is {a * b}.")
        elif kind == 3:
            b = b or 1
            lines.append(f"{a * b} / {b} = {a}")
        elif kind == 4:
            name, item = rng.pick(_NAMES), rng.pick(_ITEMS)
            lines.append(
                f"{name} has {a} {item} and buys {b} more. Now {name} has {a + b} {item}."
                f" <answer>{a + b}</answer>"
            )
        else:
            x = rng.below(20)
            lines.append(f"Solve {a} * x + {b} = {a * x + b}. x = {x}")
    return lines


def _gen_grids(rng: _Rng, n: int) -> list[str]:
    lines = []
    for _ in range(n):
        w, h = 4 + rng.below(4), 4 + rng.below(3)
        rows = []
        for y in range(h):
            row = []
            for x in range(w):
                if y in (0, h - 1) or x in (0, w - 1):
                    row.append("#")
                else:
                    row.append(rng.pick((".", ".", ".", "#", "$", "X")))
            rows.append(row)
        rows[1 + rng.below(h - 2)][1 + rng.below(w - 2)] = "@"
        lines.extend("".join(r) for r in rows)
        moves = [rng.pick(_MOVES) for _ in range(1 + rng.below(6))]
        lines.append(f"Moves: {', '.join(moves)}")
        lines.append(json.dumps({"actions": moves}))
    return lines


def _gen_json(rng: _Rng, n: int) -> list[str]:
    lines = []
    for i in range(n):
        kind = rng.below(4)
        if kind == 0:
            lines.append(json.dumps([rng.below(1000) for _ in range(1 + rng.below(8))]))
        elif kind == 1:
            lines.append(
                json.dumps(
                    {
                        "task_id": f"{rng.pick(_ENVS)}-{i:04d}",
                        "agent": rng.pick(_ROLES),
                        "turn": rng.below(8),
                        "reward": round(rng.below(101) / 100, 2),
                        "done": bool(rng.below(2)),
                    }
                )
            )
        elif kind == 2:
            lines.append(
                json.dumps({"position": [rng.below(8), rng.below(8)], "action": rng.pick(_MOVES)})
            )
        else:
            lines.append(
                json.dumps(
                    [
                        {"role": "user", "content": f"Move {rng.pick(_MOVES)}."},
                        {"role": "assistant", "content": rng.pick(_MOVES)},
                    ]
                )
            )
    return lines


def _gen_sentences(rng: _Rng, n: int) -> list[str]:
    return [
        f"{rng.pick(_SUBJ)} {rng.pick(_VERB)} {rng.pick(_MOVES)} {rng.pick(_TAIL)}"
        for _ in range(n)
    ]


def training_corpus(special_tokens: tuple[str, ...] = ()) -> list[str]:
    """The tokenizer's training text: the shipped files (sorted by name), then generated text.

    Special tokens are blanked out, so no merge is spent on their pieces.
    """
    texts = [p.read_text(encoding="utf-8") for p in sorted(_CORPUS_DIR.glob("*.txt"))]
    rng = _Rng(_CORPUS_SEED)
    generated = (
        _gen_arithmetic(rng, 600)
        + _gen_grids(rng, 120)
        + _gen_json(rng, 300)
        + _gen_sentences(rng, 300)
    )
    texts.append("\n".join(generated) + "\n")
    for tok in special_tokens:
        texts = [t.replace(tok, "\n") for t in texts]
    return texts

"""The planning envs' ledger (planning.py's docstring, "Rewards: progress is paid once"): the
record an agent's gains are paid against, what a list of moves does to a state (a puzzle's
`simulate` returns an Outcome), and what an episode's summed costs are charged.

Apart from the workflow (planning.py): the puzzles (plan_path.py, sokoban.py, sudoku.py) build
Records and Outcomes in their `simulate`, and the charge is a function of the costs alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Record:
    """The best an agent's side of the episode has reached: what further moves are paid against."""

    potential: float  # the highest potential reached so far
    won: bool = False  # the win bonus was paid
    marks: frozenset[Any] = frozenset()  # one-off events paid (Sokoban: goals reached)

    def merge(self, other: Record) -> Record:
        return Record(
            max(self.potential, other.potential), self.won or other.won, self.marks | other.marks
        )


@dataclass
class Outcome:
    """What a list of moves does to a state (computed on a copy; `state` is the new one)."""

    state: Any
    gains: float  # paid against the record: >= 0
    costs: float  # steps, invalid moves, failures: >= 0, charged by the ledger
    record: Record  # the record after these moves
    solved: bool = False
    failed: bool = False  # irrecoverable (e.g. a Sokoban box in a dead square)
    summary: str = ""  # one line for the history, e.g. "now at (3, 4); 1 invalid move"
    info: dict[str, Any] = field(default_factory=dict)  # JSON-able details


def episode_charge(costs: float, m: float) -> float:
    """What an episode's summed costs are charged: in full up to h = m/2, then h more at most,
    approached exponentially; continuous with slope 1 at h, increasing, never above m (m <= 0:
    nothing is charged)."""
    h = m / 2
    if h <= 0:
        return 0.0
    if costs <= h:
        return costs
    return h + h * -math.expm1(-(costs - h) / h)

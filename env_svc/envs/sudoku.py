"""Sudoku: fill the grid so that every row, column and box holds each digit once (paper §5.1,
tool + plan agents).

Task: a `size` x `size` Sudoku, 4 (2x2 boxes, the default) or 9 (3x3 boxes), with a **unique**
solution: a full grid is drawn from the seed (a valid pattern under random digit, row, column,
band and stack permutations and transposition), then clues are removed in random order while the
solution stays unique (checked by a counting solver), down to `min_clues` (default 4 for 4x4,
which removes as many as uniqueness allows, and 30 for 9x9). The same (split, seed) always gives
the same puzzle.

Moves: a list of cells `[row, col, value]` (rows and columns from 0, value 1..size, or 0 to clear
a cell), written in order; or a full grid `[[...], ...]` of size x size values (0 = blank), which
replaces every non-clue cell at once.

Rewards (the reference gives only +2 for solving; the rest is ours), split into gains paid once
against the episode's record and costs charged by the episode's ledger (see planning.py):

- a cell write that is rejected: on a given clue, or clashing with a digit in its row, column or box
  (not applied): cost 0.1 each
- a write that brings the number of blank cells holding the solution's digit above its highest so
  far in the episode: gain +1/blanks per cell above that highest (a full solve from scratch: +1)
- a write that clears or overwrites a cell holding the solution's digit: cost 1/blanks
- solved (the grid is complete and valid **and every given clue is kept**; first time: it ends the
  episode): gain +2
- a full grid that changes a given clue: rejected whole, state unchanged: cost 0.1 per changed clue

A full grid counts as one write of every cell. Clearing a right digit costs 1/blanks and writing
it again earns nothing until the count passes its highest (the reference had no shaping to farm;
ours paid every rise of the count, so clearing and rewriting broke even, and a per-answer floor
could make it pay). An episode's gains total at most 3, a solve's, and a solve with no costs
scores exactly that. The reference let a full-grid answer overwrite the clues and
never checked them, so any valid Sudoku "solved" every puzzle; here clues can never change and
success checks them again. Team reward: the fraction of the blank cells holding the solution's
digit, 1.0 when solved. `done` = `success` = solved. Tool agent: the same table, simulated on a
copy and paid against its own record (no gains for cells play or its earlier proposals already
got right). Grids and moves are read through the bounded parser of plan_answers.py; at most
400 cells per answer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, ClassVar

from env_svc.envs import plan_programs
from env_svc.envs._text import clip
from env_svc.envs.plan_answers import MAX_MOVES_PER_ACTION
from env_svc.envs.plan_ledger import Outcome, Record
from env_svc.envs.planning import PlanningEnv

COST_REJECTED, R_SOLVED = 0.1, 2.0  # and a right digit undone costs 1/blanks (self.blanks)
BOX = {4: 2, 9: 3}


@dataclass
class SudokuState:
    grid: list[list[int]]


def full_grid(n: int, rng: random.Random) -> list[list[int]]:
    """A random complete Sudoku of side n (n = b*b)."""
    b = BOX[n]
    digits = list(range(1, n + 1))
    rng.shuffle(digits)
    bands = rng.sample(range(b), b)
    rows = [band * b + r for band in bands for r in rng.sample(range(b), b)]
    stacks = rng.sample(range(b), b)
    cols = [stack * b + c for stack in stacks for c in rng.sample(range(b), b)]
    grid = [[digits[(b * (r % b) + r // b + c) % n] for c in cols] for r in rows]
    if rng.random() < 0.5:
        grid = [list(col) for col in zip(*grid, strict=True)]
    return grid


def count_solutions(
    grid: list[list[int]], limit: int = 2, *, forbid: tuple[int, int, int] | None = None
) -> int:
    """The number of completions of `grid` (0 = blank), counting up to `limit`. With
    forbid=(row, col, value), completions with that value in that cell are not counted."""
    n = len(grid)
    b = BOX[n]
    full = ((1 << n) - 1) << 1
    rows, cols, boxes = [0] * n, [0] * n, [0] * n
    cells: list[int] = []
    flat = [v for row in grid for v in row]
    for i, v in enumerate(flat):
        r, c = divmod(i, n)
        if v:
            bit = 1 << v
            k = (r // b) * b + c // b
            if (rows[r] | cols[c] | boxes[k]) & bit:
                return 0
            rows[r] |= bit
            cols[c] |= bit
            boxes[k] |= bit
        else:
            cells.append(i)
    ban = {}
    if forbid is not None:
        ban[forbid[0] * n + forbid[1]] = 1 << forbid[2]
    found = 0

    def search(empty: list[int]) -> bool:
        nonlocal found
        if not empty:
            found += 1
            return found >= limit
        best, best_mask, best_count = -1, 0, n + 1
        for i in empty:
            r, c = divmod(i, n)
            mask = full & ~(rows[r] | cols[c] | boxes[(r // b) * b + c // b]) & ~ban.get(i, 0)
            cnt = mask.bit_count()
            if cnt < best_count:
                best, best_mask, best_count = i, mask, cnt
                if cnt <= 1:
                    break
        if best_count == 0:
            return False
        rest = [i for i in empty if i != best]
        r, c = divmod(best, n)
        k = (r // b) * b + c // b
        while best_mask:
            bit = best_mask & -best_mask
            best_mask ^= bit
            rows[r] |= bit
            cols[c] |= bit
            boxes[k] |= bit
            stop = search(rest)
            rows[r] ^= bit
            cols[c] ^= bit
            boxes[k] ^= bit
            if stop:
                return True
        return False

    search(cells)
    return found


def make_puzzle(
    n: int, rng: random.Random, min_clues: int
) -> tuple[list[list[int]], list[list[int]]]:
    """(puzzle, solution): clues removed in random order while the solution stays unique."""
    solution = full_grid(n, rng)
    puzzle = [row[:] for row in solution]
    order = [(r, c) for r in range(n) for c in range(n)]
    rng.shuffle(order)
    clues = n * n
    for r, c in order:
        if clues <= min_clues:
            break
        v = puzzle[r][c]
        puzzle[r][c] = 0
        # Unique still iff no completion puts another digit in the emptied cell.
        if count_solutions(puzzle, 1, forbid=(r, c, v)):
            puzzle[r][c] = v
        else:
            clues -= 1
    return puzzle, solution


def is_valid_complete(grid: list[list[int]]) -> bool:
    n = len(grid)
    b = BOX[n]
    want = set(range(1, n + 1))
    units = [list(row) for row in grid] + [[grid[r][c] for r in range(n)] for c in range(n)]
    units += [
        [grid[br + r][bc + c] for r in range(b) for c in range(b)]
        for br in range(0, n, b)
        for bc in range(0, n, b)
    ]
    return all(set(u) == want for u in units)


class SudokuEnv(PlanningEnv):
    """Sudoku: fill the grid, keeping the given clues (tool + plan agents)."""

    name: ClassVar[str] = "sudoku"
    title: ClassVar[str] = "Sudoku"
    example_moves: ClassVar[str] = "[[0,1,3],[2,2,4]]"
    shared_on_fork = (*PlanningEnv.shared_on_fork, "givens", "solution")
    tool_program: ClassVar[str | None] = plan_programs.SUDOKU

    def __init__(self, options=None):
        super().__init__(options)
        self.size = int(self.options.get("size", 4))
        if self.size not in BOX:
            raise ValueError(f"sudoku: size must be 4 or 9, got {self.size}")
        self.min_clues = int(self.options.get("min_clues", 4 if self.size == 4 else 30))
        if not 0 <= self.min_clues <= self.size * self.size:
            raise ValueError(
                f"sudoku: min_clues must be in 0..{self.size * self.size}, got {self.min_clues}"
            )
        b = BOX[self.size]
        self.stdin_doc = (
            f'keys: "size" {self.size}, "box" {b} (boxes are {b}x{b}), "grid" list of rows '
            'with 0 for a blank, "clues" list of [row, col] that are given and fixed'
        )
        self.givens: tuple[tuple[int, ...], ...] = ()
        self.solution: tuple[tuple[int, ...], ...] = ()
        self.blanks = 1

    # ---- puzzle ---------------------------------------------------------------------------

    def generate(self, rng: random.Random) -> SudokuState:
        puzzle, solution = make_puzzle(self.size, rng, self.min_clues)
        self.givens = tuple(tuple(row) for row in puzzle)
        self.solution = tuple(tuple(row) for row in solution)
        self.blanks = max(1, sum(v == 0 for row in puzzle for v in row))
        return SudokuState([row[:] for row in puzzle])

    def render(self) -> str:
        n, b = self.size, BOX[self.size]
        lines = []
        for r, row in enumerate(self.state.grid):
            cells = [str(v) if v else "." for v in row]
            lines.append(f"{r}: " + " | ".join(" ".join(cells[i : i + b]) for i in range(0, n, b)))
        empty = sum(v == 0 for row in self.state.grid for v in row)
        filled = [
            [r, c]
            for r in range(n)
            for c in range(n)
            if self.state.grid[r][c] and not self.givens[r][c]
        ]
        origin = (
            f"Cells filled so far (all other digits are given clues, fixed): {filled}."
            if filled
            else "Every digit shown is a given clue (fixed)."
        )
        return (
            f"{n}x{n} grid ('.' blank; boxes are {b}x{b}; row number first, columns 0..{n - 1}):\n"
            + "\n".join(lines)
            + f"\n{origin}\nBlank cells left: {empty}."
        )

    def rules(self) -> str:
        n = self.size
        return (
            f"Fill every blank so each row, column and {BOX[n]}x{BOX[n]} box holds 1..{n} once. "
            f"A move is a cell [row, col, value] (row and col from 0, value 1..{n}, 0 clears a "
            f"cell); "
            "a write on a given clue or clashing with its row, column or box is rejected. "
            f"You may instead give the whole {n}x{n} grid as a list of rows; it must keep every "
            f"clue."
        )

    def puzzle_json(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "box": BOX[self.size],
            "grid": [row[:] for row in self.state.grid],
            "clues": self._clue_list(),
        }

    def parse_moves(self, value: Any) -> list[Any]:
        n = self.size
        if not isinstance(value, list) or not value:
            raise ValueError("expected a non-empty list of [row, col, value] cells or a full grid")
        if len(value) > MAX_MOVES_PER_ACTION:
            raise ValueError(
                f"{len(value)} cells is over the limit of {MAX_MOVES_PER_ACTION} per answer"
            )
        if len(value) == n and all(isinstance(row, list) and len(row) == n for row in value):
            for r, row in enumerate(value):
                for c, v in enumerate(row):
                    if not _is_int(v) or not 0 <= v <= n:
                        raise ValueError(
                            f"grid value {clip(repr(v), 40)} at [{r}, {c}] is not an integer 0..{n}"
                        )
            return [list(row) for row in value]  # a full grid (rows of n; cells have 3)
        cells = []
        for i, cell in enumerate(value):
            if not (isinstance(cell, list) and len(cell) == 3 and all(_is_int(x) for x in cell)):
                raise ValueError(
                    f"move {clip(repr(cell), 60)} at position {i} is not [row, col, value] with "
                    f"integers"
                )
            r, c, v = cell
            if not (0 <= r < n and 0 <= c < n and 0 <= v <= n):
                raise ValueError(
                    f"move {clip(repr(cell), 60)} at position {i} is out of range: row and col "
                    f"0..{n - 1}, value 1..{n} (0 clears)"
                )
            cells.append([r, c, v])
        return cells

    def start_record(self) -> Record:
        return Record(potential=self._correct(self.state.grid))

    def simulate(self, moves: list[Any], record: Record | None = None) -> Outcome:
        n = self.size
        rec = self.paid_record(record)
        if len(moves[0]) == n:  # a full grid (a cell has 3 entries)
            changed = [
                [r, c]
                for r in range(n)
                for c in range(n)
                if self.givens[r][c] and moves[r][c] != self.givens[r][c]
            ]
            if changed:
                info = {
                    "clue_conflicts": changed,
                    "invalid": "the grid changes given clues; it was rejected whole",
                }
                return Outcome(
                    self.state,
                    0.0,
                    COST_REJECTED * len(changed),
                    rec,
                    summary=f"grid rejected: it changes the clues at {clip(str(changed), 200)}",
                    info=info,
                )
            grid = [[self.givens[r][c] or moves[r][c] for c in range(n)] for r in range(n)]
            undone = sum(
                self._right(self.state.grid, r, c) and not self._right(grid, r, c)
                for r in range(n)
                for c in range(n)
            )
            correct, rejected = self._correct(grid), []
            best = max(rec.potential, correct)  # written at once: judged at the end
            gains, costs = (best - rec.potential) / self.blanks, undone / self.blanks
        else:
            grid, gains, costs, best, correct, rejected = self._write_cells(moves, rec.potential)
        solved = self._solved(grid)
        if solved and not rec.won:
            gains += R_SOLVED
        empty = sum(v == 0 for row in grid for v in row)
        summary = "solved" if solved else f"{empty} blank cells left"
        if rejected:
            summary += f"; {len(rejected)} write{'s' if len(rejected) > 1 else ''} rejected"
        info: dict[str, Any] = {"correct_cells": correct, "blank_cells": empty}
        if rejected:
            info["invalid_moves"] = rejected
        return Outcome(
            SudokuState(grid),
            gains,
            costs,
            Record(best, rec.won or solved, rec.marks),
            solved=solved,
            summary=summary,
            info=info,
        )

    def _write_cells(
        self, moves: list[list[int]], best: float
    ) -> tuple[Any, float, float, float, int, list[Any]]:
        """Cell writes in order from the current grid: (grid, gains, costs, best, correct,
        rejected)."""
        grid = [row[:] for row in self.state.grid]
        correct = self._correct(grid)
        gains = costs = 0.0
        rejected = []
        for r, c, v in moves:
            why = self._rejected(grid, r, c, v)
            if why:
                rejected.append([r, c, v, why])
                costs += COST_REJECTED
                continue
            was_right = self._right(grid, r, c)
            if was_right and v != grid[r][c]:
                costs += 1 / self.blanks  # undoing a right digit
            grid[r][c] = v
            correct += self._right(grid, r, c) - was_right
            if correct > best:  # only a new highest count pays
                gains, best = gains + (correct - best) / self.blanks, correct
        return grid, gains, costs, best, correct, rejected

    def _right(self, grid: list[list[int]], r: int, c: int) -> bool:
        """A blank of the puzzle holding the solution's digit."""
        return not self.givens[r][c] and grid[r][c] == self.solution[r][c]

    def _rejected(self, grid: list[list[int]], r: int, c: int, v: int) -> str:
        """Why a cell write is refused ("" when it is not)."""
        if self.givens[r][c]:
            return "given clue"
        if v and self._clashes(grid, r, c, v):
            return "clashes with its row, column or box"
        return ""

    def progress(self) -> float:
        return self._correct(self.state.grid) / self.blanks

    # ---- helpers --------------------------------------------------------------------------

    def _clue_list(self) -> list[list[int]]:
        return [[r, c] for r in range(self.size) for c in range(self.size) if self.givens[r][c]]

    def _correct(self, grid: list[list[int]]) -> int:
        return sum(
            1
            for r in range(self.size)
            for c in range(self.size)
            if not self.givens[r][c] and grid[r][c] == self.solution[r][c]
        )

    def _clashes(self, grid: list[list[int]], r: int, c: int, v: int) -> bool:
        n, b = self.size, BOX[self.size]
        if any(grid[r][cc] == v for cc in range(n) if cc != c):
            return True
        if any(grid[rr][c] == v for rr in range(n) if rr != r):
            return True
        br, bc = r - r % b, c - c % b
        return any(
            grid[rr][cc] == v
            for rr in range(br, br + b)
            for cc in range(bc, bc + b)
            if (rr, cc) != (r, c)
        )

    def _solved(self, grid: list[list[int]]) -> bool:
        """Complete, valid, and every given clue kept (the reference forgot the last check)."""
        clues_kept = all(
            grid[r][c] == g for r, row in enumerate(self.givens) for c, g in enumerate(row) if g
        )
        return clues_kept and is_valid_complete(grid)

    def solution_moves(self) -> list[list[int]]:
        """The cells still to fill, as [row, col, value] moves (for tests and baselines)."""
        return [
            [r, c, self.solution[r][c]]
            for r in range(self.size)
            for c in range(self.size)
            if self.state.grid[r][c] != self.solution[r][c]
        ]

    def demo_moves(self) -> list[list[int]]:
        """The solution as a full grid: it replaces every written cell at once, so digits written
        wrong earlier clash with nothing."""
        return [list(row) for row in self.solution]


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)

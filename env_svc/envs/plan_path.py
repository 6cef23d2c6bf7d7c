"""Plan-Path: walk a grid from the start to the goal around walls (paper §5.1, tool + plan agents).

Task: a `grid_size` x `grid_size` grid (default 10) whose cells are walls with probability
`wall_ratio` (default 0.22); start and goal are distinct free cells, the goal reachable (checked
by BFS) and at least 2 moves away. The BFS optimum (fewest moves) is known. Moves: U/D/L/R.
The same (split, seed) always gives the same grid.

Rewards (per move, summed over the moves of one answer; the reference's values, split into
gains paid once against the episode's record and costs charged by the episode's ledger, see
planning.py):

- valid move: cost 0.01
- invalid move (wall or off the grid; the walker stays): cost 0.1
- a move to a cell closer to the goal (BFS distance) than any reached before in the episode: gain +1
  per step of distance beyond that best
- reaching the goal (first time: it ends the episode): gain +1
- reaching it in the optimal number of moves (all moves of the episode count): gain +0.5 more

Moves after the goal is reached are ignored. The reference pays potential shaping,
Phi(after) - Phi(before) with Phi = -(Manhattan distance) discounted by 0.99, per answer with a
per-answer floor, so walking away (floored at -0.9) and back (+1 a move) paid 34.8 over an
episode against an honest 7.4; here only a new best distance (the true BFS one) pays, so walking
away costs its steps and walking back earns nothing until it passes the best. An episode's gains
total at most d0 + 1.5, which only an optimal solve reaches, and it also pays the fewest costs.
Team reward: `1 - d / d0` clipped to [0, 1] (d the BFS distance now, d0 at the start), 1.0 at the
goal. `done` = `success` = at the goal. Tool agent: the same table, simulated on a copy and paid
against its own record (no gains for distance play or its earlier proposals already reached).
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar

from env_svc.envs import plan_programs
from env_svc.envs.plan_answers import DIRECTIONS, direction_moves
from env_svc.envs.plan_ledger import Outcome, Record
from env_svc.envs.planning import PlanningEnv

COST_STEP, COST_INVALID, R_GOAL, R_OPTIMAL, SHAPING = 0.01, 0.1, 1.0, 0.5, 1.0


@dataclass
class PathState:
    pos: tuple[int, int]
    moves: int = 0  # moves made in the episode, invalid ones included


def bfs_distances(grid: tuple[str, ...], source: tuple[int, int]) -> dict[tuple[int, int], int]:
    """BFS distance from `source` to every reachable free cell ('#' is a wall)."""
    h, w = len(grid), len(grid[0])
    dist = {source: 0}
    queue = deque([source])
    while queue:
        r, c = queue.popleft()
        for dr, dc in DIRECTIONS.values():
            nr, nc = r + dr, c + dc
            if 0 <= nr < h and 0 <= nc < w and grid[nr][nc] != "#" and (nr, nc) not in dist:
                dist[(nr, nc)] = dist[(r, c)] + 1
                queue.append((nr, nc))
    return dist


def shortest_path(
    grid: tuple[str, ...], start: tuple[int, int], goal: tuple[int, int]
) -> list[str] | None:
    """An optimal list of moves from start to goal, or None when unreachable."""
    dist = bfs_distances(grid, goal)
    if start not in dist:
        return None
    path, pos = [], start
    while pos != goal:
        for name, (dr, dc) in DIRECTIONS.items():
            nxt = (pos[0] + dr, pos[1] + dc)
            if dist.get(nxt) == dist[pos] - 1:
                path.append(name)
                pos = nxt
                break
    return path


class PlanPathEnv(PlanningEnv):
    """Plan-Path: move from S to G on a grid with walls (tool + plan agents)."""

    name: ClassVar[str] = "plan_path"
    title: ClassVar[str] = "Plan-Path (grid path planning)"
    stdin_doc: ClassVar[str] = (
        'keys: "grid" list of row strings with "#" wall and "." free, '
        '"pos" [row, col] current position, "goal" [row, col]; row 0 is the top'
    )
    shared_on_fork = (*PlanningEnv.shared_on_fork, "grid", "dist")
    tool_program: ClassVar[str | None] = plan_programs.PLAN_PATH

    def __init__(self, options=None):
        super().__init__(options)
        self.grid_size = int(self.options.get("grid_size", 10))
        self.wall_ratio = float(self.options.get("wall_ratio", 0.22))
        if not 3 <= self.grid_size <= 50:
            raise ValueError(f"plan_path: grid_size must be in 3..50, got {self.grid_size}")
        if not 0.0 <= self.wall_ratio <= 0.6:
            raise ValueError(f"plan_path: wall_ratio must be in [0, 0.6], got {self.wall_ratio}")
        self.grid: tuple[str, ...] = ()
        self.start = self.goal = (0, 0)
        self.optimum = 0
        self.dist: dict[tuple[int, int], int] = {}

    # ---- puzzle ---------------------------------------------------------------------------

    def generate(self, rng: random.Random) -> PathState:
        n = self.grid_size
        for _ in range(1000):
            grid = tuple(
                "".join("#" if rng.random() < self.wall_ratio else "." for _ in range(n))
                for _ in range(n)
            )
            free = [(r, c) for r in range(n) for c in range(n) if grid[r][c] == "."]
            if len(free) < 2:
                continue
            start, goal = rng.sample(free, 2)
            dist = bfs_distances(grid, goal)
            if dist.get(start, 0) >= 2:
                break
        else:  # pragma: no cover - only with extreme wall ratios
            grid, start, goal = tuple("." * n for _ in range(n)), (0, 0), (n - 1, n - 1)
            dist = bfs_distances(grid, goal)
        self.grid, self.start, self.goal, self.dist = grid, start, goal, dist
        self.optimum = dist[start]
        return PathState(pos=start)

    def render(self) -> str:
        pos = self.state.pos
        rows = []
        for r, line in enumerate(self.grid):
            cells = [
                "S" if (r, c) == pos else "G" if (r, c) == self.goal else ch
                for c, ch in enumerate(line)
            ]
            rows.append("".join(cells))
        return (
            "Grid ('#' wall, '.' free, 'S' you, 'G' goal; row 0 is the top):\n"
            + "\n".join(rows)
            + f"\nYou are at {list(pos)} (row, col); the goal is at {list(self.goal)}."
        )

    def rules(self) -> str:
        legal = [
            m
            for m, (dr, dc) in DIRECTIONS.items()
            if self._free(self.state.pos[0] + dr, self.state.pos[1] + dc)
        ]
        return (
            'Moves: "U" up (row-1), "D" down (row+1), "L" left (col-1), "R" right (col+1). '
            "Walls and the grid's edge block a move. Reach G in as few moves as possible.\n"
            f"Legal moves from here: {', '.join(legal) or 'none'}."
        )

    def puzzle_json(self) -> dict[str, Any]:
        return {"grid": list(self.grid), "pos": list(self.state.pos), "goal": list(self.goal)}

    def parse_moves(self, value: Any) -> list[str]:
        return direction_moves(value)

    def start_record(self) -> Record:
        return Record(potential=-self.dist[self.state.pos])

    def simulate(self, moves: list[str], record: Record | None = None) -> Outcome:
        rec = self.paid_record(record)
        best, won = rec.potential, rec.won
        pos, count = self.state.pos, self.state.moves
        gains, costs, invalid, valid, reached = 0.0, 0.0, 0, 0, False
        for m in moves:
            dr, dc = DIRECTIONS[m]
            nxt = (pos[0] + dr, pos[1] + dc)
            count += 1
            if self._free(*nxt):
                costs += COST_STEP
                pos, valid = nxt, valid + 1
                if -self.dist[pos] > best:  # only a new best distance pays
                    gains += SHAPING * (-self.dist[pos] - best)
                    best = -self.dist[pos]
            else:
                costs += COST_INVALID
                invalid += 1
            if pos == self.goal:
                reached = True
                if not won:
                    gains += R_GOAL + (R_OPTIMAL if count == self.optimum else 0.0)
                    won = True
                break
        summary = (
            "reached the goal"
            if reached
            else f"now at {list(pos)}, {self.dist[pos]} moves from the goal"
        )
        if invalid:
            summary += f"; {invalid} invalid move{'s' if invalid > 1 else ''}"
        info = {
            "valid_moves": valid,
            "invalid_moves": invalid,
            "pos": list(pos),
            "distance": self.dist[pos],
            "optimal": reached and count == self.optimum,
        }
        return Outcome(
            PathState(pos, count),
            gains,
            costs,
            Record(best, won, rec.marks),
            solved=reached,
            summary=summary,
            info=info,
        )

    def progress(self) -> float:
        return 1.0 - self.dist[self.state.pos] / self.optimum

    # ---- helpers --------------------------------------------------------------------------

    def _free(self, r: int, c: int) -> bool:
        return 0 <= r < self.grid_size and 0 <= c < self.grid_size and self.grid[r][c] != "#"

    def solution(self) -> list[str]:
        """An optimal list of moves from the current position (for tests and baselines)."""
        return shortest_path(self.grid, self.state.pos, self.goal) or []

    def demo_moves(self) -> list[str] | None:
        return self.solution() or None

"""Sokoban: push every box onto a goal (paper §5.1, tool + plan agents).

Task: a `size` x `size` room (default 6, walls all round) with `boxes` boxes (default 1), as many
goals, and the player. Rooms are generated from the seed (random inner walls keeping the floor
connected, random goals/boxes/player, no box starting on a goal or in a dead square, boxes at
least 2 steps from the goals in total) and each is **verified solvable** by `solve_sokoban`, a
BFS over (player, boxes) states. The same (split, seed) always gives the same room.
Moves: U/D/L/R; walking into a box pushes it when the cell behind it is free.

Rewards (per move, summed over the moves of one answer; the reference's values, split into
gains paid once against the episode's record and costs charged by the episode's ledger, see
planning.py):

- valid move: cost 0.01
- invalid move (into a wall, or pushing a box into a wall or box; nothing moves): cost 0.05
- a box pushed onto a goal that no box has reached before in the episode (boxes starting on a goal
  count as reached): gain +1
- a box pushed off a goal (onto a non-goal cell): cost 0.5
- a push that brings D, the boxes' summed Manhattan distance to their nearest goals, below its
  lowest so far in the episode: gain +0.1 per unit below that lowest
- all boxes on goals (win; it ends the episode): gain +10
- failure: a box pushed into a dead square (a cell from which no push sequence reaches a goal:
  non-goal corners, walls without goals...) or `max_moves` (default 200, the reference's limit)
  moves made: cost 5

Moves after a win or a failure are ignored. The reference pays +1 for every push onto a goal and
-0.5 for every push off, with potential shaping 0.1 * (Phi(after) - Phi(before)), Phi = -D,
discounted by 0.99 and a per-answer floor: pushing a box on and off a goal in one answer beat
the honest solve 19.1 to 12.3. Here each goal's first arrival pays once, pushing off costs 0.5
and pushing back on earns nothing, and the shaping pays only a new lowest D. An episode's gains
total at most boxes + 0.1 * D0 + 10 (D0 the starting D), which a solve reaches; among solves,
the one with the fewest costs scores most. Team reward: `1 - D / D0` clipped to [0, 1], 1.0 when
solved, 0 after a failure. `done` = solved or failed; `success` = solved. Tool agent: the same
table, simulated on a copy and paid against its own record (no gains for goals or distances that
play or its earlier proposals already reached).
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

COST_STEP, COST_INVALID, COST_OFF_GOAL, COST_FAIL = 0.01, 0.05, 0.5, 5.0
R_ON_GOAL, R_WIN, SHAPING = 1.0, 10.0, 0.1

Cell = tuple[int, int]


@dataclass
class SokobanState:
    player: Cell
    boxes: tuple[Cell, ...]  # sorted
    moves: int = 0


def _step(cell: Cell, d: tuple[int, int]) -> Cell:
    return (cell[0] + d[0], cell[1] + d[1])


def dead_squares(floor: frozenset[Cell], goals: frozenset[Cell]) -> frozenset[Cell]:
    """Floor cells from which a lone box can never be pushed onto a goal (pull search from
    goals)."""
    live = set(goals)
    queue = deque(goals)
    while queue:
        y = queue.popleft()
        for d in DIRECTIONS.values():
            x = (y[0] - d[0], y[1] - d[1])  # the box was at x, pushed by d onto y ...
            p = (x[0] - d[0], x[1] - d[1])  # ... by the player standing at p
            if x in floor and p in floor and x not in live:
                live.add(x)
                queue.append(x)
    return frozenset(floor - live)


def box_distance(boxes: tuple[Cell, ...], goals: tuple[Cell, ...]) -> int:
    return sum(min(abs(b[0] - g[0]) + abs(b[1] - g[1]) for g in goals) for b in boxes)


def solve_sokoban(
    floor: frozenset[Cell],
    goals: frozenset[Cell],
    boxes: tuple[Cell, ...],
    player: Cell,
    *,
    dead: frozenset[Cell] | None = None,
    max_states: int = 300_000,
) -> list[str] | None:
    """A move-optimal solution (BFS over (player, boxes)), [] when already solved, or None when
    unsolvable or over `max_states` states."""
    dead = dead_squares(floor, goals) if dead is None else dead
    start = (player, frozenset(boxes))
    if start[1] <= goals:
        return []
    parent: dict[tuple[Cell, frozenset[Cell]], tuple[Any, str] | None] = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        p, bs = state
        for name, d in DIRECTIONS.items():
            q = _step(p, d)
            if q not in floor:
                continue
            if q in bs:
                nb = _step(q, d)
                if nb not in floor or nb in bs or nb in dead:
                    continue
                nbs = (bs - {q}) | {nb}
            else:
                nbs = bs
            nxt = (q, nbs)
            if nxt in parent:
                continue
            parent[nxt] = (state, name)
            if nbs <= goals:
                path = []
                node: Any = nxt
                while parent[node] is not None:
                    node, move = parent[node]
                    path.append(move)
                return path[::-1]
            if len(parent) > max_states:
                return None
            queue.append(nxt)
    return None


def _connected(cells: set[Cell]) -> bool:
    first = min(cells)
    seen, queue = {first}, deque([first])
    while queue:
        c = queue.popleft()
        for d in DIRECTIONS.values():
            n = _step(c, d)
            if n in cells and n not in seen:
                seen.add(n)
                queue.append(n)
    return len(seen) == len(cells)


class SokobanEnv(PlanningEnv):
    """Sokoban: push the boxes onto the goals (tool + plan agents)."""

    name: ClassVar[str] = "sokoban"
    title: ClassVar[str] = "Sokoban"
    stdin_doc: ClassVar[str] = (
        'keys: "grid" list of row strings (legend above), "player" [row, col], '
        '"boxes" and "goals" lists of [row, col]; row 0 is the top'
    )
    shared_on_fork = (*PlanningEnv.shared_on_fork, "floor", "goals", "dead")
    tool_program: ClassVar[str | None] = plan_programs.SOKOBAN

    def __init__(self, options=None):
        super().__init__(options)
        self.size = int(self.options.get("size", 6))
        self.num_boxes = int(self.options.get("boxes", 1))
        self.max_moves = int(self.options.get("max_moves", 200))
        if not 5 <= self.size <= 8:
            raise ValueError(f"sokoban: size must be in 5..8, got {self.size}")
        if not 1 <= self.num_boxes <= (3 if self.size >= 7 else 2):
            raise ValueError(
                f"sokoban: boxes must be 1..{3 if self.size >= 7 else 2} for size {self.size}, "
                f"got {self.num_boxes}"
            )
        if self.max_moves < 1:
            raise ValueError(f"sokoban: max_moves must be >= 1, got {self.max_moves}")
        self.floor: frozenset[Cell] = frozenset()
        self.goals: tuple[Cell, ...] = ()
        self.dead: frozenset[Cell] = frozenset()
        self.d0 = 1

    # ---- puzzle ---------------------------------------------------------------------------

    def generate(self, rng: random.Random) -> SokobanState:
        n, k = self.size, self.num_boxes
        interior = [(r, c) for r in range(1, n - 1) for c in range(1, n - 1)]
        for _ in range(2000):
            floor = set(interior)
            for _ in range(rng.randint(0, len(interior) // 4)):
                cell = rng.choice(sorted(floor))
                trial = floor - {cell}
                if len(trial) >= 2 * k + 4 and _connected(trial):
                    floor = trial
            picks = rng.sample(sorted(floor), 2 * k + 1)
            goals, boxes, player = (
                tuple(sorted(picks[:k])),
                tuple(sorted(picks[k : 2 * k])),
                picks[2 * k],
            )
            frozen_floor, frozen_goals = frozenset(floor), frozenset(goals)
            dead = dead_squares(frozen_floor, frozen_goals)
            if any(b in dead for b in boxes) or box_distance(boxes, goals) < 2:
                continue
            if solve_sokoban(frozen_floor, frozen_goals, boxes, player, dead=dead) is None:
                continue
            self.floor, self.goals, self.dead = frozen_floor, goals, dead
            self.d0 = box_distance(boxes, goals)
            return SokobanState(player, boxes)
        raise RuntimeError(
            f"sokoban: no solvable room found for size {n} with {k} boxes; "
            "use fewer boxes or a larger size"
        )

    def grid_rows(self) -> list[str]:
        st, goals = self.state, set(self.goals)
        rows = []
        for r in range(self.size):
            line = []
            for c in range(self.size):
                cell = (r, c)
                if cell not in self.floor:
                    line.append("#")
                elif cell == st.player:
                    line.append("+" if cell in goals else "@")
                elif cell in st.boxes:
                    line.append("*" if cell in goals else "$")
                else:
                    line.append("." if cell in goals else "_")
            rows.append("".join(line))
        return rows

    def render(self) -> str:
        on = sum(b in self.goals for b in self.state.boxes)
        return (
            "Room ('#' wall, '_' floor, '.' goal, '$' box, '*' box on goal, '@' you, "
            "'+' you on a goal; row 0 is the top):\n"
            + "\n".join(self.grid_rows())
            + f"\nYou are at {list(self.state.player)}; boxes "
            f"{[list(b) for b in self.state.boxes]}; goals {[list(g) for g in self.goals]}; boxes "
            f"on goals: {on}/{len(self.goals)}."
        )

    def rules(self) -> str:
        legal = [m for m, d in DIRECTIONS.items() if self._legal(self.state, d)]
        return (
            'Moves: "U" up (row-1), "D" down (row+1), "L" left (col-1), "R" right (col+1). '
            "Walking into a box pushes it if the cell behind it is free; boxes cannot be pulled. "
            "A box pushed into a corner or along a wall away from every goal is lost. "
            "Put every box on a goal.\n"
            f"Legal moves from here: {', '.join(legal) or 'none'}."
        )

    def puzzle_json(self) -> dict[str, Any]:
        return {
            "grid": self.grid_rows(),
            "player": list(self.state.player),
            "boxes": [list(b) for b in self.state.boxes],
            "goals": [list(g) for g in self.goals],
        }

    def parse_moves(self, value: Any) -> list[str]:
        return direction_moves(value)

    def start_record(self) -> Record:
        boxes = self.state.boxes
        return Record(
            -box_distance(boxes, self.goals), marks=frozenset(b for b in boxes if b in self.goals)
        )

    def simulate(self, moves: list[str], record: Record | None = None) -> Outcome:
        rec = self.paid_record(record)
        best, won, reached = rec.potential, rec.won, set(rec.marks)
        player, boxes, count = self.state.player, set(self.state.boxes), self.state.moves
        goals = set(self.goals)
        gains, costs, invalid, pushes, solved, failed = 0.0, 0.0, 0, 0, False, ""
        for m in moves:
            d = DIRECTIONS[m]
            count += 1
            q = _step(player, d)
            pushed_to = self._push(q, d, boxes)
            if pushed_to is False:
                costs += COST_INVALID
                invalid += 1
            else:
                costs += COST_STEP
                player = q
            if pushed_to:
                pushes += 1
                # a goal's first arrival pays once
                if pushed_to in goals and pushed_to not in reached:
                    gains += R_ON_GOAL
                    reached.add(pushed_to)
                elif q in goals and pushed_to not in goals:
                    costs += COST_OFF_GOAL
                phi = -box_distance(tuple(boxes), self.goals)
                if phi > best:  # only a new lowest D pays
                    gains += SHAPING * (phi - best)
                    best = phi
            if boxes <= goals:
                solved = True
                gains += 0.0 if won else R_WIN
                won = True
                break
            if pushed_to and pushed_to in self.dead:
                failed = (
                    f"box pushed to {list(pushed_to)}, a dead square: it can never reach a goal"
                )
            elif count >= self.max_moves:
                failed = f"the move budget of {self.max_moves} is spent"
            if failed:
                costs += COST_FAIL
                break
        new = SokobanState(player, tuple(sorted(boxes)), count)
        on = len(boxes & goals)
        summary = (
            "solved: every box is on a goal"
            if solved
            else f"failed: {failed}"
            if failed
            else f"now at {list(player)}, {on}/{len(goals)} boxes on goals"
        )
        if invalid:
            summary += f"; {invalid} invalid move{'s' if invalid > 1 else ''}"
        info = {
            "invalid_moves": invalid,
            "pushes": pushes,
            "boxes_on_goals": on,
            "player": list(player),
        }
        if failed:
            info["failure"] = failed
        return Outcome(
            new,
            gains,
            costs,
            Record(best, won, frozenset(reached)),
            solved=solved,
            failed=bool(failed),
            summary=summary,
            info=info,
        )

    def _push(self, q: Cell, d: tuple[int, int], boxes: set[Cell]) -> Cell | bool | None:
        """The player steps onto q: None when q is free floor, the box's new cell when it pushes
        one (`boxes` is updated), False when the move is invalid (nothing moves)."""
        if q not in self.floor:
            return False
        if q not in boxes:
            return None
        nb = _step(q, d)
        if nb not in self.floor or nb in boxes:
            return False
        boxes.remove(q)
        boxes.add(nb)
        return nb

    def progress(self) -> float:
        return 1.0 - box_distance(self.state.boxes, self.goals) / self.d0

    # ---- helpers --------------------------------------------------------------------------

    def _legal(self, st: SokobanState, d: tuple[int, int]) -> bool:
        q = _step(st.player, d)
        if q not in self.floor:
            return False
        if q in st.boxes:
            nb = _step(q, d)
            return nb in self.floor and nb not in st.boxes
        return True

    def solution(self) -> list[str] | None:
        """A move-optimal solution from the current state (for tests and baselines)."""
        return solve_sokoban(
            self.floor, frozenset(self.goals), self.state.boxes, self.state.player, dead=self.dead
        )

    def demo_moves(self) -> list[str] | None:
        return self.solution() or None

"""The planning envs' own tool programs: general solvers, written as the tool agent should write
them (its `demonstration`). Each reads the puzzle JSON on stdin (the keys of the env's
`puzzle_json`) and prints one line `**Actions List**: [...]`; none hard-codes a puzzle's moves.
They never run in this process, only in the sandbox, where `atgrpo model demos` plays them."""

PLAN_PATH = """\
import json
import sys
from collections import deque

# Breadth-first search from the current position: the first path to reach the goal is shortest.
puzzle = json.load(sys.stdin)
grid, start, goal = puzzle["grid"], tuple(puzzle["pos"]), tuple(puzzle["goal"])
steps = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
came_from = {start: None}
queue = deque([start])
while queue and goal not in came_from:
    row, col = queue.popleft()
    for move, (dr, dc) in steps.items():
        cell = (row + dr, col + dc)
        inside = 0 <= cell[0] < len(grid) and 0 <= cell[1] < len(grid[0])
        if inside and grid[cell[0]][cell[1]] != "#" and cell not in came_from:
            came_from[cell] = ((row, col), move)
            queue.append(cell)
moves, cell = [], goal
while came_from.get(cell):
    cell, move = came_from[cell]
    moves.append(move)
print("**Actions List**:", json.dumps(moves[::-1]))
"""

SOKOBAN = """\
import json
import sys
from collections import deque

# Breadth-first search over (player, boxes) states: the first to put every box on a goal is the
# fewest moves. A box pushed into a corner that is not a goal can never move again: skip those.
puzzle = json.load(sys.stdin)
grid = puzzle["grid"]
goals = frozenset(map(tuple, puzzle["goals"]))
steps = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}


def wall(r, c):
    return not (0 <= r < len(grid) and 0 <= c < len(grid[r])) or grid[r][c] == "#"


def dead(r, c):
    return (r, c) not in goals and (wall(r - 1, c) or wall(r + 1, c)) and (
        wall(r, c - 1) or wall(r, c + 1)
    )


start = (tuple(puzzle["player"]), frozenset(map(tuple, puzzle["boxes"])))
came_from = {start: None}
queue = deque([start])
end = start if start[1] <= goals else None
while queue and end is None:
    state = queue.popleft()
    (r, c), boxes = state
    for move, (dr, dc) in steps.items():
        player = (r + dr, c + dc)
        if wall(*player):
            continue
        moved = boxes
        if player in boxes:
            box = (player[0] + dr, player[1] + dc)
            if wall(*box) or box in boxes or dead(*box):
                continue
            moved = (boxes - {player}) | {box}
        nxt = (player, moved)
        if nxt not in came_from:
            came_from[nxt] = (state, move)
            if moved <= goals:
                end = nxt
                break
            queue.append(nxt)
moves = []
while end is not None and came_from[end]:
    end, move = came_from[end]
    moves.append(move)
print("**Actions List**:", json.dumps(moves[::-1]))
"""

SUDOKU = """\
import json
import sys

# Backtracking from the given clues alone (digits written earlier may be wrong), always filling
# the blank with the fewest candidates first; the answer is the whole grid.
puzzle = json.load(sys.stdin)
n, b = puzzle["size"], puzzle["box"]
clues = {tuple(cell) for cell in puzzle["clues"]}
grid = [
    [v if (r, c) in clues else 0 for c, v in enumerate(row)]
    for r, row in enumerate(puzzle["grid"])
]


def candidates(r, c):
    used = set(grid[r]) | {grid[i][c] for i in range(n)}
    top, left = r - r % b, c - c % b
    used |= {grid[i][j] for i in range(top, top + b) for j in range(left, left + b)}
    return [v for v in range(1, n + 1) if v not in used]


def solve():
    blanks = [(r, c) for r in range(n) for c in range(n) if grid[r][c] == 0]
    if not blanks:
        return True
    r, c = min(blanks, key=lambda cell: len(candidates(*cell)))
    for v in candidates(r, c):
        grid[r][c] = v
        if solve():
            return True
    grid[r][c] = 0
    return False


solve()
print("**Actions List**:", json.dumps(grid))
"""

"""Tool-agent "model outputs" for the planning tests: solvers that read the puzzle JSON on stdin
and print the actions list, written independently of the environments' own solvers."""

PATH_SOLVER = """
import json, sys
from collections import deque

def solve(p):
    grid, start, goal = p["grid"], tuple(p["pos"]), tuple(p["goal"])
    moves = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
    prev = {start: None}
    queue = deque([start])
    while queue:
        cur = queue.popleft()
        for m, (dr, dc) in moves.items():
            r, c = cur[0] + dr, cur[1] + dc
            if 0 <= r < len(grid) and 0 <= c < len(grid[0]) and grid[r][c] != "#" and (r, c) not in prev:
                prev[(r, c)] = (cur, m)
                queue.append((r, c))
    path, node = [], goal
    while prev[node] is not None:
        node, m = prev[node]
        path.append(m)
    return path[::-1]

if __name__ == "__main__":
    print("searching with BFS")
    print("**Actions List**:", json.dumps(solve(json.load(sys.stdin))))
"""  # noqa: E501

SOKOBAN_SOLVER = """
import json, sys
from collections import deque

def solve(p):
    grid = p["grid"]
    goals = frozenset(map(tuple, p["goals"]))
    start = (tuple(p["player"]), frozenset(map(tuple, p["boxes"])))
    moves = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
    def free(c):
        return 0 <= c[0] < len(grid) and 0 <= c[1] < len(grid[0]) and grid[c[0]][c[1]] != "#"
    prev = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        player, boxes = state
        if boxes <= goals:
            path = []
            while prev[state] is not None:
                state, m = prev[state]
                path.append(m)
            return path[::-1]
        for m, (dr, dc) in moves.items():
            q = (player[0] + dr, player[1] + dc)
            if not free(q):
                continue
            nb = boxes
            if q in boxes:
                b2 = (q[0] + dr, q[1] + dc)
                if not free(b2) or b2 in boxes:
                    continue
                nb = (boxes - {q}) | {b2}
            if (q, nb) not in prev:
                prev[(q, nb)] = (state, m)
                queue.append((q, nb))
    return None

if __name__ == "__main__":
    print("searching with BFS")
    print("**Actions List**:", json.dumps(solve(json.load(sys.stdin))))
"""

SUDOKU_SOLVER = '''
import json, sys

def candidates(g, n, b, r, c):
    used = set(g[r]) | {g[i][c] for i in range(n)}
    br, bc = r - r % b, c - c % b
    used |= {g[i][j] for i in range(br, br + b) for j in range(bc, bc + b)}
    return [v for v in range(1, n + 1) if v not in used]

def solutions(g, n, b, limit=2):
    """Up to `limit` completions of g (0 = blank), by backtracking on the most constrained cell."""
    found = []
    def go():
        best = None
        for r in range(n):
            for c in range(n):
                if g[r][c] == 0:
                    cand = candidates(g, n, b, r, c)
                    if best is None or len(cand) < len(best[2]):
                        best = (r, c, cand)
        if best is None:
            found.append([row[:] for row in g])
            return len(found) >= limit
        r, c, cand = best
        for v in cand:
            g[r][c] = v
            if go():
                g[r][c] = 0
                return True
        g[r][c] = 0
        return False
    go()
    return found

def solve(p):
    g, n, b = [row[:] for row in p["grid"]], p["size"], p["box"]
    done = solutions(g, n, b, 1)[0]
    return [[r, c, done[r][c]] for r in range(n) for c in range(n) if p["grid"][r][c] == 0]

if __name__ == "__main__":
    print("searching with backtracking")
    print("**Actions List**:", json.dumps(solve(json.load(sys.stdin))))
'''

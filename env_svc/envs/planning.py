"""The two-agent planning workflow shared by Plan-Path, Sokoban and Sudoku (paper §5.1).

Each turn the `tool` agent acts first, then the `plan` agent (sequential: the plan agent sees the
tool agent's output of the same turn).

- **tool**: writes one ```python block. The program gets the puzzle's current state as JSON on
  stdin and must print a line `**Actions List**: [...]` (a JSON list of moves). It runs in the
  sandbox; its moves are *simulated* on a copy of the state (never applied), and the tool agent's
  local reward is what those moves would earn. No code block, a crash, a timeout, no sandbox or no
  parsable actions list: local reward `failure_reward` (option, default -1.0) and
  `info["parse_error"]` or `info["exec_error"]` saying what was wrong.
- **plan**: ends its answer with `#### ` and a JSON list of moves; the moves are *applied*. Its local
  reward is what they earn. Malformed (no `#### `, bad JSON, an unknown move, an empty list):
  local reward `failure_reward`, `info["parse_error"]`, state unchanged.
- **floor**: the local reward of a well-formed answer is never below `min_answer_reward` (option,
  default -0.9; the unclipped sum is in `info["raw_reward"]` when clipped). Move penalties add up
  (a Sokoban deadlock costs -5, walking away from a Plan-Path goal -1 a move), and without the
  floor a crash or garbage would outscore an honest attempt within a GRPO group, teaching the
  agents to fail on purpose when unsure. So a format failure always scores strictly lowest.
- **team reward** (both agents): the puzzle's progress after the step, in [0, 1], exactly 1.0 when
  solved (0 once failed irrecoverably). A tool step never changes the state, so its team reward is
  the progress the plan agent left.

The router mixes `alpha * team + local`; nothing here does. Prompts are one user message rebuilt
from the state each time (puzzle, rules, answer format, the history of earlier turns inlined as
text; for the plan agent also this turn's tool code, its stdout/stderr truncated, and its actions).

A puzzle subclass supplies the rules: `generate`, `render`, `rules`, `puzzle_json`, `parse_moves`,
`simulate` and `progress` (see each method). Its state lives in `self.state` as plain data, so the
default deep-copying `fork()` gives an independent copy.
"""

from __future__ import annotations

import ast
import json
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from atgrpo.contract.sandbox import Limits
from atgrpo.sdk.env import Environment, EnvSpec, Message, StepResult, task_rng, turn_order_option
from env_svc.envs._text import clip as _clip
from env_svc.envs._text import decode as _decode
from env_svc.envs._text import program_lines, run_failure

AGENTS = ("tool", "plan")
FAILURE_REWARD = -1.0      # no code block, crash, timeout, no sandbox, no actions list, no `#### `...
MIN_ANSWER_REWARD = -0.9   # the floor of a well-formed answer's local reward (above FAILURE_REWARD)
MAX_MOVES_PER_ACTION = 400
ACTIONS_MARKER = "**Actions List**:"
PLAN_MARKER = "####"
HISTORY_TURNS = 6          # earlier turns shown in a prompt (the most recent ones)
CODE_CHARS, STDOUT_CHARS, STDERR_CHARS = 1500, 600, 400


@dataclass
class Outcome:
    """What a list of moves does to a state (computed on a copy; `state` is the new one)."""

    state: Any
    reward: float                 # the local reward those moves earn
    solved: bool = False
    failed: bool = False          # irrecoverable (e.g. a Sokoban box in a dead square)
    summary: str = ""             # one line for the history, e.g. "now at (3, 4); 1 invalid move"
    info: dict[str, Any] = field(default_factory=dict)   # JSON-able details


# ---------------------------------------------------------------------------------------------
# Parsing model output

_CODE_RE = re.compile(r"```(?:python|py|python3)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def extract_code(text: str) -> str | None:
    """The last ```python block of `text` (an unterminated last block counts), or None."""
    blocks = [b for b in _CODE_RE.findall(text) if b.strip()]
    return blocks[-1] if blocks else None


def _balanced(text: str, start: int) -> str | None:
    """The bracketed literal starting at text[start] == '[' up to its matching ']', or None."""
    depth, quote, escaped = 0, "", False
    for i in range(start, min(len(text), start + 100_000)):
        ch = text[i]
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth == 0:
                return text[start:i + 1]
    return None


def parse_list_after(text: str, marker: str) -> tuple[Any, str | None]:
    """The list literal right after the last `marker` that is followed by one: (value, None), or
    (None, what was wrong). JSON first; a Python literal (single quotes) is accepted too."""
    positions = [m.end() for m in re.finditer(re.escape(marker), text)]
    if not positions:
        return None, f"no '{marker}' found"
    for pos in reversed(positions):
        j = pos
        while j < len(text) and text[j] in " \t`":
            j += 1
        if j < len(text) and text[j] == "[":
            literal = _balanced(text, j)
            if literal is None:
                return None, f"the list after '{marker}' is not closed with ']'"
            try:
                return json.loads(literal), None
            except ValueError:
                pass
            try:
                return ast.literal_eval(literal), None
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                return None, f"the list after '{marker}' is not valid JSON: {_clip(literal, 80)}"
    return None, f"'{marker}' is not followed by a JSON list like [\"U\", \"R\"]"


def moves_text(moves: Any) -> str:
    return json.dumps(moves, separators=(",", ":"))


# ---------------------------------------------------------------------------------------------


class PlanningEnv(Environment):
    """Base class: the tool/plan workflow; a subclass supplies one puzzle's rules."""

    title: ClassVar[str] = ""             # "Plan-Path", used in prompts
    default_max_turns: ClassVar[int] = 5  # the reference's stateful configs use max_turns 5
    stdin_doc: ClassVar[str] = ""         # the keys of the puzzle JSON the tool program reads
    example_moves: ClassVar[str] = '["U","R"]'
    # Attributes set by generate() and never changed after: forks share them instead of copying.
    shared_on_fork = (*Environment.shared_on_fork, "tool_limits")

    def __init__(self, options: Mapping[str, Any] | None = None):
        super().__init__(options)
        max_turns = int(self.options.get("max_turns", self.default_max_turns))
        order = turn_order_option(self.options, AGENTS, self.name)
        if order == ("tool",):
            raise ValueError(f"{self.name}: the tool agent alone never plays a move; use turn_order [plan] "
                             "for a single agent, or [tool, plan]")
        self.solo = "tool" not in order
        self.spec = EnvSpec(self.name, agents=AGENTS, turn_order=order, max_turns=max_turns,
                            description=next(iter((self.__doc__ or "").strip().splitlines()), ""))
        self.failure_reward = float(self.options.get("failure_reward", FAILURE_REWARD))
        self.min_answer_reward = float(self.options.get("min_answer_reward", MIN_ANSWER_REWARD))
        if not self.min_answer_reward > self.failure_reward:
            raise ValueError(f"{self.name}: min_answer_reward ({self.min_answer_reward}) must be above "
                             f"failure_reward ({self.failure_reward}), so that failing never pays")
        timeout_ms = int(float(self.options.get("tool_timeout_s", 5.0)) * 1000)
        if timeout_ms <= 0:
            raise ValueError(f"{self.name}: tool_timeout_s must be > 0, got {self.options['tool_timeout_s']}")
        self.tool_limits = None if Limits is None else Limits(
            wall_timeout_ms=timeout_ms, cpu_time_ms=timeout_ms, memory_bytes=512 * 2**20,
            max_output_bytes=64 * 2**10, max_processes=16, max_file_bytes=2**20, max_open_files=64)
        self.state: Any = None
        self.task_id = ""
        self.turn = 0                          # completed turns
        self.done = False
        self.success = False
        self.history: list[dict[str, str]] = []  # per completed turn: {"tool": ..., "plan": ...}
        self.tool_out: dict[str, Any] | None = None   # this turn's tool output, for the plan agent

    # ---- what a puzzle implements ---------------------------------------------------------

    def generate(self, rng: random.Random) -> Any:
        """A new puzzle's initial state (plain data), drawn from `rng` only."""
        raise NotImplementedError

    def render(self) -> str:
        """The current state as text for a prompt."""
        raise NotImplementedError

    def rules(self) -> str:
        """The legal moves now and what a move means."""
        raise NotImplementedError

    def puzzle_json(self) -> dict[str, Any]:
        """The current state as the JSON object the tool program reads on stdin."""
        raise NotImplementedError

    def parse_moves(self, value: Any) -> list[Any]:
        """Check a parsed list of moves; raise ValueError saying what is wrong."""
        raise NotImplementedError

    def simulate(self, moves: list[Any]) -> Outcome:
        """What `moves` would do from the current state, computed without changing it."""
        raise NotImplementedError

    def progress(self) -> float:
        """The team signal for the current state: in [0, 1], exactly 1.0 when solved."""
        raise NotImplementedError

    # ---- Environment ----------------------------------------------------------------------

    def reset(self, task_id: str, seed: int, split: str) -> None:
        self.task_id = task_id
        self.state = self.generate(task_rng(split, seed))
        self.turn, self.done, self.success = 0, False, False
        self.history, self.tool_out = [], None

    def observe(self, agent: str) -> list[Message]:
        self._check_agent(agent)
        if self.state is None:
            raise RuntimeError(f"{self.name}: observe() before reset()")
        role = ("You are the tool agent of a two-agent team: write a program that finds the moves."
                if agent == "tool" else "You are solving this puzzle alone: decide the moves to play."
                if self.solo else "You are the plan agent of a two-agent team: decide the moves to play.")
        parts = [f"{role}\nPuzzle: {self.title}. Turn {self.turn + 1} of {self.spec.max_turns}.",
                 self.render(), self.rules()]
        if self.history:
            shown = self.history[-HISTORY_TURNS:]
            first = len(self.history) - len(shown) + 1
            lines = [f"Turn {first + i}: " + (h["plan"] if self.solo else f"tool {h['tool']}; plan {h['plan']}")
                     for i, h in enumerate(shown)]
            parts.append("Previous turns:\n" + "\n".join(lines))
        if agent == "tool":
            parts.append(
                "Write a Python program in one ```python code block. It reads the puzzle as JSON "
                f"from stdin ({self.stdin_doc}) and must print one line:\n"
                f"**Actions List**: {self.example_moves}\n"
                "with the JSON list of moves that solves the puzzle from the current state.")
        else:
            if not self.solo:
                parts.append(self._tool_report())
            parts.append("End your answer with a line: #### followed by a JSON list of moves, "
                         f"e.g.\n#### {self.example_moves}")
        return [{"role": "user", "content": "\n\n".join(p for p in parts if p)}]

    async def step(self, agent: str, action: str) -> StepResult:
        self._check_agent(agent)
        if self.state is None:
            raise RuntimeError(f"{self.name}: step() before reset()")
        if self.done:
            return StepResult(self._team(), 0.0, True, self.success, {"error": "the episode is over"})
        if agent == "tool":
            return await self._tool_step(action)
        return self._plan_step(action)

    # ---- the tool agent -------------------------------------------------------------------

    async def _tool_step(self, action: str) -> StepResult:
        out: dict[str, Any] = {"code": "", "stdout": "", "stderr": "", "actions": None, "error": ""}
        self.tool_out = out
        info: dict[str, Any] = {}

        def fail(key: str, message: str) -> StepResult:
            out["error"] = message
            info[key] = message
            return StepResult(self._team(), self.failure_reward, False, False, info)

        code = extract_code(action if isinstance(action, str) else "")
        if code is None:
            return fail("parse_error", "no ```python code block found; put the program in one "
                                       "```python ... ``` block")
        out["code"] = _clip(code.strip(), CODE_CHARS)
        if self.sandbox is None:
            return fail("exec_error", "no sandbox configured")
        stdin = json.dumps(self.puzzle_json(), separators=(",", ":")).encode()
        kwargs = {} if self.tool_limits is None else {"limits": self.tool_limits}
        try:
            result = await self.sandbox.execute(code, stdin=stdin, **kwargs)
        except Exception as e:  # the sandbox refused or is down: score, never crash the episode
            info["sandbox_error"] = True
            return fail("exec_error", f"sandbox error: {type(e).__name__}: {e}")
        stdout = _decode(getattr(result, "stdout", b""))
        stderr = _decode(getattr(result, "stderr", b""))
        out["stdout"], out["stderr"] = _clip(stdout.strip(), STDOUT_CHARS), _clip(stderr.strip(), STDERR_CHARS)
        info["verdict"] = getattr(getattr(result, "verdict", None), "value", str(getattr(result, "verdict", "")))
        failure = run_failure(result, stderr)
        if failure:
            return fail("exec_error", failure)
        value, err = parse_list_after(stdout, ACTIONS_MARKER)
        if err is not None:
            return fail("parse_error", f"stdout has no actions list ({err}); print a line "
                                       f"**Actions List**: {self.example_moves}")
        try:
            moves = self.parse_moves(value)
        except ValueError as e:
            return fail("parse_error", f"bad actions list: {e}")
        out["actions"] = moves
        outcome = self.simulate(moves)
        info.update(actions=moves, simulated=outcome.info, would_solve=outcome.solved)
        return StepResult(self._team(), self._answer_reward(outcome, info), False, False, info)

    def _tool_report(self) -> str:
        out = self.tool_out
        if out is None:
            return "The tool agent has not acted this turn."
        lines = program_lines(out, "Its stdout", "Its stderr")
        if out["actions"] is not None:
            lines.append(f"The tool agent's proposed actions: {moves_text(out['actions'])}")
        else:
            lines.append(f"The tool agent proposed no actions: {out['error']}")
        return "\n".join(lines)

    # ---- the plan agent -------------------------------------------------------------------

    def _plan_step(self, action: str) -> StepResult:
        tool = self.tool_out
        tool_line = ("did not act" if tool is None else
                     f"proposed {_clip(moves_text(tool['actions']), 200)}" if tool["actions"] is not None else
                     f"failed ({_clip(tool['error'], 100)})")
        value, err = parse_list_after(action if isinstance(action, str) else "", PLAN_MARKER)
        moves: list[Any] | None = None
        if err is None:
            try:
                moves = self.parse_moves(value)
            except ValueError as e:
                err = str(e)
        if moves is None:
            message = f"{err}; end the answer with a line like: #### {self.example_moves}"
            self._end_turn(tool_line, f"answer malformed ({_clip(str(err), 100)})")
            return StepResult(self._team(), self.failure_reward, False, False, {"parse_error": message})
        outcome = self.simulate(moves)
        self.state = outcome.state
        self.done = outcome.solved or outcome.failed
        self.success = outcome.solved
        self._end_turn(tool_line, f"played {_clip(moves_text(moves), 200)}: {outcome.summary}")
        info = {"actions": moves, **outcome.info}
        if outcome.failed:
            info["failed"] = True
        return StepResult(self._team(), self._answer_reward(outcome, info), self.done, self.success, info)

    def _end_turn(self, tool_line: str, plan_line: str) -> None:
        self.history.append({"tool": tool_line, "plan": plan_line})
        self.turn += 1
        self.tool_out = None

    # ---- helpers --------------------------------------------------------------------------

    def _answer_reward(self, outcome: Outcome, info: dict[str, Any]) -> float:
        """A well-formed answer's local reward: its moves' reward, floored at min_answer_reward."""
        raw = round(outcome.reward, 6)
        if raw < self.min_answer_reward:
            info["raw_reward"] = raw
            return self.min_answer_reward
        return raw

    def _team(self) -> float:
        if self.success:
            return 1.0
        if self.done:          # failed irrecoverably
            return 0.0
        return round(min(1.0, max(0.0, self.progress())), 6)

    def _check_agent(self, agent: str) -> None:
        if agent not in AGENTS:
            raise ValueError(f"{self.name}: unknown agent {agent!r}; this environment's agents are {AGENTS}")


def direction_moves(value: Any, *, limit: int = MAX_MOVES_PER_ACTION) -> list[str]:
    """A checked list of U/D/L/R moves (case-insensitive); ValueError says what is wrong."""
    if not isinstance(value, list):
        raise ValueError(f"expected a list of moves like [\"U\",\"R\"], got {type(value).__name__}")
    if not value:
        raise ValueError("the list of moves is empty; give at least one move")
    if len(value) > limit:
        raise ValueError(f"{len(value)} moves is over the limit of {limit} per answer")
    moves = []
    for i, m in enumerate(value):
        if not isinstance(m, str) or m.strip().upper() not in DIRECTIONS:
            raise ValueError(f"unknown move {m!r} at position {i}; use only \"U\", \"D\", \"L\", \"R\"")
        moves.append(m.strip().upper())
    return moves


DIRECTIONS: dict[str, tuple[int, int]] = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}

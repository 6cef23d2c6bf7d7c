"""The two-agent planning workflow shared by Plan-Path, Sokoban and Sudoku (paper §5.1).

Each turn the `tool` agent acts first, then the `plan` agent (sequential: the plan agent sees the
tool agent's output of the same turn).

- **tool**: writes one ```python block. The program gets the puzzle's current state as JSON on
  stdin and must print a line `**Actions List**: [...]` (a JSON list of moves). It runs in the
  sandbox; its moves are *simulated* on a copy of the state (never applied).
- **plan**: ends its answer with `#### ` and a JSON list of moves; the moves are *applied*.

**Rewards: progress is paid once.** A puzzle splits what a list of moves earns into *gains* and
*costs* (each puzzle's table says which is which):

- **gains** (>= 0) are paid against a *record*: the highest potential reached so far in the
  episode (Plan-Path: minus the distance to the goal; Sokoban: minus the boxes' summed distance
  to the goals; Sudoku: the cells holding the solution's digit), the one-off events already paid
  (a box's first arrival on each Sokoban goal) and whether the win bonus was paid. A move is paid
  only for raising the record, the potential's rise beyond the best reached so far (states
  in the middle of an answer count), so walking away and back, pushing a box off a goal and on
  again, or clearing a cell and writing it again earn nothing the second time. An episode's gains
  therefore never total more than one solve's.
- **costs** (>= 0: steps, invalid moves, pushes off a goal, failures) add up per agent over the
  episode, C, and the episode charges `charged(C)` of them: C itself up to h = m/2, beyond that
  `h + h * (1 - exp(-(C - h) / h))`, with m = -`min_answer_reward` (option, default -0.9, so
  m = 0.9 and h = 0.45; `min_answer_reward: 0` charges no costs); an answer pays the rise of
  `charged` it causes. So an honest episode's few costs are charged in full (45 steps' worth),
  every further cost still lowers the reward until the charge is within rounding (1e-6) of m (a
  GRPO group still prefers the cleaner answer), and no episode is charged more than m: the
  floor applies to the episode's total, not per answer, and a penalty can never be traded for a
  later gain, because gains are paid against the record, not against the state.
- **local reward** of a well-formed answer: its gains minus the charge it adds, so never below
  `min_answer_reward`, which is above `failure_reward` (option, default -1.0): a format failure
  scores that flat, every time, outside the ledger: no `#### `, no code block, not a list of moves
  (unknown move, empty, over 400 moves), too large (64 KiB) or too deep (32 brackets) a literal,
  no parsable actions list. Within a GRPO group (one state, one ledger) a format failure always
  scores strictly lowest, and over an episode m bounds what well-formed answers can lose, so
  failing on purpose never pays. `info` carries `gains`, `costs` and `charged`; a format failure
  carries `judge_error` (a reason: no_marker, no_list, not_closed, not_data, too_large, too_deep,
  bad_moves, no_code; counted by the host in `atgrpo_env_judge_errors_total`) and `parse_error`.
- **the tool agent** is scored as the plan agent would be for its moves, against its own ledger:
  its own costs, and a record that holds the best of what play has reached and what its earlier
  proposals were paid for. So it is paid for what a proposal *adds*: a proposal that simulates to
  nothing beyond that record earns no gains, and a winning proposal repeated while the plan agent
  stalls earns nothing the second time (its total gains over an episode never exceed one solve).
  A crash, a timeout or no sandbox: `failure_reward` with `info["exec_error"]`.
- **team reward** (both agents): the puzzle's progress after the step, in [0, 1], exactly 1.0 when
  solved (0 once failed irrecoverably). A tool step never changes the state, so its team reward is
  the progress the plan agent left.

The router mixes `alpha * team + local`; nothing here does. Prompts are one user message rebuilt
from the state each time (puzzle, rules, answer format, the history of earlier turns inlined as
text; for the plan agent also this turn's tool code, its stdout/stderr truncated, and its actions).

Every parse of model text or program output goes through atgrpo.sdk.judge's bounded parsers; the
bracket scan that finds the literal stops at 64 KiB or 32 levels, so nothing an agent writes can
raise out of `step`. The parsers are in plan_answers.py; the record, the Outcome of a list of moves
and the episode's charge in plan_ledger.py.

A puzzle subclass supplies the rules: `generate`, `render`, `rules`, `puzzle_json`, `parse_moves`,
`start_record`, `simulate` and `progress` (see each method), and for `demonstration` (warm-start
data, never used in training) its solver: `demo_moves` and a general `tool_program`
(plan_programs.py). Its state lives in `self.state` as
plain data, so the default deep-copying `fork()` gives an independent copy (ledgers included).
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from typing import Any, ClassVar

from atgrpo.sdk.env import Environment, EnvSpec, Message, StepResult, task_rng, turn_order_option
from atgrpo.sdk.judge import JudgeError, failure_info
from env_svc.envs._text import clip as _clip
from env_svc.envs._text import program_lines
from env_svc.envs.common import (
    CODE_CHARS,
    FAILURE_REWARD,
    HISTORY_TURNS,
    read_result,
    tool_limits,
    user_prompt,
)
from env_svc.envs.plan_answers import extract_code, moves_text, parse_list_after
from env_svc.envs.plan_ledger import Outcome, Record, episode_charge

AGENTS = ("tool", "plan")
MIN_ANSWER_REWARD = -0.9  # minus the most an episode's costs are charged (above FAILURE_REWARD)
ACTIONS_MARKER = "**Actions List**:"
PLAN_MARKER = "####"
STDOUT_CHARS = 600  # of the tool program's stdout, in the plan agent's prompt


class PlanningEnv(Environment):
    """Base class: the tool/plan workflow; a subclass supplies one puzzle's rules."""

    title: ClassVar[str] = ""  # "Plan-Path", used in prompts
    default_max_turns: ClassVar[int] = 5  # the reference's stateful configs use max_turns 5
    stdin_doc: ClassVar[str] = ""  # the keys of the puzzle JSON the tool program reads
    example_moves: ClassVar[str] = '["U","R"]'
    tool_program: ClassVar[str | None] = None  # the tool agent's demonstration (plan_programs.py)
    # Attributes set by generate() and never changed after: forks share them instead of copying.
    shared_on_fork = (*Environment.shared_on_fork, "tool_limits")

    def __init__(self, options: Mapping[str, Any] | None = None):
        super().__init__(options)
        max_turns = int(self.options.get("max_turns", self.default_max_turns))
        order = turn_order_option(self.options, AGENTS, self.name)
        if order == ("tool",):
            raise ValueError(
                f"{self.name}: the tool agent alone never plays a move; use turn_order [plan] "
                "for a single agent, or [tool, plan]"
            )
        self.solo = "tool" not in order
        self.spec = EnvSpec(
            self.name,
            agents=AGENTS,
            turn_order=order,
            max_turns=max_turns,
            description=next(iter((self.__doc__ or "").strip().splitlines()), ""),
        )
        self.failure_reward = float(self.options.get("failure_reward", FAILURE_REWARD))
        self.min_answer_reward = float(self.options.get("min_answer_reward", MIN_ANSWER_REWARD))
        if not self.failure_reward < self.min_answer_reward <= 0:
            raise ValueError(
                f"{self.name}: min_answer_reward ({self.min_answer_reward}) must be <= 0 and above "
                f"failure_reward ({self.failure_reward}), so that failing never pays"
            )
        self.tool_limits = tool_limits(self.options, self.name)
        self.state: Any = None
        self.task_id = ""
        self.turn = 0  # completed turns
        self.done = False
        self.success = False
        self.history: list[dict[str, str]] = []  # per completed turn: {"tool": ..., "plan": ...}
        self.tool_out: dict[str, Any] | None = None  # this turn's tool output, for the plan agent
        # The ledgers (module docstring): what play has reached, what the tool agent was paid for
        # (at least what play has reached), and each agent's summed costs. None until reset();
        # simulate() then pays against the current state's own record.
        self.record: Record | None = None
        self.tool_record: Record | None = None
        self.costs: dict[str, float] = dict.fromkeys(AGENTS, 0.0)

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

    def start_record(self) -> Record:
        """The record of the current state as if nothing had been paid yet (its potential, and the
        one-off events it already holds, e.g. boxes that start on goals)."""
        raise NotImplementedError

    def simulate(self, moves: list[Any], record: Record | None = None) -> Outcome:
        """What `moves` would do from the current state, computed without changing it: gains paid
        against `record` (default: what play has reached; see `paid_record`), costs, and the new
        record."""
        raise NotImplementedError

    def progress(self) -> float:
        """The team signal for the current state: in [0, 1], exactly 1.0 when solved."""
        raise NotImplementedError

    def demo_moves(self) -> list[Any] | None:
        """Moves that solve the puzzle from the current state (the env's own solver), as the plan
        agent writes them; None where there is none. The default has none."""
        return None

    # ---- Environment ----------------------------------------------------------------------

    def reset(self, task_id: str, seed: int, split: str) -> None:
        self.task_id = task_id
        self.state = self.generate(task_rng(split, seed))
        self.turn, self.done, self.success = 0, False, False
        self.history, self.tool_out = [], None
        self.record = self.tool_record = self.start_record()
        self.costs = dict.fromkeys(AGENTS, 0.0)

    def observe(self, agent: str) -> list[Message]:
        self._check_agent(agent)
        if self.state is None:
            raise RuntimeError(f"{self.name}: observe() before reset()")
        role = (
            "You are the tool agent of a two-agent team: write a program that finds the moves."
            if agent == "tool"
            else "You are solving this puzzle alone: decide the moves to play."
            if self.solo
            else "You are the plan agent of a two-agent team: decide the moves to play."
        )
        parts = [
            f"{role}\nPuzzle: {self.title}. Turn {self.turn + 1} of {self.spec.max_turns}.",
            self.render(),
            self.rules(),
        ]
        if self.history:
            shown = self.history[-HISTORY_TURNS:]
            first = len(self.history) - len(shown) + 1
            lines = [
                f"Turn {first + i}: "
                + (h["plan"] if self.solo else f"tool {h['tool']}; plan {h['plan']}")
                for i, h in enumerate(shown)
            ]
            parts.append("Previous turns:\n" + "\n".join(lines))
        if agent == "tool":
            parts.append(
                "Write a Python program in one ```python code block. It reads the puzzle as JSON "
                f"from stdin ({self.stdin_doc}) and must print one line:\n"
                f"**Actions List**: {self.example_moves}\n"
                "with the JSON list of moves that solves the puzzle from the current state."
            )
        else:
            if not self.solo:
                parts.append(self._tool_report())
            parts.append(
                "End your answer with a line: #### followed by a JSON list of moves, "
                f"e.g.\n#### {self.example_moves}"
            )
        return user_prompt(p for p in parts if p)

    async def step(self, agent: str, action: str) -> StepResult:
        self._check_agent(agent)
        if self.state is None:
            raise RuntimeError(f"{self.name}: step() before reset()")
        if self.done:
            return StepResult(
                self._team(), 0.0, True, self.success, {"error": "the episode is over"}
            )
        if agent == "tool":
            return await self._tool_step(action)
        return self._plan_step(action)

    def demonstration(self, agent: str) -> str | None:
        """The tool agent: the puzzle's general solver program (`tool_program`); the plan agent:
        the env's own solution from the current state. None before reset and once it is over."""
        self._check_agent(agent)
        if self.state is None or self.done:
            return None
        if agent == "tool":
            if self.tool_program is None:
                return None
            return (
                "This program searches from the current state for the moves that solve the "
                f"puzzle and prints them.\n```python\n{self.tool_program}```"
            )
        moves = self.demo_moves()
        if not moves:
            return None
        return f"These moves solve the puzzle from the current state.\n#### {moves_text(moves)}"

    # ---- the tool agent -------------------------------------------------------------------

    async def _tool_step(self, action: str) -> StepResult:
        out: dict[str, Any] = {"code": "", "stdout": "", "stderr": "", "actions": None, "error": ""}
        self.tool_out = out
        info: dict[str, Any] = {}

        def fail(message: str, reason: str = "") -> StepResult:
            """A format failure (reason: why the answer is malformed) or, without one, an exec
            failure."""
            out["error"] = message
            info.update(
                failure_info(JudgeError(reason, message)) if reason else {"exec_error": message}
            )
            return StepResult(self._team(), self.failure_reward, False, False, info)

        code = extract_code(action if isinstance(action, str) else "")
        if code is None:
            return fail(
                "no ```python code block found; put the program in one ```python ... ``` block",
                "no_code",
            )
        out["code"] = _clip(code.strip(), CODE_CHARS)
        if self.sandbox is None:
            return fail("no sandbox configured")
        stdin = json.dumps(self.puzzle_json(), separators=(",", ":")).encode()
        try:
            result = await self.sandbox.execute(code, stdin=stdin, limits=self.tool_limits)
        except Exception as e:  # the sandbox refused or is down: score, never crash the episode
            info["sandbox_error"] = True
            return fail(f"sandbox error: {type(e).__name__}: {e}")
        stdout, failure = read_result(result, out, info, STDOUT_CHARS)
        if failure:
            return fail(failure)
        moves, err = self._read_moves(stdout, ACTIONS_MARKER)
        if err is not None:
            return fail(
                f"bad actions list: {err}"
                if err.reason == "bad_moves"
                else f"stdout has no actions list ({err}); print a line **Actions List**: "
                f"{self.example_moves}",
                err.reason,
            )
        out["actions"] = moves
        # Paid against the tool's own record: what play reached and its earlier proposals were paid.
        outcome = self.simulate(moves, self.paid_record(self.tool_record))
        self.tool_record = outcome.record
        info.update(actions=moves, simulated=outcome.info, would_solve=outcome.solved)
        return StepResult(self._team(), self._score("tool", outcome, info), False, False, info)

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
        tool_line = (
            "did not act"
            if tool is None
            else f"proposed {_clip(moves_text(tool['actions']), 200)}"
            if tool["actions"] is not None
            else f"failed ({_clip(tool['error'], 100)})"
        )
        moves, err = self._read_moves(action if isinstance(action, str) else "", PLAN_MARKER)
        if err is not None:
            message = f"{err}; end the answer with a line like: #### {self.example_moves}"
            self._end_turn(tool_line, f"answer malformed ({_clip(str(err), 100)})")
            return StepResult(
                self._team(),
                self.failure_reward,
                False,
                False,
                failure_info(JudgeError(err.reason, message)),
            )
        outcome = self.simulate(moves, self.record)
        self.state, self.record = outcome.state, outcome.record
        # What play reaches is no longer the tool agent's to be paid for.
        self.tool_record = self.paid_record(self.tool_record).merge(outcome.record)
        self.done = outcome.solved or outcome.failed
        self.success = outcome.solved
        self._end_turn(tool_line, f"played {_clip(moves_text(moves), 200)}: {outcome.summary}")
        info = {"actions": moves, **outcome.info}
        if outcome.failed:
            info["failed"] = True
        return StepResult(
            self._team(), self._score("plan", outcome, info), self.done, self.success, info
        )

    def _end_turn(self, tool_line: str, plan_line: str) -> None:
        self.history.append({"tool": tool_line, "plan": plan_line})
        self.turn += 1
        self.tool_out = None

    # ---- helpers --------------------------------------------------------------------------

    def _read_moves(self, text: str, marker: str) -> tuple[Any, JudgeError | None]:
        """The checked moves after `marker` in `text`: (moves, None) or (None, why not)."""
        value, err = parse_list_after(text, marker)
        if err is not None:
            return None, err
        try:
            return self.parse_moves(value), None
        except JudgeError as e:
            return None, e
        except (ValueError, TypeError) as e:
            return None, JudgeError("bad_moves", str(e))

    def paid_record(self, record: Record | None) -> Record:
        """The record a simulation pays against: the one given, else what play has reached, else
        (before reset, e.g. a puzzle loaded by hand) the current state's own."""
        if record is not None:
            return record
        return self.record if self.record is not None else self.start_record()

    def _score(self, agent: str, outcome: Outcome, info: dict[str, Any]) -> float:
        """A well-formed answer's local reward: its gains minus what its costs add to the agent's
        episode charge (below m = -min_answer_reward in total, so the reward is above it)."""
        before = self.costs[agent]
        after = self.costs[agent] = before + outcome.costs
        m = -self.min_answer_reward
        charged = episode_charge(after, m) - episode_charge(before, m)
        info.update(
            gains=round(outcome.gains, 6), costs=round(outcome.costs, 6), charged=round(charged, 6)
        )
        return round(outcome.gains - charged, 6)

    def _team(self) -> float:
        if self.success:
            return 1.0
        if self.done:  # failed irrecoverably
            return 0.0
        return round(min(1.0, max(0.0, self.progress())), 6)

    def _check_agent(self, agent: str) -> None:
        if agent not in AGENTS:
            raise ValueError(
                f"{self.name}: unknown agent {agent!r}; this environment's agents are {AGENTS}"
            )

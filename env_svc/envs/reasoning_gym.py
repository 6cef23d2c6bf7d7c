"""`reasoning_gym`: any task of the reasoning-gym library (`pip install 'atgrpo[benchmarks]'`) as
an environment: a `reasoner` alone, or a `tool` agent plus the `reasoner`, as in `math`.

Each episode is one generated entry of the dataset named by the `dataset` option (e.g.
`basic_arithmetic`, `leg_counting`, `sudoku`, `maze`; `dataset_config` is passed to
`reasoning_gym.create_dataset` as keyword arguments). Entries come from two datasets of
`train_size` and `eval_size` entries, seeded `data_seed` and `data_seed + EVAL_SEED_OFFSET`:
reasoning-gym draws entry i from Random(seed + i), so the two splits never share a draw, and the
same (split, seed) always gives the same entry. A task's seed picks the entry (seed modulo the
split's size; eval seeds count from EVAL_SEED_OFFSET), so training walks its split in order, once
per epoch, and evaluation takes the first `eval_size` entries.

- **reasoner** sees the question and ends with `<answer>...</answer>` (reasoning-gym's own
  convention; the last one counts; a `\\boxed{}` or `Final answer:` line is accepted when there is
  none). Local reward: the answer's score (in [0, 1]; a few tasks give partial credit),
  `failure_reward` (default -1) when no answer can be found.
- **the judge**: model text never runs as code in this process. A dataset whose own scorer
  evaluates the answer or pays wrong answers is scored by ours (rg_safe.py: data and arithmetic
  parsing only, the dataset's score for an honest answer); every other dataset's `score_answer`
  runs in the scorer worker (rg_scorer.py), in a child process forked per call, isolated and
  bounded, and pays its verdict of right (1.0) or nothing, partial credit only where audited as
  progress (rg_credit.py: most of reasoning-gym's partial credit pays constant answers).
  `composite` is refused (it would score around all this). An answer over 64 KiB or nested over
  32 brackets deep, or one the judge cannot score (a scorer crash or timeout, text that is not
  the arithmetic asked for), is a format failure: local reward `failure_reward`, team score 0,
  `judge_error` (the reason) and `parse_error` in the step's info.
- **tool** writes one ```python block, run in the sandbox like `math`'s tool agent; its answer is
  the `<answer>...</answer>` it prints, else its last non-empty stdout line. Local reward: its
  answer's score, 0 when it printed nothing, `failure_reward` for no code block or a crash.
- **team reward** (both agents): the reasoner's latest score (0 before it answers).
- **demonstration** (warm-start data, never used in training): the reasoner's is the entry's
  answer in <answer> tags; the tool agent's a program computing it, for the datasets whose entry
  determines it (`TOOL_PROGRAMS`: basic_arithmetic, letter_counting), else None.
- **done / success**: success = the reasoner's latest score is 1.0; the episode ends then, or
  after `max_turns` (default 1; a later turn tells the agents their answer was not right, an
  oracle, so evaluate with `max_turns: 1`).

Options: `dataset` (required when any option is given), `dataset_config`, `train_size` (10000),
`eval_size` (200), `data_seed` (0), `max_turns`, `turn_order` (e.g. `[reasoner]` for L0),
`failure_reward`, `tool_timeout_s` (5). Built with no options at all (ListEnvs describes every
built-in so) the env names its spec without importing reasoning-gym, and reset asks for `dataset`.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable, Mapping
from typing import Any

from atgrpo.errors import InvalidArgument
from atgrpo.sdk.env import EVAL_SEED_OFFSET, Environment, Message, StepResult
from atgrpo.sdk.judge import JudgeError, check_bounds, failure_info
from env_svc.envs._text import clip as _clip
from env_svc.envs.answer_extract import extract_answer
from env_svc.envs.common import ToolTurns, tool_limits
from env_svc.envs.rg_credit import REFUSED, credit
from env_svc.envs.rg_safe import SYMPY_SCORED, math_text, scorer_for
from env_svc.envs.rg_scorer import WORKER

AGENTS = ("tool", "reasoner")
ANSWER_CHARS = 600
NO_ANSWER = "no <answer>...</answer> found; end with the final answer in <answer></answer> tags"
INSTALL_HINT = "pip install 'atgrpo[benchmarks]'"
OWNED_KEYS = ("seed", "size")  # create_dataset arguments this env sets from its own options


def tagged_answer(text: str) -> str | None:
    """The content of the last <answer>...</answer> (reasoning-gym's convention), or None. Two
    rfinds, not a regex: a text of many unclosed tags costs linear time, not quadratic."""
    end = text.rfind("</answer>")
    start = text.rfind("<answer>", 0, max(end, 0))
    if end < 0 or start < 0:
        return None
    return text[start + len("<answer>") : end].strip() or None


def reasoner_answer(text: str) -> str | None:
    return tagged_answer(text) or extract_answer(text)


def program_answer(stdout: str) -> str | None:
    """A tool program's answer: a printed <answer> block (answers may span lines, e.g. a grid),
    else its last non-empty line."""
    lines = [ln.strip() for ln in stdout.strip().splitlines() if ln.strip()]
    return tagged_answer(stdout) or (lines[-1] if lines else None)


def _arithmetic_program(dataset: Any, entry: dict) -> str | None:
    """basic_arithmetic: the expression printed. With parentheses allowed (the default) the dataset
    computes it as Python does, its `/` as floor division; without, it computes left to right,
    and a `/` in the question may not be the division it did, so that answer is not derivable."""
    expression = str(entry["metadata"]["expression"])
    if getattr(dataset.config, "allow_parentheses", True):
        return f"print({expression.replace('/', '//')})"
    if "/" in expression:
        return None
    first, *rest = expression.split()
    for op, number in zip(rest[::2], rest[1::2], strict=True):
        first = f"({first} {op} {number})"
    return f"print({first.removeprefix('(').removesuffix(')') if rest else first})"


def _letters_program(dataset: Any, entry: dict) -> str:
    """letter_counting: the letter counted in the text, case-insensitively (as the dataset
    counts)."""
    meta = entry["metadata"]
    text, letter = " ".join(meta["span"]), str(meta["target_letter"]).lower()
    return f"text = {text!r}\nprint(text.lower().count({letter!r}))"


# The tool agent's demonstration, for the datasets whose answer a program computes from the entry.
TOOL_PROGRAMS: dict[str, Callable[[Any, dict], str | None]] = {
    "basic_arithmetic": _arithmetic_program,
    "letter_counting": _letters_program,
}


def _in_process(scorer: Any, dataset: Any, answer: str, entry: dict) -> float:
    """One of our safe scorers; should it fail on some input we did not foresee, that answer is
    a scorer error like a worker crash, not a failed step."""
    try:
        return float(scorer(dataset, answer, entry))
    except JudgeError:
        raise
    except Exception as e:  # noqa: BLE001 - see the docstring
        raise JudgeError("scorer_error", _clip(f"{type(e).__name__}: {e}", 200)) from None


def _unread(info: dict[str, Any]) -> str:
    """For the history: why the judge could not read an answer, so the next turn can fix it."""
    return f" (unreadable: {_clip(info['parse_error'], 160)})" if "judge_error" in info else ""


def _library() -> Any:
    try:
        import reasoning_gym
    except ImportError:
        raise ValueError(
            f"env reasoning_gym needs the reasoning-gym package: {INSTALL_HINT}"
        ) from None
    return reasoning_gym


@functools.lru_cache(maxsize=32)
def _dataset(name: str, config_json: str, seed: int, size: int) -> Any:
    """A dataset object, shared by every episode with the same options (creating one validates
    its config; entries are generated on demand)."""
    rg = _library()
    try:
        return rg.create_dataset(name, seed=seed, size=size, **json.loads(config_json))
    except (TypeError, AssertionError, ValueError) as e:
        raise ValueError(
            f"reasoning_gym: dataset {name!r} refused dataset_config {json.loads(config_json)}: "
            f"{type(e).__name__}: {e or 'its config check failed'}"
        ) from None


def dataset_names() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def check_dataset(name: Any, config: Any) -> tuple[str, str]:
    """(name, config as canonical JSON), or ValueError saying what to write instead."""
    _library()
    names = dataset_names()
    if name is None:
        raise ValueError(
            "reasoning_gym: the option `dataset` is required: a reasoning-gym dataset name, "
            "e.g. basic_arithmetic"
        )
    if not isinstance(name, str) or name not in names:
        some = ", ".join(
            n
            for n in ("basic_arithmetic", "leg_counting", "sudoku", "maze", "countdown")
            if n in names
        )
        raise ValueError(
            f"reasoning_gym: unknown dataset {name!r}; use one of reasoning-gym's {len(names)} "
            f"datasets, e.g. {some} (all: reasoning_gym.factory.DATASETS)"
        )
    if name in REFUSED:
        raise ValueError(f"reasoning_gym: dataset {name!r} is not served: {REFUSED[name]}")
    if not isinstance(config, Mapping):
        raise ValueError(
            f"reasoning_gym: dataset_config must be a mapping of {name}'s config fields, got "
            f"{config!r}"
        )
    if owned := sorted(set(config) & set(OWNED_KEYS)):
        raise ValueError(
            f"reasoning_gym: dataset_config may not set {owned}; use the options data_seed, "
            "train_size and eval_size"
        )
    try:
        config_json = json.dumps(dict(config), sort_keys=True)
    except (TypeError, ValueError):
        raise ValueError(
            f"reasoning_gym: dataset_config must hold plain values, got {config!r}"
        ) from None
    _dataset(name, config_json, 0, 1)  # the dataset's own config check, now rather than at reset
    return name, config_json


def entry_index(seed: int, split: str, size: int) -> int:
    index = seed - EVAL_SEED_OFFSET if split == "eval" and seed >= EVAL_SEED_OFFSET else seed
    return abs(index) % size


class ReasoningGymEnv(ToolTurns, Environment):
    """A reasoning-gym task: a reasoner (and optionally a tool agent) answers; the dataset
    scores."""

    name = "reasoning_gym"
    shared_on_fork = (*Environment.shared_on_fork, "limits", "dataset", "entry")

    def __init__(self, options: Mapping[str, Any] | None = None):
        super().__init__(options)
        self._start_team(
            AGENTS, 1, "a reasoning-gym task: the dataset's own scorer grades the answer"
        )
        self.sizes = {
            "train": int(self.options.get("train_size", 10_000)),
            "eval": int(self.options.get("eval_size", 200)),
        }
        for split, size in self.sizes.items():
            if not 1 <= size < EVAL_SEED_OFFSET:
                raise ValueError(
                    f"reasoning_gym: {split}_size must be in 1..{EVAL_SEED_OFFSET - 1}, got {size}"
                )
        self.data_seed = int(self.options.get("data_seed", 0))
        self.limits = tool_limits(self.options, self.name)
        # A run always passes options (atgrpo adds turn_order); only a listing builds with none.
        self.source = (
            check_dataset(self.options.get("dataset"), self.options.get("dataset_config") or {})
            if self.options
            else None
        )
        self.dataset: Any = None
        self.entry: dict[str, Any] | None = None
        self.done = False
        self.score = 0.0  # the reasoner's latest score

    # ---- Environment ------------------------------------------------------------------------

    def reset(self, task_id: str, seed: int, split: str) -> None:
        if self.source is None:
            raise InvalidArgument(
                "env reasoning_gym needs the option `dataset` (a reasoning-gym dataset name, "
                "e.g. basic_arithmetic)"
            )
        name, config_json = self.source
        offset = EVAL_SEED_OFFSET if split == "eval" else 0
        self.dataset = _dataset(name, config_json, self.data_seed + offset, self.sizes[split])
        self.entry = self.dataset[entry_index(seed, split, self.sizes[split])]
        self.done, self.score = False, 0.0
        self._start_turns()

    def observe(self, agent: str) -> list[Message]:
        self._check(agent)
        if self.entry is None:
            raise RuntimeError("reasoning_gym: observe() before reset()")
        multi = len(self.spec.turn_order) > 1
        role = (
            "You are the tool agent of a two-agent team (you and a reasoner): write a Python "
            "program that computes the answer."
            if agent == "tool"
            else "You are the reasoning agent of a two-agent team (you and a tool agent who writes "
            "programs): give the final answer."
            if multi
            else "Solve the task."
        )
        if agent == "tool":
            tail = [
                "Write the program in one ```python code block. It runs with Python 3 and its "
                "standard library only, without input. Print the final answer on the last line, or "
                "between <answer> and </answer> when it spans several lines."
            ]
        else:
            tail = [self._tool_report()] if "tool" in self.spec.turn_order else []
            tail.append(
                "Think step by step, then give only the final answer between <answer> and "
                "</answer>, in exactly the format the task asks for."
            )
        return self._prompt(role, [f"Task:\n{self.entry['question']}"], tail)

    def demonstration(self, agent: str) -> str | None:
        """The reasoner: the entry's reference answer in <answer> tags; the tool agent: a program
        computing it, for the datasets of TOOL_PROGRAMS (None for the others). None before reset
        and once the episode is over."""
        self._check(agent)
        if self.entry is None or self.done:
            return None
        if agent == "reasoner":
            answer = self.entry.get("answer")
            if not isinstance(answer, str) or not answer.strip():
                return None
            return f"<answer>{answer.strip()}</answer>"
        build = TOOL_PROGRAMS.get(self.source[0])
        program = build(self.dataset, self.entry) if build is not None else None
        return None if program is None else f"```python\n{program}\n```"

    @property
    def success(self) -> bool:
        """The reasoner's latest score is 1.0: the episode ends on it."""
        return self.done

    def _ready(self) -> bool:
        return self.entry is not None

    async def _act(self, agent: str, action: str) -> StepResult:
        return await (self._tool(action) if agent == "tool" else self._reasoner(action))

    def _team(self) -> float:
        return self.score

    # ---- agents -----------------------------------------------------------------------------

    async def _score(self, answer: str) -> tuple[float, dict[str, Any]]:
        """The answer's score and info; an answer the judge cannot score is a format failure
        (score 0, `judge_error` in info: its step pays failure_reward), never an exception."""
        try:
            check_bounds(answer, "the answer")
            name, config_json = self.source
            scorer = scorer_for(name, self.dataset)
            if scorer is None:
                if name in SYMPY_SCORED:
                    math_text(answer)  # sympy's parse_expr evals: plain mathematics only
                score = credit(
                    name,
                    await asyncio.to_thread(
                        WORKER.score, self.dataset, name, config_json, answer, self.entry
                    ),
                )
            else:
                score = _in_process(scorer, self.dataset, answer, self.entry)
        except JudgeError as e:
            return 0.0, failure_info(e)
        return score, {}

    async def _reasoner(self, action: str) -> StepResult:
        answer = reasoner_answer(action)
        if answer is None:
            return self._failed("reasoner", "gave no <answer>", {"parse_error": NO_ANSWER})
        self.score, info = await self._score(answer)
        self.done = self.score >= 1.0
        info.update(answer=_clip(answer, ANSWER_CHARS), score=self.score)
        self._record(
            "reasoner",
            f"answered {_clip(answer, 200)}"
            + ("" if self.done else " (not right)" + _unread(info)),
        )
        local = self.failure_reward if "judge_error" in info else self.score
        return StepResult(self.score, local, self.done, self.done, info)

    async def _tool(self, action: str) -> StepResult:
        ran = await self._run_tool(action, program_answer, {"score": 0.0})
        if isinstance(ran, StepResult):
            return ran
        run, answer = ran
        out, info = run.out, run.info
        out["answer"] = _clip(answer, ANSWER_CHARS)
        score, extra = await self._score(answer)
        info.update(extra, answer=out["answer"], score=score)
        self._record("tool", f"printed {_clip(answer, 200)}" + _unread(info))
        return StepResult(
            self.score, self.failure_reward if "judge_error" in info else score, False, False, info
        )

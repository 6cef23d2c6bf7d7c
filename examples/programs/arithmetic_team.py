"""The arithmetic team of the built-in `reasoning_gym` env, written as a plain agent program.

A tool agent writes a Python program for "Calculate 5 - 9." (reasoning-gym's basic_arithmetic,
two one-digit numbers, + and -: bench/real_learning.py's `arithmetic` task); the program runs in
the sandbox (`task.sandbox`, never here); the reasoner sees the tool's report and answers in
<answer></answer> tags. Prompts, parsing, tasks and rewards are the built-in env's
(env_svc/envs/reasoning_gym.py), so the two learn alike:

- team reward (returned): the judge's score of the reasoner's answer, 1.0 right or 0.0;
- tool (`task.reward`): its printed answer's score; 0 when it printed nothing; -1 for no
  ```python block, a crash or an answer the judge cannot read;
- reasoner: its score; -1 when it gave no readable answer.

Train it from the repository's root (needs `pip install 'atgrpo[programs,benchmarks]'`):

    atgrpo model tiny --out .atgrpo/models/tiny
    atgrpo train examples/programs/arithmetic_team_L1_tiny.yaml     # a CPU smoke run
    atgrpo train examples/programs/arithmetic_team_L1_smollm2.yaml  # the built-in's SmolLM2 run
"""

from __future__ import annotations

import functools

import reasoning_gym

from atgrpo.sdk.env import EVAL_SEED_OFFSET
from atgrpo.sdk.judge import JudgeError, check_bounds
from atgrpo.sdk.program import program_env

# The built-in env's own parsing and sandbox run, so the numbers match it exactly.
from env_svc.envs._text import clip, program_lines
from env_svc.envs.common import TOOL_LIMITS, run_tool
from env_svc.envs.reasoning_gym import entry_index, program_answer, reasoner_answer

FAILURE = -1.0  # the built-in envs' failure_reward
DATASET = "basic_arithmetic"
CONFIG = {  # bench/_learning_variants.py's arithmetic(1, ["+", "-"])
    "min_terms": 2,
    "max_terms": 2,
    "min_digits": 1,
    "max_digits": 1,
    "operators": ["+", "-"],
    "allow_parentheses": False,
    "allow_negation": False,
}
SIZES = {"train": 10_000, "eval": 64}  # the SmolLM2 config's train_size (default) and eval_size
DATA_SEED = 0

TOOL_ROLE = (
    "You are the tool agent of a two-agent team (you and a reasoner): write a Python program that "
    "computes the answer."
)
TOOL_ASK = (
    "Write the program in one ```python code block. It runs with Python 3 and its standard library "
    "only, without input. Print the final answer on the last line, or between <answer> and "
    "</answer> when it spans several lines."
)
REASONER_ROLE = (
    "You are the reasoning agent of a two-agent team (you and a tool agent who writes programs): "
    "give the final answer."
)
REASONER_ASK = (
    "Think step by step, then give only the final answer between <answer> and </answer>, in "
    "exactly the format the task asks for."
)


@functools.cache
def dataset(split: str):
    """reasoning-gym's dataset of a split, seeded as the built-in env seeds it."""
    seed = DATA_SEED + (EVAL_SEED_OFFSET if split == "eval" else 0)
    return reasoning_gym.create_dataset(DATASET, seed=seed, size=SIZES[split], **CONFIG)


def make_task(task_id: str, seed: int, split: str) -> dict:
    """The entry the built-in env picks for this seed: the same train and eval tasks."""
    return dataset(split)[entry_index(seed, split, SIZES[split])]


def judge(task, answer: str) -> float | None:
    """reasoning-gym's score of `answer`, paid as the built-in env pays it: 1.0 when right, else
    0.0 (no credit for a substring of the right answer); None when it cannot be read."""
    try:
        check_bounds(answer, "the answer")
    except JudgeError:
        return None
    # basic_arithmetic's scorer only compares strings; other datasets' scorers may eval the
    # answer, which must never run in this process (see env_svc/envs/rg_safe.py).
    return 1.0 if dataset(task.split).score_answer(answer, task.data) >= 1.0 else 0.0


def user(*parts: str) -> list[dict]:
    return [{"role": "user", "content": "\n\n".join(parts)}]


async def ask(client, role: str, messages: list[dict]) -> str:
    reply = await client.chat.completions.create(model=role, messages=messages)
    return reply.choices[0].message.content or ""


async def arithmetic_team(task, client) -> float:
    """The tool writes a program, the sandbox runs it, the reasoner answers."""
    head = "Turn 1 of 1."
    question = f"Task:\n{task.data['question']}"
    program = await ask(client, "tool", user(f"{TOOL_ROLE}\n{head}", question, TOOL_ASK))

    run = await run_tool(program, task.sandbox, TOOL_LIMITS, "arithmetic_team")  # the sandbox
    out = run.out
    if run.failure is not None:  # no ```python block, or it failed to run
        out["error"] = run.failure[1]
        task.reward("tool", FAILURE)
    elif (answer := program_answer(run.stdout)) is None:
        out["error"] = "the program printed nothing"
        task.reward("tool", 0.0)
    else:
        out["answer"] = clip(answer, 600)
        score = judge(task, answer)
        task.reward("tool", FAILURE if score is None else score)

    report = program_lines(out, "Its output", "Its errors")
    report.append(
        f"The tool agent's answer: {out['answer']}"
        if out["answer"] is not None
        else f"The tool agent gave no answer: {out['error']}"
    )
    said = await ask(
        client,
        "reasoner",
        user(f"{REASONER_ROLE}\n{head}", question, "\n".join(report), REASONER_ASK),
    )
    answer = reasoner_answer(said)
    score = None if answer is None else judge(task, answer)
    task.reward("reasoner", FAILURE if score is None else score)
    return score or 0.0  # the team reward: the reasoner's score (success at 1.0)


ArithmeticTeam = program_env(
    "arithmetic_team",
    arithmetic_team,
    agents=("tool", "reasoner"),
    max_turns=1,
    make_task=make_task,
    description="reasoning-gym arithmetic: a tool agent's program, then the reasoner's answer",
)

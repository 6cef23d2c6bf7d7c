"""A two-agent program written with the OpenAI Agents SDK (`openai-agents`), trained as it is.

A `solver` agent answers a sum ("What is 38 + 7?"); a `checker` agent sees the solver's answer
and gives the final one. Both are Agents SDK `Agent`s run with `Runner.run`, their model an
`OpenAIChatCompletionsModel` pointed at `task.base_url`: every model call the SDK makes reaches
atgrpo's interception server, and the policy of the role named by the model answers it. Tracing
is disabled, so nothing leaves the machine.

Rewards: each agent's own (`task.reward`): 1.0 when its answer holds the right sum as its last
number, else 0.0; the team reward (returned) is the checker's.

Train it from the repository's root (needs `pip install 'atgrpo[programs]'` and, as the
Makefile installs it, `pip install --no-deps openai-agents==0.24.0`):

    atgrpo model tiny --out .atgrpo/models/tiny
    atgrpo train examples/programs/agents_sdk_pair_L1_tiny.yaml
"""

from __future__ import annotations

import random
import re

from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
from openai import AsyncOpenAI

from atgrpo.sdk.program import program_env

set_tracing_disabled(True)  # the SDK would otherwise send traces to OpenAI


def make_task(task_id: str, seed: int, split: str) -> tuple[int, int]:
    """Two numbers to add, drawn from the task's seed (eval seeds are their own range)."""
    rng = random.Random(f"{split}:{seed}")
    return rng.randint(10, 99), rng.randint(1, 9)


def last_number(text: str) -> int | None:
    numbers = re.findall(r"-?\d+", text)
    return int(numbers[-1]) if numbers else None


def agent(name: str, instructions: str, base_url: str) -> Agent:
    """An Agents SDK agent whose model is the atgrpo role `name`, served at `base_url`."""
    client = AsyncOpenAI(base_url=base_url, api_key="unused")  # the loopback needs no key
    model = OpenAIChatCompletionsModel(model=name, openai_client=client)
    return Agent(name=name, instructions=instructions, model=model)


async def solve_and_check(task, client) -> float:
    """The solver answers, the checker corrects; the team is right when the checker is."""
    a, b = task.data
    solver = agent("solver", "You add numbers. Reply with the sum only.", task.base_url)
    checker = agent(
        "checker",
        "You check another agent's sum. Reply with the correct sum only.",
        task.base_url,
    )
    solved = await Runner.run(solver, f"What is {a} + {b}?")
    said = str(solved.final_output)
    task.reward("solver", 1.0 if last_number(said) == a + b else 0.0)
    checked = await Runner.run(checker, f"What is {a} + {b}? The solver says: {said}")
    right = 1.0 if last_number(str(checked.final_output)) == a + b else 0.0
    task.reward("checker", right)
    return right


AgentsPair = program_env(
    "agents_sdk_pair",
    solve_and_check,
    agents=("solver", "checker"),
    max_turns=1,
    make_task=make_task,
)

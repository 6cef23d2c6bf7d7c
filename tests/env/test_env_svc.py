"""env_svc and sandbox_svc as real processes (started by the local launcher): the built-in
environments over gRPC, with the tool agent's code running in the sandbox service."""

import asyncio

from atgrpo.sdk.client import EnvClient
from tests.env.planning_solvers import PATH_SOLVER
from tests.env.test_planning_envs import plan_answer


def test_builtins_are_listed_and_described(env_address):
    async def go():
        async with EnvClient(env_address) as c:
            specs = {s.name: s for s in await c.list_envs()}
            assert {"toy", "plan_path", "sokoban", "sudoku"} <= set(specs)
            assert specs["sokoban"].turn_order == ("tool", "plan")
            assert (await c.describe("sudoku")).agents == ("tool", "plan")

    asyncio.run(go())


def test_tool_code_runs_in_the_sandbox_service_and_reaches_the_plan_prompt(env_address):
    async def go():
        async with EnvClient(env_address) as c:
            ep, _ = await c.reset("plan_path", "t", seed=5, split="train", options={"grid_size": 6})
            tool = await c.step(ep, "tool", f"Here is my solver.\n```python\n{PATH_SOLVER}\n```")
            assert tool.local_reward > 0, tool.info
            prompt, turn = await c.observe(ep, "plan")
            assert turn == 0 and "Actions List" in prompt[-1]["content"]
            hostile = await c.step(
                (await c.fork(ep, 1))[0], "tool", "```python\nwhile True: pass\n```"
            )
            assert hostile.local_reward < 0 and hostile.info.get("exec_error")
            bad = await c.step(ep, "plan", "I would go up")
            assert bad.local_reward < 0 and "parse_error" in bad.info
            bad2 = await c.step(ep, "plan", plan_answer(["X"]))
            assert bad2.local_reward < 0

    asyncio.run(go())


def test_humaneval_problems_are_judged_by_their_check_in_the_sandbox_service(env_address):
    async def go():
        async with EnvClient(env_address) as c:
            ep, spec = await c.reset(
                "code", "humaneval-53", seed=0, split="eval", options={"dataset": "humaneval"}
            )
            assert spec.turn_order == ("coder", "tester")
            prompt, _ = await c.observe(ep, "coder")
            assert "def add(x: int, y: int):" in prompt[-1]["content"]
            wrong = await c.step(
                (await c.fork(ep, 1))[0], "coder", "```python\n    return x - y\n```"
            )
            assert (
                not wrong.success
                and wrong.local_reward == 0.0
                and "AssertionError" in wrong.info["error"]
            )
            right = await c.step(
                ep, "coder", "```python\ndef add(x: int, y: int):\n    return x + y\n```"
            )
            assert right.success and right.team_reward == 1.0

    asyncio.run(go())

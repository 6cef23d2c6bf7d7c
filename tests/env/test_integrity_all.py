"""Every built-in environment against the same hostile texts, through the env host (what env_svc
serves), on both isolated sandbox backends: each step returns a score with finite rewards, within
seconds, and never raises.

The per-env suites (test_integrity_code.py, _math, _planning, _reasoning_gym) try the judges'
own holes; this one makes sure no env was left out of the general rules: bounded parsers, linear
scans, and a judge error reported as a format failure (counted in atgrpo_env_judge_errors_total).
"""

import asyncio
import math
import time

import pytest

from atgrpo.sdk.host import EnvHost
from atgrpo.sdk.inprocess import LocalEnvs
from atgrpo.sdk.registry import Registry
from env_svc.envs import BUILTIN

DEEP = "[" * 10_000 + "]" * 10_000
HOSTILE = {
    "deep list": f"#### {DEEP}\n<answer>{DEEP}</answer>\n\\boxed{{{DEEP}}}",
    "deep braces": "\\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}",
    "exponent tower": "<answer>9**9**9**9</answer> \\boxed{9^{9^{9^{9}}}} #### [9**9**9**9]",
    "huge integer": "\\boxed{" + "9" * 100_000 + "} <answer>" + "9" * 100_000 + "</answer>",
    "megabyte": "x" * ((1 << 20) - 64),
    "long spaces": "test" + " " * 500_000 + "input",
    "code that prints a deep list": "```python\nprint('**Actions List**: ' + '[' * 100000 + ']' * "
    "100000)\nprint('<answer>' + '[' * 100000 + '</answer>')\n```",
    "code that prints a tower": "```python\nprint('**Actions List**: "
    "[9**9**9**9]')\nprint('9**9**9**9')\n```",
    "code equal to everything": "```python\nclass E:\n    def __eq__(self, o): return "
    "True\nprint(E())\n```",
}
ENVS = {
    "toy": {},
    "plan_path": {},
    "sokoban": {},
    "sudoku": {},
    "code": {},
    "math": {},
    "reasoning_gym": {"dataset": "basic_arithmetic"},
}


@pytest.mark.parametrize("env", sorted(ENVS))
def test_hostile_text_scores_and_never_raises(env, isolated_sandbox):
    async def go():
        envs = LocalEnvs(EnvHost(Registry(BUILTIN, discover=False), sandbox=isolated_sandbox))
        slow = {}
        for name, text in HOSTILE.items():
            ep, spec = await envs.reset(env, "0", seed=0, split="train", options=ENVS[env])
            for agent in spec.turn_order:
                t = time.monotonic()
                r = await envs.step(ep, agent, text)
                took = time.monotonic() - t
                assert math.isfinite(r.team_reward) and math.isfinite(r.local_reward), (
                    name,
                    agent,
                    r,
                )
                # Nothing here is right (the toy relay reads the first symbol said, and a text may
                # happen to hold the secret: it is a learning check, not a judge).
                assert env == "toy" or (r.local_reward <= 0.0 and r.team_reward <= 0.0), (
                    name,
                    agent,
                    r,
                )
                if took > 10:
                    slow[(name, agent)] = took
                if r.done:
                    break
            await envs.close_episodes([ep])
        assert not slow, slow

    asyncio.run(go())

"""A scripted engine and a number-picking environment that make the tree driver's choices
predictable, and a Collect plan over that environment (pick_plan). The engine is a fake, on
purpose: it pins the driver's rules, not generation."""

import asyncio

from atgrpo.contract.rollout import (
    AgentPlan,
    CollectPlan,
    Completion,
    Generation,
    PolicyRef,
    TaskRef,
)
from atgrpo.contract.sampling import Sampling
from atgrpo.sdk import Environment, EnvSpec, StepResult


class ScriptedEngine:
    """Answers each agent with texts from `script(agent, messages, n, call_index)`."""

    def __init__(self, script):
        self.script = script
        self.calls = []  # (agent, messages, n)
        self.in_flight = self.max_in_flight = 0

    async def generate(self, agent: AgentPlan, messages, n: int) -> Generation:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(0.001)
        texts = self.script(agent.name, messages, n, len(self.calls))
        self.calls.append((agent.name, messages, n))
        self.in_flight -= 1
        prompt = [ord(c) for c in messages[-1]["content"]][:50]
        return Generation(
            prompt,
            [Completion([ord(c) for c in t], [-0.5] * len(t), t, "stop") for t in texts],
            PolicyRef(agent.pool, agent.adapter, 7),
        )


class PickEnv(Environment):
    """Agents pick digits; team reward = the digit / 10; done (and success) when one picks 9.
    Each prompt lists the digits kept so far, so a later agent's prompt shows earlier choices."""

    name = "pick"

    def __init__(self, options=None):
        super().__init__(options)
        self.spec = EnvSpec(
            "pick",
            ("a", "b"),
            ("a", "b"),
            max_turns=self.options.get("max_turns", 3),
            parallel=self.options.get("parallel", False),
        )
        self.kept = []

    def reset(self, task_id, seed, split):
        if task_id == "explode":
            raise RuntimeError("this task cannot start")

    def observe(self, agent):
        return [{"role": "user", "content": f"{agent} sees {self.kept}"}]

    def step(self, agent, action):
        if not action.isdigit():
            return StepResult(0.0, -1.0, info={"parse_error": "not a digit"})
        self.kept.append((agent, int(action)))
        return StepResult(int(action) / 10, 0.0, done=action == "9", success=action == "9")


def pick_plan(**kw) -> CollectPlan:
    """A tree Collect of PickEnv through a real engine: 2 tasks, agents a then b on pool "p"
    sampling 4 tokens at temperature 1, 2 turns, K 3; `kw` replaces any field."""
    agents = {
        n: AgentPlan(n, "p", sampling=Sampling(temperature=1.0, max_tokens=4)) for n in ("a", "b")
    }
    fields = dict(
        run_id="r",
        step=1,
        env="pick",
        turn_order=("a", "b"),
        max_turns=2,
        k=3,
        alpha=1.0,
        tasks=tuple(TaskRef(f"t{i}", i, episode=i + 1) for i in range(2)),
        agents=agents,
    )
    return CollectPlan(**{**fields, **kw})

"""`twin`: the parallel toy of bench/parallel_credit.py. Two roles, `left` and `right`, each told
the same secret digit (prompt `left: the secret is 3`), answer at once (a parallel turn, one
turn); the team wins only when both name the secret (the first of the digits 1-4 in a text is
what it names). Every reward is the team's (1 or 0), local rewards are 0: how a role's answer is
credited is all that AT-GRPO's update sees of it."""

from atgrpo.sdk import Environment, EnvSpec, StepResult, task_rng

SYMBOLS = "1234"
ROLES = ("left", "right")


def named(text: str) -> str | None:
    return next((c for c in text if c in SYMBOLS), None)


class TwinEnv(Environment):
    name = "twin"

    def __init__(self, options=None):
        super().__init__(options)
        self.spec = EnvSpec(self.name, ROLES, ROLES, max_turns=1, parallel=True)
        self.secret, self.pending = "", {}

    def reset(self, task_id, seed, split):
        self.secret = task_rng(split, seed).choice(SYMBOLS)

    def observe(self, agent):
        return [{"role": "user", "content": f"{agent}: the secret is {self.secret}"}]

    def step(self, agent, action):
        self.pending[agent] = named(action)
        info = {"symbol": self.pending[agent], "secret": self.secret}
        if len(self.pending) < len(ROLES):
            return StepResult(0.0, 0.0, info=info)
        won = all(s == self.secret for s in self.pending.values())
        return StepResult(float(won), 0.0, done=True, success=won, info=info)

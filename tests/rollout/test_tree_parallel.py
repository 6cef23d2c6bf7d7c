"""Parallel turns as joint actions (DESIGN.md §1; issue 17), hand-worked with a scripted engine.

MaxDigitEnv: three roles each hold a digit (a 3, b 7, c 5, so the maximum is 7). In a turn each
role says a digit; its local reward is 1 when its answer is the maximum, else 0; the team reward,
reported by the turn's last step, is 1 when all three said the maximum (done, success), else 0.
With alpha = 1 a branch's joint score is 3 * team + the number of roles that said 7.
"""

import asyncio

from atgrpo.contract.rollout import AgentPlan, CollectPlan, EpisodeEnd, Sample, TaskRef
from atgrpo.sdk import Environment, EnvSpec, StepResult
from atgrpo.sdk.host import EnvHost
from atgrpo.sdk.inprocess import LocalEnvs
from atgrpo.sdk.registry import Registry
from rollout_svc.tree import collect
from tests.rollout.scripted import ScriptedEngine

ROLES = ("a", "b", "c")
DIGITS = {"a": 3, "b": 7, "c": 5}


class MaxDigitEnv(Environment):
    """The team wins when all three roles say the largest digit any of them holds. A role that
    says "0" gives up: the episode ends there, unsuccessfully (option `give_up`)."""

    name = "max_digit"

    def __init__(self, options=None):
        super().__init__(options)
        self.spec = EnvSpec(
            self.name, ROLES, ROLES, max_turns=self.options.get("max_turns", 3), parallel=True
        )
        self.history: list[dict[str, int]] = []  # each completed turn's answers
        self.turn: dict[str, int] = {}  # this turn's answers so far

    def reset(self, task_id, seed, split):
        pass

    def observe(self, agent):
        return [
            {
                "role": "user",
                "content": f"{agent} holds {DIGITS[agent]}; answers so far {self.history}",
            }
        ]

    def step(self, agent, action):
        before = list(self.turn)  # who acted before this agent in this turn
        self.turn[agent] = int(action)
        local = 1.0 if int(action) == max(DIGITS.values()) else 0.0
        info = {"before": before}
        if action == "0" and self.options.get("give_up"):
            return StepResult(0.0, local, done=True, info=info)
        if len(self.turn) < len(ROLES):
            return StepResult(0.0, local, info=info)  # mid-turn: no team reward yet
        won = all(v == max(DIGITS.values()) for v in self.turn.values())
        self.history.append(self.turn)
        self.turn = {}
        return StepResult(1.0 if won else 0.0, local, done=won, success=won, info=info)


class CountingEnvs(LocalEnvs):
    """LocalEnvs that records every fork and every StepMany."""

    def __init__(self, host):
        super().__init__(host)
        self.forks, self.step_calls = [], []

    async def fork(self, episode_id, n):
        self.forks.append(n)
        return await super().fork(episode_id, n)

    async def step_many(self, steps):
        self.step_calls.append([(agent, action) for _, agent, action in steps])
        return await super().step_many(steps)


def envs():
    r = Registry(discover=False)
    r.register(MaxDigitEnv)
    return CountingEnvs(EnvHost(r))


def plan(**kw):
    base = dict(
        env="max_digit",
        tasks=(TaskRef("t0", 0, episode=1),),
        agents={n: AgentPlan(n, "p") for n in ROLES},
        turn_order=ROLES,
        max_turns=1,
        k=3,
        parallel=True,
    )
    base.update(kw)
    return CollectPlan(**base)


def scripted(turns):
    """A ScriptedEngine answering each agent with turns[turn][agent] (one text per branch); the
    turn is read off the prompt (the number of completed turns it shows)."""
    return ScriptedEngine(
        lambda agent, msgs, n, i: turns[msgs[-1]["content"].count("{")][agent][:n]
    )


def run(p, engine, env_api):
    async def go():
        return [e async for e in collect(p, env_api, engine)]

    events = asyncio.run(go())
    return [e for e in events if isinstance(e, Sample)], [
        e for e in events if isinstance(e, EpisodeEnd)
    ]


def by_agent(samples, agent, field):
    return [getattr(s, field) for s in samples if s.agent == agent]


def test_the_turns_team_reward_reaches_every_agents_sample_and_the_best_joint_branch_goes_on():
    #            branch 0    branch 1    branch 2
    # answers    7, 7, 5     3, 7, 7     7, 7, 7
    # team       0           0           1
    # locals     1, 1, 0     0, 1, 1     1, 1, 1
    # joint sum  2           2           6        -> branch 2
    env_api = envs()
    engine = scripted([{"a": ["7", "3", "7"], "b": ["7", "7", "7"], "c": ["5", "7", "7"]}])
    samples, (end,) = run(plan(), engine, env_api)
    assert len(samples) == 9
    for agent in ROLES:
        assert by_agent(samples, agent, "branch") == [0, 1, 2]
        assert by_agent(samples, agent, "turn") == [0, 0, 0]
        assert by_agent(samples, agent, "team_reward") == [0.0, 0.0, 1.0]  # a's too, not only c's
        assert by_agent(samples, agent, "selected") == [False, False, True]
        assert (
            by_agent(samples, agent, "done")
            == by_agent(samples, agent, "success")
            == [False, False, True]
        )
        # one group, one prompt
        assert len({tuple(s.prompt_ids) for s in samples if s.agent == agent}) == 1
    assert by_agent(samples, "a", "local_reward") == [1.0, 0.0, 1.0]
    assert by_agent(samples, "b", "local_reward") == [1.0, 1.0, 1.0]
    assert by_agent(samples, "c", "local_reward") == [0.0, 1.0, 1.0]
    # Within a branch the steps go in turn order: c acts after a and b on every branch.
    assert by_agent(samples, "c", "info") == [{"before": ["a", "b"]}] * 3
    assert end.success and end.turns == 1
    # alpha * 1 + 1 each, on the kept branch
    assert end.agent_rewards == {
        "a": 2.0,
        "b": 2.0,
        "c": 2.0,
    }
    assert len(env_api.host.store) == 0


def test_a_tie_in_the_joint_sum_goes_to_the_lowest_index():
    # answers 3,7,3 | 7,7,5 | 7,7,5 -> sums 1, 2, 2 -> branch 1
    engine = scripted([{"a": ["3", "7", "7"], "b": ["7", "7", "7"], "c": ["3", "5", "5"]}])
    samples, (end,) = run(plan(), engine, envs())
    assert all(s.selected == (s.branch == 1) for s in samples)
    assert all(s.team_reward == 0.0 for s in samples)
    assert end.agent_rewards == {"a": 1.0, "b": 1.0, "c": 0.0} and not end.success


def test_forks_are_made_once_per_turn_from_the_pre_turn_state():
    # Turn 0: 7,3,5 | 7,7,3 | 3,7,7 -> sums 1, 2, 2 -> branch 1 (a 7, b 7, c 3). Turn 1 wins on
    # branch 0.
    env_api = envs()
    engine = scripted(
        [
            {"a": ["7", "7", "3"], "b": ["3", "7", "7"], "c": ["5", "3", "7"]},
            {"a": ["7", "3", "3"], "b": ["7", "7", "7"], "c": ["7", "7", "7"]},
        ]
    )
    samples, (end,) = run(plan(max_turns=3), engine, env_api)
    assert env_api.forks == [3, 3]  # one K-way fork per turn
    # One n=K generation per agent per turn, all three agents at once.
    assert [(agent, n) for agent, _, n in engine.calls] == [(r, 3) for r in ROLES] * 2
    assert engine.max_in_flight == 3
    prompts = [m[-1]["content"] for _, m, _ in engine.calls]
    assert prompts[:3] == [
        "a holds 3; answers so far []",
        "b holds 7; answers so far []",
        "c holds 5; answers so far []",
    ]
    kept = "[{'a': 7, 'b': 7, 'c': 3}]"  # turn 0's kept branch, whole
    assert prompts[3:] == [
        f"a holds 3; answers so far {kept}",
        f"b holds 7; answers so far {kept}",
        f"c holds 5; answers so far {kept}",
    ]
    # One StepMany per agent per turn, over the K branches, in turn order.
    assert [{agent for agent, _ in call} for call in env_api.step_calls] == [
        {"a"},
        {"b"},
        {"c"},
    ] * 2
    assert [len(call) for call in env_api.step_calls] == [3] * 6
    assert [s.selected for s in samples if s.turn == 0 and s.agent == "a"] == [False, True, False]
    assert [s.selected for s in samples if s.turn == 1 and s.agent == "a"] == [True, False, False]
    assert end.success and end.turns == 2
    assert end.agent_rewards == {"a": 1.0 + 2.0, "b": 1.0 + 2.0, "c": 0.0 + 2.0}
    assert len(env_api.host.store) == 0  # the forks not kept were closed


def test_episodes_that_never_finish_leave_nothing_behind():
    env_api = envs()
    engine = scripted([{r: ["1", "2"] for r in ROLES}] * 2)
    samples, (end,) = run(plan(max_turns=2, k=2), engine, env_api)
    assert len(samples) == 2 * 3 * 2 and end.turns == 2 and not end.success
    assert env_api.forks == [2, 2] and len(env_api.host.store) == 0


def test_selection_first_keeps_branch_zero():
    # Branch 2 wins the turn, but "first" keeps branch 0; the next turn starts from its answers.
    env_api = envs()
    turn = {"a": ["3", "3", "7"], "b": ["7", "7", "7"], "c": ["5", "7", "7"]}
    engine = scripted([turn, turn])
    samples, (end,) = run(plan(max_turns=2, selection="first"), engine, env_api)
    assert all(s.selected == (s.branch == 0) for s in samples)
    assert [s.team_reward for s in samples if s.agent == "a"] == [0.0, 0.0, 1.0] * 2
    assert (
        engine.calls[3][1][-1]["content"] == "a holds 3; answers so far [{'a': 3, 'b': 7, 'c': 5}]"
    )
    assert end.turns == 2 and not end.success
    assert end.agent_rewards == {"a": 0.0, "b": 2.0, "c": 0.0}
    assert len(env_api.host.store) == 0


def test_flat_mode_plays_one_joint_branch_without_forks():
    env_api = envs()
    engine = scripted([{r: ["7"] for r in ROLES}])
    samples, (end,) = run(plan(mode="flat", k=8, selection="first"), engine, env_api)
    assert env_api.forks == [] and all(n == 1 for _, _, n in engine.calls)
    assert [(s.agent, s.branch, s.team_reward, s.local_reward, s.selected) for s in samples] == [
        (r, 0, 1.0, 1.0, True) for r in ROLES
    ]
    assert end.success and end.agent_rewards == {"a": 2.0, "b": 2.0, "c": 2.0}
    assert len(env_api.host.store) == 0


def test_a_step_that_ends_the_turn_early_skips_the_later_agents_on_that_branch_only():
    # Branch 0: a gives up ("0"): done there, b and c take no step. Branch 1 plays the whole turn.
    env_api = envs()
    engine = scripted([{"a": ["0", "7"], "b": ["7", "7"], "c": ["7", "5"]}])
    samples, (end,) = run(plan(k=2, env_options={"give_up": True}), engine, env_api)
    assert [len(call) for call in env_api.step_calls] == [2, 1, 1]
    assert by_agent(samples, "b", "info") == [
        {"skipped": "the turn ended on this branch before this agent acted"},
        {"before": ["a"]},
    ]
    assert by_agent(samples, "c", "local_reward") == [0.0, 0.0]
    assert by_agent(samples, "b", "done") == [True, False]
    # sums: branch 0 = 0 (a's 0), branch 1 = 1 + 1 + 0 = 2 -> branch 1; no one won, the episode goes
    # on.
    assert by_agent(samples, "a", "selected") == [False, True]
    assert not end.success and end.turns == 1
    assert len(env_api.host.store) == 0


def test_sequential_plans_still_fork_per_agent():
    env_api = envs()
    run(plan(parallel=False), scripted([{r: ["7", "7", "7"] for r in ROLES}]), env_api)
    assert env_api.forks == [3, 3, 3] and len(env_api.host.store) == 0


# ---- algorithm.parallel_credit: all_pairs -------------------------------------------------------


class SumToSeven(Environment):
    """Roles `roles` (option) each say a digit at once; the team wins when they add up to 7. The
    last step of a turn resolves it; every local reward is 0, so credit is all team reward."""

    name = "sum_to_seven"

    def __init__(self, options=None):
        super().__init__(options)
        roles = tuple(self.options.get("roles", ["a", "b"]))
        self.spec = EnvSpec(self.name, roles, roles, max_turns=1, parallel=True)
        self.pending: dict[str, int] = {}

    def reset(self, task_id, seed, split):
        pass

    def observe(self, agent):
        return [{"role": "user", "content": f"{agent}: say a digit"}]

    def step(self, agent, action):
        self.pending[agent] = int(action)
        if len(self.pending) < len(self.spec.turn_order):
            return StepResult(0.0, 0.0)
        won = sum(self.pending.values()) == 7
        return StepResult(float(won), 0.0, done=True, success=won)


def seven_envs():
    r = Registry(discover=False)
    r.register(SumToSeven)
    return CountingEnvs(EnvHost(r))


def seven_plan(roles=("a", "b"), **kw):
    return plan(
        env="sum_to_seven",
        agents={n: AgentPlan(n, "p") for n in roles},
        turn_order=roles,
        env_options={"roles": list(roles)},
        **kw,
    )


def answers(by_agent):
    return ScriptedEngine(lambda agent, msgs, n, i: by_agent[agent][:n])


def test_all_pairs_credits_each_answer_with_its_mean_over_every_partner_answer():
    """a says 3, 4, 5 and b says 3, 4, 9: no same-index pair adds up to 7, so paired credit
    scores every sample 0 (no signal); a's 3 with b's 4 and a's 4 with b's 3 do. Each answer meets
    the partner's three: a's 3 and 4 and b's 3 and 4 win once in three (1/3), 5 and 9 never. The
    best joint action goes on: the first that won, in order diagonal (0,0) (1,1) (2,2), then
    offset 1 (0,1) (1,2) (2,0): a's branch 0 with b's branch 1."""
    script = {"a": ["3", "4", "5"], "b": ["3", "4", "9"]}
    paired, (paired_end,) = run(seven_plan(), answers(script), seven_envs())
    assert {s.team_reward for s in paired} == {0.0} and not paired_end.success

    env_api = seven_envs()
    samples, (end,) = run(seven_plan(parallel_credit="all_pairs"), answers(script), env_api)
    assert env_api.forks == [9]  # 3 x 3 joint actions, one fork each
    third = 1 / 3
    assert by_agent(samples, "a", "team_reward") == [third, third, 0.0]
    assert by_agent(samples, "b", "team_reward") == [third, third, 0.0]
    assert by_agent(samples, "a", "selected") == [True, False, False]
    assert by_agent(samples, "b", "selected") == [False, True, False]
    assert end.success and end.agent_rewards == {"a": 1.0, "b": 1.0}  # the kept joint action won
    # done, success and the paired figure stay those of the answer's own (diagonal) joint action
    assert by_agent(samples, "a", "success") == [False, False, False]
    assert [s.info["credit_joint_actions"] for s in samples] == [3] * 6
    assert [s.info["paired_team_reward"] for s in samples] == [0.0] * 6


def test_all_pairs_equals_paired_on_single_role_turns():
    script = {"a": ["3", "7", "1"]}
    runs = []
    for credit in ("paired", "all_pairs"):
        env_api = seven_envs()
        samples, ends = run(seven_plan(("a",), parallel_credit=credit), answers(script), env_api)
        ends = [(e.task_id, e.success, e.turns, e.agent_rewards) for e in ends]  # not the timing
        runs.append((samples, ends, env_api.forks, env_api.step_calls))
    assert runs[0] == runs[1]
    assert [s.team_reward for s in runs[0][0]] == [0.0, 1.0, 0.0]


def test_all_pairs_with_three_roles_scores_k_balanced_combinations_per_answer():
    """Three roles, K = 3: the diagonal plus K - 1 of the 8 nonzero offset vectors, each giving 3
    joint actions in which every answer of every agent appears once: 9 joint actions, and each
    answer is credited over exactly 3 of them. The draw is the tree's own: the same again."""
    roles = ("a", "b", "c")
    script = {"a": ["1", "2", "3"], "b": ["2", "3", "4"], "c": ["4", "2", "0"]}
    firsts = []
    for _ in range(2):
        env_api = seven_envs()
        samples, _ = run(seven_plan(roles, parallel_credit="all_pairs"), answers(script), env_api)
        assert env_api.forks == [9]
        assert [s.info["credit_joint_actions"] for s in samples] == [3] * 9
        # each agent's step calls cover every joint action, its answers 3 times each
        for agent, call in zip(roles, env_api.step_calls, strict=True):
            assert sorted(action for _, action in call) == sorted(script[agent] * 3)
        firsts.append([s.team_reward for s in samples])
    assert firsts[0] == firsts[1]

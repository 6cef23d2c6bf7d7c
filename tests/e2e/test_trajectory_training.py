"""Trajectory-level GRPO (algorithm.grouping: trajectory) end to end: the five services as real
processes, the tiny model, a toy L1 run of two steps. Checks the step events and the samples as the
router grouped them: per (task, agent) K copies, each copy's samples sharing one return and one
advantage, the copies' advantages centred over copies (not over samples)."""

from __future__ import annotations

import json
import math
from collections import defaultdict

import pytest

from tests.e2e.toy_runs import K, toy_config, train_locally

pytestmark = pytest.mark.slow


def test_trajectory_grouping_trains_on_k_copies_per_task(tiny_model, tmp_path):
    data = toy_config(tmp_path / "run", tiny_model, "L1", tasks_per_step=2)
    data["algorithm"]["grouping"] = "trajectory"
    sink, served = train_locally(data)

    steps = [e for e in sink.events if e["kind"] == "step"]
    assert [e["step"] for e in steps] == [1, 2]
    assert served == {("a", ""): 2}
    for e in steps:
        assert e["pools"]["a"]["version"] == e["step"]
        lines = (
            (tmp_path / "run" / "samples" / f"step-{e['step']:06d}.jsonl").read_text().splitlines()
        )
        copies = defaultdict(list)  # (task, agent) -> branch -> samples
        for s in map(json.loads, lines):
            copies[(s["task_id"], s["agent"], s["branch"])].append(s)
            assert s["selected"] and s["policy"]["version"] == e["step"] - 1
        groups = defaultdict(dict)
        for (task, agent, branch), mine in copies.items():
            groups[(task, agent)][branch] = mine
            # One copy is one episode: turns 0..n-1 once each, one return and one advantage.
            assert [s["turn"] for s in mine] == list(range(len(mine))) and len(mine) <= 2
            assert (
                len({s["reward"] for s in mine}) == 1 and len({s["advantage"] for s in mine}) == 1
            )
            assert all(math.isfinite(s["advantage"]) for s in mine)
        assert len(groups) == 2 * 2  # 2 tasks x 2 agents
        per_agent = defaultdict(int)
        for (_, agent, _), mine in copies.items():
            per_agent[agent] += len(mine)
        # the step event counts what was trained
        assert e["pools"]["a"]["agents"] == dict(per_agent)
        for by_branch in groups.values():
            # the speaker acts in every copy; toy: so does the listener
            assert sorted(by_branch) == list(range(K))
            # centred over copies
            assert abs(sum(c[0]["advantage"] for c in by_branch.values())) < 1e-5

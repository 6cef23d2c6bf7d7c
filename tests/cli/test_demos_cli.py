"""The supervised warm start: `atgrpo model demos` plays train episodes with the env's own solver
(Environment.demonstration) and writes each agent's prompt and answer; `atgrpo model teach
--demos` fine-tunes a real (tiny) model on them, on the prompt the rollout renders."""

import asyncio
import json
import random

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from atgrpo.cli import main
from atgrpo.models.chat import chat_tokens
from atgrpo.models.sft import IGNORE, answer_loss, batch_backward, batches, sft
from atgrpo.sdk import demos
from atgrpo.sdk.host import EnvHost
from atgrpo.sdk.registry import registry_for
from tests.env.sdk_envs import CounterEnv

HERE = "tests.cli.test_demos_cli"


class SolvedCounter(CounterEnv):
    """CounterEnv whose agent a knows the way: 2 a turn, then what is left; b adds 0 until the
    last step. With `overshoot`, a adds one too many on odd targets (those episodes fail)."""

    name = "solved_counter"

    def demonstration(self, agent):
        left = self.target - self.total
        if agent == "b":
            return "0"
        step = min(2, left) + (self.options.get("overshoot", 0) if self.target % 2 else 0)
        return str(step)


class HalfSolved(CounterEnv):
    """Only agent a has a demonstration; b needs the user's solver."""

    name = "half_solved"

    def demonstration(self, agent):
        return "1" if agent == "a" else None


def zero(agent, messages):  # a solver for the CLI's --solver
    return "0"


def play(env, options=None, episodes=6, solver=None):
    name, registry = registry_for(env)
    return asyncio.run(demos.play(EnvHost(registry), name, options or {}, episodes, solver=solver))


def test_each_agents_prompt_and_answer_are_kept_turn_by_turn():
    rows, stats = play(SolvedCounter, {"max_turns": 5})
    assert (stats.episodes, stats.kept) == (6, 6)
    first = [r for r in rows if r.task_id == rows[0].task_id]
    # target t in 5..9: a adds 2 a turn (or what is left) and b 0, so ceil(t / 2) turns
    target = int(first[0].messages[0]["content"].split("target ")[1].split(",")[0])
    assert [r.agent for r in first] == ["a", "b"] * (-(-target // 2)) or first[-1].agent == "a"
    assert sum(int(r.response) for r in first) == target
    assert first[0].messages[0]["content"].startswith("a: total 0")
    assert first[1].messages[0]["content"].startswith(f"b: total {first[0].response}")
    assert [r.turn for r in first[:4]] == [0, 0, 1, 1]


def test_only_episodes_that_succeed_are_written():
    rows, stats = play(SolvedCounter, {"max_turns": 5, "overshoot": 1}, episodes=12)
    odd = {r.task_id for r in rows if "target 5" in r.messages[0]["content"]}
    assert stats.kept < stats.episodes and not odd  # odd targets overshoot and are dropped
    assert stats.demos == len(rows) > 0


def test_an_agent_without_a_demonstration_takes_the_solver_or_is_named():
    rows, _ = play(HalfSolved, {"max_turns": 9}, solver=zero)
    assert {(r.agent, r.response) for r in rows} == {("a", "1"), ("b", "0")}
    with pytest.raises(demos.NoDemonstration, match="no demonstration for agent 'b'"):
        play(HalfSolved)


def test_the_cli_writes_demos_that_teach_reads_and_refuses_bad_ones(tmp_path, capsys):
    out = tmp_path / "demos.jsonl"
    env = f"{HERE}:HalfSolved"
    argv = ["model", "demos", "--env", env, "--episodes", "3", "--out", str(out)]
    assert main(argv) == 2 and "give a solver" in capsys.readouterr().err
    assert main([*argv, "--options", '{"max_turns": 9}', "--solver", f"{HERE}:zero"]) == 0
    assert "from 3 of 3 episodes" in capsys.readouterr().out
    assert len(demos.read(out)) == len(out.read_text().splitlines())

    bad = tmp_path / "bad.jsonl"
    bad.write_text(out.read_text().splitlines()[0] + '\n{"agent": "a", "response": 3}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2: write"):
        demos.read(bad)
    teach = ["model", "teach", "--base", "x", "--demos", str(bad), "--out", str(tmp_path / "m")]
    assert main(teach) == 2 and "bad.jsonl:2" in capsys.readouterr().err


def test_batches_mask_the_prompt_and_the_padding_and_show_each_row_once():
    rows = [([7] * p + [1] * a, p) for p, a in [(3, 2), (5, 1), (2, 4), (4, 3), (1, 1)]]
    seen = []
    for ids, mask, labels in batches(rows, 2, random.Random(0), pad=0):
        for i in range(ids.shape[0]):
            n = int(mask[i].sum())
            kept = [t for t in labels[i].tolist() if t != IGNORE]
            assert kept == [1] * len(kept) and ids[i, n:].eq(0).all()
            assert labels[i, :n].tolist().count(IGNORE) == ids[i, :n].tolist().count(7)
            seen.append((n, len(kept)))
    assert sorted(seen) == sorted((len(r), len(r) - p) for r, p in rows)


def test_the_answer_loss_is_the_models_own_labelled_loss_and_gradient(tiny_model):
    """Logits only at the answer's positions: the same loss and gradient as the model's own
    `labels=` loss over every position."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    rows = [([5, 6, 7, 8, 9, 10, 11], 4), ([12, 13, 14, 15, 16], 2), ([17, 18, 19], 1)]
    ids, mask, labels = batches(rows, 3, random.Random(0), pad=0)[0]
    got = answer_loss(model, ids, mask, labels)
    got.backward()
    mine = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    want = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    want.backward()
    torch.testing.assert_close(got, want)
    for a, p in zip(mine, model.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad, rtol=1e-4, atol=1e-6)
    # one row at a time, each cut to its own length: the batch's mean and gradient again
    model.zero_grad()
    assert batch_backward(model, ids, mask, labels, 1, bf16=False) == pytest.approx(want.item())
    for a, p in zip(mine, model.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad, rtol=1e-4, atol=1e-6)


def test_fine_tuning_teaches_the_tiny_model_its_demonstrations(tiny_model, tmp_path):
    rows, _ = play(SolvedCounter, {"max_turns": 5}, episodes=4)
    rows = [r for r in rows if r.agent == "a"]
    stats = sft(tiny_model, tmp_path / "m", rows, epochs=40, lr=2e-3, batch_size=4)
    assert stats.loss_last < stats.loss_first / 5 and stats.examples == len(rows)
    right = [r.response for r in rows]
    taught = [a == b for a, b in zip(greedy(tmp_path / "m", rows), right, strict=True)]
    untaught = [a == b for a, b in zip(greedy(tiny_model, rows), right, strict=True)]
    # the answer (2 or what is left, read off the prompt's numbers) is the prompt's, not a constant
    assert sum(taught) >= 0.8 * len(rows) and not any(untaught)
    assert {"2", "1"} <= set(right)


def greedy(model_dir, rows) -> list[str]:
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    said = []
    for r in rows:
        ids = torch.tensor([chat_tokens(tok, r.messages)])
        gen = model.generate(ids, max_new_tokens=4, do_sample=False)
        said.append(tok.decode(gen[0, ids.shape[1] :], skip_special_tokens=True).strip())
    return said


def test_demos_of_an_env_that_runs_programs_need_a_sandbox_and_local_starts_one(tmp_path, capsys):
    """reasoning_gym's tool agent: its demonstration is a program, run in the sandbox; without one
    the command says how to give one and writes nothing; `--sandbox local` starts its own."""
    options = {
        "dataset": "basic_arithmetic",
        "dataset_config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
        "turn_order": ["tool", "reasoner"],
        "max_turns": 1,
    }
    out = tmp_path / "demos.jsonl"
    argv = ["model", "demos", "--env", "reasoning_gym", "--options", json.dumps(options)]
    argv += ["--episodes", "2", "--out", str(out)]
    assert main(argv) == 2 and "or --sandbox local to start one" in capsys.readouterr().err
    assert not out.exists()
    assert main([*argv, "--sandbox", "local"]) == 0
    assert "4 demonstrations from 2 of 2 episodes" in capsys.readouterr().out
    assert [r.agent for r in demos.read(out)] == ["tool", "reasoner"] * 2

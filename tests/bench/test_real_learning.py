"""bench/real_learning.py at its smoke size: the tiny model, the arithmetic task, two eval tasks;
AT-GRPO for two steps, then a second call for L0 whose training budget stops it. It checks the
bench's wiring (configs the services accept, a greedy evaluation at every step with its samples
kept, a stopped run's checkpoint evaluated, a second call keeping the first call's runs, the table,
curves and JSON agreeing); the real run (SmolLM2, tens of minutes a variant) writes
docs/real_learning/. One variant a call: three runs of the five services, not four."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def bench(tmp_path, env, *args):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "real_learning.py"), "--out", str(tmp_path), *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    return proc, json.loads((tmp_path / "real_learning.json").read_text())


def eval_task_ids(path) -> set[str]:
    return {json.loads(line)["task_id"] for line in path.open()}


def test_real_learning_smoke(tiny_model, tmp_path, subprocess_env):
    env = {**subprocess_env, "ATGRPO_BENCH_SMOKE": "1"}
    # A target every evaluation meets: reached at step 0, held at the two after it, so the run
    # stops where it would anyway.
    args = ("--model", tiny_model, "--variants", "at-grpo", "--target", "0", "--hold", "2")
    _, data = bench(tmp_path, env, *args)
    [at] = data["runs"]
    assert at["to_target"] == {
        "step": 0,
        "minutes": 0.0,
        "samples": 0,
        "held": True,
        "wall_minutes": 0.0,  # the evaluation before training is the one that reached it
    }
    assert at["target"] == 0 and at["eval_s"] > 0
    assert (at["task"], at["variant"], at["dtype"]) == ("arithmetic", "at-grpo", "bfloat16")
    assert [e["step"] for e in at["evals"]] == [0, 1, 2]
    runs = tmp_path / "runs"
    for e in at["evals"]:
        assert 0.0 <= e["success"] <= 1.0 and 0.0 <= e["reasoner_unreadable"] <= 1.0
        assert "tool_right" in e
        # Greedy evaluation of the same two tasks: the samples each evaluation kept say so.
        kept = runs / "arithmetic-at-grpo-bf16" / "eval-samples" / f"step-{e['step']:06d}.jsonl"
        assert len(eval_task_ids(kept)) == 2  # the bench's dtype, bfloat16, names the run
    assert at["train_s"] > 0 and len(at["train_reward"]) == 2
    # each step's training seconds and samples, what the minutes-to-T table reads
    assert [(e["step"], e["samples"]) for e in at["steps"]] == [(1, 64), (2, 64)]
    # 8 tasks x K 4 x two agents, one turn
    assert at["samples_per_step"] == 64

    # A second call for the other variant keeps the first call's run. Its training budget is
    # spent by the first step: the run stops there, between evaluations, and the checkpoint of
    # that step is evaluated.
    proc, again = bench(
        tmp_path,
        env,
        "--model",
        tiny_model,
        "--variants",
        "L0",
        "--steps",
        "3",
        "--eval-every",
        "10",
        "--minutes",
        "0.0001",
        "--lr",
        "2e-5",
        "--label",
        "lr2e-5",
    )
    kept, l0 = again["runs"]
    assert kept == at
    # The stop is asked at step 1's event; the step already in flight may complete too.
    last = len(l0["train_reward"])
    assert l0["variant"] == "L0" and last in (1, 2)
    assert l0["label"] == "lr2e-5" and l0["knobs"] == {
        "lr": 2e-5,
        "k": 4,
        "tasks_per_step": 8,
        "seed": 0,
        "max_staleness": 0,
        "stop_at_fence": False,
        "eval_overlap": False,
        "min_lr_ratio": 1.0,
        "stop_at_paragraph": False,
    }
    assert [e["step"] for e in l0["evals"]] == [0, last]
    assert "tool_right" not in l0["evals"][0] and l0["train_s"] > 0
    (stopped,) = (runs / "arithmetic-L0-bf16-lr2e-5" / "evals").glob("*/eval-samples/*.jsonl")
    assert len(eval_task_ids(stopped)) == 2
    # L0 takes 16 tasks of its one agent: as many samples as AT-GRPO's two agents
    assert l0["samples_per_step"] == 64
    table = (tmp_path / "real_learning.md").read_text()
    assert (
        f"| arithmetic | at-grpo | bfloat16 | {at['evals'][0]['success']:.3f} |" in table
        and f"| arithmetic | L0 (lr2e-5) | bfloat16 | {l0['evals'][0]['success']:.3f} |" in table
        and table.strip() in proc.stdout
    )
    assert (tmp_path / "real_learning.png").stat().st_size > 10_000
    # the time-to-accuracy table has the --target run only
    assert "| arithmetic | at-grpo | bfloat16 | 0.0 | 0 | 0.0 | 0 |" in table
    assert "| arithmetic | L0 (lr2e-5) | bfloat16 | 0.0 |" not in table


def test_a_target_run_stops_once_the_target_held_and_reports_the_training_to_it():
    sys.path.insert(0, str(ROOT))
    from bench._learning_report import target_stop, time_to_target

    # evaluations at steps 0, 10, 20, 30: 0.1, 0.92, 0.88, 0.95 against 0.9, hold 2
    successes = [0.1, 0.92, 0.88, 0.95]
    assert [target_stop(successes[:n], 0.9, 2) for n in range(1, 5)] == [False] * 3 + [True]
    assert not target_stop([0.1, 0.5], 0.9, 0) and target_stop([0.1, 0.9], 0.9, 0)
    # steps 1..30 of 60 s, 64 samples each (a run's "steps"); evaluations excluded by step_seconds
    steps = [{"step": s, "step_seconds": 60.0, "samples": 64} for s in range(1, 31)]
    evals = [{"step": 10 * i, "success": x} for i, x in enumerate(successes)]
    assert time_to_target(steps, evals, 0.9, 2) == {
        "step": 10,
        "minutes": 10.0,
        "samples": 640,
        "held": False,  # 0.88 at step 20
    }
    # with the router's evaluation times: from the end of step 0's to the end of step 10's
    clocked = [{**e, "time": 1000.0 + 700.0 * i} for i, e in enumerate(evals)]
    assert time_to_target(steps, clocked, 0.9, 2)["wall_minutes"] == pytest.approx(700 / 60)
    assert time_to_target(steps, evals, 0.9, 3)["held"] is None  # the run ended before 3 more
    assert time_to_target(steps, evals, 0.99, 2) is None


def test_the_knobs_reach_the_run_config():
    sys.path.insert(0, str(ROOT))
    from atgrpo.config import parse_config
    from bench._learning_config import Knobs, run_config

    knobs = Knobs(
        lr=3e-5,
        k=8,
        tasks_per_step=4,
        seed=7,
        max_staleness=1,
        stop_at_fence=True,
        label="sweep",
        stop_at_paragraph=True,
    )
    for variant, tasks in (("at-grpo", 4), ("L0", 8)):  # L0: twice the tasks, as many samples
        cfg = parse_config(
            run_config("arithmetic", variant, "/m", ROOT / "x", 10, 5, 64, knobs=knobs)
        )
        assert (cfg.run.seed, cfg.run.tasks_per_step, cfg.algorithm.k) == (7, tasks, 8)
        assert cfg.max_staleness("shared") == 1
        assert {a: c.train_sampling.stop for a, c in cfg.agents.items()} == (
            {"tool": ("\n```\n",), "reasoner": ("\n\n",)}
            if variant == "at-grpo"
            else {"reasoner": ("\n\n",)}
        )
        assert cfg.pools["shared"].optim.lr == 3e-5


def test_a_budgeted_run_is_stopped_so_that_its_last_step_ends_within_the_budget():
    sys.path.insert(0, str(ROOT))
    from bench.real_learning import stop_due

    # 100 s steps, 600 s: asked after step 5 (500 s + two more would be 700), step 6 ends at 600
    took = [100.0] * 6
    assert [stop_due(took[:n], 600.0) for n in range(1, 7)] == [False] * 4 + [True] * 2
    # the recent steps foretell: steps that got faster let the run go on
    assert not stop_due([200.0, 50.0, 50.0, 50.0], 600.0) and stop_due([200.0, 200.0, 200.0], 600.0)


def test_the_trl_variant_trains_l0_with_trl_and_is_evaluated_by_atgrpo(
    tiny_model, tmp_path, subprocess_env
):
    """TRL's GRPOTrainer at the smoke size: its budget is spent by its first step, so it stops
    there, its save is evaluated by atgrpo's evaluation, and its result has one_run's shape."""
    env = {**subprocess_env, "ATGRPO_BENCH_SMOKE": "1"}
    args = ("--model", tiny_model, "--variants", "trl", "--steps", "3", "--eval-every", "10")
    budget = ("--minutes", "0.0001", "--target", "0", "--hold", "1", "--compare-target", "0")
    proc, data = bench(tmp_path, env, *args, *budget)
    [trl] = data["runs"]
    assert (trl["task"], trl["variant"], trl["dtype"]) == ("arithmetic", "trl", "bfloat16")
    assert [e["step"] for e in trl["evals"]] == [0, 1]
    first = trl["steps"][0]
    assert first["step"] == 1 and first["step_seconds"] > first["rollout_seconds"] > 0
    # L0's samples: 16 tasks x K 4, one optimizer step over them
    assert trl["steps"][0]["samples"] == 64 and trl["samples_per_step"] == 64
    assert trl["train_s"] > 0 and trl["eval_s"] > 0 and len(trl["train_reward"]) == 1
    assert trl["to_target"] == {"step": 0, "minutes": 0.0, "samples": 0, "held": True}
    settings = trl["trl"]["settings"]
    assert settings["num_generations"] == 4 and settings["max_completion_length"] == 64
    assert settings["beta"] == 0.0 and settings["temperature"] == 1.0 and settings["bf16"]
    assert settings["per_device_train_batch_size"] * settings["gradient_accumulation_steps"] == 64
    # atgrpo's evaluation did the scoring: its eval samples of the same two tasks, each step's
    kept = tmp_path / "runs" / "arithmetic-trl-bf16" / "eval-samples"
    for e in trl["evals"]:
        assert len(eval_task_ids(kept / f"step-{e['step']:06d}.jsonl")) == 2
        assert 0.0 <= e["success"] <= 1.0 and "reasoner_unreadable" in e
    table = (tmp_path / "real_learning.md").read_text()
    assert "| arithmetic | trl | bfloat16 | 0.0 | 0 | 0 | yes |" in table  # minutes to T
    assert table.strip() in proc.stdout


def test_the_trl_variant_gets_l0s_tasks_prompts_and_rewards_from_the_env(tiny_model):
    """The TRL reward function is the env's judge mixed as the router mixes L0's rewards
    (alpha 1 x team + local): right 1 + 1, wrong 0 + 0, unreadable 0 + failure_reward -1; its
    prompts are the env's messages of the router's tasks, tokenized as the rollout does."""
    sys.path.insert(0, str(ROOT))
    from transformers import AutoTokenizer

    from atgrpo.config import parse_config
    from bench._learning_config import Knobs, run_config
    from bench._trl_variant import EnvJudge, train_tasks, trl_settings
    from rollout_svc.engines.render import chat_tokens
    from router_svc.steps import step_tasks

    cfg = parse_config(run_config("arithmetic", "L0", tiny_model, ROOT / "x", 2, 1, 2))
    judge = EnvJudge(cfg)
    tasks = train_tasks(cfg.run.seed, 2, cfg.run.tasks_per_step)
    assert len(tasks) == 32 and tasks[16:] == [(t.task_id, t.seed) for t in step_tasks(0, 1, 16)]
    prompts = judge.prompts(tasks[:3])
    question = prompts[0][-1]["content"].split("Calculate ")[1].split(".")[0]  # e.g. "0 - 4"
    a, op, b = question.split()
    right = int(a) + int(b) if op == "+" else int(a) - int(b)
    reward = judge.reward_func()
    answers = [f"So <answer>{right}</answer>", f"<answer>{right + 1}</answer>", "I do not know"]
    completions = [[{"role": "assistant", "content": x}] for x in answers]
    task_id, seed = [tasks[0][0]] * 3, [tasks[0][1]] * 3
    assert reward(completions=completions, task_id=task_id, seed=seed) == [2.0, 0.0, -1.0]
    # the prompt ids TRL renders (its apply_chat_template call) are the rollout's
    tok = AutoTokenizer.from_pretrained(tiny_model)
    trl_ids = tok.apply_chat_template(
        conversation=prompts,
        tools=None,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
    )["input_ids"]
    assert [list(ids) for ids in trl_ids] == [chat_tokens(tok, p) for p in prompts]
    settings = trl_settings(cfg, 2, ROOT / "x", "bfloat16")
    assert settings["learning_rate"] == cfg.pools["shared"].optim.lr and settings["beta"] == 0.0
    # a stop string TRL's generate would not honour is refused, not silently dropped
    stopped = run_config(
        "arithmetic", "L0", tiny_model, ROOT / "x", 2, 1, 2, knobs=Knobs(stop_at_paragraph=True)
    )
    with pytest.raises(ValueError, match="stop strings"):
        trl_settings(parse_config(stopped), 2, ROOT / "x", "bfloat16")


def test_a_checkpointed_run_cut_short_resumes_from_its_last_checkpoint(tiny_model, tmp_path):
    # As a paper_table cell whose machine went away after step 1 of 2: run again, it trains step 2
    # only, from step 1's checkpoint, and reports the whole run's steps and evaluations.
    from bench.real_learning import one_run

    first = one_run("arithmetic", "at-grpo", tiny_model, tmp_path, 1, 1, 2, checkpoint_every=1)
    assert "resumed_after_step" not in first
    second = one_run("arithmetic", "at-grpo", tiny_model, tmp_path, 2, 1, 2, checkpoint_every=1)
    assert second["resumed_after_step"] == 1
    assert [s["step"] for s in second["steps"]] == [1, 2]
    assert [e["step"] for e in second["evals"]] == [0, 1, 2]
    assert second["evals"][:2] == first["evals"]
    # without checkpoints a rerun starts over
    third = one_run("arithmetic", "at-grpo", tiny_model, tmp_path, 1, 1, 2)
    assert "resumed_after_step" not in third and [s["step"] for s in third["steps"]] == [1]


def test_a_resumed_run_counts_the_evaluations_its_earlier_process_ran():
    from bench.real_learning import earlier_eval_seconds

    evals = [{"step": 0, "eval_seconds": 10.0}, {"step": 4, "eval_seconds": 20.0}]
    evals.append({"step": 8, "eval_seconds": 30.0})
    assert earlier_eval_seconds(evals, 4) == 30.0  # steps 0 and 4: 4's checkpoint came after it
    assert earlier_eval_seconds(evals, 0) == 0.0  # not resumed: this process timed them all
    assert earlier_eval_seconds([{"step": 0}], 4) == 0.0  # an evaluation with no seconds recorded

"""bench/real_learning.py's `trl` variant: TRL's GRPOTrainer training the reasoner alone (the L0
setting), on what atgrpo's L0 run of the same knobs trains on, evaluated by atgrpo's own greedy
evaluation, so its curve and its time to accuracy sit beside atgrpo's.

Shared with atgrpo's L0 run (run_config(task, "L0", ...), the same config object):
  tasks    step s trains the tasks the router gives L0's step s (router_svc.steps.step_tasks:
           16 tasks a step, in order, never shuffled), K = num_generations completions each;
  prompts  the chat messages the reasoning_gym env gives the reasoner of each task (reset and
           observe, with the run's env options, through EnvClient's interface over the env library
           in this process: atgrpo.sdk.inprocess.LocalEnvs), rendered by the same chat template
           with the generation prompt;
  reward   the env's own judge: each completion stepped as the reasoner's action on a fresh
           episode of its task, rewarded alpha * team + local as the router mixes them (right 2,
           wrong 0, unreadable 0 + failure_reward -1);
  update   the pool's optimizer exactly (torch AdamW over every weight with its lr, betas and
           weight decay, a constant lr, its gradient clip), one optimizer step a step over its
           K x 16 samples (the token mean over all of them: loss_type dapo), PPO clip 0.2/0.2,
           no KL (atgrpo's kl_coef 0), group-std advantages, bf16 autocast over float32 masters;
  eval     at step 0, every --eval-every steps and at the end the model is saved (bf16, as
           atgrpo's checkpoints are) and evaluated by atgrpo.cli.runner.evaluate with the L0
           config whose pool model_path is that save: the same 5 services, greedy, the same eval
           tasks, its samples kept as run_dir/eval-samples/step-NNNNNN.jsonl.
What TRL cannot do as atgrpo does is in DIFFERS (recorded with each run). Evaluations and saves
are not counted in the training seconds: a step's seconds run from the end of the previous step's
callback (after its save and evaluation) to this step's end.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from bench._learning_config import Knobs, run_config
from bench._learning_report import eval_samples_show, reached, run_record, target_stop

# What this variant does differently from atgrpo's L0 run, and why (TRL 1.16 has no setting for it).
DIFFERS = {
    "zero_variance_filter": "atgrpo drops the groups whose rewards are all equal (DAPO's filter), "
    "so their tokens leave the token mean; TRL keeps them with advantage 0 in its denominator "
    "(same direction, a smaller gradient before Adam's normalisation), and steps the optimizer "
    "on a step whose groups are all flat, where atgrpo skips the update",
    "ratio": "TRL's on-policy ratio is exactly 1 (old log-probs are the trainer's own, detached); "
    "atgrpo's is the trainer's against the rollout engine's bf16 log-probs, near 1, so the clip "
    "and dual clip (c 3) rarely act there either",
    "advantage_eps": "TRL divides by std + 1e-4, atgrpo by std + 1e-6",
    "rollout": "TRL samples with model.generate on the training model (float32 weights, "
    "bf16 autocast with --dtype bfloat16); atgrpo's rollout service samples from a bf16 copy",
    "prompt_limit": "TRL 1.16 has no prompt limit (max_prompt_length is gone): the prompts "
    "(~85 SmolLM2 tokens for arithmetic) are far under atgrpo's max_prompt_tokens 1024, so "
    "neither cuts one",
}


def micro_batches(samples: int, most: int = 16) -> int:
    """The gradient accumulation steps: the fewest that make micro-batches of at most `most`
    sequences (64 samples: 4 of 16, about atgrpo's 4096-token micro-batch)."""
    return next(d for d in range(1, samples + 1) if samples % d == 0 and samples // d <= most)


def train_tasks(seed: int, steps: int, per_step: int) -> list[tuple[str, int]]:
    """(task_id, seed) of each training task of steps 0..steps-1, in order: the router's."""
    from router_svc.steps import step_tasks

    return [(t.task_id, t.seed) for s in range(steps) for t in step_tasks(seed, s, per_step)]


class EnvJudge:
    """The reasoning_gym env of a run config, in this process: the reasoner's prompts and the
    reward of its answers, as the router and the rollout get them from the env service."""

    def __init__(self, cfg: Any):
        from atgrpo.env_check import env_options
        from atgrpo.sdk.host import EnvHost
        from atgrpo.sdk.inprocess import LocalEnvs
        from env_svc.server import builtin_registry

        self.envs = LocalEnvs(EnvHost(builtin_registry()))
        self.name, self.options = cfg.env.name, env_options(cfg)
        self.alpha = cfg.algorithm.alpha
        (self.agent,) = cfg.env.turn_order

    async def _prompt(self, task_id: str, seed: int) -> list[dict[str, str]]:
        ep, _ = await self.envs.reset(self.name, task_id, seed, "train", self.options)
        messages, _ = await self.envs.observe(ep, self.agent)
        await self.envs.close_episodes([ep])
        return [{"role": m["role"], "content": m["content"]} for m in messages]

    async def _reward(self, task_id: str, seed: int, answer: str) -> float:
        ep, _ = await self.envs.reset(self.name, task_id, seed, "train", self.options)
        r = await self.envs.step(ep, self.agent, answer)
        await self.envs.close_episodes([ep])
        return self.alpha * r.team_reward + r.local_reward

    def prompts(self, tasks: list[tuple[str, int]]) -> list[list[dict[str, str]]]:
        async def every():
            return await asyncio.gather(*(self._prompt(t, s) for t, s in tasks))

        return asyncio.run(every())

    def rewards(self, tasks: list[tuple[str, int]], answers: list[str]) -> list[float]:
        async def every():
            return await asyncio.gather(
                *(self._reward(t, s, a) for (t, s), a in zip(tasks, answers, strict=True))
            )

        return asyncio.run(every())

    def reward_func(self):
        """GRPOTrainer's reward function (TRL names it by __name__): a completion's reward."""

        def env_reward(completions, task_id, seed, **_: Any) -> list[float]:
            answers = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
            return self.rewards(list(zip(task_id, seed, strict=True)), answers)

        return env_reward


def trl_settings(cfg: Any, steps: int, output_dir: Path, dtype: str) -> dict[str, Any]:
    """GRPOConfig's arguments for atgrpo's L0 config `cfg` (the optimizer itself is atgrpo's,
    built in trl_run)."""
    optim, alg = cfg.pools["shared"].optim, cfg.algorithm
    update, sampling = cfg.update_for("shared"), cfg.agents["reasoner"].train_sampling
    if optim.warmup_steps or optim.min_lr_ratio != 1.0 or update.epochs != 1:
        raise ValueError("the trl variant matches a constant lr, no warmup and one epoch only")
    if sampling.stop:  # GRPOTrainer's generate has no stop strings of its own to match them with
        raise ValueError("the trl variant matches no stop strings: leave out --stop-at-paragraph")
    samples = cfg.run.tasks_per_step * alg.k
    accum = micro_batches(samples)
    return {
        "output_dir": str(output_dir),
        "max_steps": steps,
        "per_device_train_batch_size": samples // accum,
        "gradient_accumulation_steps": accum,  # one optimizer step a step, as mini_batch_size does
        "num_generations": alg.k,
        "num_iterations": update.epochs,
        "shuffle_dataset": False,  # step s: the router's tasks of step s
        "max_completion_length": sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": max(sampling.top_k, 0),
        "beta": update.loss.kl_coef,
        "epsilon": update.loss.clip_eps_low,
        "epsilon_high": update.loss.clip_eps_high,
        "loss_type": "dapo",  # atgrpo's token_mean over the mini-batch
        "scale_rewards": "group" if alg.norm_std else "none",
        "mask_truncated_completions": False,
        "learning_rate": optim.lr,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "weight_decay": optim.weight_decay,
        "adam_beta1": optim.betas[0],
        "adam_beta2": optim.betas[1],
        "max_grad_norm": optim.grad_clip,
        "bf16": dtype == "bfloat16",
        "use_cpu": True,
        "gradient_checkpointing": False,  # atgrpo's CPU pools do not checkpoint
        "seed": cfg.run.seed,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
    }


def _callback(run: dict[str, Any], evaluate_at, eval_every, minutes, target, hold):
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        """Each step's training seconds, the evaluations, and the stops (budget, target)."""

        def on_train_begin(self, args, state, control, model=None, **kw):
            evaluate_at(0, None)
            run["mark"] = time.perf_counter()

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                run["train_reward"].append((state.global_step, logs["reward"]))

        def on_step_end(self, args, state, control, model=None, **kw):
            step, took = state.global_step, time.perf_counter() - run["mark"]
            rollout, run["rollout_s"] = run["rollout_s"], 0.0
            run["steps"].append(
                {
                    "step": step,
                    "step_seconds": took,
                    "samples": run["samples"],
                    "rollout_seconds": rollout,
                }
            )
            spent = [e["step_seconds"] for e in run["steps"]]
            # The step after this one would end past the budget (TRL stops right after the step
            # that asks, where atgrpo's router finishes the one in flight: real_learning.stop_due).
            over = minutes is not None and sum(spent) + statistics.fmean(spent[-3:]) > minutes * 60
            if step % eval_every == 0 or step == state.max_steps or over:
                success = evaluate_at(step, model)
                if target is not None and target_stop(success, target, hold):
                    control.should_training_stop = True
            if over:
                control.should_training_stop = True
            run["mark"] = time.perf_counter()
            return control

    return Clock()


def trl_run(
    task: str,
    model: str,
    run_dir: Path,
    steps: int,
    eval_every: int,
    eval_tasks: int,
    minutes: float | None,
    dtype: str,
    target: float | None,
    hold: int,
    knobs: Knobs,
) -> dict[str, Any]:
    """Train the `trl` variant (see the module's docstring); a result shaped as one_run's."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from atgrpo.cli.runner import evaluate
    from atgrpo.config import parse_config

    start = time.perf_counter()
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)

    def l0(model_path: str, where: Path) -> dict[str, Any]:
        return run_config(
            task, "L0", model_path, where, steps, eval_every, eval_tasks, dtype, knobs
        )

    cfg = parse_config(l0(model, run_dir))
    judge = EnvJudge(cfg)
    tasks = train_tasks(cfg.run.seed, steps, cfg.run.tasks_per_step)
    data = Dataset.from_dict(
        {
            "prompt": judge.prompts(tasks),
            "task_id": [t for t, _ in tasks],
            "seed": [s for _, s in tasks],
        }
    )
    settings = trl_settings(cfg, steps, run_dir / "trl", dtype)
    tokenizer = AutoTokenizer.from_pretrained(model, padding_side="left", truncation_side="left")
    policy = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)  # the masters
    optim = cfg.pools["shared"].optim
    # atgrpo's optimizer (trainer_svc/state.py): AdamW over every weight, decay on all of them
    # (the Trainer's own would spare biases and norms), at a constant lr.
    adamw = torch.optim.AdamW(
        policy.parameters(), lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay
    )
    constant = torch.optim.lr_scheduler.LambdaLR(adamw, lambda _: 1.0)

    samples = cfg.run.tasks_per_step * cfg.algorithm.k
    run: dict[str, Any] = {"steps": [], "train_reward": [], "samples": samples, "rollout_s": 0.0}
    evals: list[dict[str, Any]] = []
    eval_s = [0.0]

    def evaluate_at(step: int, trained: Any) -> list[float]:
        """atgrpo's evaluation of the model at `step` (None: the starting model); the successes
        so far."""
        began = time.perf_counter()
        where = run_dir / "evals-trl" / f"step-{step:06d}"
        path = model
        if trained is not None:
            path = str(where / "model")
            state = {k: v.to(torch.bfloat16) for k, v in trained.state_dict().items()}
            trained.save_pretrained(path, state_dict=state)
            tokenizer.save_pretrained(path)
        result = evaluate(parse_config(l0(path, where)), None)
        (found,) = (where / "evals").glob("*/eval-samples/*.jsonl")
        kept = run_dir / "eval-samples" / f"step-{step:06d}.jsonl"
        kept.parent.mkdir(exist_ok=True)
        shutil.copyfile(found, kept)
        if trained is not None:
            shutil.rmtree(path)  # 270 MB a save; its samples are what stays
        evals.append(
            {
                "step": step,
                "success": result["success_rate"],
                "returns": {a: m["reward_mean"] for a, m in result["agents"].items()},
                **eval_samples_show(kept),
            }
        )
        eval_s[0] += time.perf_counter() - began
        return [e["success"] for e in evals]

    trainer = GRPOTrainer(
        model=policy,
        reward_funcs=judge.reward_func(),
        args=GRPOConfig(**settings),
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[_callback(run, evaluate_at, eval_every, minutes, target, hold)],
        optimizers=(adamw, constant),
    )
    generate = trainer._generate_and_score_completions  # TRL's rollout: sampling and rewards

    def timed(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return generate(*args, **kwargs)
        finally:
            run["rollout_s"] += time.perf_counter() - began

    trainer._generate_and_score_completions = timed  # a step's rollout seconds, beside its own
    trainer.train()
    steps_ = run["steps"]
    return {
        **run_record(task, "trl", dtype, knobs, start, run_dir, steps_, evals, eval_s[0]),
        **reached(steps_, evals, target, hold),
        "train_reward": run["train_reward"],
        "samples_per_step": float(run["samples"]),
        "trained_samples_per_step": float(run["samples"]),
        "time_breakdown_s": {
            k: statistics.fmean(e[k] for e in steps_) for k in ("step_seconds", "rollout_seconds")
        },
        "trl": {
            "settings": {k: v for k, v in settings.items() if k != "output_dir"},
            "optimizer": "torch.optim.AdamW(all weights), constant lr (atgrpo's pool optimizer)",
            "mixed_precision": trainer.accelerator.mixed_precision,  # bf16: autocast on CPU
            "differs": DIFFERS,
        },
    }
